"""The documentation holds together: every relative link in the README, docs/ and the config READMEs
reaches an existing file and, with an `#anchor`, an existing heading; every repository path the docs
cite in `code` exists; every section the code, configs and claims point readers to exists; every
method file has its page; and the commands the docs tell users to type keep MLflow on localhost
unless authenticated."""

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "fedfactor"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "config" / "README.md",
         REPO / "config" / "paper_numbers" / "README.md"]
# Written by the method pages' author, one per file in src/fedfactor/methods/ (tested below); listed
# here too so that a missing one fails as a page, not only as a link
METHOD_FILES = sorted(p.stem for p in (PACKAGE / "methods").glob("*.py") if p.stem not in ("__init__", "base"))
# Where the code, configs and claims send readers ("see docs/x.md", 'README, "Section"')
POINTERS = [*PACKAGE.rglob("*.py"), *(REPO / "config").rglob("*.yaml"),
            *(p for p in (REPO / "workflow").rglob("*") if p.suffix in (".smk", ".py", ".rst", ".yaml", ".sh")),
            *(REPO / "benchmarks").rglob("*.py"), *(REPO / "probes").rglob("*.py"), REPO / "Snakefile"]
# Files of the authors' repositories the docs name (not ours, so not checked here)
AUTHORS_FILES = {"models/LoraResnet1.py"}
# The package's subpackages (run, study, methods, ...): `run/job.py` in a page is src/fedfactor/run/job.py
SUBPACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


def _name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _prose(text: str) -> str:
    """The text outside ``` blocks (a `# comment` in a shell block is no heading, a path no citation);
    line count kept."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m[0].count("\n"), text, flags=re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(path.read_text()), re.M):
        slug = _slug(heading)
        n = sum(1 for a in out if a == slug or re.fullmatch(re.escape(slug) + r"-\d+", a))
        out.add(slug if n == 0 else f"{slug}-{n}")  # GitHub numbers repeated headings
    return out


def _links(path: Path) -> list[str]:
    prose = re.sub(r"`[^`\n]*`", "", _prose(path.read_text()))  # `[x](y)` in code is no link
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", prose)


def test_the_pages_tested_include_every_docs_page_and_each_method_files_page():
    names = {_name(p) for p in PAGES}
    assert {"README.md", "docs/README.md", "docs/bibliography.md", "config/README.md"} <= names
    assert {f"docs/methods/{m}.md" for m in METHOD_FILES} <= names, "a method file has no page under docs/methods/"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):  # https:, mailto:: outside the repository
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {_name(path)}")
    assert broken == [], f"{_name(page)}: " + "; ".join(broken)


def _cited_paths(page: Path) -> list[str]:
    """Repository paths a page writes as `code`: from the top (src/..., config/...), or inside the
    package (methods/base.py). Outputs (results/...) and patterns (<study>, *, X.yaml) are not files."""
    out = []
    for span in re.findall(r"`([^`\n]+)`", _prose(page.read_text())):
        path = span.split(":")[0]  # src/fedfactor/study/workflow.py:partition_sets names a function in it
        if re.search(r"[<>*{}\[\]$ ]|\bX\.|NAME|\.\.\.", path):
            continue
        if re.fullmatch(r"(src|config|tests|workflow|docs|benchmarks|probes|profiles|envs)/[\w./+-]*", path) \
                or path in ("results/README.md", "Snakefile", "BENCHMARKS.md", "pyproject.toml"):
            out.append(path)
        elif re.fullmatch(rf"({'|'.join(SUBPACKAGES)})/\w+\.py", path) and path not in AUTHORS_FILES:
            out.append(f"src/fedfactor/{path}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_repository_path_a_page_cites_exists(page):
    assert [p for p in _cited_paths(page) if not (REPO / p).exists()] == []


def test_the_path_check_sees_the_paths_the_pages_cite():
    # the check above is only as good as its pattern: it must find the paths written in the docs
    cited = {p for page in PAGES for p in _cited_paths(page)}
    assert {"config/runs/digits.yaml", "src/fedfactor/config.py", "src/fedfactor/methods/base.py",
            "src/fedfactor/run/weights.py", "tests/conftest.py", "workflow/scripts/slurm_local.sh"} <= cited


# MLflow tags a run carries (fedfactor.version.cpu, fedfactor.warnings, fedfactor.run_key): no modules
TAGS = ("version", "warnings", "run_key")


def _module_names(page: Path) -> list[str]:
    """The dotted names of the package a page writes in `code`: fedfactor.reparam.factorize,
    fedfactor.methods.build; not a file (envs/fedfactor.yaml) nor an MLflow tag."""
    pattern = rf"(?<![\w/.-])fedfactor\.(?!(?:{'|'.join(TAGS)})\b)\w+(?:\.\w+)*"
    return [m for span in re.findall(r"`([^`\n]+)`", _prose(page.read_text())) for m in re.findall(pattern, span)]


def _resolves(dotted: str) -> bool:
    """Whether a module path, or a name in a module, exists: the longest importable prefix, then attributes."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_module_path_a_page_names_exists(page):
    # a module moved to another room (fedfactor.job -> fedfactor.run.job) leaves no page behind
    assert [m for m in _module_names(page) if not _resolves(m)] == []


def test_the_module_check_sees_the_names_written():
    named = {m for page in PAGES for m in _module_names(page)}
    assert {"fedfactor.methods.build", "fedfactor.models.weight_layers"} <= named
    assert not named & {"fedfactor.version", "fedfactor.warnings", "fedfactor.yaml"}
    assert not _resolves("fedfactor.job") and not _resolves("fedfactor.reparam.decompose_all")


def test_the_layout_page_shows_the_layers_the_import_test_holds():
    from .test_imports import LAYERS

    # docs/layout.md's table, bottom up: a row per layer, its packages in the first column
    rows = [set(re.findall(r"`(\w+)`", line.split("|")[1]))
            for line in (REPO / "docs" / "layout.md").read_text().splitlines() if line.startswith("| `")]
    # the package's __init__ and __main__ are no rooms of their own
    assert rows == [set(layer) - {"fedfactor"} for layer in LAYERS if set(layer) - {"fedfactor", "__main__"}]


def test_the_layout_page_names_every_package_and_module_of_the_top_level():
    # docs/layout.md's tree, under src/fedfactor/: a new room (or a module moved into one) shows there
    tree = (REPO / "docs" / "layout.md").read_text().split("src/fedfactor/\n", 1)[1].split("```", 1)[0]
    named = set(re.findall(r"^  (\w+)(?:/|\.py)", tree, re.M)) | set(re.findall(r" (__main__)\.py", tree))
    top = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | set(SUBPACKAGES)
    assert top - named == set() and named - top == set()


def _section_starts(path: Path) -> list[str]:
    """What a quoted section name may name on a page: a heading, or a paragraph's bold lead."""
    text = _prose(path.read_text())
    return [*re.findall(r"^#{1,6} (.+)$", text, re.M), *re.findall(r"^\*\*([^*]+)\*\*", text, re.M)]


@pytest.mark.parametrize("source", [p for p in POINTERS if p.is_file()], ids=_name)
def test_pointers_from_code_and_configs_name_existing_pages_and_sections(source):
    # comment lines joined, so that a pointer broken over two lines reads as one
    text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", source.read_text())
    broken = []
    for page, _, section in re.findall(r"\b(README|docs/[\w/.-]+\.md)(, \"([^\"]+)\")?", text):
        path = REPO / ("README.md" if page == "README" else page)
        if not path.is_file():
            broken.append(f"{page}: no such page")
        elif section and not any(s.startswith(section) for s in _section_starts(path)):
            broken.append(f'{page}, "{section}": no such section')
    assert broken == []


def test_the_pointer_check_sees_the_pointers_written():
    # the default study's config sends readers to two pages; the check must find both
    text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", (REPO / "config" / "config.yaml").read_text())
    assert {"docs/default_study.md", "docs/as_run.md"} <= set(re.findall(r"docs/[\w/.-]+\.md", text))


def test_claims_cite_papers_the_bibliography_lists():
    papers = {a for a in _anchors(REPO / "docs" / "bibliography.md") if re.fullmatch(r"\d{3}", a)}
    assert papers == {"000", "001", "002", "003", "004"}
    for study in sorted((REPO / "config" / "studies").glob("*.yaml")):
        for claim in yaml.safe_load(study.read_text()).get("claims", []):
            cited = set(re.findall(r"\b(00\d)\b", claim["source"]))
            assert cited and cited <= papers, (study.name, claim["id"], claim["source"])


def test_the_methods_index_lists_every_method_file_and_every_registered_method():
    from fedfactor.methods import METHODS

    index = (REPO / "docs" / "methods.md").read_text()
    assert [m for m in METHOD_FILES if f"(methods/{m}.md)" not in index] == []
    assert [n for n in METHODS.names() if f"| `{n}` |" not in index] == []


def test_mlflow_ui_and_server_commands_bind_to_localhost_unless_they_authenticate():
    docs = "\n".join(p.read_text() for p in PAGES)
    commands = re.findall(r"^(?:MLFLOW_\w+=\S+ )?mlflow (?:ui|server)\b.*$", docs, re.M)
    assert len(commands) >= 3  # the local UI, a cluster's server, the authenticated server
    for command in commands:
        assert "--host 127.0.0.1" in command or "--app-name basic-auth" in command, command

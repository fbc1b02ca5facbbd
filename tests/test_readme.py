"""The README is the front page: what fedfactor is, the two commands, the default study's table and
figures, and links to docs/ for everything else, in at most 200 lines. Its links are checked with
every other page's in tests/test_docs.py; its commands in tests/test_readme_commands.py."""

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_the_readme_is_at_most_200_lines():
    assert len(README.splitlines()) <= 200


def test_the_readme_has_its_sections_in_order():
    headings = re.findall(r"^## (.+)$", README, re.M)
    assert headings == ["Two commands", "What the default study produces", "The papers' claims on real images",
                        "Documentation"]


def test_the_two_commands_install_and_run_the_default_study_and_the_tests():
    section = README.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S)
    assert len(commands) == 2
    study, tests = (c.strip() for c in commands)
    assert "pip install -e ." in study and study.endswith("snakemake --cores all")
    assert 'pip install -e ".[test]"' in tests
    # both tiers, fast first; CI runs exactly these two pytest calls
    tiers = re.findall(r"python -m pytest [^&]*", tests)
    assert [t.strip() for t in tiers] == ['python -m pytest -q -n auto -m "not slow"', "python -m pytest -q -n auto -m slow"]
    ci = (REPO / ".ci" / "run").read_text()
    assert all(t.strip() in ci for t in tiers)


def test_the_default_study_table_has_every_method_and_scenario_of_config_yaml():
    # the table shows the study config/config.yaml runs: a method or scenario added or renamed there
    # must show here too
    study = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    section = README.split("## What the default study produces", 1)[1].split("\n## ", 1)[0]
    # two tables: the tuned study, then the untuned one (config/variants/untuned.yaml)
    tables = [t for t in re.split(r"\n\s*\n", section) if t.startswith("|")]
    assert len(tables) == 2
    headers = []
    for table in tables:
        header, _, *body = [line.strip("|").split("|") for line in table.splitlines()]
        headers.append(columns := [h.strip() for h in header])
        assert columns[: len(study["scenarios"]) + 2] == ["method", *study["scenarios"], "cost [GB]"]
        assert [r[0].strip() for r in body] == list(study["methods"])
        for row in body:  # mean +- std [95 % interval] (n = the study's seeds) in every scenario column
            cells = row[1 : len(study["scenarios"]) + 1]
            assert all(re.fullmatch(rf" \d+\.\d\d \+- \d+\.\d\d \[\d+\.\d, \d+\.\d\] \(n={len(study['seeds'])}\) ", c)
                       for c in cells), row
    # the tuned table names the values chosen on validation; the untuned one has none
    assert headers[0][-1].startswith("chosen on validation") and headers[1][-1] == "cost [GB]"


def test_the_readme_numbers_name_their_versions():
    section = README.split("## What the default study produces", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"Python \d+\.\d+\.\d+, torch \d+\.\d+\.\d+\S*, numpy \d+\.\d+\.\d+", section)
    assert "constraints.txt" in section


def test_the_readme_shows_the_default_study_figures():
    figures = re.findall(r"^!\[[^\]]+\]\((docs/default_accuracy_\w+\.png)\)$", README, re.M)
    assert figures == ["docs/default_accuracy_rounds.png", "docs/default_accuracy_bytes.png"]


def test_the_readme_links_every_docs_page():
    # a page nobody links to is a page nobody finds: docs/README.md is the index, the README lists the
    # top-level pages and the paper pages (docs/methods/*.md are reached through docs/methods.md)
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    pages |= {p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "papers").glob("*.md")}
    linked = set(re.findall(r"\]\((docs/[\w/.-]+\.md)\)", README))
    assert pages - linked == set()

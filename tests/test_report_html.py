"""The study's HTML report (`snakemake --report`), read in a real headless Chromium.

A tiny study runs end to end through Snakemake, its report is built, and the report is opened and
clicked through as a reader would (tests/report_browser.py): every table, claim file and figure the
study wrote must be listed in its category, show in place with the very bytes on disk, and carry its
caption from workflow/report/.

Needs Debian's chromium and chromium-driver and selenium (report_browser.INSTALL_HINT). Without them
the tests skip, except under CI (the CI variable set), where they fail. FEDFACTOR_REPORT_REPO points
the tests at another checkout of the workflow (a scratch copy with other rules, say).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote

import pytest

from .report_browser import (
    BrowserUnavailable,
    Report,
    assert_report_complete,
    caption_lead,
    check_report,
    read_report,
    start_browser,
)

pytestmark = pytest.mark.slow  # a study run, its HTML report and a headless browser

REPO = Path(os.environ.get("FEDFACTOR_REPORT_REPO") or Path(__file__).resolve().parents[1])
CAPTIONS = REPO / "workflow" / "report"

# The smallest real study: digits, an MLP, 2 clients, 1 round, 1 seed, two methods; with a paper table
# (its numbers in PAPER_CSV, written beside the study) and a claim, so every kind of result is made.
TINY_RUN = "data: {name: digits}\nmodel: {name: mlp}\nfl: {clients: 2, rounds: 1, epochs: 1, batch_size: 32}\n"
TINY_STUDY = {
    "study": "tiny",
    "seeds": [0],
    "scenarios": {"iid": {"partition": {"kind": "iid"}, "fl": {"rounds": 1, "clients": 2}}},
    "methods": {"fedavg": {"name": "fedavg"}, "local": {"name": "local"}},
    "paper": {"name": "A tiny paper", "numbers": "numbers", "tables": [{
        "csv": "tiny_table1.csv", "metric": "accuracy_pct", "dataset": "Digits",
        "scenarios": {"iid": {"setting": "IID"}}, "methods": {"local": "Local", "fedavg": "FedAvg"}}]},
    "claims": [{"id": "fedavg_beats_local", "claim": "FedAvg beats Local with IID clients",
                "source": "the tiny paper, Table 1", "kind": "order", "a": "fedavg", "b": "local",
                "scenarios": ["iid"]}],
}
PAPER_CSV = """paper,table,dataset,setting,method,metric,value,std,note
A tiny paper,Table 1,Digits,IID,Local,accuracy_pct,90.0,1.0,
A tiny paper,Table 1,Digits,IID,FedAvg,accuracy_pct,95.0,0.5,
"""

# What of results/<study>/ the report must show: (glob, category, caption file, or None: any caption).
# Only what a reader can look at in place is reported; the .md/.csv/.tex twins of a table and the .pdf
# twin of a figure lie beside it on disk.
RESULTS = [
    ("tables/table.html", "Tables", "table.rst"),
    ("tables/paper.html", "Tables", "paper.rst"),
    ("tables/*.html", "Tables", None),
    ("claims/*.html", "Claims", "claims.rst"),
    ("figures/*.png", "Figures", "figures.rst"),
    ("diagnostics/figures/*.png", "Factor-analysis diagnostics", "diagnostics.rst"),
    ("diagnostics/*.html", "Factor-analysis diagnostics", "diagnostics.rst"),
]


@dataclass
class Built:
    workdir: Path  # Snakemake's working directory: the report's paths are relative to it
    study_dir: Path
    report: Path


def snakemake(repo: Path, workdir: Path, *args: str, env: dict | None = None) -> None:
    # with `env`, the fork server's snakemake (tests/forkserver.py)
    cmd = [*([sys.executable, "-m", "snakemake"] if env is None else ["snakemake"]), "--snakefile",
           str(repo / "Snakefile"), *args]
    r = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, f"{' '.join(cmd[2:])} failed:\n{r.stderr[-6000:]}\n{r.stdout[-3000:]}"


def build_study(repo: Path, workdir: Path, study: dict = TINY_STUDY, env: dict | None = None) -> Built:
    """Run `study` with the workflow of `repo` in `workdir`, then build its report.html."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "run.yaml").write_text(TINY_RUN)
    (workdir / "numbers").mkdir(exist_ok=True)
    (workdir / "numbers" / "tiny_table1.csv").write_text(PAPER_CSV)
    config = {**study, "run_config": str(workdir / "run.yaml"), "results": str(workdir / "results")}
    if "paper" in config:  # its numbers folder relative to the study's working directory
        config["paper"] = {**config["paper"], "numbers": str(workdir / config["paper"]["numbers"])}
    (workdir / "study.yaml").write_text(json.dumps(config))
    study_dir = workdir / "results" / study["study"]
    report = study_dir / "report.html"
    snakemake(repo, workdir, "--cores", "2", "--configfile", "study.yaml", env=env)
    snakemake(repo, workdir, "--cores", "1", "--configfile", "study.yaml", "--report", str(report), env=env)
    return Built(workdir, study_dir, report)


def expected_results(study_dir: Path) -> dict[Path, tuple[str, str | None]]:
    """Every file of `RESULTS` the study wrote -> (its category, its caption file)."""
    out: dict[Path, tuple[str, str | None]] = {}
    for pattern, category, caption in RESULTS:
        for f in sorted(study_dir.glob(pattern)):
            out.setdefault(f.resolve(), (category, caption))
    return out


def caption_snippets(f: Path, caption: str | None, study: str) -> list[str]:
    """Words the rendered caption of `f` must hold: its caption file's bold lead and the study's name;
    a figure's caption also names the figure."""
    if caption is None:
        return []
    snippets = [caption_lead((CAPTIONS / caption).read_text()), study]
    if caption == "figures.rst":
        snippets.append(f.name)
    return snippets


@pytest.fixture(scope="module")
def browser():
    try:
        b = start_browser()
    except BrowserUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"headless Chromium is needed in CI: {e}", pytrace=False)
        pytest.skip(f"no headless Chromium: {e}")
    yield b
    b.quit()


@pytest.fixture(scope="module")
def built(tmp_path_factory, fedfactor_env) -> Built:
    return build_study(REPO, tmp_path_factory.mktemp("report_study"), env=fedfactor_env)


@pytest.fixture(scope="module")
def report(browser, built) -> Report:  # browser first: no study is run where no browser starts
    return read_report(built.report, browser)


def test_report_shows_every_result_in_place_with_its_caption(report, built):
    expected = expected_results(built.study_dir)
    names = {f.relative_to(built.study_dir.resolve()).as_posix() for f in expected}
    for must in ("tables/table.html", "tables/paper.html", "claims/claims.html", "figures/accuracy_rounds.png",
                 "diagnostics/figures/communalities.png"):
        assert must in names, f"the study did not write {must}; it wrote {sorted(names)}"
    assert_report_complete(
        report, expected, root=built.workdir,
        categories={f: category for f, (category, _) in expected.items()},
        captions={f: caption_snippets(f, caption, "tiny") for f, (_, caption) in expected.items()})
    # the HTML tables show their content: both methods in the results table, the paper's numbers
    # beside ours, the claim with its verdict
    shown = {i.name: i.text for i in report.items}
    assert "fedavg" in shown["table.html"] and "local" in shown["table.html"], shown["table.html"][:500]
    assert "95.0" in shown["paper.html"] and "FedAvg" in shown["paper.html"], shown["paper.html"][:500]
    assert "FedAvg beats Local with IID clients" in shown["claims.html"], shown["claims.html"][:500]
    assert re.search(r"not reproduced|reproduced|within noise", shown["claims.html"]), shown["claims.html"][:500]
    # about 10 s on 2 busy cores; far more means some step only passed on its wait's timeout
    assert report.seconds < 60, f"reading the report took {report.seconds:.1f} s"


def test_report_front_page_describes_the_study(report):
    text = report.description
    assert "fedfactor study tiny" in text
    for word in ("iid", "fedavg", "local", "Seeds: 0.", "1 x 2 x 1 = 2 runs", "A tiny paper", "checks 1 of its claims"):
        assert word in text, f"{word!r} not on the report's front page: {text[:1500]}"
    for category in report.by_category():  # each category the report has is explained and linked
        assert f"{category}:" in text, f"the front page does not explain {category!r}"
    assert "System Message" not in text, "workflow.rst does not render cleanly"


# -- the captions alone: rendered as Snakemake renders them (Jinja, then docutils), no browser, no study


FIGURES = ["accuracy_rounds", "accuracy_bytes", "accuracy_time", "per_client", "similarity", "matching", "decomp", "elora",
           "something_new"]
FULL = {**TINY_STUDY, "title": "A tiny study", "smoke": True, "overrides": {"fl": {"rounds": 2}},
        "select": {"scenarios": ["iid"]}, "data_root": "data", "results": "results", "run_config": "run.yaml"}
PLAIN = {key: value for key, value in FULL.items() if key not in ("paper", "claims", "title", "smoke", "overrides",
                                                               "select")}


def render_caption(name: str, config: dict, params: dict | None = None, wildcards: dict | None = None,
                   categories: tuple[str, ...] = ()) -> str:
    """workflow/report/<name> as HTML, the way Snakemake's report renders a caption (report/__init__.py):
    Jinja with trim_blocks and lstrip_blocks, then docutils; a docutils warning fails here."""
    from types import SimpleNamespace

    from docutils.core import publish_parts
    from jinja2 import Environment
    from snakemake.iocontainers import Namedlist, Wildcards
    from snakemake.report import Category

    env = Environment(trim_blocks=True, lstrip_blocks=True)
    snakemake = SimpleNamespace(config=config, params=Namedlist(fromdict=params or {}),
                                wildcards=Wildcards(fromdict=wildcards or {}), output=Namedlist())
    cats = {Category(name=c): {} for c in categories}
    links = "".join(f"\n.. _{c}: javascript:app.showCategory('{quote(c)}')" for c in categories)
    text = env.from_string((CAPTIONS / name).read_text() + "\n" + links).render(
        snakemake=snakemake, categories=cats, files=[])
    part = "html_body" if name == "workflow.rst" else "body"
    with warnings.catch_warnings():  # writer_name, as Snakemake calls it, is deprecated in docutils 0.22
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        parts = publish_parts(text, writer_name="html", settings_overrides={"halt_level": 2, "report_level": 5})
    return parts[part]


@pytest.mark.parametrize("config", [PLAIN, FULL], ids=["plain", "paper_claims_smoke"])
def test_captions_render_cleanly(config):
    categories = ("Tables", "Claims", "Figures", "Factor-analysis diagnostics")
    front = render_caption("workflow.rst", config, categories=categories)
    assert "fedfactor study" in front and "tiny" in front
    for c in categories:
        assert f"javascript:app.showCategory('{quote(c)}')" in front, f"no link to {c}"
    assert ("A tiny paper" in front) == ("paper" in config)
    assert ("SMOKE RUN" in front) == bool(config.get("smoke"))
    for name in ("table.rst", "paper.rst", "claims.rst", "diagnostics.rst"):
        html = render_caption(name, config, params={"not_implemented": ["fedper", "fedfomo"]})
        assert caption_lead((CAPTIONS / name).read_text()) in html
        assert ("fedper" in html) == (name != "diagnostics.rst"), f"{name} does not name the skipped methods"
        assert "fedper" not in render_caption(name, config)
    for figure in FIGURES:
        html = render_caption("figures.rst", config, wildcards={"name": figure})
        assert f"{figure}.png" in html and (f"{figure}.pdf" in html) == (not config.get("smoke"))  # PNG only
        assert ("drawn from this study's runs" in html) == (figure == "something_new"), figure


def test_checker_names_what_is_missing_stale_or_unexpected(report, built):
    """check_report itself: a report missing a file, embedding other bytes, or showing more than
    expected is caught (so the test above cannot pass by checking nothing)."""
    expected = list(expected_results(built.study_dir))
    assert check_report(report, expected, root=built.workdir) == []
    ghost = built.study_dir / "figures" / "not_drawn.png"
    assert any("not_drawn.png" in p and "missing" in p
               for p in check_report(report, [*expected, ghost], root=built.workdir))
    assert any("not expected" in p for p in check_report(report, expected[1:], root=built.workdir))
    stale = Report(report.description, [replace(i, data=i.data + b"x") if i.name == "table.html" else i
                                        for i in report.items])
    assert any("table.html" in p and "stale" in p for p in check_report(stale, expected, root=built.workdir))
    uncaptioned = Report(report.description, [replace(i, caption="") for i in report.items])
    assert len(check_report(uncaptioned, expected, root=built.workdir)) == len(expected)


def test_the_front_page_names_each_methods_chosen_values_beside_it():
    """A tuned study: the Snakefile hands the chosen values to the template (config's
    `_chosen_on_validation`, study.smk), and each method's line names them per scenario."""
    tuned = {**PLAIN, "tuning": {"file": "config/tuned/tiny.yaml"},
             "_chosen_on_validation": {"fedavg": "iid: lr 0.05", "local": "iid: lr 0.1"}}
    front = render_caption("workflow.rst", tuned)
    assert "; chosen on validation: iid: lr 0.05" in front and "; chosen on validation: iid: lr 0.1" in front
    assert "config/tuned/tiny.yaml" in front
    assert "chosen on validation:" not in render_caption("workflow.rst", PLAIN)

"""fedfactor verdicts (report/verdicts.py): every claim of the paper studies on one page, with the paper's own
numbers, the CPU-scale verdict from the CPU studies' claims.csv and the paper-scale verdict from the paper
studies' claims.csv; on the repository's studies and hand-written results."""

import contextlib
import io
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from fedfactor.cli import main
from fedfactor.report.borrow import read_study_file
from fedfactor.report.claims import CHECK_COLUMNS, COLUMNS
from fedfactor.report.spec import SMOKE_COLUMN
from fedfactor.study.verdicts import _PaperReader, paper_values, spec_of, write_page

REPO = Path(__file__).resolve().parents[2]
STUDIES = REPO / "config" / "studies"
CPU = STUDIES / "cpu"
PAPER_CLAIMS = 92  # every claim of config/studies/*.yaml

LOSES = "factorized_fl_label.fedavg_loses_under_permutation"
INTERVAL = ("fedavg: standard_iid -> permuted_iid: +3.00 pp, 95 % CI [+1.00, +5.00], paired t-test p=0.01, n=5 "
            "(reproduced)")


def _rows(page: str) -> dict[str, list[str]]:
    """The claim rows of the page: `origin.id` -> its cells (claim, source, paper's numbers, ours, CPU-scale
    verdict, tested at, paper-scale verdict)."""
    out = {}
    for line in page.splitlines():
        if m := re.match(r"\| \*\*([^*]+)\*\*: ", line):
            assert m.group(1) not in out, f"{m.group(1)} has two rows"
            out[m.group(1)] = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
    return out


def _all_claims() -> set[str]:
    docs = (read_study_file(p) for p in STUDIES.glob("*.yaml"))
    return {f"{d['study']}.{c['id']}" for d in docs for c in d.get("claims") or []}


def _write_claims(folder: Path, rows: list[dict], checks: list[dict] = ()) -> None:
    """claims.csv (and comparisons.csv) as `fedfactor claims` writes them."""
    folder.mkdir(parents=True)
    base = {c: "" for c in COLUMNS} | {"seeds": 5}
    pd.DataFrame([base | r for r in rows], columns=COLUMNS).to_csv(folder / "claims.csv", index=False)
    pd.DataFrame(list(checks), columns=CHECK_COLUMNS).to_csv(folder / "comparisons.csv", index=False)


def _cpu_result(results: Path, smoke: str = "") -> None:
    """cpu_factorized_fl's verdicts: fedavg_loses_under_permutation reproduced, with its one comparison;
    fedfomo_sends_6x left to paper scale."""
    _write_claims(results / "cpu_factorized_fl" / "claims", [{
        "smoke_run": smoke, "origin": "factorized_fl_label", "id": "fedfomo_sends_6x", "mode": "",
        "verdict": "needs paper scale", "claim": "FedFOMO sends six times FedAvg's bytes", "missing": "fedfomo: VGG",
        "seeds": 0}, {
        "smoke_run": smoke, "origin": "factorized_fl_label", "id": "fedavg_loses_under_permutation", "mode": "",
        "kind": "drop", "verdict": "reproduced", "claim": "FedAvg loses accuracy when the labels are permuted",
        "observed": "fedavg: standard_iid 80.00 -> permuted_iid 77.00 (+3.00 pp)", "interval": INTERVAL,
        "condition": "falls from each `from` to its `to` scenario", "seeds_agree": "5/5",
        "scale_note": "tested on 4 of the paper study's 8 scenarios", "failed": "fedavg in permuted_iid, seed 5: x",
    }], [{"origin": "factorized_fl_label", "id": "fedavg_loses_under_permutation", "mode": "",
          "comparison": "fedavg: standard_iid -> permuted_iid", "unit": "pp", "value": 3.0, "low": 1.0, "high": 5.0,
          "verdict": "reproduced", "condition_low": 0.0, "condition_high": math.inf}])


@pytest.fixture(scope="module")
def empty_page(tmp_path_factory):
    """The page on the repository's studies with no results at all: (its text, its folder)."""
    folder = tmp_path_factory.mktemp("verdicts")
    write_page(STUDIES, CPU, folder / "results", folder / "verdicts.md")
    return (folder / "verdicts.md").read_text(), folder


def test_the_page_lists_every_claim_of_the_paper_studies_once(empty_page):
    page, folder = empty_page
    rows = _rows(page)
    assert len(rows) == PAPER_CLAIMS and set(rows) == _all_claims()
    deferred = "fedfac_tuning.deepest_lambda_best"  # names VGG-16's layers: needs paper scale, run or not
    for key, cells in rows.items():
        assert len(cells) == 7, key
        # no results: not run at CPU scale and at paper scale, in every mode
        at_cpu = "needs paper scale" if key == deferred else "not run"
        assert set(re.findall(r"\*\*([^*]+)\*\*", cells[4])) == {at_cpu}, key
        assert set(re.findall(r"\*\*([^*]+)\*\*", cells[6])) == {"not run"}, key
        assert cells[5].startswith("`cpu_"), key  # every claim is taken by a CPU study
        lambdas = ", ".join(f"lambda{k}" for k in (1, *range(3, 15)))
        assert cells[3] == ("" if key != deferred else f"paper scale only: {lambdas}: VGG-16 has 15 layers below its "
                            "classifier to choose from; the CPU model (cnn_bn) has 3"), key
    # a claim about a seed method has a verdict as run and one with the text variant
    alpha = rows["factorized_fl_label.alpha_consistent_under_permutation"]
    assert alpha[4] == "as run: **not run**<br>text: **not run**"
    # the summary: a line per paper, its claims all not run
    summary = {m.group(1): m.group(2) for m in re.finditer(r"^\| ([^|*]+ \(00\d[^|]*\)) \| (\d+) \|", page, re.M)}
    assert sum(map(int, summary.values())) == PAPER_CLAIMS and len(summary) == 4
    assert "| Factorized-FL (000, NeurIPS 2022) | 20 | 0 | 0 | 0 | 0 | 0 | 20 | 0 |" in page
    assert "| FedFac / FedSplit (001) | 13 | 0 | 0 | 0 | 0 | 1 | 12 | 0 |" in page  # one claim names VGG-16's layers
    assert list(folder.glob("*.png")) == []  # nothing run: no figure


def test_the_paper_numbers_are_the_claim_on_the_transcribed_tables(empty_page):
    rows = _rows(empty_page[0])
    # Table 1 (top) cost column: FedFOMO 122.33 GB, FedAvg 20.39 GB, a ratio of 6.0 in every label scenario
    sends = rows["factorized_fl_label.fedfomo_sends_6x"][2]
    assert sends.startswith("cifar10_standard_iid: fedfomo 122.3300 / fedavg 20.3900 = 6; ")
    assert sends.count("fedfomo 122.3300 / fedavg 20.3900 = 6") == 8
    assert rows["factorized_fl_domain.fedfomo_sends_6x"][2] == "cifar100_5domains: fedfomo 244.6600 / fedavg 40.7800 = 6"
    assert rows[LOSES][2].startswith("fedavg: cifar10_standard_iid 70.28 -> cifar10_permuted_iid 65.31 (+4.97 pp)")
    # a figure's claim: the tables print none of its values
    assert rows["factorized_fl_ablations.rank1_best"][2] == "not printed"


def test_paper_values_read_the_tables_in_the_claims_units():
    spec = spec_of(read_study_file(STUDIES / "factorized_fl_label.yaml"))
    values = paper_values(spec)
    assert values[("cifar10_standard_iid", "fedfomo", "bytes")] == pytest.approx(122.33)
    assert values[("cifar10_standard_iid", "fedavg", "bytes")] == pytest.approx(20.39)
    assert values[("cifar10_standard_iid", "fedavg", "accuracy")] == pytest.approx(70.28)
    # the reader gives one value per (scenario, method, metric) and names what the tables lack
    reader = _PaperReader(spec, None, values=values)
    side = spec.claims[0].sides()[0]
    assert reader.get(side, "nowhere", "accuracy") is None and reader.missing == [f"{side.method} in nowhere"]
    assert reader.get(side, "nowhere", "accuracy") is None and len(reader.missing) == 1
    assert paper_values(spec_of(read_study_file(STUDIES / "factorized_fl_ablations.yaml"))) == {}
    # FedFac's Table 2 prints fractions (0.8033): the claims compare percentages
    fedfac = paper_values(spec_of(read_study_file(STUDIES / "fedfac_table2.yaml")))
    assert fedfac[("cifar10_pi0.1", "fedavg", "accuracy")] == pytest.approx(80.33)


def test_the_cpu_and_paper_scale_verdicts_are_read_from_the_results(tmp_path):
    results = tmp_path / "results"
    _cpu_result(results)
    _write_claims(results / "factorized_fl_label" / "claims", [
        {"origin": "factorized_fl_label", "id": "fedavg_loses_under_permutation", "mode": "",
         "kind": "drop", "verdict": "not reproduced", "claim": "x"}])
    out = tmp_path / "docs" / "verdicts.md"
    out.parent.mkdir()
    rows = write_page(STUDIES, CPU, results, out)
    assert len(rows) == PAPER_CLAIMS
    cells = _rows(out.read_text())[LOSES]
    assert cells[3] == (f"{INTERVAL}; (tested on 4 of the paper study's 8 scenarios); failed runs left out: fedavg "
                        "in permuted_iid, seed 5: x")
    assert cells[4] == "**reproduced**" and cells[5] == "`cpu_factorized_fl`" and cells[6] == "**not reproduced**"
    far = _rows(out.read_text())["factorized_fl_label.fedfomo_sends_6x"]
    assert far[3] == "paper scale only: fedfomo: VGG" and far[4] == "**needs paper scale**" and far[6] == "**not run**"
    others = {k: c for k, c in _rows(out.read_text()).items()
              if k not in (LOSES, "factorized_fl_label.fedfomo_sends_6x", "fedfac_tuning.deepest_lambda_best")}
    assert all(c[4].count("not run") == c[4].count("**") // 2 for c in others.values())
    assert "| Factorized-FL (000, NeurIPS 2022) | 20 | 1 | 0 | 0 | 0 | 1 | 18 | 1 |" in out.read_text()
    # one figure, for the paper with CPU results, beside the page
    assert [p.name for p in out.parent.glob("*.png")] == ["verdicts_factorized_fl.png"]
    assert "![Factorized-FL (000, NeurIPS 2022): claims at CPU scale](verdicts_factorized_fl.png)" in out.read_text()
    row = next(r for r in rows if f"{r.origin}.{r.id}" == LOSES)
    [check] = row.cpu["as run"]["comparisons"]
    assert (check["value"], check["low"], check["high"], check["condition_high"]) == (3.0, 1.0, 5.0, math.inf)


def test_a_smoke_runs_verdicts_are_not_results(tmp_path):
    results = tmp_path / "results"
    _cpu_result(results, smoke=SMOKE_COLUMN)
    out = tmp_path / "verdicts.md"
    rows = write_page(STUDIES, CPU, results, out)
    cells = _rows(out.read_text())[LOSES]
    assert cells[3] == "" and cells[4] == "**not run**"
    assert _rows(out.read_text())["factorized_fl_label.fedfomo_sends_6x"][4] == "**not run**"
    assert list(tmp_path.glob("*.png")) == []
    assert all(r.cpu == {} for r in rows if r.id != "deepest_lambda_best")  # deferred, run or not


def test_a_cpu_study_with_text_variants_the_paper_study_lacks_shows_its_verdict(tmp_path):
    """cpu_simfed has simfed's text variant, simfed_table5 has not: the CPU study's 'as run' and 'text'
    rows are both shown, and the paper study's one verdict stands for 'as run'."""
    results = tmp_path / "results"
    claim = {"origin": "simfed_table5", "id": "simfed_above_factorized_fedavg", "kind": "order",
             "verdict": "reproduced", "claim": "x", "interval": "s: simfed vs fedavg_factorized: +5.00 pp"}
    # what cpu_simfed writes for it: simfed has a text variant there (simfed_text), not in simfed_table5
    _write_claims(results / "cpu_simfed" / "claims", [{**claim, "mode": "as run"}, {**claim, "mode": "text"}])
    out = tmp_path / "verdicts.md"
    write_page(STUDIES, CPU, results, out)
    cells = _rows(out.read_text())["simfed_table5.simfed_above_factorized_fedavg"]
    assert cells[4] == "as run: **reproduced**<br>text: **reproduced**"


def test_the_verdicts_command_writes_the_page(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the default studies folders are the repository's
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["verdicts", "--results", str(tmp_path), "--out", str(tmp_path / "v.md")]) == 0
    assert f"{PAPER_CLAIMS} claims of 4 papers at CPU scale: 0 reproduced" in printed.getvalue()
    assert f"1 needs paper scale, {PAPER_CLAIMS - 1} not run -> {tmp_path / 'v.md'}" in printed.getvalue()
    assert len(_rows((tmp_path / "v.md").read_text())) == PAPER_CLAIMS


def test_a_papers_figure_is_named_after_its_first_name():
    from fedfactor.study.verdicts import _slug

    assert _slug("Factorized-FL (000, NeurIPS 2022)") == "factorized_fl"
    assert _slug("FedFac / FedSplit (001)") == "fedfac"

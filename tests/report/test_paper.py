"""fedfactor paper-tables: paper vs ours on hand-built runs and a hand-written paper CSV."""

import json

import pandas as pd
import pytest

from fedfactor.errors import UsageError
from fedfactor.report.paper import paper_tables, read_numbers, resolve_tables
from fedfactor.report.spec import SMOKE_COLUMN, SMOKE_TITLE, PaperSpec, StudySpec

REPO_NUMBERS = __import__("pathlib").Path(__file__).resolve().parents[2] / "config" / "paper_numbers"
LAST = {"test_pool": "shared", "model": "trained", "report": "last"}
BEST = {"test_pool": "client", "model": "received", "report": "best"}

HEADER = "paper,table,dataset,setting,method,metric,value,std,note\n"
TOY = HEADER + "".join([
    "Toy,Table 9,D1,S1,PA,accuracy_pct,55.5,1.0,\n",
    "Toy,Table 9,D1,S2,PA,accuracy_pct,40.25,,std cut at the page edge\n",
    "Toy,Table 9,D1,S1,PB,accuracy_pct,50.0,2.0,\n",
    "Toy,Table 9,D1,S2,PB,accuracy_pct,45.0,2.0,\n",
    "Toy,Table 9,D1,S1,PC,accuracy_pct,,1.5,mean lost in extraction; std 1.5 visible\n",
    "Toy,Table 9,D1,S2,PC,accuracy_pct,61.0,0.5,\n",
    "Toy,Table 9,D1,S1,PD,accuracy_pct,70.0,,\n",
    "Toy,Table 9,D1,S2,PD,accuracy_pct,71.0,,\n",
    "Toy,Table 9,D1,S1,PA,cost_gb,1.5,,\n",
    "Toy,Table 9,D1,S2,PA,cost_gb,1.5,,\n",
    "Toy,Table 9,D1,S1,PB,cost_gb,,,printed '-' (no communication)\n",
    "Toy,Table 9,D1,S2,PB,cost_gb,,,printed '-' (no communication)\n",
])
GRID = HEADER + "".join(
    f"Toy,Table 2,D1,alpha=0.1; R_l={rl}%; R_c={rc}%,PA,accuracy_pct,{80 + rl / 100 + rc / 1000:.3f},0.5,\n"
    for rl in (20, 40) for rc in (20, 40, 60))


def _run(root, scenario, label, seed, acc, nbytes=1e9, protocol=LAST, dataset="cifar10", per_client=None,
         new_clients=None):
    d = root / "runs" / scenario / label / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({
        "scenario": scenario, "method": label, "seed": seed, "accuracy": acc, "accuracy_mean": acc,
        "accuracy_best_mean": acc, "accuracy_weighted": acc, "bytes_total": nbytes, "rounds": 2, "clients": 4,
        "protocol": protocol, "dataset": dataset, "per_client_accuracy": per_client or [acc] * 4,
        "new_clients": new_clients,
    }))


@pytest.fixture
def numbers(tmp_path):
    folder = tmp_path / "numbers"
    folder.mkdir()
    (folder / "toy.csv").write_text(TOY)
    (folder / "grid.csv").write_text(GRID)
    read_numbers.cache_clear()
    return folder


def _study(numbers, tables, smoke=False, implemented=("a", "b", "b2")):
    methods = {m: {"name": m, "implemented": m in implemented} for m in ("a", "b", "b2", "c")}
    return StudySpec.model_validate({
        "study": "toy", "title": "toy study", "smoke": smoke, "seeds": [0, 1, 2], "scenarios": ["s1", "s2"],
        "methods": methods, "paper": {"name": "Toy paper", "numbers": str(numbers), "tables": tables},
    })


TOY_TABLE = {"csv": "toy.csv", "metric": ["accuracy_pct", "cost_gb"], "dataset": "D1",
             "scenarios": {"s1": "S1", "s2": "S2"}, "methods": {"a": "PA", "b": "PB", "c": "PC"}}


def _cells(frame, metric="accuracy_pct"):
    f = frame[frame.metric == metric]
    return {(r.paper_method, r.setting): r for r in f.itertuples()}


def test_cells_hold_ours_the_papers_and_the_difference(numbers, tmp_path):
    for seed, acc in enumerate([0.5, 0.6, 0.7]):
        _run(tmp_path, "s1", "a", seed, acc, nbytes=2e9)
    _run(tmp_path, "s2", "a", 0, 0.4, nbytes=2e9)
    _run(tmp_path, "s2", "a", 1, 0.5, nbytes=2e9)
    _run(tmp_path, "s1", "b", 0, 0.3, nbytes=0)
    out = tmp_path / "out"
    frame = paper_tables(_study(numbers, [TOY_TABLE]), [tmp_path / "runs"], out)
    cells = _cells(frame)
    a1 = cells[("PA", "S1")]
    # 50, 60, 70: mean 60, sample std 10, 95 % interval 60 -+ 4.3027 * 10 / sqrt(3); the paper 55.5 +- 1.0; diff +4.5
    assert (a1.seeds, a1.ours_mean, a1.paper_value, a1.paper_std) == (3, 60.0, 55.5, 1.0)
    assert a1.ours_std == pytest.approx(10.0) and a1.diff == pytest.approx(4.5)
    assert (a1.ours_ci_low, a1.ours_ci_high) == pytest.approx((35.1586, 84.8414), abs=1e-4)
    assert a1.our_method == "a" and a1.our_scenario == "s1" and a1.ours_status == "ok"
    a2 = cells[("PA", "S2")]
    assert a2.seeds == 2 and a2.ours_mean == pytest.approx(45.0) and a2.diff == pytest.approx(4.75)
    assert cells[("PB", "S2")].ours_status == "not run"  # b has no run in s2
    assert cells[("PC", "S1")].ours_status == "not implemented yet"
    assert cells[("PC", "S1")].paper_status == "lost in extraction" and pd.isna(cells[("PC", "S1")].diff)
    assert cells[("PD", "S1")].ours_status == "not run" and cells[("PD", "S1")].our_method != "a"
    cost = _cells(frame, "cost_gb")
    assert cost[("PA", "S1")].ours_mean == pytest.approx(2.0) and cost[("PA", "S1")].diff == pytest.approx(0.5)
    assert cost[("PB", "S1")].paper_status == "not printed" and cost[("PB", "S1")].ours_mean == 0

    md = (out / "paper.md").read_text()
    accuracy = md.split("— communication [GB]")[0]
    rows = {line.split("|")[1].strip(): line for line in accuracy.splitlines() if line.startswith("| P")}
    assert "ours 60.00 +- 10.00 [35.16, 84.84] (n=3); paper 55.50 +- 1.00; diff +4.50" in rows["PA — ours: a"]
    # 40, 50: 45 -+ 12.706 (one degree of freedom) * 7.07 / sqrt(2) = [-18.53, 108.53], shown within
    # 0-100 % and marked; two seeds are few
    assert "ours 45.00 +- 7.07 [0.00*, 100.00*] (n=2 of 3, few seeds); paper 40.25 [1]; diff +4.75" in rows["PA — ours: a"]
    assert "ours: not implemented yet; paper: lost in extraction [2]" in rows["PC — ours: c"]
    assert rows["PD"].count("ours: not run") == 2  # a paper row none of ours maps to
    assert "[1] std cut at the page edge" in md and "[2] mean lost in extraction; std 1.5 visible" in md
    assert "ours 2.00 +- 0.00 [2.00, 2.00] (n=3); paper 1.50; diff +0.50" in md  # GB, the same in every seed
    assert "paper: not printed" in md
    # every table names its source and our protocol; rows follow the paper's order
    assert md.count("Source: Toy, Table 9 (config/paper_numbers/toy.csv") == 2
    assert "after its local training" in md and "pooled test split" in md and "last round" in md
    assert md.index("| PA") < md.index("| PB") < md.index("| PC") < md.index("| PD")
    assert "SMOKE" not in md
    html = (out / "paper.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count("<table>") == 2 and "<style>" in html
    assert "PA — ours: a" in html and "lost in extraction" in html
    tex = (out / "paper.tex").read_text()
    assert tex.count("\\begin{tabular}") == 2 and "$\\pm$" in tex and "accuracy [\\%]" in tex
    assert set(pd.read_csv(out / "paper.csv")["metric"]) == {"accuracy_pct", "cost_gb"}


def test_smoke_runs_are_titled_so_everywhere(numbers, tmp_path):
    _run(tmp_path, "s1", "a", 0, 0.5, dataset="synthetic:cifar10")
    out = tmp_path / "out"
    for study in (_study(numbers, [TOY_TABLE]), _study(numbers, [TOY_TABLE], smoke=True)):
        frame = paper_tables(study, [tmp_path / "runs"], out)
        md = (out / "paper.md").read_text()
        titles = [line for line in md.splitlines() if line.startswith("#")]
        assert len(titles) == 3 and all(t.lstrip("# ").startswith(SMOKE_TITLE) for t in titles)
        assert set(frame["smoke_run"]) == {SMOKE_COLUMN}
        assert SMOKE_COLUMN in (out / "paper.html").read_text()
        assert "SMOKE RUN on synthetic data --- not results" in (out / "paper.tex").read_text()
        (tmp_path / "runs" / "s1" / "a" / "seed0" / "summary.json").write_text(
            (tmp_path / "runs" / "s1" / "a" / "seed0" / "summary.json").read_text().replace("synthetic:", ""))


def test_per_domain_columns_and_new_client_strategies(numbers, tmp_path):
    table = {"csv": "toy.csv", "metric": "accuracy_pct", "dataset": "D1",
             "scenarios": {"s1": [{"setting": "S1", "clients": [0, 1]}, {"setting": "S2"}]},
             "methods": {"a": "PA"}}
    for seed in range(3):
        _run(tmp_path, "s1", "a", seed, 0.5, per_client=[0.2, 0.4, 0.6, 0.8])
    frame = paper_tables(_study(numbers, [table]), [tmp_path / "runs"], tmp_path / "out")
    cells = _cells(frame)
    assert cells[("PA", "S1")].ours_mean == pytest.approx(30.0)  # clients 0 and 1: (20 + 40) / 2
    assert cells[("PA", "S2")].ours_mean == pytest.approx(50.0)  # all clients: the reported accuracy

    # per-client accuracies are the last round's: under another protocol the cell says why it is empty
    other = tmp_path / "best"
    _run(other, "s1", "a", 0, 0.5, protocol=BEST)
    cells = _cells(paper_tables(_study(numbers, [table]), [other / "runs"], tmp_path / "out"))
    assert cells[("PA", "S1")].ours_status.startswith("no value: per-client accuracies are the last round's")

    nc = {"clients": [3], "strategies": {"ensemble": {"accuracy_mean": 0.5, "accuracy_weighted": 0.6,
                                                      "per_client": [0.5]}}}
    table = {"csv": "toy.csv", "metric": "accuracy_pct", "dataset": "D1", "scenarios": {"s1": "S1"},
             "methods": {"a": [{"method": "PA", "new_clients": "ensemble"},
                               {"method": "PB", "new_clients": "finetune"}]}}
    weighted = tmp_path / "weighted"
    _run(weighted, "s1", "a", 0, 0.9, protocol={**BEST, "report": "best_weighted"}, new_clients=nc)
    cells = _cells(paper_tables(_study(numbers, [table]), [weighted / "runs"], tmp_path / "out"))
    assert cells[("PA", "S1")].ours_mean == pytest.approx(60.0)  # weighted under best_weighted
    assert cells[("PB", "S1")].ours_status.startswith("not implemented yet (no new-client strategy 'finetune'")


def test_a_grid_laid_out_by_setting_parts(numbers, tmp_path):
    table = {"csv": "grid.csv", "metric": "accuracy_pct", "dataset": "D1", "layout": {"rows": "R_l", "columns": "R_c"},
             "scenarios": {"s1": "alpha=0.1"},
             "methods": {"a": {"method": "PA", "setting": "R_l=20%; R_c=20%"},
                         "b": {"method": "PA", "setting": "R_c=40%; R_l=20%"},
                         "b2": {"method": "PA", "setting": "R_l=40%; R_c=60%"}}}
    _run(tmp_path, "s1", "a", 0, 0.81)
    _run(tmp_path, "s1", "b", 0, 0.82)
    frame = paper_tables(_study(numbers, [table]), [tmp_path / "runs"], tmp_path / "out")
    md = (tmp_path / "out" / "paper.md").read_text()
    assert "| R_l | R_c=20% | R_c=40% | R_c=60% |" in md and "Setting: alpha=0.1." in md
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| R_l=")}
    assert set(rows) == {"R_l=20%", "R_l=40% — ours: b2"}  # a and b share the R_l=20% row
    assert "ours (a) 81.00 (n=1 of 3, no interval); paper 80.22 +- 0.50; diff +0.78" in rows["R_l=20%"]
    assert "ours (b) 82.00" in rows["R_l=20%"] and "ours: not run; paper 80.26" in rows["R_l=20%"]
    assert "ours: not run; paper 80.46" in rows["R_l=40% — ours: b2"]  # b2 has no run yet
    assert len(frame) == 6


def test_explicit_cells_map_single_pairs(numbers, tmp_path):
    """The same grid cells as method setting parts, given one (scenario, method) pair at a time."""
    table = {"csv": "grid.csv", "metric": "accuracy_pct", "dataset": "D1", "layout": {"rows": "R_l", "columns": "R_c"},
             "cells": [{"scenario": "s1", "method": "a", "setting": "alpha=0.1; R_l=20%; R_c=20%", "paper_method": "PA"},
                       {"scenario": "s2", "method": "a", "setting": "R_c=40%; R_l=40%", "paper_method": "PA"}]}
    _run(tmp_path, "s1", "a", 0, 0.81)
    _run(tmp_path, "s2", "a", 0, 0.70)
    frame = paper_tables(_study(numbers, [table]), [tmp_path / "runs"], tmp_path / "out")
    ours = frame[frame.ours_status == "ok"].set_index("setting")
    assert ours.loc["alpha=0.1; R_l=20%; R_c=20%", "ours_mean"] == pytest.approx(81.0)
    assert ours.loc["alpha=0.1; R_l=40%; R_c=40%", "our_scenario"] == "s2"
    assert ours.loc["alpha=0.1; R_l=40%; R_c=40%", "diff"] == pytest.approx(70.0 - 80.44)


def test_real_paper_numbers_factorized_fl_table1(tmp_path):
    """The repository's transcription: Table 1 top, CIFAR-10."""
    for seed, acc in enumerate([0.7128, 0.7328]):
        _run(tmp_path, "c10_iid", "fedavg", seed, acc, nbytes=20.57e9)
    study = StudySpec.model_validate({
        "study": "t", "title": "t", "smoke": False, "seeds": [0, 1], "scenarios": ["c10_iid", "c10_noniid"],
        "methods": {"fedavg": {"name": "fedavg", "implemented": True},
                    "fedfomo": {"name": "fedfomo", "implemented": False}},
        "paper": {"name": "Factorized-FL", "numbers": str(REPO_NUMBERS), "tables": [{
            "csv": "factorized_fl_table1_label.csv", "metric": ["accuracy_pct", "cost_gb"], "dataset": "CIFAR-10",
            "scenarios": {"c10_iid": "Standard IID", "c10_noniid": "Standard Non-IID"},
            "methods": {"fedavg": "FedAvg", "fedfomo": "FedFOMO"}}]}})
    frame = paper_tables(study, [tmp_path / "runs"], tmp_path / "out")
    cells = _cells(frame)
    # the paper: FedAvg 70.28 on CIFAR-10 Standard IID (its std lost); ours 72.28 +- 1.41
    fedavg = cells[("FedAvg", "Standard IID")]
    assert fedavg.paper_value == 70.28 and fedavg.diff == pytest.approx(2.0) and fedavg.ours_std == pytest.approx(2 ** 0.5)
    assert cells[("FedAvg", "Standard Non-IID")].paper_status == "lost in extraction"
    assert cells[("FedFOMO", "Standard IID")].ours_status == "not implemented yet"
    assert cells[("Stand-Alone", "Standard IID")].ours_status == "not run"
    assert _cells(frame, "cost_gb")[("FedAvg", "Standard IID")].diff == pytest.approx(0.18)  # 20.57 - 20.39
    # the paper's 9 rows x its 4 CIFAR-10 columns; the two permuted columns have no scenario of ours
    assert len(frame[frame.metric == "accuracy_pct"]) == 9 * 4
    assert set(frame[frame.setting == "Permuted IID"].ours_status) == {"not run", "not implemented yet"}


def test_mapping_errors_are_one_clear_line(numbers):
    def resolve(**changes):
        table = {**TOY_TABLE, "metric": "accuracy_pct", **changes}
        resolve_tables(PaperSpec.model_validate({"name": "t", "numbers": str(numbers), "tables": [table]}))

    with pytest.raises(UsageError, match=r"toy.csv \(accuracy_pct\): scenario 's1' x method 'a': no value of dataset "
                                         r"'D1', method 'PX'.*its methods on 'D1': 'PA', 'PB', 'PC', 'PD'"):
        resolve(methods={"a": "PX"})
    with pytest.raises(UsageError, match="its datasets: 'D1'"):
        resolve(dataset="D9")
    grid = {"csv": "grid.csv", "dataset": "D1", "scenarios": {"s1": "alpha=0.1"}, "methods": {"a": "PA"}}
    with pytest.raises(UsageError, match="6 values match .*name more of the setting"):
        resolve(**grid)
    with pytest.raises(UsageError, match="layout: setting .* has no 'R_x' part"):
        resolve(csv="grid.csv", dataset="D1", scenarios={}, methods={}, layout={"rows": "R_x", "columns": "R_c"},
                cells=[{"scenario": "s1", "method": "a", "setting": "R_l=20%; R_c=20%", "paper_method": "PA"}])
    with pytest.raises(UsageError, match="maps to dataset 'D1', which `datasets` leaves out"):
        resolve(datasets=[])
    with pytest.raises(UsageError, match="no such file"):
        resolve(csv="missing.csv")
    with pytest.raises(UsageError, match="no values of metric accuracy_frac"):
        resolve(metric="accuracy_frac")
    with pytest.raises(UsageError, match="already fills this paper value from scenario 's1'"):
        resolve(scenarios={"s1": "S1", "s2": "S1"})


def test_without_runs_or_without_a_paper_table(numbers, tmp_path):
    frame = paper_tables(_study(numbers, [TOY_TABLE]), [], tmp_path / "a")
    assert set(frame["ours_status"]) == {"not run", "not implemented yet"}
    assert "no runs yet" in (tmp_path / "a" / "paper.md").read_text()
    study = StudySpec.model_validate({**_study(numbers, [TOY_TABLE]).model_dump(), "paper": None})
    frame = paper_tables(study, [], tmp_path / "b")
    assert frame.empty and "has no paper table" in (tmp_path / "b" / "paper.md").read_text()
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["paper.csv", "paper.html", "paper.md", "paper.tex"]

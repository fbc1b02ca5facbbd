"""`fedfactor diagnose`: factor analysis of run folders' client weights, FedFac's split history,
the files it writes, the runs it skips, and the numbers it adds to each run's MLflow run."""

import json
import logging

import numpy as np
import pandas as pd
import pytest

from fedfactor.cli import main
from fedfactor.diagnostics.diagnose import diagnose
from fedfactor.errors import UsageError
from fedfactor.tracking import retry

from .conftest import LAYER, MODULE, make_run, planted, write_history


@pytest.mark.slow
def test_diagnose_writes_every_file_and_skips_or_reports_bad_runs(tmp_path, caplog):
    runs = tmp_path / "runs"
    make_run(runs / "fedavg0", seed=0, weights=planted(0))
    make_run(runs / "fedavg1", seed=1, weights=planted(2))
    make_run(runs / "local0", method="local", weights=planted(0, n_shared=0))
    fedfac = make_run(runs / "fedfac0", method="fedfac", weights=planted(3))
    states = np.zeros((4, 12), np.uint8)
    states[:, :6] = 1
    states[2:, 9] = 1  # one unit of 12 flips between rounds 2 and 3
    write_history(fedfac, states)
    (fedfac / "diagnostics" / f"fedfac.shared.{LAYER}" / ".round_0005.npy.tmp").write_bytes(b"half")  # ignored
    make_run(runs / "noweights")  # trained before client weights were written
    make_run(runs / "nolayers", weights=planted(0), layers={})
    bad = planted(0)
    bad[1, 2, 0, 0] = np.nan
    make_run(runs / "nan", seed=5, weights=bad)

    out = tmp_path / "out"
    caplog.set_level(logging.WARNING, logger="fedfactor")
    assert main(["-q", "diagnose", str(runs), "--out", str(out), "--kappa", "0.45", "--no-mlflow"]) == 0
    for name in ("diagnostics.csv", "diagnostics.md", "eigenvalues.csv"):
        assert (out / name).stat().st_size > 0
    for name in ("communalities", "eigenvalues", "split_history", "stability"):
        assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert (out / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
    assert not list(out.glob(".*.tmp"))

    csv = pd.read_csv(out / "diagnostics.csv", keep_default_na=False, na_values=[""])
    assert len(csv) == 5 and set(csv["run"].map(lambda p: p.rsplit("/", 1)[-1])) == \
        {"fedavg0", "fedavg1", "local0", "fedfac0", "nan"}
    ok = csv[csv["error"].isna()].set_index("run")
    assert (ok["layer"] == LAYER).all() and (ok["module"] == MODULE).all() and (ok["K"] == 6).all()
    local = ok.loc[str(runs / "local0")]
    assert (ok.drop(index=str(runs / "local0"))["G"] == 2).all() and local["G"] > 2  # no common pattern
    assert local["shared_ge0.9"] == 0
    fed = ok.loc[str(fedfac)]
    assert fed["fedfac_rounds"] == 4 and fed["fedfac_shared_last"] == pytest.approx(7 / 12)
    assert fed["fedfac_stable_last"] == 1.0 and fed["fedfac_stable_mean"] == pytest.approx((1 + 11 / 12 + 1) / 3)
    assert ok.loc[str(runs / "fedavg0"), "shared_mean"] == 0.5 and ok.loc[str(runs / "fedavg0"), "fedfac_rounds"] == 0
    (err,) = csv[csv["error"].notna()].itertuples()
    assert err.seed == 5 and "NaN" in err.error and np.isnan(err.G)
    assert any("NaN" in r.getMessage() for r in caplog.records)

    md = (out / "diagnostics.md").read_text()
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in md.splitlines()
            if line.startswith("| s |")}
    assert set(rows) == {("s", "fedavg"), ("s", "local"), ("s", "fedfac")}
    assert "| 2.0 +- 0.0 (2) |" in rows["s", "fedavg"] and "| 50 |" in rows["s", "fedavg"]  # G mean of two seeds
    assert rows["s", "fedfac"].rstrip(" |").endswith("58 | 100 | 97")
    assert "## Errors" in md and "seed5" in md
    skipped = md.split("## Skipped runs")[1]
    assert "noweights" in skipped and "no client_weights.npz" in skipped
    assert "nolayers" in skipped and "no analysed layer" in skipped

    eig = pd.read_csv(out / "eigenvalues.csv")
    assert len(eig) == 4 * 12 and eig["run"].nunique() == 4
    assert np.allclose(eig.groupby("run")["cumulative_share"].max(), 1.0)
    g = eig[(eig["run"] == str(runs / "fedavg0")) & (eig["factors"] == 2)]["cumulative_share"].item()
    assert g == pytest.approx(ok.loc[str(runs / "fedavg0"), "eig_share_G"])


def test_the_figures_of_a_smoke_run_say_so_and_come_as_png_only(tmp_path, drawn):
    from fedfactor.report.figures import SMOKE_TITLE

    make_run(tmp_path / "runs" / "a", weights=planted(0))
    summary = tmp_path / "runs" / "b" / "summary.json"
    make_run(summary.parent, seed=1, weights=planted(1))
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "dataset": "synthetic:cifar10"}))
    files = diagnose([tmp_path / "runs"], tmp_path / "out", mlflow=False)["files"]
    assert {f.name for f in files if f.suffix != ".csv" and f.suffix != ".md"} == {"communalities.png", "eigenvalues.png"}
    assert not list((tmp_path / "out").glob("*.pdf"))
    assert len(drawn) == 2 and all(title.startswith(SMOKE_TITLE) and len(title) > len(SMOKE_TITLE) and mark
                                   for title, mark in drawn)


@pytest.mark.slow
def test_no_fedfac_run_means_no_split_figures_and_no_analysed_run_still_writes_the_outputs(tmp_path):
    make_run(tmp_path / "runs" / "a", weights=planted(0))
    assert diagnose([tmp_path / "runs"], tmp_path / "out", mlflow=False)["rows"]["G"].notna().all()
    assert (tmp_path / "out" / "communalities.png").exists() and (tmp_path / "out" / "communalities.pdf").exists()
    assert not (tmp_path / "out" / "split_history.png").exists() and not (tmp_path / "out" / "split_history.pdf").exists()

    make_run(tmp_path / "old" / "a")
    done = diagnose([tmp_path / "old"], tmp_path / "out2", mlflow=False)
    assert len(done["rows"]) == 0 and len(done["skipped"]) == 1
    for name in ("diagnostics.md", "diagnostics.csv", "communalities.png", "eigenvalues.png"):
        assert (tmp_path / "out2" / name).exists()
    assert "no layer analysed" in (tmp_path / "out2" / "diagnostics.md").read_text()


@pytest.mark.slow
def test_a_damaged_split_history_is_reported_beside_the_analysis(tmp_path):
    run = make_run(tmp_path / "runs" / "f", method="fedfac", weights=planted(0))
    write_history(run, np.ones((2, 12)))
    np.save(run / "diagnostics" / f"fedfac.shared.{LAYER}" / "round_0002.npy", np.full(12, 3, np.uint8))
    (row,) = diagnose([run], tmp_path / "out", kappa=0.45, mlflow=False)["rows"].itertuples()
    assert row.G == 2 and "round_0002.npy holds values other than 0 and 1" in row.error
    md = (tmp_path / "out" / "diagnostics.md").read_text()
    assert "| s | fedfac |" in md and "## Errors" in md


def test_bad_arguments_are_one_line_usage_errors(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["diagnose", str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    make_run(tmp_path / "runs" / "a", weights=planted(0))
    assert main(["diagnose", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--kappa", "1.5"]) == 2
    assert "kappa" in capsys.readouterr().err
    with pytest.raises(UsageError, match="method"):
        diagnose([tmp_path / "runs"], tmp_path / "out", method="ml")
    (tmp_path / "file").write_text("")
    assert main(["diagnose", str(tmp_path / "runs"), "--out", str(tmp_path / "file"), "--no-mlflow"]) == 2
    assert not (tmp_path / "out").exists()


def _mlflow_run(tmp_path, uri, name, method="fedavg", history=None):
    """A run folder whose training logged to MLflow, as the training job does."""
    from fedfactor.config import TrackingConfig
    from fedfactor.tracking import Tracker

    run_dir = tmp_path / "runs" / name
    tracker = Tracker(TrackingConfig(uri=uri, experiment="diag"), run_dir, {"seed": 0}, {"method": method},
                      f"s/{method}/seed0")
    assert tracker.active
    tracker.log_metrics({"bytes_up": 1.0}, step=1)
    tracker.finish({"accuracy": 0.5}, [])
    make_run(run_dir, method=method, weights=planted(0), run_id=tracker.run_id, uri=uri)
    if history is not None:
        write_history(run_dir, history)
    return run_dir, tracker.run_id


@pytest.mark.slow
def test_numbers_and_figures_land_on_the_runs_own_mlflow_run(tmp_path, monkeypatch, caplog):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    a, a_id = _mlflow_run(tmp_path, uri, "a")
    b, b_id = _mlflow_run(tmp_path, uri, "b", method="fedfac", history=np.eye(3, 12, dtype=np.uint8))
    client = MlflowClient(tracking_uri=uri)

    # --no-mlflow: nothing is logged
    assert main(["-q", "diagnose", str(a), "--out", str(tmp_path / "out0"), "--no-mlflow", "--kappa", "0.45"]) == 0
    assert not any(k.startswith("fa.") for k in client.get_run(a_id).data.metrics)

    # the store named by each run's own config, found from summary.json's run id
    done = diagnose([tmp_path / "runs"], tmp_path / "out", kappa=0.45)
    assert done["mlflow"] == {a: ("logged", a_id), b: ("logged", b_id)}
    run = client.get_run(a_id)
    assert run.info.status == "FINISHED" and run.data.metrics["final_accuracy"] == 0.5  # the run as trained
    assert run.data.metrics[f"fa.{LAYER}.factors"] == 2 and run.data.metrics[f"fa.{LAYER}.shared_share_mean"] == 0.5
    assert run.data.metrics[f"fa.{LAYER}.shared_share_ge0.5"] == 0.5 and run.data.tags["fa.kappa"] == "0.45"
    assert f"fa.{LAYER}.stable_share_last" not in run.data.metrics
    assert client.get_run(b_id).data.metrics[f"fa.{LAYER}.stable_share_last"] == pytest.approx(10 / 12)
    arts = {x.path for x in client.list_artifacts(b_id, "diagnostics")}
    # PNGs for the UI; the PDFs are the study's figures' (--figures)
    assert arts == {f"diagnostics/{n}" for n in ("factor_analysis.csv", "communalities.png", "eigenvalues.png",
                                                 "split_history.png", "stability.png")}
    assert len(client.search_runs([run.info.experiment_id])) == 2  # no run added

    # again, with the store given and summary.json's id gone: mlflow.json's run key finds the run;
    # equal values are not logged twice
    summary = json.loads((a / "summary.json").read_text())
    (a / "summary.json").write_text(json.dumps({**summary, "mlflow_run_id": None}))
    assert main(["-q", "diagnose", str(a), "--out", str(tmp_path / "out2"), "--kappa", "0.45", "--uri", uri]) == 0
    assert len(client.get_metric_history(a_id, f"fa.{LAYER}.factors")) == 1

    # a store that does not exist is not created; one that cannot be read warns and does not fail
    done = diagnose([a], tmp_path / "out3", kappa=0.45, uri=f"sqlite:///{tmp_path}/other.db")
    assert done["mlflow"][a][0] == "no run"
    assert not (tmp_path / "other.db").exists()
    monkeypatch.setattr(retry, "RETRY_SECONDS", 0.2)
    (tmp_path / "broken.db").write_text("not a database")
    caplog.set_level(logging.WARNING, logger="fedfactor")
    done = diagnose([tmp_path / "runs"], tmp_path / "out4", kappa=0.45, uri=f"sqlite:///{tmp_path}/broken.db")
    assert [o for o, _ in done["mlflow"].values()] == ["unreachable", "unreachable"]
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1  # tried once, not for every run
    assert (tmp_path / "out4" / "diagnostics.md").exists()

"""Tuning on validation: equal budgets, selection on validation scores alone, the chosen values'
file and its checks, a failed point as a result."""

import json
import random
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedfactor.study import tuning
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.job import train
from fedfactor.study.workflow import study_runs

from ..conftest import TINY, snakemake_in_process

REPO = Path(__file__).resolve().parents[2]
TUNING = {"file": "chosen.yaml", "seeds": [7, 8], "points": 4,
          "common": {"fl.lr": [0.01, 0.03, 0.1, 0.3]},
          "methods": {"simfed": {"fl.lr": [0.01, 0.1], "tau": [0.5, 0.9]}}}


def test_grid_points_follow_parameter_grid_with_method_keys_on_top():
    assert tuning.points(TUNING, "fedavg") == [{"fl.lr": v} for v in (0.01, 0.03, 0.1, 0.3)]
    assert tuning.points(TUNING, "simfed") == [{"fl.lr": 0.01, "tau": 0.5}, {"fl.lr": 0.01, "tau": 0.9},
                                               {"fl.lr": 0.1, "tau": 0.5}, {"fl.lr": 0.1, "tau": 0.9}]


def test_every_method_gets_the_same_number_of_points():
    tuning.check(TUNING, ["fedavg", "simfed"], ["fedavg", "simfed"])
    bigger = {**TUNING, "methods": {"simfed": {"fl.lr": [0.01, 0.1, 1.0], "tau": [0.5, 0.9]}}}
    with pytest.raises(UsageError, match=r"simfed searches 6 points \(3 fl.lr x 2 tau\).*tuning.points = 4"):
        tuning.check(bigger, ["fedavg", "simfed"], ["fedavg", "simfed"])
    with pytest.raises(UsageError, match="tuning.methods names 'fedprox'"):
        tuning.check({**TUNING, "methods": {"fedprox": {}}}, ["fedavg"], ["fedavg", "simfed"])
    with pytest.raises(UsageError, match="'partition.alpha': the scenario's data, partition"):
        tuning.check({**TUNING, "common": {"partition.alpha": [0.1, 1, 10, 100]}}, ["fedavg"], ["fedavg", "simfed"])
    with pytest.raises(UsageError, match="non-empty list"):
        tuning.check({**TUNING, "common": {"fl.lr": []}}, ["fedavg"], ["fedavg", "simfed"])


def test_the_default_study_gives_every_method_the_same_budget():
    study = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    t, methods = study["tuning"], study["methods"]
    tuning.check(t, list(methods), list(methods))
    assert {len(tuning.points(t, m)) for m in methods} == {t["points"]}
    # and the same budget at every point: no method's own `run` changes it (the tuning runs as the
    # study's expansion gives them)
    runs = [r for r in study_runs(study) if r.kind == "tuning"]
    assert len(runs) == len(study["scenarios"]) * len(methods) * t["points"]
    tuning.check_runs_alike({r.name: load_config(REPO / study["run_config"], r.sets) for r in runs})


def test_unequal_training_budgets_are_refused():
    a, b = load_config(None, TINY), load_config(None, [*TINY, "fl.rounds=3"])
    with pytest.raises(UsageError, match=r"b trains with fl.rounds=3 against 2 for a: every point"):
        tuning.check_runs_alike({"a": a, "b": b})


@pytest.mark.parametrize("key", tuning.BUDGET_KEYS)
def test_a_budget_key_is_refused_as_a_grid_key(key):
    grid = {**TUNING, "methods": {"simfed": {key: [1, 2], "tau": [0.5, 0.9]}}}
    with pytest.raises(UsageError, match=rf"simfed's key '{re.escape(key)}' sets the training budget"):
        tuning.check(grid, ["fedavg", "simfed"], ["fedavg", "simfed"])
    with pytest.raises(UsageError, match=rf"fedavg's key '{re.escape(key)}' sets the training budget"):
        tuning.check({**TUNING, "common": {key: [1, 2, 3, 4]}}, ["fedavg"], ["fedavg", "simfed"])


@pytest.mark.parametrize("setting", ["fl.rounds=3", "fl.epochs=2", "fl.batch_size=16", "fl.clients=5",
                                     "fl.fraction=0.5"])
def test_a_point_that_differs_in_budget_after_the_first_is_refused(setting):
    # every point of every method is compared, not each method's first: here the last point differs
    same = load_config(None, TINY)
    points = {f"{m}@p{i}": same for m in ("fedavg", "simfed") for i in range(3)}
    tuning.check_runs_alike(points)
    with pytest.raises(UsageError, match=rf"simfed@p2 trains with {re.escape(setting.split('=')[0])}="):
        tuning.check_runs_alike({**points, "simfed@p2": load_config(None, [*TINY, setting])})


def test_a_points_values_go_to_the_run_config_or_the_method():
    entry = {"name": "simfed", "run": {"fl": {"on_divergence": "skip"}}}
    assert tuning.with_values(entry, {"fl.lr": 0.1, "tau": 0.5}) == {
        "name": "simfed", "tau": 0.5, "run": {"fl": {"on_divergence": "skip", "lr": 0.1}}}
    assert tuning.with_values({"name": "fedavg"}, {"tau": 1}) == {"name": "fedavg", "tau": 1}
    assert entry == {"name": "simfed", "run": {"fl": {"on_divergence": "skip"}}}  # not changed in place


def _summaries(root, scores, rng=None):
    """Tuning runs' summaries: scores[label][i] = (val per seed, test per seed); None: no summary."""
    for label, per_point in scores.items():
        for i, point in enumerate(per_point):
            for seed, pair in zip(TUNING["seeds"], point or [None] * 2):
                folder = root / "s" / label / f"p{i}" / f"seed{seed}"
                folder.mkdir(parents=True, exist_ok=True)
                if pair is None:
                    continue
                val, test = pair
                if rng is not None:  # the test split scrambled: its numbers are anything
                    test = rng.random()
                (folder / "summary.json").write_text(json.dumps({"val_score": val, "accuracy": test,
                                                                 "accuracy_mean": test}))


def _choice(doc):
    return {label: c["values"] for label, c in doc["chosen"]["s"].items()}


def test_selection_reads_validation_only(tmp_path):
    # fedavg: p1 best on validation, p3 best on test; simfed: p2 failed on one seed, p0 wins
    scores = {"fedavg": [[(0.5, 0.9), (0.5, 0.9)], [(0.8, 0.1), (0.7, 0.1)], [(0.6, 0.5), (0.6, 0.5)],
                         [(0.1, 0.99), (0.1, 0.99)]],
              "simfed": [[(0.7, 0.1), (0.7, 0.1)], [(0.6, 0.9), (0.6, 0.9)], [(0.95, 0.9), None],
                         [(0.2, 0.2), (0.2, 0.2)]]}
    _summaries(tmp_path / "a", scores)
    doc = tuning.select(TUNING, ["s"], ["fedavg", "simfed"], tmp_path / "a" / "s" / "..", {"rounds": {"s": 2}})
    assert _choice(doc) == {"fedavg": {"fl.lr": 0.03}, "simfed": {"fl.lr": 0.01, "tau": 0.5}}
    fedavg = doc["chosen"]["s"]["fedavg"]
    assert fedavg["val_score"] == pytest.approx(0.75)
    assert [t["val_score"] for t in fedavg["tried"]] == pytest.approx([0.5, 0.75, 0.6, 0.1])
    failed = doc["chosen"]["s"]["simfed"]["tried"][2]
    assert failed["val_score"] is None and "seed 8" in failed["failed"][0]
    assert doc["grid"]["simfed"] == TUNING["common"] | TUNING["methods"]["simfed"]
    # scrambling the test numbers changes no choice
    for k in range(3):
        _summaries(tmp_path / f"b{k}", scores, rng=random.Random(k))
        assert _choice(tuning.select(TUNING, ["s"], ["fedavg", "simfed"], tmp_path / f"b{k}", {})) == _choice(doc)


def test_a_failed_point_records_the_reason_its_run_gave(tmp_path):
    scores = {"fedavg": [[(0.5, 0.9), (0.5, 0.9)], None, [(0.6, 0.5), None], [(0.1, 0.9), (0.1, 0.9)]]}
    _summaries(tmp_path, scores)
    run = tmp_path / "s" / "fedavg"
    job = {"runs": [], "failed": [{"run": str(run / "p1" / "seed7"), "reason": "round 3, client 2: mean training "
                                   "loss nan is not finite"}]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "ok.json").write_text(json.dumps({"runs": []}))  # a job with no failure
    reasons = tuning.failure_reasons([tmp_path / "job.json", tmp_path / "ok.json"])
    tried = tuning.select(TUNING, ["s"], ["fedavg"], tmp_path, {}, reasons)["chosen"]["s"]["fedavg"]["tried"]
    assert tried[1]["failed"] == ["seed 7: failed: round 3, client 2: mean training loss nan is not finite",
                                  "seed 8: no summary: the run failed (its log says why)"]
    assert tried[2]["failed"] == ["seed 8: no summary: the run failed (its log says why)"]
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UsageError, match="tuning job file .*bad.json cannot be read"):
        tuning.failure_reasons([tmp_path / "bad.json"])


def test_a_method_whose_every_point_failed_is_refused(tmp_path):
    _summaries(tmp_path, {"fedavg": [None] * 4})
    with pytest.raises(UsageError, match="every point of fedavg in s failed"):
        tuning.select(TUNING, ["s"], ["fedavg"], tmp_path, {})


def test_chosen_values_round_trip_and_stale_files_are_refused(tmp_path):
    scores = {m: [[(0.1 * (i + 1), 0.5)] * 2 for i in range(4)] for m in ("fedavg", "simfed")}
    _summaries(tmp_path, scores)
    t = {**TUNING, "file": str(tmp_path / "chosen.yaml")}
    doc = tuning.select(t, ["s"], ["fedavg", "simfed"], tmp_path, tuning.provenance("toy", "snakemake tune", {}))
    assert doc["command"] == "snakemake tune" and "commit" in doc and doc["study"] == "toy"
    assert doc["budget"] == {"points": 4, "rounds": {}, "seeds": [7, 8]} and "rounds" not in doc
    tuning.write(doc, t["file"])
    assert tuning.read_chosen(t, ["s"], ["fedavg", "simfed"]) == {
        "s": {"fedavg": {"fl.lr": 0.3}, "simfed": {"fl.lr": 0.1, "tau": 0.9}}}
    with pytest.raises(UsageError, match="no chosen values for fedavg in other"):
        tuning.read_chosen(t, ["other"], ["fedavg"])
    with pytest.raises(UsageError, match="fedavg was tuned on another grid"):
        tuning.read_chosen({**t, "common": {"fl.lr": [1, 2, 3, 4]}}, ["s"], ["fedavg"])
    with pytest.raises(UsageError, match="does not exist: run `snakemake tune`"):
        tuning.read_chosen({**t, "file": str(tmp_path / "none.yaml")}, ["s"], ["fedavg"])
    (tmp_path / "bad.yaml").write_text("a: 1\n")
    with pytest.raises(UsageError, match="is not a file of chosen values"):
        tuning.read_chosen({**t, "file": str(tmp_path / "bad.yaml")}, ["s"], ["fedavg"])


def _npz(path, y_test):
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 40)
    x = (rng.normal(size=(160, 1, 8, 8)) + y[:, None, None, None]).astype(np.float32)
    np.savez(path, x=x, y=y, x_test=x[:60] + 0.1, y_test=y_test)


def test_scrambled_test_labels_change_no_validation_score(tmp_path):
    """The validation score a tuning run is selected on does not depend on the test split's labels."""
    y_test = np.repeat(np.arange(4), 40)[:60]
    _npz(tmp_path / "a.npz", y_test)
    _npz(tmp_path / "b.npz", np.random.default_rng(1).permutation(y_test))
    summaries = []
    for name in ("a", "b"):
        cfg = load_config(None, [*TINY, f"data.name=npz:{tmp_path / name}.npz", "data.split_mode=official",
                                 "data.split=[0.8, 0.2, 0.0]", "fl.clients=2"])
        summaries.append(train(cfg, tmp_path / f"run_{name}"))
    a, b = summaries
    assert a["val_score"] == b["val_score"] is not None
    assert a["accuracy"] != b["accuracy"]  # the test labels did change what the test scores


@pytest.mark.slow
def test_train_runs_allow_failed_records_a_diverged_run_and_exits_0(tmp_path):
    runs = [{"out": str(tmp_path / "ok"), "set": []}, {"out": str(tmp_path / "diverged"), "set": ["fl.lr=1e12"]}]
    cmd = [sys.executable, "-m", "fedfactor", "train-runs", *[a for s in TINY for a in ("--set", s)],
           "--runs", json.dumps(runs), "--done", str(tmp_path / "done.json"), "--threads", "1"]
    failed = subprocess.run(cmd, capture_output=True, text=True)
    assert failed.returncode == 1 and not (tmp_path / "done.json").exists()
    allowed = subprocess.run([*cmd, "--allow-failed"], capture_output=True, text=True)
    assert allowed.returncode == 0, allowed.stderr
    done = json.loads((tmp_path / "done.json").read_text())
    assert [f["run"] for f in done["failed"]] == [str(tmp_path / "diverged")]
    assert "round 1, client 0" in done["failed"][0]["reason"]
    assert (tmp_path / "ok" / "summary.json").exists() and not (tmp_path / "diverged" / "summary.json").exists()


@pytest.mark.slow
def test_snakemake_tune_trains_every_point_and_the_study_runs_at_the_chosen_values(tmp_path, monkeypatch,
                                                                                  fedfactor_env):
    monkeypatch.setenv("PATH", fedfactor_env["PATH"])  # the jobs' `fedfactor` (tests/forkserver.py)
    """The workflow end to end: `snakemake tune` on a tiny study writes the file and its record; the
    study's runs read the file; and a clone that has the committed file but no tuning runs (a fresh
    one) tunes again rather than finding nothing to do."""
    run = tmp_path / "run.yaml"
    run.write_text("data: {name: digits}\nmodel: {name: mlp}\nfl: {clients: 4, rounds: 2, epochs: 1}\n")
    chosen = tmp_path / "tuned.yaml"
    study = tmp_path / "study.yaml"
    study.write_text(json.dumps({
        "study": "tiny", "run_config": str(run), "results": str(tmp_path / "results"), "seeds": [0],
        "scenarios": {"iid": {"partition": {"kind": "iid"}}},
        "methods": {"fedavg": {"name": "fedavg"}, "local": {"name": "local"}},
        "tuning": {"file": str(chosen), "seeds": [100], "points": 2, "common": {"fl.lr": [0.02, 1e12]}}}))
    doc_tuning = json.loads(study.read_text())["tuning"]
    argv = ["--directory", str(tmp_path), "--configfile", str(study)]
    tuned = snakemake_in_process("tune", "--cores", "1", *argv)
    # the closing line names the command that runs this study, not the default one
    assert f"`snakemake --cores all --configfile {study}` then runs the study with them" in tuned
    # each tuning run's line shows its validation score in %, and no test accuracy
    # the tuning runs' experiment differs from the study's at its start (the MLflow UI cuts long names)
    with sqlite3.connect(tmp_path / "results" / "mlflow.db") as db:
        names = {n for (n,) in db.execute("SELECT name FROM experiments")}
    assert "tuning-fedfactor-tiny" in names, names
    record = tmp_path / "results" / "tiny" / "tuning" / "chosen.yaml"
    assert chosen.read_text() == record.read_text()
    doc = yaml.safe_load(chosen.read_text())
    for method in ("fedavg", "local"):
        entry = doc["chosen"]["iid"][method]
        tried = [t for t in entry["tried"] if t["val_score"] is not None]
        assert [t["values"] for t in entry["tried"]] == tuning.points(doc_tuning, method)
        assert entry["values"] == max(tried, key=lambda t: t["val_score"])["values"]
        # lr 1e12 diverges: the point is recorded with the reason its run gave, from the job's record
        assert entry["values"] == {"fl.lr": 0.02} and entry["tried"][1]["val_score"] is None
        assert re.match(r"seed 100: failed: round 1, client \d+: mean training loss", entry["tried"][1]["failed"][0])
    # the study's runs, at the chosen values
    plan = snakemake_in_process("-n", "-p", *argv)
    runs = {Path(r["out"]).parent.name: r["set"] for command in re.findall(r"^Shell command: .*train-runs .*$", plan, re.M)
            for argv_ in [shlex.split(command)] for r in json.loads(argv_[argv_.index("--runs") + 1])}
    assert set(runs) == {"fedavg", "local"}
    for method, sets in runs.items():
        assert f"fl.lr={doc['chosen']['iid'][method]['values']['fl.lr']}" in sets, (method, sets)
    assert "nothing to be done" in snakemake_in_process("tune", "-n", *argv).lower()
    # the committed file without the tuning runs: `tune` trains again (a job a run: runs_per_job 1)
    shutil.rmtree(tmp_path / "results" / "tiny" / "tuning")
    again = snakemake_in_process("tune", "-n", *argv)
    assert re.search(r"^tune_train\s+4$", again, re.M) and re.search(r"^tune_select\s+1$", again, re.M), again


def _chosen_file(tmp_path):
    """A file of chosen values as tune_select writes it, and the study's tuning section that reads it."""
    scores = {m: [[(0.1 * (i + 1), 0.5)] * 2 for i in range(4)] for m in ("fedavg", "simfed")}
    scores["fedavg"][1] = None  # lr 0.03 failed
    _summaries(tmp_path, scores)
    t = {**TUNING, "file": str(tmp_path / "chosen.yaml")}
    tuning.write(tuning.select(t, ["s"], ["fedavg", "simfed"], tmp_path, {"rounds": {"s": 2}}), t["file"])
    return t


def _edit(t, change):
    doc = yaml.safe_load(Path(t["file"]).read_text())
    change(doc)
    Path(t["file"]).write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.mark.parametrize("change, says", [
    (lambda d: d["chosen"]["s"]["fedavg"]["values"].update({"fl.lr": 99.0}),
     r"fedavg in s: fl.lr=99.0 is no point of its grid \(\[0.01, 0.03, 0.1, 0.3\]\)"),
    (lambda d: d["chosen"]["s"]["fedavg"]["values"].update({"fl.momentum": 0.5}),
     r"fedavg in s: the chosen values hold 'fl.momentum', which the grid does not tune"),
    (lambda d: d["chosen"]["s"]["simfed"].update(values={}),
     r"simfed in s: the chosen values lack 'fl.lr', which the grid tunes"),
    (lambda d: d["chosen"]["s"]["fedavg"]["values"].update({"fl.lr": 0.03}),
     r"fedavg in s: fl.lr=0.03 was never tried, or failed, on the tuning seeds"),
    (lambda d: d["budget"].update(seeds=[7]), r"was tuned with budget.seeds \[7\], but the study's tuning section "
                                              r"gives \[7, 8\]"),
], ids=["not in the grid", "a key never tuned", "no values", "a failed point", "other seeds"])
def test_a_chosen_value_the_tuning_did_not_choose_is_refused_naming_file_method_and_key(tmp_path, change, says):
    t = _chosen_file(tmp_path)
    assert tuning.read_chosen(t, ["s"], ["fedavg", "simfed"], {"s": 2})["s"]["fedavg"] == {"fl.lr": 0.3}
    _edit(t, change)
    with pytest.raises(UsageError, match="does not match its checksum: it was edited after `snakemake tune` wrote it"):
        tuning.read_chosen(t, ["s"], ["fedavg", "simfed"])
    # allowed as edited, the file must still hold what the tuning could have chosen
    with pytest.raises(UsageError, match=rf"^tuning.file {re.escape(t['file'])}.*{says}.*tune again"):
        tuning.read_chosen({**t, "allow_edited": True}, ["s"], ["fedavg", "simfed"])


def test_an_edit_is_used_when_the_study_allows_it_and_the_rounds_must_be_the_studys(tmp_path):
    t = _chosen_file(tmp_path)
    _edit(t, lambda d: d["chosen"]["s"]["fedavg"]["values"].update({"fl.lr": 0.1}))  # tried, not the best
    assert tuning.read_chosen({**t, "allow_edited": True}, ["s"], ["fedavg"])["s"]["fedavg"] == {"fl.lr": 0.1}
    _edit(t, lambda d: d.pop("checksum"))
    with pytest.raises(UsageError, match="has no checksum"):
        tuning.read_chosen(t, ["s"], ["fedavg"])
    t = _chosen_file(tmp_path / "again")
    with pytest.raises(UsageError, match=r"tuned s at 2 rounds, but the study trains it 5 rounds"):
        tuning.read_chosen(t, ["s"], ["fedavg"], {"s": 5})


@pytest.mark.parametrize("key, value", [("points", 4.0), ("points", True), ("seeds", [7.0, 8])])
def test_tuning_counts_must_be_whole_numbers(key, value):
    with pytest.raises(UsageError, match=rf"tuning.{key} must be"):
        tuning.check({**TUNING, key: value}, ["fedavg"], ["fedavg", "simfed"])


def test_provenance_names_the_commit_and_changes_besides_the_file_written(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("a = 1\n")
    (tmp_path / "chosen.yaml").write_text("old\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chosen.yaml").unlink()  # the step's own output, about to be written again
    clean = tuning.provenance("s", "snakemake tune", {"a": 2}, ["chosen.yaml"])
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert clean["commit"] == head and clean["uncommitted_changes"] is False and clean["rounds"] == {"a": 2}
    (tmp_path / "code.py").write_text("a = 2\n")
    assert tuning.provenance("s", "snakemake tune", {}, ["chosen.yaml"])["uncommitted_changes"] is True


@pytest.mark.slow
def test_a_tuning_runs_line_shows_its_validation_score_in_percent_and_no_test_accuracy(tmp_path, capsys):
    """`train-runs` without a study (the tuning jobs) prints a line a run: the number the run is chosen
    by, as every other line prints accuracies, and no test accuracy for a researcher to watch."""
    from fedfactor.cli import main

    run = tmp_path / "run.yaml"
    run.write_text("data: {name: digits}\nmodel: {name: mlp}\nfl: {clients: 2, rounds: 1, epochs: 1}\n")
    runs = [{"out": str(tmp_path / "p0"), "set": ["method.name=fedavg", "label=fedavg@p0", "seed=100"]}]
    assert main(["train-runs", "--config", str(run), "--runs", json.dumps(runs)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "/seed100:" in x]
    summary = json.loads((tmp_path / "p0" / "summary.json").read_text())
    assert re.search(rf": validation {100 * summary['val_score']:.2f} % in \d+\.\d s -> ", line), line
    assert "accuracy" not in line and f"{summary['accuracy']:.4f}" not in line

"""Damaged files of finished runs fed to the report commands: one `fedfactor: error:` line naming the
file, exit 2, nothing in --out; grouped by the file that is damaged.

`table` and `curves` get random damage in tests/test_bad_input.py; here every other command that reads
run folders gets each class of damage to the files it reads. One hand-built run folder serves all of
them: a FedDecomp sweep point with client weights and similarity diagnostics, in a study's layout.
"""

import contextlib
import io
import json

import numpy as np
import pandas as pd
import pytest

from fedfactor.cli import main
from fedfactor.report.spec import StudySpec

from ..conftest import write_content

K = 4
STUDY_COMMANDS = ["diagnose", "claims", "paper-tables", "figures", "decomp", "elora"]


def _summary(seed):
    return {"scenario": "s1", "method": "a", "seed": seed, "accuracy": 0.5, "accuracy_mean": 0.5,
            "accuracy_best_mean": 0.5, "accuracy_weighted": 0.5, "bytes_total": 1e9, "rounds": 3, "clients": K,
            "protocol": {"test_pool": "shared", "model": "trained", "report": "last"}, "dataset": "digits",
            "per_client_accuracy": [0.5] * K, "analysed_layers": {"1": "fc"},
            "config": {"method": {"name": "feddecomp", "e_lora": 1 + seed, "training": "alternating"}}}


def _metrics():
    r = np.arange(1, 4)
    return pd.DataFrame({"round": r, "accuracy_mean": 0.3 + 0.1 * r, "bytes_up": 100 * r, "bytes_down": 100 * r,
                         "elapsed_seconds": 1.5 * r, "feddecomp.sigma_distance": 1.0 * r,
                         "feddecomp.delta_sigma": 1.0 * r, "feddecomp.delta_tau": 1.0 * r}).to_csv(index=False)


def _npy(array):
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=array.dtype == object)
    return buf.getvalue()


@pytest.fixture
def runs(tmp_path):
    """tmp_path/runs/s1/a/seed{0,1} (seed 1 with similarity diagnostics), study.json and its paper CSV."""
    for seed in (0, 1):
        d = tmp_path / "runs" / "s1" / "a" / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(_summary(seed)))
        (d / "metrics.csv").write_text(_metrics())
        np.savez(d / "client_weights.npz", **{"fc.weight": np.random.default_rng(seed).normal(size=(K, 6, 5))})
    for name in ("similarity_u", "matching_counts"):
        folder = d / "diagnostics" / name
        folder.mkdir(parents=True)
        for t in (1, 2, 3):
            np.save(folder / f"round_{t:04d}.npy",
                    np.full((K, K), t) if name == "matching_counts" else np.eye(K) * 0.5 + 0.5)
    numbers = tmp_path / "numbers"
    numbers.mkdir()
    (numbers / "toy.csv").write_text("paper,table,dataset,setting,method,metric,value,std,note\n"
                                     "Toy,Table 9,D1,S1,PA,accuracy_pct,55.5,1.0,\n")
    spec = StudySpec.model_validate({
        "study": "toy", "title": "toy", "smoke": False, "seeds": [0, 1], "scenarios": ["s1"],
        "methods": {"a": {"name": "feddecomp", "implemented": True}},
        "claims": [{"id": "c1", "claim": "x", "source": "y", "kind": "ratio", "a": "a", "b": "a", "scenarios": ["s1"],
                    "min": 0.5}],
        "paper": {"name": "Toy", "numbers": str(numbers), "tables": [
            {"csv": "toy.csv", "metric": ["accuracy_pct"], "dataset": "D1", "scenarios": {"s1": "S1"},
             "methods": {"a": "PA"}}]}})
    (tmp_path / "study.json").write_text(json.dumps(spec.model_dump(mode="json")))
    return tmp_path


def _argv(root, command):
    runs, out, study = str(root / "runs"), str(root / "out"), str(root / "study.json")
    return {
        "diagnose": ["diagnose", runs, "--out", out, "--no-mlflow"],
        "claims": ["claims", runs, "--study", study, "--out", out],
        "paper-tables": ["paper-tables", runs, "--study", study, "--out", out],
        "figures": ["figures", runs, "--out", out],
        "decomp": ["figure", "--kind", "decomp", runs, "--out", f"{out}/decomp.png"],
        "elora": ["figure", "--kind", "elora", runs, "--out", f"{out}/elora.png"],
        "similarity": ["figure", "--kind", "similarity", f"{runs}/s1/a/seed1", "--out", f"{out}/similarity.png"],
    }[command]


def assert_refused(root, command, bad):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["-q", *_argv(root, command)])
    message = err.getvalue()
    assert code == 2, message
    assert message.startswith("fedfactor: error:") and message.count("\n") == 1, message
    assert str(bad) in message, message
    assert out.getvalue() == "" and not (root / "out").exists()
    return message


@pytest.mark.parametrize("command", [*STUDY_COMMANDS, "similarity"])
@pytest.mark.slow
def test_the_undamaged_runs_make_every_report(runs, command):
    # the refusals below only mean something if the same folders, undamaged, work
    assert main(["-q", *_argv(runs, command)]) == 0
    assert any((runs / "out").iterdir())


# --------------------------------------------------------------------------------------------
# summary.json


def _doc(**changes):
    doc = _summary(1)
    doc.update(changes)
    return json.dumps(doc)


DAMAGED_SUMMARIES = {  # every command reads a run's name
    "not JSON": '{"scenario": "s1", "method": ',
    "empty": "",
    "a JSON list": json.dumps([_summary(1)]),
    "binary junk": b"\x89PNG\r\n\x1a\n\x00\xff\xfe",
    "a folder": "DIR",
    "no scenario": json.dumps({k: v for k, v in _summary(1).items() if k != "scenario"}),
    "seed 'x'": _doc(seed="x"),
    "seed null": _doc(seed=None),
    "seed 10**30": _doc(seed=10**30),
    "arrays nested 10**5 deep": "[" * 100_000 + "]" * 100_000,
}
READS = [  # (command, a field it reads, a value of the wrong type)
    ("claims", "accuracy", "x"), ("paper-tables", "accuracy", "x"), ("elora", "accuracy", "x"),
    ("figures", "per_client_accuracy", None), ("figures", "per_client_accuracy", ["x"]),
    ("diagnose", "analysed_layers", ["fc"]), ("diagnose", "analysed_layers", {"1": 3}),
    ("claims", "bytes_total", "x"), ("paper-tables", "protocol", None),
    # the E_lora sweep reads the method's settings: a value no run has is a damaged summary
    ("elora", "config", {"method": {"training": "alternating", "e_lora": "2"}}),
    ("elora", "config", {"method": {"training": "alternating", "e_lora": 2.5}}),
    ("elora", "config", {"method": {"training": "alternating", "e_lora": True}}),
    ("elora", "config", {"method": {"training": "alternating", "e_lora": [1]}}),
    ("elora", "config", {"method": {"training": "alternating", "e_lora": 10**30}}),
    ("elora", "config", {"method": []}),
    ("figures", "config", {"method": {"training": "alternating", "e_lora": 1e300}}),
]


@pytest.mark.parametrize("command", STUDY_COMMANDS)
@pytest.mark.parametrize("damage", sorted(DAMAGED_SUMMARIES))
def test_a_damaged_summary_is_refused_by_every_report(runs, command, damage):
    bad = runs / "runs/s1/a/seed1/summary.json"
    content = DAMAGED_SUMMARIES[damage]
    if content == "DIR":
        bad.unlink()
        bad.mkdir()
    else:
        write_content(bad, content)
    assert_refused(runs, command, bad)


@pytest.mark.parametrize("command, key, value", READS)
def test_a_summary_field_of_the_wrong_type_is_refused_by_the_reports_reading_it(runs, command, key, value):
    bad = runs / "runs/s1/a/seed1/summary.json"
    bad.write_text(_doc(**{key: value}))
    assert key.split(".")[0] in assert_refused(runs, command, bad)


# --------------------------------------------------------------------------------------------
# metrics.csv (read by figures and the FedDecomp figure; `curves` in test_figures.py)

METRICS = _metrics()
DAMAGED_METRICS = {
    "missing": (None, "does not exist"),
    "empty": ("", "cannot read"),
    "a folder": ("DIR", "cannot read"),
    "binary junk": (b"\x00\xff\xfe\x89junk\n\x00\x01", "cannot read"),
    "no rows": (METRICS.splitlines()[0] + "\n", "has no evaluated round"),
    "no columns": ("\n\n", "cannot read"),
    "text for an accuracy": (METRICS.replace("0.4", "high", 1), "accuracy_mean holds something other than numbers"),
    "text for a round": (METRICS.replace("\n2,", "\nsecond,"), "round column holds something other than whole"),
    "a round repeated": (METRICS.replace("\n2,", "\n1,"), "holds round 1 twice"),
    "text for a distance": (METRICS.replace("2.0\n", "far\n", 1), "feddecomp.delta_tau holds something other than"),
    "an infinite distance": (METRICS.replace("2.0\n", "inf\n", 1), "feddecomp.delta_tau holds something other than"),
    "a negative distance": (METRICS.replace("2.0\n", "-2.0\n", 1), "feddecomp.delta_tau holds something other"),
}


@pytest.mark.parametrize("command", ["figures", "decomp"])
@pytest.mark.parametrize("damage", sorted(DAMAGED_METRICS))
def test_a_damaged_metrics_csv_is_refused(runs, command, damage):
    bad = runs / "runs/s1/a/seed1/metrics.csv"
    content, what = DAMAGED_METRICS[damage]
    if content == "DIR":
        bad.unlink()
        bad.mkdir()
    else:
        write_content(bad, content)
    assert what in assert_refused(runs, command, bad)


def test_text_for_bytes_is_refused_by_figures(runs):
    bad = runs / "runs/s1/a/seed1/metrics.csv"
    bad.write_text(METRICS.replace(",200,", ",lots,", 1))
    assert "bytes_up holds something other than byte counts" in assert_refused(runs, "figures", bad)


# --------------------------------------------------------------------------------------------
# diagnostics/<name>/round_NNNN.npy (the similarity heatmaps, in figures and figure --kind similarity)


class _Payload:
    def __reduce__(self):  # unpickling it would run print: it must never be unpickled
        return (print, ("unpickled!",))


DAMAGED_NPY = {
    "not an npy file": (b"not an npy file", "cannot read"),
    "truncated": (_npy(np.eye(K))[:-9], "cannot read"),
    "a pickled object array": (_npy(np.array([_Payload()] * K * K, dtype=object).reshape(K, K)), "cannot read"),
    "a folder": ("DIR", "cannot read"),
    "text": (_npy(np.full((K, K), "a")), "not real numbers"),
    "complex numbers": (_npy(np.eye(K) * (1 + 1j)), "not real numbers"),
    "a vector": (_npy(np.ones(K)), "not a square clients x clients matrix"),
    "values outside -1..1": (_npy(np.full((K, K), 5.0)), "outside -1..1"),
    "infinite values": (_npy(np.full((K, K), np.inf)), "outside -1..1"),
}


@pytest.mark.parametrize("command", ["figures", "similarity"])
@pytest.mark.parametrize("damage", sorted(DAMAGED_NPY))
def test_a_damaged_similarity_matrix_is_refused(runs, command, damage):
    bad = runs / "runs/s1/a/seed1/diagnostics/similarity_u/round_0003.npy"
    content, what = DAMAGED_NPY[damage]
    if content == "DIR":
        bad.unlink()
        bad.mkdir()
    else:
        write_content(bad, content)
    assert what in assert_refused(runs, command, bad)  # which also finds nothing printed: no "unpickled!"


@pytest.mark.parametrize("command", ["figures", "similarity"])
@pytest.mark.parametrize("content, what", [(_npy(np.full((K, K), 0.5)), "other than counts"),
                                           (_npy(np.eye(K) * 1j), "not real numbers")])
def test_damaged_matching_counts_are_refused(runs, command, content, what):
    bad = runs / "runs/s1/a/seed1/diagnostics/matching_counts/round_0003.npy"
    bad.write_bytes(content)
    assert what in assert_refused(runs, command, bad)

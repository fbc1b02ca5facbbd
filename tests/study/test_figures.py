"""`study_figures`: which files a study's runs give, the smoke-run marking, and bad input."""

import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedfactor.errors import UsageError
from fedfactor.report.figures import SMOKE_TITLE, method_styles
from fedfactor.study.figures import (ALWAYS, OPTIONAL, _accuracy_figure, _spread_figure, _spread_rows, load_study,
                                     study_figures)

from ..conftest import write_content

PNG, PDF = b"\x89PNG\r\n\x1a\n", b"%PDF"
K, ROUNDS = 4, 3
DECOMP = {"feddecomp.sigma_distance": 2.0, "feddecomp.delta_sigma": 1.0, "feddecomp.delta_tau": 0.5}


def _run(root, scenario, method, seed, dataset="digits", bytes_per_round=2_000, config=None, metrics=(),
         diagnostics=(), seconds_per_round=2.0):
    """A finished run in root/<scenario>/<method>/seed<N>, like a study's runs folder; each seed takes
    half a second a round longer than the one before."""
    path = root / scenario / method / f"seed{seed}"
    path.mkdir(parents=True)
    per_client = [0.2 + 0.2 * k + 0.01 * seed for k in range(K - 1)] + [float("nan")]  # one client untested
    summary = {"scenario": scenario, "method": method, "seed": seed, "dataset": dataset, "accuracy": 0.5,
               "per_client_accuracy": per_client, "config": {"method": config or {"name": method}}}
    (path / "summary.json").write_text(json.dumps(summary))
    r = np.arange(1, ROUNDS + 1)
    frame = pd.DataFrame({"round": r, "accuracy_mean": 0.3 + 0.1 * r + 0.01 * seed,
                          "bytes_up": bytes_per_round * r, "bytes_down": bytes_per_round * r,
                          "elapsed_seconds": (seconds_per_round + 0.5 * seed) * r})
    for column in metrics:
        frame[column] = DECOMP[column] * r
    frame.to_csv(path / "metrics.csv", index=False)
    for name in diagnostics:
        folder = path / "diagnostics" / name
        folder.mkdir(parents=True)
        for t in r:
            m = np.full((K, K), t, np.int64) if name == "matching_counts" else np.eye(K) * 0.5 + 0.5
            np.save(folder / f"round_{t:04d}.npy", m)
    return path


def _plain(root, dataset="digits"):
    for scenario in ("iid", "dir0.1"):
        for seed in (0, 1):
            _run(root, scenario, "fedavg", seed, dataset=dataset)
            _run(root, scenario, "local", seed, dataset=dataset, bytes_per_round=0,  # nothing on a log axis
                 seconds_per_round=0.5)


def _everything(root):
    _plain(root)
    _run(root, "iid", "factorized_fl_alpha", 0, diagnostics=("similarity_u", "similarity_v", "matching_counts"))
    _run(root, "dir0.1", "simfed", 0, diagnostics=("similarity_z",))  # SimFed counts no matches
    for e in (1, 3):
        _run(root, "iid", f"feddecomp_e{e}", 0, metrics=list(DECOMP),
             config={"name": "feddecomp", "e_lora": e, "training": "alternating"})


def _check_files(written, names):
    assert written == [written[0].parent / f"{n}.{ext}" for n in names for ext in ("png", "pdf")]
    for path in written:
        assert path.read_bytes()[:8 if path.suffix == ".png" else 4] == (PNG if path.suffix == ".png" else PDF)
    assert not list(written[0].parent.glob(".*.tmp"))


@pytest.mark.slow
def test_plain_runs_give_the_always_drawn_figures_each_as_png_and_pdf(tmp_path, drawn):
    _plain(tmp_path / "runs")
    written = study_figures([tmp_path / "runs"], tmp_path / "figs", title="Study A")
    _check_files(written, ALWAYS)
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == sorted(p.name for p in written)
    assert [title.split(":")[0] for title, _ in drawn] == ["Study A"] * len(ALWAYS) == ["Study A"] * 4
    assert not any(mark for _, mark in drawn)
    assert Image.open(written[0]).text["Title"] == drawn[0][0]  # the title travels in the file too


@pytest.mark.slow
def test_optional_figures_appear_exactly_when_their_data_is_there(tmp_path):
    _everything(tmp_path / "runs")
    out = tmp_path / "figs"
    _check_files(study_figures([tmp_path / "runs"], out, title="t"), ALWAYS + OPTIONAL)

    # a later call without their data leaves no stale optional figure behind
    _check_files(study_figures([tmp_path / "runs" / "dir0.1" / "fedavg"], out, title="t"), ALWAYS)
    assert sorted(p.stem for p in out.iterdir()) == sorted(2 * list(ALWAYS))

    # SimFed's similarities alone: heatmaps and their spread, but no matching counts to draw
    _check_files(study_figures([tmp_path / "runs" / "dir0.1"], out, title="t"),
                 ALWAYS + ("similarity", "similarity_spread"))


@pytest.mark.slow
def test_one_e_lora_value_is_no_sweep_but_its_diagnostics_are_drawn(tmp_path):
    _run(tmp_path / "runs", "iid", "feddecomp", 0, metrics=["feddecomp.delta_sigma"],
         config={"name": "feddecomp", "e_lora": 1, "training": "alternating"})
    _run(tmp_path / "runs", "iid", "feddecomp", 1, config={"name": "feddecomp", "e_lora": 1, "training": "alternating"})
    _check_files(study_figures([tmp_path / "runs"], tmp_path / "figs", title=""), ALWAYS + ("decomp",))


@pytest.mark.parametrize("how", ["dataset", "flag"])
@pytest.mark.slow
def test_smoke_runs_are_titled_and_watermarked_in_every_figure(tmp_path, drawn, how):
    if how == "dataset":  # one run on synthetic data is enough
        _everything(tmp_path / "runs")
        _run(tmp_path / "runs", "iid", "fedprox", 0, dataset="synthetic:blobs")
    else:
        _plain(tmp_path / "runs")
    written = study_figures([tmp_path / "runs"], tmp_path / "figs", title="Study A", smoke=how == "flag")
    assert len(drawn) == len(written) == len(ALWAYS + OPTIONAL if how == "dataset" else ALWAYS)
    assert {p.suffix for p in (tmp_path / "figs").iterdir()} == {".png"}  # no PDF: it is for no paper
    for title, mark in drawn:
        assert title.startswith(SMOKE_TITLE) and "Study A" in title and mark


def _panel(fig, scenario):
    (ax,) = [a for a in fig.axes if a.get_visible() and a.get_title().startswith(scenario)]
    return ax


@pytest.mark.slow
def test_the_time_figure_draws_accuracy_against_the_mean_seconds_of_each_round(tmp_path, drawn):
    _plain(tmp_path / "runs")
    written = study_figures([tmp_path / "runs"], tmp_path / "figs", title="Study A")
    assert "accuracy_time" in ALWAYS and tmp_path / "figs" / "accuracy_time.png" in written
    assert "Study A: mean client accuracy against wall-clock time (mean ± std over seeds)" in [t for t, _ in drawn]

    study = load_study([tmp_path / "runs"])
    styles = {m: {"color": "C0", "linestyle": "-"} for m in study.methods}
    r = np.arange(1, ROUNDS + 1)
    accuracy = 100 * (0.3 + 0.1 * r + 0.005)  # the mean of seeds 0 and 1
    ax = _panel(_accuracy_figure(study, styles, "time"), "iid")
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"fedavg", "local"}  # local training sends nothing but takes time: a line like any
    for method, seconds in (("fedavg", 2.0), ("local", 0.5)):
        assert np.asarray(lines[method].get_xdata()) == pytest.approx((seconds + 0.25) * r)  # not the rounds
        assert np.asarray(lines[method].get_ydata()) == pytest.approx(accuracy)
    assert ax.get_xlabel().startswith("wall-clock time since the run's start [s]")
    assert "machine" in ax.get_xlabel()  # the seconds are this machine's, not a property of the method

    rounds = {line.get_label(): line for line in _panel(_accuracy_figure(study, styles, "rounds"), "iid").get_lines()}
    assert np.asarray(rounds["local"].get_xdata()) == pytest.approx(r)


def test_many_methods_get_distinct_styles():
    styles = method_styles([f"m{i}" for i in range(30)])
    assert len({(tuple(s["color"]), s["linestyle"]) for s in styles.values()}) == 30
    assert len({tuple(s["color"]) for s in list(styles.values())[:20]}) == 20


BAD = [  # (file, content, what the message says)
    ("metrics.csv", "round,accuracy_mean\n1,0.1\n2,0.2,0.5,7\n", r"cannot read .*metrics.csv \(Error tokenizing"),
    ("metrics.csv", None, "metrics.csv does not exist"),
    ("metrics.csv", "round,accuracy_mean,bytes_down\n1,0.5,10\n", "has no column 'bytes_up'"),
    ("metrics.csv", "round,accuracy_mean,bytes_up,bytes_down\n1,0.5,-1,10\n", "bytes_up holds something other"),
    ("metrics.csv", "round,accuracy_mean,bytes_up,bytes_down\n1,0.5,7,lots\n", "bytes_down holds something other"),
    ("metrics.csv", "round,accuracy_mean,bytes_up,bytes_down\n1,0.5,7,8\n", "has no column 'elapsed_seconds'"),
    ("metrics.csv", "round,accuracy_mean,bytes_up,bytes_down,elapsed_seconds\n1,0.5,7,8,-0.5\n",
     r"elapsed_seconds holds something other than seconds since the run's start \(numbers >= 0\)"),
    ("metrics.csv", "round,accuracy_mean,bytes_up,bytes_down,elapsed_seconds\n1,0.5,7,8,inf\n",
     "elapsed_seconds holds something other than seconds"),
    ("metrics.csv", "round,accuracy_mean,bytes_up,bytes_down,elapsed_seconds\n1,0.5,7,8,soon\n",
     "elapsed_seconds holds something other than seconds"),
    ("summary.json", '{"scenario": "iid", "method": "fedavg", "seed": 1}', "lacks 'per_client_accuracy'"),
    ("summary.json", '{"scenario": "iid", "method": "fedavg", "seed": 1, "per_client_accuracy": [0.5, 3]}',
     "per_client_accuracy.1: input should be less than or equal to 1"),
    ("diagnostics/similarity_u/round_0003.npy", b"not an npy file", r"cannot read .*round_0003.npy"),
]


@pytest.mark.parametrize("name, content, pattern", BAD)
def test_bad_input_is_one_usage_error_line_and_writes_nothing(tmp_path, name, content, pattern):
    _plain(tmp_path / "runs")
    bad = _run(tmp_path / "runs", "iid", "factorized_fl_alpha", 1, diagnostics=("similarity_u",)) / name
    write_content(bad, content)
    with pytest.raises(UsageError, match=pattern) as err:
        study_figures([tmp_path / "runs"], tmp_path / "figs", title="t")
    assert str(bad) in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "figs").exists()


@pytest.mark.slow
def test_a_run_label_twice_or_an_out_file_is_refused(tmp_path):
    _run(tmp_path / "a", "iid", "fedavg", 0)
    _run(tmp_path / "b", "iid", "fedavg", 0)
    with pytest.raises(UsageError, match="are both scenario iid, method fedavg, seed 0; pass the runs of one study"):
        study_figures([tmp_path / "a", tmp_path / "b"], tmp_path / "figs", title="t")
    # the same run reached twice counts once
    _check_files(study_figures([tmp_path / "a", tmp_path / "a/iid"], tmp_path / "figs", title="t"), ALWAYS)
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="is a file; give a folder"):
        study_figures([tmp_path / "a"], tmp_path / "file", title="t")


def _similarities(run, name, rounds):
    """Overwrite a fake run's `name` diagnostics with the given K x K matrix per round."""
    for r, m in rounds.items():
        np.save(run / "diagnostics" / name / f"round_{r:04d}.npy", m)


def _pairs(values):
    """A symmetric K x K similarity matrix with 1 on the diagonal and `values` above it."""
    m = np.eye(K)
    m[np.triu_indices(K, 1)] = values
    return np.maximum(m, m.T)


@pytest.mark.slow
def test_the_spread_pools_seeds_per_round_on_the_similarity_matched_on_and_draws_tau(tmp_path):
    root = tmp_path / "runs"
    low, high = np.linspace(0.0, 0.5, 6), np.linspace(0.3, 0.8, 6)
    for seed, values in ((0, low), (1, high)):
        run = _run(root, "dom", "simfed", seed, config={"name": "simfed", "tau": 0.9},
                   diagnostics=("similarity_z", "similarity_v"))
        _similarities(run, "similarity_v", {r: -np.ones((K, K)) for r in range(1, ROUNDS + 1)})  # not matched on
        _similarities(run, "similarity_z", {1: _pairs(values)})
    alpha = _run(root, "dom", "factorized_fl_alpha", 0, config={"name": "factorized_fl_alpha", "tau": 0.0},
                 diagnostics=("similarity_u", "similarity_v"))
    _similarities(alpha, "similarity_v", {1: np.full((K, K), np.nan)})  # nobody uploaded yet: no row
    _run(root, "dom", "fedavg", 0)  # logs no similarity: no line
    _run(root, "dom", "fedfac", 0, config={"name": "fedfac", "tau": "95%"})  # FedFac's tau names a threshold

    study = load_study([root])
    spread = _spread_rows(study)
    simfed = spread[spread.method == "simfed"].set_index("round")
    pooled = np.repeat(np.concatenate([low, high]), 2)  # each pair twice: both triangles
    assert list(simfed.index) == [1, 2, 3] and set(simfed["name"]) == {"similarity_z"}
    assert simfed.loc[1, "max"] == 0.8 and simfed.loc[1, 0.5] == pytest.approx(np.median(pooled))
    assert simfed.loc[1, 0.1] == pytest.approx(np.quantile(pooled, 0.1))
    assert simfed.loc[2, 0.5] == 0.5 and simfed.loc[1, "taus"] == [0.9]  # the fake's 0.5 off the diagonal
    alpha_rows = spread[spread.method == "factorized_fl_alpha"]
    assert list(alpha_rows["round"]) == [2, 3] and set(alpha_rows["name"]) == {"similarity_v"}

    fig = _spread_figure(study, spread, {m: {"color": "C0", "linestyle": "-"} for m in study.methods})
    (ax,) = [a for a in fig.axes if a.get_visible() and a.get_title().startswith("dom")]
    levels = {line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"}
    assert levels == {0.9, 0.0}  # each method's tau as a dashed level
    assert {t.get_text() for t in fig.legends[0].get_texts()} >= {"simfed ($z$)", "simfed: tau 0.9"}
    _check_files(study_figures([root], tmp_path / "figs", title="t"), ALWAYS + ("similarity", "similarity_spread"))

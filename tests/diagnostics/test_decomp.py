import json

import pandas as pd
import pytest

from fedfactor.cli import main
from fedfactor.errors import UsageError
from fedfactor.diagnostics.decomp import decomposition_figure, elora_figure

PNG, PDF = b"\x89PNG\r\n\x1a\n", b"%PDF"


def _run(path, scenario, method, seed, metrics=None, accuracy=0.5, method_config=None):
    path.mkdir(parents=True)
    summary = {"scenario": scenario, "method": method, "seed": seed, "accuracy": accuracy,
               "config": {"method": method_config or {"name": method}}}
    (path / "summary.json").write_text(json.dumps(summary))
    metrics = metrics or {}
    rounds = len(next(iter(metrics.values()), [0, 0]))
    pd.DataFrame({"round": range(1, rounds + 1), "accuracy_mean": [0.5] * rounds, **metrics}).to_csv(
        path / "metrics.csv", index=False)
    return path


def _decomp(dist, dsigma, dtau):
    return {"feddecomp.sigma_distance": dist, "feddecomp.delta_sigma": dsigma, "feddecomp.delta_tau": dtau}


@pytest.mark.slow
def test_decomposition_figure_returns_the_last_rounds_mean_over_seeds(tmp_path):
    _run(tmp_path / "a0", "dir0.1", "feddecomp", 0, _decomp([3.0, 2.0], [1.0, 5.0], [0.0, 4.0]))
    _run(tmp_path / "a1", "dir0.1", "feddecomp", 1, _decomp([3.0, 4.0], [1.0, 7.0], [0.0, 8.0]))
    _run(tmp_path / "s0", "dir0.1", "feddecomp_simultaneous", 0, _decomp([9.0, 9.5], [2.0, 3.0], [1.0, 2.0]))
    reverse = {"feddecomp.delta_sigma": [1.0, 1.5], "feddecomp.delta_tau": [0.5, 0.25]}  # no shared sigma
    _run(tmp_path / "r0", "dir0.1", "feddecomp_reverse", 0, reverse)
    _run(tmp_path / "f0", "dir0.1", "fedavg", 0)  # no diagnostics: left out
    out = tmp_path / "fig" / "decomp.png"
    table = decomposition_figure([tmp_path], out, title="t")
    assert out.read_bytes()[:8] == PNG and out.with_suffix(".pdf").read_bytes()[:4] == PDF
    got = table.set_index("method")
    assert list(got.index) == ["feddecomp", "feddecomp_reverse", "feddecomp_simultaneous"]
    assert got.loc["feddecomp", "feddecomp.sigma_distance"] == 3.0
    assert got.loc["feddecomp", "feddecomp.delta_sigma"] == 6.0 and got.loc["feddecomp", "feddecomp.delta_tau"] == 6.0
    assert pd.isna(got.loc["feddecomp_reverse", "feddecomp.sigma_distance"])
    assert got.loc["feddecomp_reverse", "feddecomp.delta_tau"] == 0.25


def test_decomposition_figure_without_feddecomp_runs_says_so(tmp_path):
    _run(tmp_path / "f0", "iid", "fedavg", 0)
    with pytest.raises(UsageError, match="logged FedDecomp's diagnostics"):
        decomposition_figure([tmp_path], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def _sweep(tmp_path):
    for e, accs in {0: [0.60, 0.62], 2: [0.80, 0.84], 5: [0.70, 0.70]}.items():
        for seed, acc in enumerate(accs):
            _run(tmp_path / f"e{e}/{seed}", "dir0.1", f"feddecomp_e{e}", seed, accuracy=acc,
                 method_config={"name": "feddecomp", "e_lora": e, "training": "alternating"})
    _run(tmp_path / "sim/0", "dir0.1", "feddecomp_simultaneous", 0, accuracy=0.75,
         method_config={"name": "feddecomp_simultaneous", "e_lora": 2, "training": "simultaneous"})
    for seed, acc in enumerate([0.5, 0.7]):
        _run(tmp_path / f"fedavg/{seed}", "dir0.1", "fedavg", seed, accuracy=acc)


@pytest.mark.slow
def test_elora_figure_groups_by_e_lora_and_draws_the_others_as_levels(tmp_path):
    _sweep(tmp_path)
    out = tmp_path / "elora.png"
    table = elora_figure([tmp_path], out)
    assert out.read_bytes()[:8] == PNG and out.with_suffix(".pdf").read_bytes()[:4] == PDF
    sweep = table[table.method == "feddecomp"].set_index("e_lora")
    assert sweep.index.tolist() == [0, 2, 5]
    assert sweep.loc[2, "mean"] == pytest.approx(82.0) and sweep.loc[2, "std"] == pytest.approx(2.0)
    assert sweep.loc[5, "std"] == 0 and sweep["count"].tolist() == [2, 2, 2]
    refs = table[table.e_lora.isna()].set_index("method")
    assert refs.loc["fedavg", "mean"] == pytest.approx(60.0) and refs.loc["fedavg", "std"] == pytest.approx(10.0)
    assert refs.loc["feddecomp_simultaneous", "mean"] == pytest.approx(75.0)


def test_elora_figure_needs_a_sweep(tmp_path):
    _run(tmp_path / "f0", "iid", "fedavg", 0)
    with pytest.raises(UsageError, match="E_lora sweep"):
        elora_figure([tmp_path], tmp_path / "x.png")


@pytest.mark.slow
def test_cli_kinds(tmp_path, capsys):
    _sweep(tmp_path / "sweep")
    assert main(["-q", "figure", str(tmp_path / "sweep"), "--kind", "elora", "--out", str(tmp_path / "e.png")]) == 0
    printed = capsys.readouterr().out
    assert "feddecomp" in printed and "82" in printed
    _run(tmp_path / "d/0", "iid", "feddecomp", 0, _decomp([1.0], [2.0], [3.0]))
    assert main(["-q", "figure", str(tmp_path / "d"), "--kind", "decomp", "--out", str(tmp_path / "d.png")]) == 0
    assert "feddecomp.delta_tau" in capsys.readouterr().out
    # similarity heatmaps are one run's; --rounds belongs to them
    assert main(["-q", "figure", str(tmp_path / "d"), str(tmp_path / "sweep"), "--out", str(tmp_path / "s.png")]) == 2
    assert "draws one run" in capsys.readouterr().err
    assert main(["-q", "figure", str(tmp_path / "d"), "--kind", "decomp", "--rounds", "1",
                 "--out", str(tmp_path / "r.png")]) == 2
    assert "--rounds applies to --kind similarity only" in capsys.readouterr().err

import json

import numpy as np
import pytest
from PIL import Image

from fedfactor.cli import main
from fedfactor.errors import UsageError
from fedfactor.report.figures import SMOKE_TITLE
from fedfactor.diagnostics.heatmaps import similarity_heatmaps

from ..conftest import write_content

PNG = b"\x89PNG\r\n\x1a\n"
K = 4


def _similarity(r, k=K):
    """Two planted groups {1, 2} and {3, 4} that grow apart; client 4 uploads only from round 2."""
    groups = np.arange(k) < k // 2
    same = groups[:, None] == groups[None, :]
    m = np.where(same, 0.5 + 0.1 * r, -0.1 * r).clip(-1, 1)
    np.fill_diagonal(m, 1.0)
    if r == 1:
        m[-1, :] = m[:, -1] = np.nan
    return m


def _counts(r, k=K):
    groups = np.arange(k) < k // 2
    return np.where(groups[:, None] == groups[None, :], r, 0).astype(np.int64)


def _run(path, names=("similarity_u", "similarity_v", "matching_counts"), rounds=range(1, 6), summary=True):
    for name in names:
        folder = path / "diagnostics" / name
        folder.mkdir(parents=True, exist_ok=True)
        for r in rounds:
            np.save(folder / f"round_{r:04d}.npy", _counts(r) if name == "matching_counts" else _similarity(r))
    if summary:
        (path / "summary.json").write_text(json.dumps({"scenario": "s", "method": "factorized", "seed": 0}))
    return path


@pytest.mark.slow
def test_default_draws_first_middle_last_round_with_counts(tmp_path):
    run = _run(tmp_path / "run")
    (run / "diagnostics/similarity_u/.round_0009.npy.abc.tmp").write_bytes(b"half")  # a killed writer's
    out = tmp_path / "fig" / "sim.png"
    drawn = similarity_heatmaps(run, out)
    assert drawn == {"rows": ["similarity_u", "similarity_v"], "rounds": [1, 3, 5], "counts_round": 5, "clients": K}
    assert out.read_bytes()[:8] == PNG and out.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"
    assert Image.open(out).text["Title"] == "s / factorized / seed 0"


@pytest.mark.slow
def test_a_run_on_synthetic_data_is_marked_a_smoke_run(tmp_path):
    run = _run(tmp_path / "run", rounds=[1])
    (run / "summary.json").write_text(json.dumps({"scenario": "s", "method": "factorized", "seed": 0,
                                                  "dataset": "synthetic:blobs"}))
    similarity_heatmaps(run, tmp_path / "a.png")
    assert Image.open(tmp_path / "a.png").text["Title"] == f"{SMOKE_TITLE}: s / factorized / seed 0"


@pytest.mark.parametrize("available, chosen", [([1], [1]), ([1, 2], [1, 2]), ([2, 4, 6, 8], [2, 4, 8])])
@pytest.mark.slow
def test_default_rounds_are_deduplicated(tmp_path, available, chosen):
    run = _run(tmp_path / "run", rounds=available)
    assert similarity_heatmaps(run, tmp_path / "a.png")["rounds"] == chosen


@pytest.mark.slow
def test_default_rounds_are_those_every_row_has(tmp_path):
    run = _run(tmp_path / "run", names=["similarity_u"], rounds=range(1, 11))
    _run(run, names=["similarity_v"], rounds=[2, 4, 6])
    assert similarity_heatmaps(run, tmp_path / "a.png")["rounds"] == [2, 4, 6]


@pytest.mark.slow
def test_explicit_rounds_in_the_order_given(tmp_path):
    run = _run(tmp_path / "run")
    drawn = similarity_heatmaps(run, tmp_path / "a.png", rounds=[4, 2, 4], title="mine")
    assert drawn["rounds"] == [4, 2]


@pytest.mark.slow
def test_only_v_and_no_counts_or_summary(tmp_path):
    run = _run(tmp_path / "run", names=["similarity_v"], summary=False)
    drawn = similarity_heatmaps(run, tmp_path / "v.png")
    assert drawn == {"rows": ["similarity_v"], "rounds": [1, 3, 5], "counts_round": None, "clients": K}
    assert (tmp_path / "v.png").read_bytes()[:8] == PNG


@pytest.mark.slow
def test_rows_in_order_u_v_z_and_counts_from_their_own_last_round(tmp_path):
    run = _run(tmp_path / "run", names=["similarity_z", "similarity_u"])
    _run(run, names=["matching_counts"], rounds=[1, 7])
    drawn = similarity_heatmaps(run, tmp_path / "a.png")
    assert drawn["rows"] == ["similarity_u", "similarity_z"] and drawn["counts_round"] == 7


@pytest.mark.slow
def test_a_damaged_summary_only_costs_the_default_title(tmp_path):
    run = _run(tmp_path / "run")
    (run / "summary.json").write_text("{")
    assert similarity_heatmaps(run, tmp_path / "a.png")["rows"] == ["similarity_u", "similarity_v"]


def test_missing_round_names_the_round_and_the_rounds_there_are(tmp_path):
    run = _run(tmp_path / "run", rounds=[1, 2, 3, 5, 7, 8])
    with pytest.raises(UsageError, match=r"no similarity_u for round 4, 9; its rounds are 1-3, 5, 7-8$"):
        similarity_heatmaps(run, tmp_path / "a.png", rounds=[1, 4, 9])
    assert not (tmp_path / "a.png").exists() and not (tmp_path / "a.pdf").exists()


def test_rows_that_share_no_round_are_refused(tmp_path):
    run = _run(tmp_path / "run", names=["similarity_u"], rounds=[1, 3])
    _run(run, names=["similarity_v"], rounds=[2, 4])
    with pytest.raises(UsageError, match=r"share no round \(similarity_u: rounds 1, 3; similarity_v: rounds 2, 4\)"):
        similarity_heatmaps(run, tmp_path / "a.png")


def test_no_folder_no_diagnostics_or_no_similarity_is_refused(tmp_path):
    with pytest.raises(UsageError, match=f"^{tmp_path / 'nope'} is not a folder"):
        similarity_heatmaps(tmp_path / "nope", tmp_path / "a.png")
    (tmp_path / "run").mkdir()
    with pytest.raises(UsageError, match=f"^{tmp_path / 'run'} has no diagnostics folder; pass the --out folder"):
        similarity_heatmaps(tmp_path / "run", tmp_path / "a.png")
    _run(tmp_path / "run", names=["matching_counts", "client_norms"])
    (tmp_path / "run/diagnostics/similarity_u").mkdir()  # a folder without round files counts as absent
    with pytest.raises(UsageError, match="holds none of similarity_u, similarity_v, similarity_z; run a method"):
        similarity_heatmaps(tmp_path / "run", tmp_path / "a.png")
    assert not (tmp_path / "a.png").exists()


def _npy(array):
    import io

    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


BAD_FILES = [  # (name, content of its round 3 file, what the message says)
    ("similarity_u", b"", r"cannot read .*round_0003.npy \("),
    ("similarity_u", b"not an npy file at all", r"cannot read .*round_0003.npy \("),
    ("similarity_v", _npy(np.eye(K))[:-8], r"cannot read .*round_0003.npy \("),
    ("similarity_u", _npy(np.zeros((K, K + 1))), r"shape \(4, 5\), not a square clients x clients matrix"),
    ("similarity_u", _npy(np.zeros(K)), r"shape \(4,\), not a square"),
    ("similarity_u", _npy(np.zeros((0, 0))), r"shape \(0, 0\), not a square"),
    ("similarity_v", _npy(np.array([["a"] * K] * K)), "holds <U1 values, not real numbers"),
    ("similarity_u", _npy(np.eye(K + 1)), r"disagree on the number of clients \(4, 5\)"),
    ("matching_counts", _npy(np.eye(K + 1, dtype=int)), r"disagree on the number of clients \(4, 5\)"),
    ("matching_counts", _npy(np.full((K, K), 0.5)), "holds something other than counts"),
    ("matching_counts", _npy(-np.ones((K, K), dtype=int)), "holds something other than counts"),
]


@pytest.mark.parametrize("name, content, pattern", BAD_FILES)
def test_damaged_matrices_are_one_line_usage_errors(tmp_path, name, content, pattern):
    run = _run(tmp_path / "run", rounds=[1, 2, 3])
    write_content(run / "diagnostics" / name / "round_0003.npy", content)
    with pytest.raises(UsageError, match=pattern) as err:
        similarity_heatmaps(run, tmp_path / "a.png")
    assert str(run) in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "a.png").exists()


@pytest.mark.slow
def test_cli_writes_the_figure(tmp_path, capsys):
    run = _run(tmp_path / "run")
    out = tmp_path / "fig.png"
    assert main(["-q", "figure", str(run), "--out", str(out), "--rounds", "2, 5", "--title", "t"]) == 0
    assert out.read_bytes()[:8] == PNG and (tmp_path / "fig.pdf").read_bytes()[:4] == b"%PDF"
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and "rounds 2, 5" in printed and str(out) in printed


@pytest.mark.parametrize("text", ["", "1,,3", "first", "1.5", "1;2"])
def test_cli_bad_rounds_text_exits_2(tmp_path, capsys, text):
    run = _run(tmp_path / "run")
    out = tmp_path / "fig.png"
    assert main(["-q", "figure", str(run), "--out", str(out), "--rounds", text]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedfactor: error: --rounds") and err.count("\n") == 1
    assert not out.exists()


def test_cli_missing_round_exits_2(tmp_path, capsys):
    run = _run(tmp_path / "run")
    assert main(["-q", "figure", str(run), "--out", str(tmp_path / "fig.png"), "--rounds", "6"]) == 2
    assert "its rounds are 1-5" in capsys.readouterr().err

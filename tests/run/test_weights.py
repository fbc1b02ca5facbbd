"""fedfactor.run.weights: the client weights a run keeps (client_weights.npz) and how
`fedfactor diagnose` reads them back, damaged files included."""

import io
import math
import zipfile

import numpy as np
import pandas as pd
import pytest
import torch

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.diagnostics.diagnose import diagnose
from fedfactor.diagnostics.layer_analysis import analyse_run
from fedfactor.diagnostics.runs import read_runs
from fedfactor.run.job import train
from fedfactor.models.layers import effective_weight
from fedfactor.run.simulator import Simulator

from ..conftest import TINY
from ..diagnostics.conftest import LAYER, MODULE, make_run, planted

# -- what a run keeps: these run training jobs --------------------------------------------------



@pytest.mark.slow
@pytest.mark.parametrize("method, extra", [("fedavg", []), ("feddecomp", ["fl.epochs=2", "method.e_lora=1"]),
                                           ("pfedpara", []), ("factorized_fl_alpha", [])])
def test_the_diagnosed_clients_keep_the_effective_weights_that_diagnose_analyses(tmp_path, method, extra):
    # Under eval.model=received the clients drop the shared entries (FedDecomp's sigma, pFedPara's
    # W_1 factors) except those the diagnostics read; Factorized-FL keeps whole states. Each kept
    # weight is the layer's effective one: sigma + tau, W_1 o (W_2 + 1), u v^T + mu.
    cfg = load_config(None, [*TINY, f"method.name={method}", *extra, "fl.fraction=0.5", "diagnostics.max_clients=3",
                             "eval.model=received"])
    summary = train(cfg, tmp_path / "run")
    saved = np.load(tmp_path / "run" / "client_weights.npz", allow_pickle=False)
    whole = Simulator(cfg)
    whole._trim = False  # every trained client keeps its whole model
    whole.run()
    clients = whole.diagnosed_clients()
    assert summary["analysed_layers"] == {"3": "body.7"} and summary["analysed_clients"] == clients
    assert len(clients) == 3 and list(saved) == ["body.7.weight"]
    expected = torch.stack([effective_weight(whole.model, "body.7", whole.states[k]) for k in clients])
    assert np.array_equal(saved["body.7.weight"], expected.to(torch.float16).numpy())
    if method != "fedavg":  # not the layer's plain parameter: there is none, or it is sigma alone
        first = whole.states[clients[0]]
        assert "body.7.weight" not in first or not torch.equal(first["body.7.weight"], expected[0])
    done = diagnose([tmp_path / "run"], tmp_path / "diagnostics", mlflow=False)
    assert done["skipped"] == []
    (row,) = done["rows"].itertuples()
    assert row.error == "" and (row.K, row.d) == (3, expected.shape[1]) and row.G >= 1


@pytest.mark.slow
def test_client_weights_under_other_diagnostics_settings_keep_the_clients_that_still_hold_them(tmp_path, caplog):
    sets = [*TINY, "fl.fraction=0.5", "eval.model=received", "checkpoint.keep=true"]
    train(load_config(None, [*sets, "diagnostics.max_clients=1"]), tmp_path)
    # the kept final checkpoint meets a wider setting: the same run (diagnostics is not in its fingerprint)
    cfg = load_config(None, [*sets, "diagnostics.max_clients=4"])
    sim = Simulator(cfg)
    first = sim.diagnosed_clients()[0]
    trained = {k for rnd in range(1, cfg.fl.rounds + 1) for k in sim.sample(rnd)}
    holding = [k for k in sim.diagnosed_clients() if k == first or k not in trained]
    assert len(holding) < 4  # some trained clients dropped the weights, so the case is real
    with caplog.at_level("WARNING", logger="fedfactor"):
        summary = train(cfg, tmp_path)
    assert "no longer hold the analysed layers' weights" in caplog.text
    saved = np.load(tmp_path / "client_weights.npz", allow_pickle=False)
    assert all(a.shape[0] == len(holding) for a in saved.values())
    assert summary["analysed_clients"] == holding


@pytest.mark.slow
def test_no_client_weights_without_keep_weights_and_an_earlier_file_is_removed(tmp_path):
    train(load_config(None, TINY), tmp_path)
    assert (tmp_path / "client_weights.npz").exists()
    summary = train(load_config(None, [*TINY, "diagnostics.keep_weights=false"]), tmp_path)
    assert not (tmp_path / "client_weights.npz").exists() and summary["analysed_clients"] == []


# --------------------------------------------------------------------------------------------
# A damaged client_weights.npz: an error row naming the file, as NaN weights get, never a traceback
# and never an unpickled object; the other runs are analysed as usual.


class _Payload:
    def __reduce__(self):  # unpickling it would run print
        return (print, ("unpickled!",))


def _npz(**arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _crc_failure():
    data = bytearray(_npz(**{f"{MODULE}.weight": planted(0)}))
    npy = data.find(b"\x93NUMPY")
    data[npy + 10 + int.from_bytes(data[npy + 8:npy + 10], "little") + 8] ^= 0xFF  # a byte of the array itself
    return bytes(data)


def _npy(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _member(content):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{MODULE}.weight.npy", content)
    return buf.getvalue()


W = f"{MODULE}.weight"
DAMAGED_WEIGHTS = {  # what client_weights.npz holds, what the error says; True: it names the file
    "a pickled object array": (_npz(**{W: np.array([_Payload()] * 6, dtype=object)}), "Object arrays cannot", True),
    "half a zip": (_npz(**{W: planted(0)})[:2000], "is not an .npz archive", True),
    "no zip at all": (b"hello", "is not an .npz archive", True),
    "nothing": (b"", "is not an .npz archive", True),
    "one .npy array": (_npy(planted(0)), "is not an .npz archive", True),
    "a folder": ("DIR", "is not an .npz archive", True),
    "a member failing its CRC": (_crc_failure(), "Bad CRC-32", True),
    "a truncated member": (_member(_npy(planted(0))[:200]), f"cannot read '{W}'", True),
    "a member that is no .npy array": (_member(b"hello"), f"'{W}' in {{bad}} is not an .npy array", True),
    "an entry summary.json does not name": (_npz(**{"other.weight": planted(0)}),
                                             f"has no entry '{W}' for layer {LAYER} of summary.json's", True),
    "text": (_npz(**{W: np.full((6, 12), "a")}), "are not floating-point numbers", False),
    "a structured array": (_npz(**{W: np.zeros((6, 12), dtype=[("a", "f4")])}), "not floating-point", False),
    "integers": (_npz(**{W: planted(0).astype(np.int64)}), "not floating-point", False),
    "a vector": (_npz(**{W: np.ones(6, np.float32)}), "are not K clients x d units", False),
    "no units": (_npz(**{W: np.ones((6, 0, 4), np.float32)}), "are not K clients x d units", False),
    "values beyond float32": (_npz(**{W: planted(0).astype(np.float64) * 1e300}), "beyond float32's range", False),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED_WEIGHTS))
def test_a_damaged_weights_file_is_an_error_row_naming_it(tmp_path, damage, capsys):
    content, what, names_file = DAMAGED_WEIGHTS[damage]
    bad = make_run(tmp_path / "bad", weights=planted(1)) / "client_weights.npz"
    if content == "DIR":
        bad.unlink()
        bad.mkdir()
    else:
        bad.write_bytes(content)
    (info,) = read_runs([tmp_path / "bad"])
    (result,) = analyse_run(info, kappa=0.45, method="principal")
    error = result.row["error"]
    assert result.nu is None and math.isnan(result.row["G"]) and what.format(bad=bad) in error
    assert (str(bad) in error) == names_file
    assert "unpickled!" not in capsys.readouterr().out


@pytest.mark.slow
def test_the_other_runs_are_analysed_and_the_command_counts_the_errors(tmp_path, capsys):
    make_run(tmp_path / "runs" / "good", weights=planted(0))
    (make_run(tmp_path / "runs" / "bad", seed=1) / "client_weights.npz").write_bytes(
        _npz(**{W: np.array([_Payload()] * 6, dtype=object)}))
    out = tmp_path / "out"
    assert main(["-q", "diagnose", str(tmp_path / "runs"), "--out", str(out), "--kappa", "0.45", "--no-mlflow"]) == 0
    printed = capsys.readouterr().out
    assert "2 runs analysed (2 layers, 1 with errors)" in printed and "unpickled!" not in printed
    rows = pd.read_csv(out / "diagnostics.csv", keep_default_na=False, na_values=[""]).set_index("seed")
    assert rows.loc[0, "G"] == 2 and "Object arrays cannot be loaded" in rows.loc[1, "error"]
    assert f"{tmp_path / 'runs' / 'bad'}: cannot read '{W}'" in (out / "diagnostics.md").read_text()

"""Where the clients' states wait between rounds (fl/store.py): the same results in every store, a
round's states in effect together, the disk store's files, and `auto`'s choice."""

import io

import pytest
import torch

import fedfactor.run.simulator as simulator
from fedfactor.config import load_config
from fedfactor.errors import Interrupted, UsageError
from fedfactor.fl.store import WHERE, ClientStates, choose
from fedfactor.methods import METHODS
from fedfactor.run.simulator import Simulator

from ..conftest import TINY

GiB = 2**30


def _sim(where, *extra, folder=None):
    cfg = load_config(None, [*TINY, "model.name=mlp", "fl.eval_every=1", f"store.client_states={where}", *extra])
    return Simulator(cfg, states_folder=folder)


def _same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _outcome(sim):
    """What a run leaves: every round's record (but its times) and every client's final state."""
    records = []
    for r in sim.run():
        record = {k: v for k, v in r.to_dict().items() if k != "elapsed_seconds"}
        record["diagnostics"] = {k: v for k, v in record["diagnostics"].items() if not k.endswith("_seconds")}
        records.append(record)
    return records, list(sim.states)


def _assert_same_run(a, b):
    (records_a, states_a), (records_b, states_b) = a, b
    assert records_a == records_b
    assert all(_same_state(x, y) for x, y in zip(states_a, states_b, strict=True))


@pytest.mark.parametrize("method", ["local", "fedamp", "fedfomo"])
@pytest.mark.parametrize("where", ["host", "disk"])
def test_every_store_gives_the_device_stores_run_bit_for_bit(method, where, tmp_path):
    """Catches: a store that changes a value it keeps (a dtype, a lost entry), hands a client another's
    state, or keeps a round's states before the round ends."""
    extra = [f"method.name={method}", "eval.model=trained"]
    reference = _outcome(_sim("device", *extra))
    _assert_same_run(_outcome(_sim(where, *extra, folder=tmp_path / "states")), reference)


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS.names())
def test_every_method_runs_the_same_in_every_store(method, tmp_path):
    """Catches: a method whose states a store changes: kept optimizer state, mixture weights, extra
    models, masks (each method's own entries)."""
    extra = [f"method.name={method}", "fl.epochs=2"]  # FedDecomp's alternating phases need two
    reference = _outcome(_sim("device", *extra))
    for where in ("host", "disk"):
        _assert_same_run(_outcome(_sim(where, *extra, folder=tmp_path / where)), reference)


def test_the_disk_store_writes_a_round_at_its_end_and_keeps_untrained_clients_in_memory(tmp_path):
    """Catches: files written before the round's commit, a staged file left behind, untrained clients
    written out (K copies of the initial model), and a read that is not the state written."""
    folder = tmp_path / "states"
    init = {"w": torch.arange(6.0).reshape(2, 3)}
    store = ClientStates([dict(init) for _ in range(3)], "disk", torch.device("cpu"), folder)
    assert not folder.exists()  # nothing written before the first trained client
    trained = {"w": init["w"] + 1}
    store.stage(1, trained)
    assert sorted(p.name for p in folder.iterdir()) == ["1.pt.staged"]
    assert _same_state(store[1], init)  # not in effect until the round commits
    store.commit()
    assert sorted(p.name for p in folder.iterdir()) == ["1.pt"]
    assert _same_state(store[1], trained) and _same_state(store[0], init)
    assert store[0]["w"] is init["w"]  # an untrained client's tensors: the shared ones, in memory
    store.stage(2, {"w": init["w"] * 5})
    store.discard()  # an interrupted round
    assert sorted(p.name for p in folder.iterdir()) == ["1.pt"] and _same_state(store[2], init)
    store.close()
    assert not folder.exists()


def test_the_host_store_keeps_a_copy_and_hands_out_the_clients_own(tmp_path):
    """Catches: the host store handing client k another client's state, or states that change after
    they are stored (a training step writing into a tensor the store still holds)."""
    states = [{"w": torch.full((2,), float(k))} for k in range(3)]
    store = ClientStates(states, "host", torch.device("cpu"))
    store.stage(0, {"w": torch.tensor([7.0, 8.0])})
    store.commit()
    assert [store[k]["w"].tolist() for k in range(3)] == [[7.0, 8.0], [1.0, 1.0], [2.0, 2.0]]
    assert len(store) == 3 and [s["w"][0].item() for s in store] == [7.0, 1.0, 2.0]


def test_an_interrupted_round_leaves_the_disk_stores_states_of_the_round_before(tmp_path):
    """Catches: run_round committing the states of a round that a stop ended (its staged files taken
    as the clients' states)."""
    sim = _sim("disk", "method.name=local", "eval.model=trained", "fl.batch_clients=false", folder=tmp_path / "states")
    sim.run_round(1)
    before = [dict(s) for s in sim.states]
    train = sim.method.local_train

    def stop_after_two_clients(k, state, received):
        if k == 2:
            raise Interrupted(15)
        return train(k, state, received)

    sim.method.local_train = stop_after_two_clients
    with pytest.raises(Interrupted):
        sim.run_round(2)
    assert all(_same_state(a, b) for a, b in zip(sim.states, before, strict=True))
    assert not list((tmp_path / "states").glob("*.staged"))


def test_a_checkpoint_of_a_disk_store_resumes_to_the_uninterrupted_run(tmp_path):
    """Catches: load_state_dict leaving the disk store's files of the killed run (or none) in place of
    the checkpoint's states, or a server left on the host."""
    extra = ["method.name=fedamp", "fl.rounds=3"]
    sim = _sim("disk", *extra, folder=tmp_path / "a")
    sim.run_round(1)
    sim.round = 1  # as `run` sets it once the round is scored
    buf = io.BytesIO()
    torch.save(sim.state_dict(), buf)
    buf.seek(0)
    resumed = _sim("disk", *extra, folder=tmp_path / "b")
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [f"{k}.pt" for k in range(4)]
    for rnd in (2, 3):
        resumed.run_round(rnd)
    reference = _sim("device", *extra)
    for rnd in (1, 2, 3):
        reference.run_round(rnd)
    assert all(_same_state(a, b) for a, b in zip(resumed.states, reference.states, strict=True))


@pytest.mark.parametrize("need, on_gpu, device, host, where", [
    (10 * GiB, True, 40 * GiB, 256 * GiB, "device"),  # half the GPU's memory is enough
    (30 * GiB, True, 40 * GiB, 256 * GiB, "host"),  # over half the GPU's
    (20 * GiB, True, 40 * GiB, 256 * GiB, "device"),  # exactly half fits
    (200 * GiB, True, 40 * GiB, 256 * GiB, "disk"),  # over half the host's too
    (30 * GiB, False, None, 24 * GiB, "disk"),  # a CPU run has no host store apart from its device
    (10 * GiB, False, None, 24 * GiB, "device"),
    (10 * GiB, True, None, None, "device"),  # memories that cannot be read are taken to fit
])
def test_auto_keeps_states_on_the_device_while_they_fit_half_its_memory(need, on_gpu, device, host, where):
    """Catches: auto choosing against the wrong memory, the host store on a CPU, or another share."""
    assert choose(need, on_gpu, device, host) == where


def test_auto_moves_states_to_disk_where_the_host_cannot_hold_them(monkeypatch, tmp_path):
    """Catches: a run on a small host refused (or swapping) when its states would fit on disk."""
    monkeypatch.setattr(simulator, "available_memory", lambda: 1000)  # bytes: less than the states
    sim = _sim("auto", "method.name=local", folder=tmp_path / "states")
    assert sim.states.where == "disk"
    monkeypatch.setattr(simulator, "available_memory", lambda: 100 * GiB)
    assert _sim("auto", "method.name=local").states.where == "device"


def test_a_store_that_cannot_hold_the_states_is_refused_before_training(monkeypatch, tmp_path):
    """Catches: the refusal checking the device's memory whatever the store (a disk store refused for
    a small host, or a disk too small let through)."""
    monkeypatch.setattr(simulator.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 1000})())
    with pytest.raises(UsageError, match=r"GiB of free disk here \(store.client_states=disk\)"):
        _sim("disk", "method.name=local", folder=tmp_path / "states")
    monkeypatch.setattr(simulator, "memory_bytes", lambda device: 1000)
    with pytest.raises(UsageError, match=r"GiB of cpu memory here \(store.client_states=host\)"):
        _sim("host", "method.name=local")


def test_where_states_wait_does_not_change_a_runs_fingerprint():
    """Catches: store.client_states in the result-determining config, which would start a finished
    run over (or refuse its checkpoint) when only the store changed."""
    configs = [load_config(None, [*TINY, f"store.client_states={w}"]) for w in ("auto", *WHERE)]
    assert all(c.result_dict() == configs[0].result_dict() for c in configs)

import json

import pytest
import torch

from fedfactor.cli import main
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.methods.fedcac import MASK, collaborators, critical_mask, overlaps, pack_mask, unpack_mask

from ..conftest import record_uploads

CNN_FLOATS = 188810  # every float entry of the tiny cnn (digits, 10 classes); it has no BatchNorm
# Its masks, one bit per entry, whole bytes per tensor: conv1 800 + 32, conv2 51200 + 64, fc 131072 + 512,
# head 5120 + 10 entries -> 100 + 4 + 6400 + 8 + 16384 + 64 + 640 + 2 bytes
CNN_MASK_BYTES = 23602

# Four clients' critical sets over four entries, and their overlaps o_ij = 1 - |m_i - m_j| / (2 |m_i|):
MASKS = [[1, 1, 0, 0], [1, 0, 1, 1], [1, 1, 0, 0], [0, 0, 1, 1]]
OVERLAP = [[1, 1 - 3 / 4, 1, 1 - 4 / 4],  # |m0| = 2; differs from m1 in 3, m2 in 0, m3 in 4 entries
           [1 - 3 / 6, 1, 1 - 3 / 6, 1 - 1 / 6],  # |m1| = 3; from m0 3, m2 3, m3 1
           [1, 1 - 3 / 4, 1, 1 - 4 / 4],
           [1 - 4 / 4, 1 - 1 / 4, 1 - 4 / 4, 1]]  # |m3| = 2; from m0 4, m1 1, m2 4
# Off the diagonal: sum 0.25 + 1 + 0 + 0.5 + 0.5 + 5/6 + 1 + 0.25 + 0 + 0 + 0.75 + 0 = 61/12, mean 61/144
AVG = 61 / 144


def _sim(tiny, *extra):
    return Simulator(load_config(None, tiny + ["method.name=fedcac", *extra]))


def test_critical_parameters_are_the_top_tau_by_sensitivity():
    before = torch.tensor([1.0, 1.0, 1.0, 1.0])
    after = torch.tensor([2.0, 1.0, -3.0, 0.5])
    # |(after - before) * after| = [2, 0, 12, 0.25]
    assert critical_mask(before, after, 0.5).tolist() == [True, False, True, False]
    assert critical_mask(before, after, 0.25).tolist() == [False, False, True, False]
    assert critical_mask(before, after, 0.1).tolist() == [False] * 4  # int(0.4) = 0 entries
    # tau = 1: the top-4 threshold is 0, so (authors' code) the smallest moved one, 0.25, takes its place
    assert critical_mask(before, after, 1.0).tolist() == [True, False, True, True]
    # ties at the threshold are all critical: [2, 2, 2, 0]
    assert critical_mask(before, torch.tensor([2.0, 2.0, 2.0, 1.0]), 0.25).tolist() == [True, True, True, False]
    # fewer than tau moved: the top-2 threshold is 0, so every entry that moved is critical ...
    assert critical_mask(before, torch.tensor([1.0, 1.0, 4.0, 1.0]), 0.5).tolist() == [False, False, True, False]
    # ... and where nothing moved, the authors' code (c >= 0) makes every entry critical
    assert critical_mask(before, before, 0.5).tolist() == [True] * 4


def test_a_mask_is_sent_as_one_bit_per_entry():
    mask = torch.tensor([True] + [False] * 8 + [True])
    bits = pack_mask(mask)
    # entry 0 -> bit 0 of byte 0, entry 9 -> bit 1 of byte 1
    assert bits.dtype == torch.uint8 and bits.tolist() == [1, 2]
    assert torch.equal(unpack_mask(bits, mask.shape), mask)
    grid = torch.rand(3, 5, 7) > 0.5
    assert pack_mask(grid).numel() == 14 and torch.equal(unpack_mask(pack_mask(grid), grid.shape), grid)
    assert pack_mask(torch.zeros(17, dtype=torch.bool, device="meta")).shape == (3,)


def test_overlaps_and_the_rising_bar_decide_who_shares_critical_parameters():
    masks = [{"w": torch.tensor(m, dtype=torch.bool)} for m in MASKS]
    o = overlaps(masks, ["w"])
    assert torch.allclose(o, torch.tensor(OVERLAP, dtype=torch.float64))
    # bar = avg + (r / beta) (max - avg), max = 1
    groups = lambda c: [torch.nonzero(row).reshape(-1).tolist() for row in c]  # noqa: E731
    c, bar = collaborators(o, 0.0)
    assert bar == pytest.approx(AVG) and groups(c) == [[2], [0, 2, 3], [0], [1]]
    c, bar = collaborators(o, 0.5)  # bar 0.7118: client 1 keeps only client 3 (5/6), client 3 keeps 1 (0.75)
    assert bar == pytest.approx(AVG + 0.5 * (1 - AVG)) and groups(c) == [[2], [3], [0], [1]]
    c, _ = collaborators(o, 0.8)  # bar 0.8847: only the identical pair
    assert groups(c) == [[2], [], [0], []]
    c, _ = collaborators(o, 1.2)  # past round beta: no one
    assert groups(c) == [[], [], [], []]
    # a client without critical entries overlaps no one
    empty = overlaps([{"w": torch.zeros(4, dtype=torch.bool)}, masks[0]], ["w"])
    assert empty.tolist() == [[0.0, 0.0], [1 - 2 / 4, 1.0]]


def test_critical_entries_come_from_the_collaborators_and_the_rest_from_everyone(tiny):
    sim = _sim(tiny, "method.beta=100")
    m = sim.method
    init = sim.server["global"]
    assert all(torch.equal(m.download(sim.server, 3)[key], init[key]) for key in init)  # nothing uploaded yet
    uploads = {}
    for k, pattern in enumerate(MASKS):  # client k's model is k + 1 everywhere; critical: head.bias[:4] as MASKS
        uploads[k] = {key: torch.full_like(t, k + 1.0) for key, t in init.items()}
        for key, t in init.items():
            mask = torch.zeros_like(t, dtype=torch.bool)
            if key == "head.bias":
                mask[:4] = torch.tensor(pattern, dtype=torch.bool)
            uploads[k][MASK + key] = pack_mask(mask)
    sim.ctx.round = 50  # factor 50 / 100 = 0.5: collaborators 0-2, 1-3
    server = m.aggregate(sim.server, uploads, {0: 1.0, 1: 1.0, 2: 1.0, 3: 5.0})
    # global (size-weighted): (1 + 2 + 3 + 5 x 4) / 8 = 3.25
    assert all(torch.equal(t, torch.full_like(t, 3.25)) for t in server["global"].values())
    expected = {0: [2, 2, 3.25, 3.25],  # critical 0, 1: mean of clients 0 and 2 = (1 + 3) / 2
                1: [3, 3.25, 3, 3],  # critical 0, 2, 3: mean of clients 1 and 3 = (2 + 4) / 2
                2: [2, 2, 3.25, 3.25],
                3: [3.25, 3.25, 3, 3]}
    for k, bias in expected.items():
        got = m.download(server, k)
        assert got["head.bias"].tolist() == bias + [3.25] * 6
        assert torch.equal(got["body.0.weight"], server["global"]["body.0.weight"])
    assert sim._scalars["cac_bar"] == pytest.approx(AVG + 0.5 * (1 - AVG))
    assert sim._scalars["cac_collaborators"] == 1.0
    assert sim._arrays["cac_overlap"][1, 3] == pytest.approx(5 / 6)
    # round 80: client 1 collaborates with no one, so its critical entries are its own model's
    sim.ctx.round = 80
    later = m.aggregate(sim.server, uploads, {k: 1.0 for k in uploads})
    assert m.download(later, 1)["head.bias"][:4].tolist() == [2, 2.5, 2, 2]


@pytest.mark.slow
def test_two_rounds_train_and_send_the_model_plus_its_mask(tiny, capsys):
    sim = _sim(tiny)
    uploads = record_uploads(sim)
    records = sim.run()
    assert records[-1].test.mean > 0.3  # ten classes: chance is 0.1
    model = CNN_FLOATS * 4
    assert [r.bytes_up_round for r in records] == [4 * (model + CNN_MASK_BYTES)] * 2
    assert [r.bytes_down_round for r in records] == [4 * model] * 2
    # what a client sends: its parameters and, per parameter, its mask (half the entries: tau 0.5)
    up = uploads[0]
    assert set(up) == set(sim.ctx.param_keys) | {MASK + key for key in sim.ctx.param_keys}
    mask = unpack_mask(up[MASK + "body.3.weight"], (64, 32, 5, 5))
    assert int(mask.sum()) >= 51200 // 2
    sets = [a for s in tiny + ["method.name=fedcac"] for a in ("--set", s)]
    assert main(["cost", *sets, "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert (cost["bytes_up"], cost["bytes_down"]) == (sim.meter.up, sim.meter.down)


def test_batchnorm_statistics_and_local_heads_stay_home(tiny):
    sim = _sim(tiny, "model.name=resnet8", "partition.permute_labels=true")
    params = set(sim.ctx.param_keys) - set(sim.ctx.head_keys)
    assert set(sim.method.upload(0, sim.states[0])) == params | {MASK + key for key in params}
    assert set(sim.method.download(sim.server, 0)) == params


@pytest.mark.parametrize("setting, key", [("method.tau=1.5", "tau"), ("method.tau=-0.1", "tau"),
                                          ("method.beta=0", "beta"), ("method.beta=2.5", "beta"),
                                          ("method.alpha=1", "alpha")])
def test_bad_hyperparameters_are_refused_naming_the_key(tiny, setting, key):
    with pytest.raises(UsageError, match=key) as err:
        _sim(tiny, setting)
    assert "\n" not in str(err.value)

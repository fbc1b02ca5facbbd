import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfactor.fl.comm import CommMeter
from fedfactor.fl.state import WeightedSum, nbytes, pack_sparse, unpack_sparse, weighted_average


def test_weighted_average_matches_hand_computed_values():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([[0.0]])}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([[4.0]])}
    out = weighted_average([a, b], [1, 3])
    # (1*1 + 3*3)/4 = 2.5, (1*2 + 3*6)/4 = 5.0, (0 + 3*4)/4 = 3.0
    assert torch.equal(out["w"], torch.tensor([2.5, 5.0]))
    assert torch.equal(out["b"], torch.tensor([[3.0]]))
    assert out["w"].dtype == torch.float32


def test_weighted_average_of_identical_states_is_exact():
    t = torch.randn(50)
    out = weighted_average([{"t": t}] * 7, [0.3, 1, 2, 5, 7, 11, 13])
    assert torch.equal(out["t"], t)


def test_weighted_average_rejects_bad_weights():
    with pytest.raises(ValueError):
        weighted_average([{"t": torch.ones(1)}], [0])
    with pytest.raises(ValueError):
        weighted_average([{"t": torch.ones(1)}, {"t": torch.ones(1)}], [1])
    with pytest.raises(ValueError):
        weighted_average([{"t": torch.ones(1)}, {"t": torch.ones(1)}], [2, -1])
    with pytest.raises(ValueError):  # a state without an entry the others have is not averaged silently
        weighted_average([{"t": torch.ones(1)}, {"u": torch.ones(1)}], [1, 1])


def test_a_weighted_sum_built_one_state_at_a_time_is_the_mean_of_them_all():
    states = [{"w": torch.randn(3, 2), "b": torch.randn(2, dtype=torch.float64)} for _ in range(5)]
    weights = [3, 1, 4, 1, 5]
    total = WeightedSum()
    for state, w in zip(states, weights):
        total.add(state, w)
    mean = total.mean()
    assert total.count == 5 and total.weight == 14
    assert mean["w"].dtype == torch.float32 and mean["b"].dtype == torch.float64
    expected = sum(w * s["b"] for s, w in zip(states, weights)) / 14
    assert torch.allclose(mean["b"], expected, rtol=1e-12)
    assert all(torch.equal(mean[k], v) for k, v in weighted_average(states, weights).items())
    with pytest.raises(ValueError):
        WeightedSum().mean()


def test_meter_counts_elements_times_element_size():
    meter = CommMeter()
    meter.upload({"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.float16)})
    meter.download({"c": torch.zeros(2, dtype=torch.float64)})
    meter.end_round()
    meter.upload({"a": torch.zeros(1)})
    meter.end_round()
    assert meter.up == 12 * 4 + 5 * 2 + 4
    assert meter.down == 16
    assert meter.history == [(58, 16), (4, 0)]
    assert nbytes({"x": torch.empty(7, 3, device="meta")}) == 84


def test_sparse_tensors_count_values_plus_indices():
    dense = torch.zeros(3, 4)
    dense[0, 1], dense[2, 3] = 1.0, 2.0
    coo = dense.to_sparse()
    # 2 float32 values + a 2 x 2 int64 index array
    assert nbytes({"m": coo}) == 2 * 4 + 2 * 2 * 8
    csr = dense.to_sparse_csr()
    # 2 values + 4 int64 row pointers + 2 int64 column indices
    assert nbytes({"m": csr}) == 2 * 4 + 4 * 8 + 2 * 8
    assert nbytes({"m": dense}) == 12 * 4


# ---------------------------------------------------------------- pack_sparse / unpack_sparse


@st.composite
def _sparse_tensors(draw):
    shape = tuple(draw(st.lists(st.integers(0, 13), min_size=0, max_size=3)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    density = draw(st.floats(0, 1))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=g, dtype=dtype)
    mask = torch.rand(shape, generator=g) < density
    return values * mask


@settings(max_examples=80, deadline=None)
@given(t=_sparse_tensors())
def test_pack_sparse_round_trips(t):
    bits, values = pack_sparse(t)
    assert bits.dtype == torch.uint8 and bits.dim() == 1
    assert bits.numel() == math.ceil(t.numel() / 8)
    assert values.dtype == t.dtype and values.numel() == int((t != 0).sum())
    out = unpack_sparse(bits, values, t.shape)
    assert out.shape == t.shape and out.dtype == t.dtype
    assert torch.equal(out, t)


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (9,), (3, 5), (2, 3, 4), (17, 3)])
def test_pack_sparse_costs_bitmap_plus_values(shape):
    t = torch.randn(shape)
    t[t.abs() < 0.5] = 0
    nnz = int((t != 0).sum())
    bits, values = pack_sparse(t)
    numel = t.numel()
    assert bits.numel() == math.ceil(numel / 8)
    assert nbytes({"bits": bits, "values": values}) == math.ceil(numel / 8) + 4 * nnz
    assert torch.equal(unpack_sparse(bits, values, shape), t)


@pytest.mark.parametrize("shape", [(5,), (8,), (4, 6), (3, 3, 3)])
def test_all_zero_tensor_costs_only_the_bitmap(shape):
    bits, values = pack_sparse(torch.zeros(shape))
    assert values.numel() == 0
    assert (bits == 0).all()
    assert nbytes({"bits": bits, "values": values}) == math.ceil(math.prod(shape) / 8)
    assert torch.equal(unpack_sparse(bits, values, shape), torch.zeros(shape))


def test_pack_sparse_bit_order_and_value_order():
    t = torch.tensor([0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0])
    bits, values = pack_sparse(t)
    # entry j of each byte is bit j (least significant first): byte 0 has bits 1 and 7, byte 1 bit 0
    assert bits.tolist() == [2 + 128, 1]
    assert values.tolist() == [2.0, 3.0, 4.0]
    # a dense tensor costs 1/32 more than sending it dense in float32
    d = torch.ones(64)
    assert nbytes(dict(zip("bv", pack_sparse(d)))) == 64 * 4 + 8


def test_pack_sparse_of_a_non_contiguous_tensor():
    t = torch.arange(12, dtype=torch.float64).reshape(3, 4) % 3
    tt = t.T
    assert not tt.is_contiguous()
    bits, values = pack_sparse(tt)
    assert torch.equal(unpack_sparse(bits, values, tt.shape), tt)


def test_a_dry_run_sums_shapes_not_values():
    total = WeightedSum()
    for _ in range(3):
        total.add({"w": torch.empty(2, 3, device="meta")}, 1.0)
    mean = total.mean()["w"]
    assert mean.is_meta and mean.shape == (2, 3) and mean.dtype == torch.float32


def test_latest_is_the_clients_own_upload_or_else_the_initial_model():
    from fedfactor.fl.state import latest

    init, mine = {"w": torch.zeros(2)}, {"w": torch.ones(2)}
    models = {"1": mine}
    assert latest(models, init, 1) is mine
    assert latest(models, init, 0) is init

import pytest
import torch

from fedfactor.fl.comm import CommMeter
from fedfactor.fl.state import nbytes, weighted_average


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

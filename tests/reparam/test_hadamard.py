"""Tests for fedfactor.reparam.hadamard: FedPara's low-rank Hadamard layers (W1 o W2, pFedPara W1 o (W2 + 1))."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedfactor.models import build_model
from fedfactor.reparam import Hadamard, gamma_for_share, hadamard_layers, hadamardize, rank_bounds, rank_for


def _set(layer: Hadamard, **values) -> Hadamard:
    with torch.no_grad():
        for name, value in values.items():
            getattr(layer, name).copy_(torch.tensor(value, dtype=torch.float64))
    return layer


# ---------------------------------------------------------------- the weight, by hand


def test_linear_weight_is_w1_times_w2_plus_one_by_hand():
    # O = 2 outputs, I = 3 inputs, rank 1
    f = _set(Hadamard(nn.Linear(3, 2).double(), rank=1),
             x1=[[1.0], [2.0]], y1=[[1.0], [0.0], [-1.0]],  # W1 = [[1, 0, -1], [2, 0, -2]]
             x2=[[1.0], [-1.0]], y2=[[2.0], [1.0], [0.0]])  # W2 = [[2, 1, 0], [-2, -1, 0]]
    expected = torch.tensor([[3.0, 0.0, -1.0], [-2.0, 0.0, -2.0]], dtype=torch.float64)  # W1 o (W2 + 1)
    assert torch.equal(f.weight, expected)
    assert set(f.state_dict()) == {"x1", "y1", "x2", "y2", "bias"}  # no core for a fully connected layer
    f.personal = False  # FedPara's W1 o W2
    assert torch.equal(f.weight, torch.tensor([[2.0, 0.0, 0.0], [-4.0, 0.0, 0.0]], dtype=torch.float64))


def test_conv_weight_tensor_form_by_hand():
    # O = 1 filter, I = 2 input channels, 2x2 kernel, rank 1: W_j[0, i, p, q] = t_j[p, q] x_j[0] y_j[i]
    f = _set(Hadamard(nn.Conv2d(2, 1, 2).double(), rank=1),
             t1=[[[[1.0, 2.0], [3.0, 4.0]]]], x1=[[2.0]], y1=[[1.0], [-1.0]],
             t2=[[[[0.0, 1.0], [0.0, 1.0]]]], x2=[[1.0]], y2=[[1.0], [2.0]])
    # W1[0, 0] = [[2, 4], [6, 8]], W1[0, 1] = -W1[0, 0]; W2 + 1: [[1, 2], [1, 2]] and [[1, 3], [1, 3]]
    expected = torch.tensor([[[[2.0, 8.0], [6.0, 16.0]], [[-2.0, -12.0], [-6.0, -24.0]]]], dtype=torch.float64)
    assert torch.equal(f.weight, expected)
    assert set(f.state_dict()) == {"t1", "x1", "y1", "t2", "x2", "y2", "bias"}


def test_conv_weight_equals_the_tucker_sum_element_by_element():
    torch.manual_seed(0)
    O, I, k, r = 3, 2, 2, 2
    f = Hadamard(nn.Conv2d(I, O, k).double(), rank=r)
    assert f.t1.shape == (r, r, k, k) and f.x1.shape == (O, r) and f.y1.shape == (I, r)
    W = f.weight.detach()

    def part(t, x, y, o, i, p, q):
        return sum(t[a, b, p, q] * x[o, a] * y[i, b] for a in range(r) for b in range(r))

    for o in range(O):
        for i in range(I):
            for p in range(k):
                for q in range(k):
                    w1 = part(f.t1, f.x1, f.y1, o, i, p, q)
                    w2 = part(f.t2, f.x2, f.y2, o, i, p, q)
                    torch.testing.assert_close(W[o, i, p, q], (w1 * (w2 + 1)).detach())


@pytest.mark.parametrize("make, x", [
    (lambda: nn.Linear(5, 4), torch.randn(3, 5)),
    (lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1, dilation=1), torch.randn(2, 3, 7, 7)),
    (lambda: nn.Conv2d(2, 3, 3, padding=2, dilation=2, bias=False), torch.randn(2, 2, 6, 6)),
], ids=["linear", "conv-stride", "conv-dilation"])
def test_forward_is_the_plain_op_with_that_weight_and_bias(make, x):
    torch.manual_seed(0)
    layer = make()
    f = Hadamard(layer, rank=2)
    w = f.weight
    if isinstance(layer, nn.Conv2d):
        expected = F.conv2d(x, w, layer.bias, stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
    else:
        expected = F.linear(x, w, layer.bias)
    torch.testing.assert_close(f(x), expected)
    assert (f.bias is None) == (layer.bias is None)
    if layer.bias is not None:
        assert torch.equal(f.bias, layer.bias) and f.bias is not layer.bias


def test_functional_call_with_a_state_of_factors():
    torch.manual_seed(0)
    f = Hadamard(nn.Linear(4, 3), rank=2)
    state = {k: torch.randn_like(v) for k, v in f.state_dict().items()}
    x = torch.randn(2, 4)
    W = (state["x1"] @ state["y1"].T) * (state["x2"] @ state["y2"].T + 1)
    torch.testing.assert_close(functional_call(f, state, (x,)), x @ W.T + state["bias"])


# ---------------------------------------------------------------- ranks and parameter counts


@pytest.mark.parametrize("shape, bounds", [
    ((256, 256, 3, 3), (16, 154)),  # r_max: 2 (9 r^2 + 512 r) <= 589,824 holds at 154 (584,584), not 155 (591,170)
    ((64, 32, 5, 5), (6, 30)),  # ceil(sqrt 32) = 6; 2 (25 * 900 + 96 * 30) = 50,760 <= 51,200 < 2 (25 * 961 + 96 * 31)
    ((512, 256), (16, 85)),  # 2 * 85 * 768 = 130,560 <= 131,072 < 2 * 86 * 768
    ((10, 512), (4, 4)),  # ceil(sqrt 10) = 4; 2 * 4 * 522 = 4,176 <= 5,120 < 2 * 5 * 522
    ((2, 512), (2, 0)),  # a 2-class head: 2 * 1 * 514 > 1,024, so r_max = 0 < r_min
])
def test_rank_bounds_by_hand(shape, bounds):
    assert rank_bounds(shape) == bounds


def test_rank_rule_interpolates_and_rounds_up():
    assert rank_for((64, 32, 5, 5), 0.0) == 6 and rank_for((64, 32, 5, 5), 1.0) == 30
    assert rank_for((64, 32, 5, 5), 0.5) == 18  # 0.5 * 6 + 0.5 * 30
    assert rank_for((64, 32, 5, 5), 0.51) == 19  # 18.24 rounds up
    assert rank_for((2, 512), 1.0) == 1  # never below 1


def _small():
    # conv 4 -> 8, 3x3 (288 weights + 8 biases); fc 32 -> 16 (512 weights + 16 biases): 824 parameters
    return nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(32, 16))


def test_parameter_counts_and_ranks_for_a_target_share_by_hand():
    # conv: r_min = ceil(sqrt 4) = 2, r_max = 3 (2 (9 * 9 + 12 * 3) = 234 <= 288 < 2 (9 * 16 + 12 * 4) = 384);
    #   one set holds 9 r^2 + 12 r: 60 at r = 2, 117 at r = 3
    # fc: r_min = ceil(sqrt 16) = 4, r_max = floor(512 / 96) = 5; one set holds 48 r: 192 at 4, 240 at 5
    # gamma = 0 -> ranks (2, 4): 24 + 2 * 60 + 2 * 192 = 528 of 824; any gamma > 0 -> (3, 5): 738 of 824
    assert rank_bounds((8, 4, 3, 3)) == (2, 3) and rank_bounds((16, 32)) == (4, 5)
    gamma, share = gamma_for_share(_small(), 0.95)
    assert share == pytest.approx(738 / 824) and 0 < gamma <= 0.001
    assert gamma_for_share(_small(), 0.7) == (0.0, pytest.approx(528 / 824))  # |0.70 - 0.641| < |0.70 - 0.896|
    with pytest.raises(ValueError, match="smallest"):
        gamma_for_share(_small(), 0.5)

    model = hadamardize(_small(), gamma)
    conv, fc = hadamard_layers(model).values()
    assert (conv.rank, fc.rank) == (3, 5)
    assert sum(p.numel() for p in model.parameters()) == 738
    assert [conv.t1.numel(), conv.x1.numel(), conv.y1.numel()] == [81, 24, 12]
    assert [fc.x1.numel(), fc.y1.numel()] == [80, 160]


@pytest.mark.parametrize("name, shape", [("cnn", (1, 8, 8)), ("resnet9", (3, 32, 32))])
def test_default_share_is_near_95_percent_for_the_study_models(name, shape):
    model = build_model(name, *shape, 10)
    total = sum(p.numel() for p in model.parameters())
    gamma, share = gamma_for_share(model, 0.95)
    hadamardize(model, gamma)
    assert sum(p.numel() for p in model.parameters()) / total == pytest.approx(share)
    assert abs(share - 0.95) < 0.005


# ---------------------------------------------------------------- the model transform


@pytest.mark.parametrize("name, shape", [("cnn", (1, 8, 8)), ("resnet8", (3, 16, 16))])
def test_hadamardize_replaces_every_dense_layer_and_keeps_batchnorm(name, shape):
    torch.manual_seed(0)
    model = build_model(name, *shape, 10)
    dense = {n: m for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}
    bns = {n: m for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    assert hadamardize(model, 0.5) is model
    layers = hadamard_layers(model)
    assert list(layers) == list(dense)
    assert not [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert all(dict(model.named_modules())[n] is m for n, m in bns.items())
    for n, f in layers.items():
        assert f.shape == tuple(dense[n].weight.shape) and f.rank == rank_for(f.shape, 0.5)
        assert f.factor_names(1) == (["x1", "y1", "t1"] if f.conv else ["x1", "y1"])
    model.eval()
    assert model(torch.randn(2, *shape)).shape == (2, 10)


def test_a_bare_layer_becomes_its_hadamard_layer():
    out = hadamardize(nn.Linear(16, 8), 1.0)
    assert isinstance(out, Hadamard) and out.rank == rank_for((8, 16), 1.0)


def test_gradients_reach_both_factor_sets():
    torch.manual_seed(0)
    model = hadamardize(build_model("cnn", 1, 8, 8, 10), 0.5)
    F.cross_entropy(model(torch.randn(4, 1, 8, 8)), torch.tensor([0, 1, 2, 3])).backward()
    for n, f in hadamard_layers(model).items():
        for p in f.factor_names(1) + f.factor_names(2):
            grad = getattr(f, p).grad
            assert grad is not None and grad.abs().sum() > 0, (n, p)


def test_init_is_he_normal_with_each_factors_own_fan():
    torch.manual_seed(0)
    f = Hadamard(nn.Conv2d(200, 300, 3), rank=40)
    for name, std in (("x1", math.sqrt(2 / 300)), ("y2", math.sqrt(2 / 200)), ("t1", math.sqrt(2 / (40 * 9)))):
        p = getattr(f, name).detach()
        assert abs(float(p.mean())) < 0.1 * std and float(p.std()) == pytest.approx(std, rel=0.05), name


def test_scaled_init_starts_at_the_replaced_layers_weight_scale():
    torch.manual_seed(0)
    # the cnn's conv 32 -> 64 and fc 256 -> 512 at the ranks the default capacity gives them
    for layer, rank in ((nn.Conv2d(32, 64, 5), 29), (nn.Linear(256, 512), 82)):
        plain = Hadamard(layer, rank=rank).weight.std()
        scaled = Hadamard(layer, rank=rank, init="scaled")
        assert torch.isclose(scaled.weight.std(), layer.weight.std(), rtol=1e-4)
        assert plain > 1.25 * layer.weight.std()  # why the option exists: He-normal factors start large
        assert float(scaled.x2.detach().std()) == pytest.approx(math.sqrt(2 / scaled.shape[0]), rel=0.1)  # W2 as drawn


def test_works_on_the_meta_device():
    with torch.device("meta"):
        model = build_model("resnet9", 3, 32, 32, 10)
        gamma, _ = gamma_for_share(model, 0.95)
        hadamardize(model, gamma)
    assert all(p.device.type == "meta" for p in model.parameters())
    out = model(torch.empty(2, 3, 32, 32, device="meta"))
    assert out.shape == (2, 10) and out.device.type == "meta"


def test_invalid_input_is_rejected():
    with pytest.raises(ValueError, match="rank"):
        Hadamard(nn.Linear(3, 2), rank=0)
    with pytest.raises(ValueError, match="gamma"):
        hadamardize(_small(), 1.5)
    with pytest.raises(ValueError, match="init"):
        Hadamard(nn.Linear(3, 2), rank=1, init="zeros")
    with pytest.raises(ValueError, match="init"):
        hadamardize(_small(), 0.5, init="zeros")
    with pytest.raises(ValueError, match="square"):
        Hadamard(nn.Conv2d(4, 4, 3, groups=2), rank=2)

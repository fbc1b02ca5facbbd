import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedfactor.reparam.lowrank import LowRankConv2d, LowRankLinear, decompose, lowrank_layers, rank_for


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 4 * 4, 5))


def _gen(seed=1):
    return torch.Generator().manual_seed(seed)


def test_a_decomposed_model_starts_as_the_plain_one_and_leaves_the_global_random_stream_alone():
    net = _net()
    x = torch.randn(4, 3, 4, 4)
    before = net(x)
    keys = list(net.state_dict())
    rng = torch.get_rng_state()
    decompose(net, 0.5, 0.5, generator=_gen())
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(net(x), before)  # B = 0: tau = 0 exactly
    assert isinstance(net[0], nn.Conv2d) and isinstance(net[4], nn.Linear)  # still found as such
    assert set(keys) <= set(net.state_dict())  # sigma keeps the weight's key
    assert [k for k in net.state_dict() if k not in keys] == ["0.tau_a", "0.tau_b", "4.tau_a", "4.tau_b"]
    assert list(lowrank_layers(net)) == ["0", "4"]


@pytest.mark.parametrize("ratio, n, rank", [(0.6, 10, 6), (0.2, 64, 12), (0.8, 3, 2), (0.1, 3, 1), (1.0, 7, 7)])
def test_rank_is_the_floor_of_ratio_times_size_and_at_least_one(ratio, n, rank):
    assert rank_for(ratio, n) == rank


def test_paper_shapes_follow_eqs_3_and_4():
    net = decompose(_net(), 0.5, 0.4, generator=_gen())
    conv, fc = net[0], net[4]
    r = rank_for(0.5, min(3, 8))  # 1
    assert conv.tau_b.shape == (3 * 3, r * 3) and conv.tau_a.shape == (r * 3, 8 * 3)
    r = rank_for(0.4, min(128, 5))  # 2
    assert fc.tau_b.shape == (128, r) and fc.tau_a.shape == (r, 5)
    assert torch.count_nonzero(conv.tau_b) == 0 and torch.count_nonzero(fc.tau_b) == 0


def test_official_shapes_scale_and_absolute_linear_rank():
    net = decompose(_net(), 0.5, 0.4, linear_rank=40, style="official", generator=_gen())
    conv, fc = net[0], net[4]
    r = math.floor(0.5 * 8)  # a share of the output channels, not of min(I, O)
    assert conv.tau_a.shape == (r * 3, 3 * 3) and conv.tau_b.shape == (8 * 3, r * 3) and conv.tau_scale == 1 / r
    assert fc.tau_a.shape == (40, 128) and fc.tau_b.shape == (5, 40) and fc.tau_scale == 1 / 40
    # kaiming-uniform with a = sqrt(5): bound 1 / sqrt(fan_in)
    assert conv.tau_a.abs().max() <= 1 / math.sqrt(9) and fc.tau_a.abs().max() <= 1 / math.sqrt(128)


def test_paper_tau_maps_the_matrix_onto_the_kernel_as_eq_4_reshapes_it():
    conv = decompose(nn.Conv2d(2, 3, 3), 1.0, 1.0, generator=_gen())
    with torch.no_grad():
        conv.tau_b.normal_(generator=_gen(2))
    m = conv.tau_b @ conv.tau_a  # (I K) x (O K)
    tau = conv.tau()
    K = 3
    for o, i, p, q in [(0, 0, 0, 0), (2, 1, 1, 2), (1, 0, 2, 1), (2, 1, 2, 2)]:
        assert tau[o, i, p, q].item() == pytest.approx(m[i * K + p, o * K + q].item())
    # the rank of the (I K) x (O K) matrix is at most r K
    assert torch.linalg.matrix_rank(m) <= conv.tau_rank * K


def test_official_tau_is_the_raw_view_divided_by_the_rank():
    conv = decompose(nn.Conv2d(2, 4, 3), 0.5, 1.0, style="official", generator=_gen())
    with torch.no_grad():
        conv.tau_b.normal_(generator=_gen(2))
    expected = (conv.tau_b @ conv.tau_a).view(4, 2, 3, 3) / 2
    assert torch.allclose(conv.tau(), expected)
    fc = decompose(nn.Linear(6, 4), 1.0, 0.5, style="official", generator=_gen())
    with torch.no_grad():
        fc.tau_b.normal_(generator=_gen(3))
    assert torch.allclose(fc.tau(), fc.tau_b @ fc.tau_a / 2)


def test_paper_linear_tau_is_the_transposed_product_of_rank_r():
    fc = decompose(nn.Linear(6, 4), 1.0, 0.5, generator=_gen())
    with torch.no_grad():
        fc.tau_b.normal_(generator=_gen(3))
    assert torch.equal(fc.tau(), (fc.tau_b @ fc.tau_a).T)
    assert torch.linalg.matrix_rank(fc.tau()) == 2


@pytest.mark.parametrize("style", ["paper", "official"])
def test_forward_uses_sigma_plus_tau_and_functional_call_takes_a_state(style):
    net = decompose(_net(), 0.5, 0.5, style=style, generator=_gen())
    with torch.no_grad():
        for layer in lowrank_layers(net).values():
            layer.tau_b.normal_(generator=_gen(4))
    conv, fc = net[0], net[4]
    x = torch.randn(2, 3, 4, 4)
    assert torch.allclose(conv(x), F.conv2d(x, conv.weight + conv.tau(), conv.bias, padding=1), atol=1e-6)
    h = torch.randn(2, 128)
    assert torch.allclose(fc(h), h @ (fc.weight + fc.tau()).T + fc.bias, atol=1e-5)
    # A state dict with other factors: the layer computes with those.
    state = {k: v.clone() for k, v in net.state_dict().items()}
    state["4.tau_b"] = torch.zeros_like(state["4.tau_b"])
    net.eval()
    out = torch.func.functional_call(net, state, (x,))
    features = net[:4](x)
    assert torch.allclose(out, features @ fc.weight.T + fc.bias, atol=1e-5)


def test_paper_init_draws_rows_of_unit_expected_norm():
    fc = decompose(nn.Linear(400, 300), 1.0, 0.5, generator=_gen())
    assert fc.tau_a.shape == (150, 300)
    assert fc.tau_a.std().item() == pytest.approx(1 / math.sqrt(300), rel=0.02)
    assert fc.tau_a.square().sum(1).mean().item() == pytest.approx(1.0, rel=0.02)


def test_the_generator_decides_the_draws():
    a = decompose(_net(), 0.5, 0.5, generator=_gen(7))
    b = decompose(_net(), 0.5, 0.5, generator=_gen(7))
    c = decompose(_net(), 0.5, 0.5, generator=_gen(8))
    assert torch.equal(a[0].tau_a, b[0].tau_a) and not torch.equal(a[0].tau_a, c[0].tau_a)


def test_shapes_only_on_the_meta_device():
    with torch.device("meta"):
        net = decompose(_net(), 0.5, 0.5, generator=_gen())
    assert net[0].tau_a.is_meta and net[4].tau().shape == (5, 128)


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="conv_ratio must be in"):
        decompose(_net(), 0.0, 0.5)
    with pytest.raises(ValueError, match="linear_ratio must be in"):
        decompose(_net(), 0.5, 1.5)
    with pytest.raises(ValueError, match="style"):
        decompose(_net(), 0.5, 0.5, style="lora")
    with pytest.raises(ValueError, match="ungrouped"):
        decompose(nn.Conv2d(4, 4, 3, groups=2), 0.5, 0.5)


def test_a_decomposed_layer_is_not_decomposed_again():
    net = decompose(_net(), 0.5, 0.5, generator=_gen())
    first = net[0].tau_a
    decompose(net, 0.5, 0.5, generator=_gen(9))
    assert net[0].tau_a is first and type(net[0]) is LowRankConv2d and type(net[4]) is LowRankLinear


def test_a_frozen_tau_is_multiplied_once_and_again_after_every_change(monkeypatch):
    net = decompose(_net(), 0.5, 0.5, generator=_gen())
    with torch.no_grad():
        for layer in lowrank_layers(net).values():
            layer.tau_b.normal_(generator=_gen(4))
    products = []
    tau = LowRankConv2d.tau
    monkeypatch.setattr(LowRankConv2d, "tau", lambda self, *a: products.append(1) or tau(self, *a))
    conv, x = net[0], torch.randn(2, 3, 4, 4)

    def expected():
        return F.conv2d(x, conv.weight + tau(conv), conv.bias, padding=1)

    # training tau: a new product (and gradient) every forward
    conv(x).sum().backward()
    conv(x)
    assert len(products) == 2 and conv.tau_b.grad is not None
    # tau frozen, sigma trained (FedDecomp's sigma phase): one product for all steps, sigma's gradient intact
    for p in (conv.tau_b, conv.tau_a):
        p.requires_grad_(False)
    opt = torch.optim.SGD([conv.weight], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        out = conv(x)
        assert torch.allclose(out, expected(), atol=1e-6)
        out.square().sum().backward()
        assert conv.weight.grad.abs().sum() > 0
        opt.step()
    assert len(products) == 3
    # a state loaded in place changes tau: the next forward uses the new factors
    with torch.no_grad():
        conv.tau_a.copy_(torch.randn_like(conv.tau_a))
    assert torch.allclose(conv(x), expected(), atol=1e-6)
    assert len(products) == 4
    # factors given by functional_call are never the cached ones
    state = dict(net.state_dict())
    state["0.tau_b"] = torch.zeros_like(state["0.tau_b"])
    out = torch.func.functional_call(conv, {k[2:]: v for k, v in state.items() if k.startswith("0.")}, (x,))
    assert torch.allclose(out, F.conv2d(x, conv.weight, conv.bias, padding=1), atol=1e-6)

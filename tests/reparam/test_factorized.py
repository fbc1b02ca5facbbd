"""Tests for fedfactor.reparam.factorized: W = pi(u v^T + mu) (000 eqs. 2-3, 003 eq. 6)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedfactor.models import build_model
from fedfactor.reparam import LAYOUTS, Factorized, factorize, factorized_layers, to_weight

O, I, K = 2, 3, 2  # a tiny conv: 2 filters, 3 input channels, 2x2 kernels


def _conv(o=O, i=I, k=K, **kw):
    return nn.Conv2d(i, o, k, **kw)


def _randomize(layer: Factorized, seed: int = 0) -> Factorized:
    """Give u, v and mu distinct random values (mu starts at zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (layer.u, layer.v, layer.mu):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return layer


# ---------------------------------------------------------------- shapes


@pytest.mark.parametrize("layout, rows, cols", [
    ("paper", K * K, I * O),
    ("official", K * K, I * O),
    ("simfed", I * K, O * K),
])
@pytest.mark.parametrize("rank", [1, 3])
def test_conv_factor_shapes_per_layout(layout, rows, cols, rank):
    f = Factorized(_conv(), layout=layout, rank=rank)
    assert f.u.shape == (rows, rank)
    assert f.v.shape == (cols, rank)
    assert f.mu.shape == (rows, cols)
    assert f.weight.shape == (O, I, K, K)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rank", [1, 4])
def test_linear_factor_shapes_in_every_layout(layout, rank):
    f = Factorized(nn.Linear(5, 7), layout=layout, rank=rank)
    assert f.u.shape == (5, rank)
    assert f.v.shape == (7, rank)
    assert f.mu.shape == (5, 7)
    assert f.weight.shape == (7, 5)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("make", [lambda: _conv(), lambda: nn.Linear(4, 3)], ids=["conv", "linear"])
def test_mu_starts_at_zero_and_factors_do_not(layout, make):
    f = Factorized(make(), layout=layout)
    assert torch.equal(f.mu, torch.zeros_like(f.mu))
    assert f.u.abs().sum() > 0 and f.v.abs().sum() > 0


def test_use_mu_false_has_no_mu_and_weight_is_rank_r():
    f = Factorized(nn.Linear(6, 5), rank=2, use_mu=False)
    assert f.mu is None
    assert set(f.state_dict()) == {"u", "v", "bias"}
    assert torch.linalg.matrix_rank(f.weight.detach()) <= 2


def test_dtype_and_bias_follow_the_original_layer():
    lin = nn.Linear(4, 3).double()
    f = Factorized(lin)
    assert f.u.dtype == f.v.dtype == f.mu.dtype == torch.float64
    assert torch.equal(f.bias, lin.bias)
    assert f.bias is not lin.bias
    assert Factorized(nn.Linear(4, 3, bias=False)).bias is None


# ---------------------------------------------------------------- reconstruction


def _loop_weight(layout, u, v, mu, o_n, i_n, k):
    W = torch.zeros(o_n, i_n, k, k, dtype=u.dtype)
    R = u.shape[1]
    for o in range(o_n):
        for i in range(i_n):
            for p in range(k):
                for q in range(k):
                    if layout == "paper":
                        a, b = p * k + q, o * i_n + i
                    elif layout == "simfed":
                        a, b = i * k + p, o * k + q
                    else:
                        raise AssertionError(layout)
                    W[o, i, p, q] = sum(u[a, r] * v[b, r] for r in range(R)) + mu[a, b]
    return W


@pytest.mark.parametrize("layout", ["paper", "simfed"])
@pytest.mark.parametrize("rank", [1, 2])
def test_conv_weight_matches_the_definition_elementwise(layout, rank):
    f = _randomize(Factorized(_conv().double(), layout=layout, rank=rank))
    u, v, mu = f.u.detach(), f.v.detach(), f.mu.detach()
    expected = _loop_weight(layout, u, v, mu, O, I, K)
    torch.testing.assert_close(f.weight.detach(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rank", [1, 2])
def test_official_weight_is_the_raw_reshape(rank):
    f = _randomize(Factorized(_conv().double(), layout="official", rank=rank))
    u, v, mu = f.u.detach(), f.v.detach(), f.mu.detach()
    m = torch.zeros(K * K, O * I, dtype=torch.float64)
    for a in range(K * K):
        for b in range(O * I):
            m[a, b] = sum(u[a, r] * v[b, r] for r in range(rank)) + mu[a, b]
    flat = m.reshape(-1)  # row-major, exactly what a raw .view(O, I, k, k) reads
    W = f.weight.detach()
    for o in range(O):
        for i in range(I):
            for p in range(K):
                for q in range(K):
                    n = ((o * I + i) * K + p) * K + q
                    assert abs(W[o, i, p, q] - flat[n]) < 1e-12
    torch.testing.assert_close(W, (u @ v.T + mu).reshape(O, I, K, K), rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rank", [1, 2])
def test_linear_weight_matches_the_definition_elementwise(layout, rank):
    f = _randomize(Factorized(nn.Linear(3, 2).double(), layout=layout, rank=rank))
    u, v, mu = f.u.detach(), f.v.detach(), f.mu.detach()
    W = f.weight.detach()
    for o in range(2):
        for i in range(3):
            expected = sum(u[i, r] * v[o, r] for r in range(rank)) + mu[i, o]
            assert abs(W[o, i] - expected) < 1e-12


def test_paper_layout_u_scales_each_kernel_position_of_every_filter():
    f = Factorized(_conv(k=3).double(), layout="paper", rank=1)
    _randomize(f)
    with torch.no_grad():
        f.mu.zero_()
    W = f.weight.detach()
    u, v = f.u.detach()[:, 0], f.v.detach()[:, 0]
    for p in range(9):
        torch.testing.assert_close(W[:, :, p // 3, p % 3], u[p] * v.reshape(O, I), rtol=0, atol=1e-12)


def test_layouts_differ_on_the_same_matrix():
    # same (k*k) x (O*I) matrix, different placement: paper ties rows to kernel positions, official not
    m = torch.arange(K * K * O * I, dtype=torch.float64).reshape(K * K, O * I)
    assert not torch.equal(to_weight(m, (O, I, K, K), "paper"), to_weight(m, (O, I, K, K), "official"))


def test_to_weight_linear_is_the_transpose():
    m = torch.randn(4, 3)
    for layout in LAYOUTS:
        assert torch.equal(to_weight(m, (3, 4), layout), m.T)


# ---------------------------------------------------------------- forward


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("conv_kw", [
    dict(),
    dict(stride=2, padding=1, bias=False),
    dict(padding=2, dilation=2),
])
def test_conv_forward_equals_conv2d_with_its_weight(layout, conv_kw):
    conv = nn.Conv2d(3, 4, 3, **conv_kw)
    f = _randomize(Factorized(conv, layout=layout, rank=2))
    x = torch.randn(2, 3, 9, 9)
    expected = F.conv2d(x, f.weight, f.bias, stride=conv.stride, padding=conv.padding, dilation=conv.dilation)
    torch.testing.assert_close(f(x), expected)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_linear_forward_equals_linear_with_its_weight(layout):
    f = _randomize(Factorized(nn.Linear(5, 3), layout=layout))
    x = torch.randn(4, 5)
    torch.testing.assert_close(f(x), F.linear(x, f.weight, f.bias))


MODEL_INPUTS = [("resnet9", (3, 32, 32)), ("cnn", (1, 8, 8)), ("mlp", (1, 8, 8))]


def _dense_layers(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}


@pytest.mark.parametrize("name, shape", MODEL_INPUTS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_factorize_replaces_every_dense_layer_and_keeps_batchnorm(name, shape, layout):
    torch.manual_seed(0)
    model = build_model(name, *shape, 10)
    dense = _dense_layers(model)
    bns = {n: m for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    x = torch.randn(1, *shape)
    model.eval()
    with torch.no_grad():
        before = model(x).shape

    out = factorize(model, layout=layout)
    assert out is model
    assert _dense_layers(model) == {}
    layers = factorized_layers(model)
    assert list(layers) == list(dense)
    for n, f in layers.items():
        assert isinstance(f, Factorized)
        assert f.shape == tuple(dense[n].weight.shape)
        assert (f.bias is None) == (dense[n].bias is None)
    # the very same BatchNorm modules stay in place
    after_bns = {n: m for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    assert after_bns.keys() == bns.keys()
    assert all(after_bns[n] is bns[n] for n in bns)
    with torch.no_grad():
        assert model(x).shape == before == (1, 10)

    keys = set(model.state_dict())
    expected = set()
    for n, m in dense.items():
        expected |= {f"{n}.u", f"{n}.v", f"{n}.mu"} | ({f"{n}.bias"} if m.bias is not None else set())
    for n, m in bns.items():
        expected |= {f"{n}.{k}" for k in m.state_dict()}
    assert keys == expected


@pytest.mark.parametrize("make", [lambda: nn.Linear(3, 2), lambda: nn.Conv2d(2, 3, 3)], ids=["linear", "conv"])
def test_factorize_of_a_bare_layer_factorizes_it_or_refuses(make):
    # A model that is itself a Conv2d/Linear cannot be changed in place: factorize must either
    # return the Factorized layer or refuse, not leave the dense layer in charge with a nameless child.
    try:
        out = factorize(make())
    except ValueError:
        return
    assert isinstance(out, Factorized)
    assert set(out.state_dict()) == {"u", "v", "mu", "bias"}


def test_factorize_passes_rank_use_mu_and_threshold():
    model = factorize(build_model("cnn", 1, 8, 8, 10), layout="simfed", rank=3, use_mu=False, threshold=0.5)
    for f in factorized_layers(model).values():
        assert f.layout == "simfed" and f.rank == 3 and f.mu is None and f.threshold == 0.5
        assert f.u.shape[1] == f.v.shape[1] == 3


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradients_reach_u_v_and_mu(layout):
    torch.manual_seed(0)
    model = factorize(build_model("cnn", 1, 8, 8, 10), layout=layout)
    model.train()
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    F.cross_entropy(model(x), y).backward()
    for n, f in factorized_layers(model).items():
        for p in (f.u, f.v, f.mu):
            assert p.grad is not None and p.grad.abs().sum() > 0, n


# ---------------------------------------------------------------- pruning and state


def _pruning_layer(threshold):
    f = _randomize(Factorized(nn.Linear(4, 3), threshold=threshold), seed=1)
    with torch.no_grad():
        f.mu.copy_(torch.tensor([[0.05, -0.5, 0.25],
                                 [-0.2, 0.01, 1.0],
                                 [0.3, -0.249, 0.0],
                                 [-0.25, 0.7, -0.1]]))
    return f


def test_small_mu_entries_are_pruned_in_eval_mode_only():
    t = 0.25
    f = _pruning_layer(t)
    x = torch.randn(6, 4)
    u, v, mu = f.u.detach(), f.v.detach(), f.mu.detach()
    kept = torch.where(mu.abs() >= t, mu, torch.zeros_like(mu))  # |mu| == t is kept
    assert (kept != mu).sum() == 5
    with torch.no_grad():
        f.eval()
        torch.testing.assert_close(f(x), F.linear(x, (u @ v.T + kept).T, f.bias))
        f.train()
        torch.testing.assert_close(f(x), F.linear(x, (u @ v.T + mu).T, f.bias))
        train_out = f(x)
        f.eval()
        assert not torch.allclose(f(x), train_out)


def test_pruned_entries_do_not_affect_the_eval_output():
    f = _pruning_layer(0.25)
    x = torch.randn(6, 4)
    f.eval()
    with torch.no_grad():
        ref = f(x)
        small = f.mu.abs() < 0.25
        f.mu[small] = f.mu[small] * -0.5 + 0.1  # other values, still below the threshold
        assert (f.mu[small].abs() < 0.25).all()
        torch.testing.assert_close(f(x), ref)
        f.train()
        assert not torch.allclose(f(x), ref)


def test_threshold_zero_never_prunes():
    f = _pruning_layer(0.0)
    x = torch.randn(6, 4)
    with torch.no_grad():
        f.eval()
        ev = f(x)
        f.train()
        torch.testing.assert_close(f(x), ev, rtol=0, atol=0)


def test_threshold_is_not_state():
    f = _pruning_layer(0.25)
    assert set(f.state_dict()) == {"u", "v", "mu", "bias"}


def test_functional_call_with_a_state_dict_drives_the_weight():
    f = _randomize(Factorized(nn.Conv2d(2, 3, 3, padding=1), layout="paper", rank=2))
    g = torch.Generator().manual_seed(7)
    state = {k: torch.randn(v.shape, generator=g) for k, v in f.state_dict().items()}
    own = {k: v.clone() for k, v in f.state_dict().items()}
    x = torch.randn(2, 2, 5, 5)
    out = functional_call(f, state, (x,))
    W = to_weight(state["u"] @ state["v"].T + state["mu"], (3, 2, 3, 3), "paper")
    torch.testing.assert_close(out, F.conv2d(x, W, state["bias"], padding=1))
    # the layer's own parameters are untouched
    assert all(torch.equal(f.state_dict()[k], own[k]) for k in own)


def test_functional_call_prunes_the_given_mu_in_eval_mode():
    f = Factorized(nn.Linear(3, 2), threshold=0.5).eval()
    u, v = torch.ones(3, 1), torch.ones(2, 1)
    mu = torch.tensor([[0.4, 0.6], [-0.1, -0.9], [0.0, 2.0]])
    bias = torch.zeros(2)
    x = torch.eye(3)
    out = functional_call(f, {"u": u, "v": v, "mu": mu, "bias": bias}, (x,))
    expected = (1.0 + torch.tensor([[0.0, 0.6], [0.0, -0.9], [0.0, 2.0]]))  # row i = input i
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_state_dict_fully_determines_the_layer(layout):
    torch.manual_seed(0)
    a = _randomize(Factorized(nn.Conv2d(2, 3, 3), layout=layout), seed=3)
    torch.manual_seed(1)
    b = Factorized(nn.Conv2d(2, 3, 3), layout=layout)
    x = torch.randn(1, 2, 6, 6)
    assert not torch.allclose(a(x), b(x))
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b(x), a(x), rtol=0, atol=0)


# ---------------------------------------------------------------- invalid input and meta device


def test_unknown_layout_is_rejected():
    with pytest.raises(ValueError):
        Factorized(_conv(), layout="bogus")
    with pytest.raises(ValueError):
        factorize(build_model("mlp", 1, 8, 8, 10), layout="bogus")


@pytest.mark.parametrize("rank", [0, -1])
def test_rank_below_one_is_rejected(rank):
    with pytest.raises(ValueError):
        Factorized(nn.Linear(3, 2), rank=rank)
    with pytest.raises(ValueError):
        Factorized(_conv(), rank=rank)


@pytest.mark.parametrize("conv", [
    lambda: nn.Conv2d(4, 4, 3, groups=2),
    lambda: nn.Conv2d(4, 4, 3, groups=4),
    lambda: nn.Conv2d(4, 4, (3, 1)),
    lambda: nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"),
], ids=["groups2", "depthwise", "non-square", "reflect-padding"])
def test_unsupported_convolutions_are_rejected(conv):
    with pytest.raises(ValueError):
        Factorized(conv())


@pytest.mark.parametrize("name, shape", MODEL_INPUTS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_factorize_works_on_the_meta_device(name, shape, layout):
    with torch.device("meta"):
        model = factorize(build_model(name, *shape, 10), layout=layout, rank=2)
    params = list(model.parameters())
    assert params and all(p.device.type == "meta" for p in params)
    for f in factorized_layers(model).values():
        assert f.u.shape[1] == 2 and f.weight.device.type == "meta"
        assert f.weight.shape == f.shape
    out = model(torch.empty(2, *shape, device="meta"))
    assert out.shape == (2, 10) and out.device.type == "meta"


def test_scaled_init_starts_at_the_replaced_layers_weight_scale():
    torch.manual_seed(0)
    for layer in (nn.Conv2d(16, 32, 3), nn.Linear(256, 512)):
        official = Factorized(layer, init="official").weight.std()
        scaled = Factorized(layer, init="scaled").weight.std()
        assert torch.isclose(scaled, layer.weight.std(), rtol=1e-4)
        assert official < 0.7 * layer.weight.std()  # why the option exists: Xavier factors start small
    with pytest.raises(ValueError, match="init"):
        Factorized(nn.Linear(4, 4), init="zeros")


def test_official_mu_init_starts_dense_mu_xavier_and_conv_mu_at_zero():
    torch.manual_seed(0)
    linear, conv = nn.Linear(40, 30), nn.Conv2d(3, 8, 3)
    dense = Factorized(linear, mu_init="official")
    bound = (6 / (40 + 30)) ** 0.5  # Xavier-uniform on the 40 x 30 matrix mu (I x O)
    assert dense.mu.abs().max() <= bound and dense.mu.abs().min() > 0
    assert dense.mu.std() > bound / 3  # spread over the range, not near zero: full rank from the start
    assert torch.linalg.matrix_rank(dense.matrix().detach()) == 30
    assert torch.count_nonzero(Factorized(conv, mu_init="official").mu) == 0
    assert torch.count_nonzero(Factorized(linear, mu_init="zero").mu) == 0
    assert torch.count_nonzero(Factorized(linear).mu) == 0  # the layer's default: the paper's zero


def test_official_bias_init_is_xavier_of_a_one_by_O_matrix():
    torch.manual_seed(0)
    linear = nn.Linear(256, 10)
    kept = Factorized(linear, bias_init="layer")
    assert torch.equal(kept.bias, linear.bias)
    redrawn = Factorized(linear, bias_init="official").bias
    bound = (6 / (1 + 10)) ** 0.5  # 0.74, against nn.Linear's 1 / sqrt(256) = 0.0625
    assert redrawn.abs().max() <= bound and redrawn.abs().max() > 1 / 256 ** 0.5
    with pytest.raises(ValueError, match="mu_init"):
        Factorized(linear, mu_init="xavier")

"""Tests for fedfactor.models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedfactor.errors import UsageError
from fedfactor.models import MODELS, build_model

SHAPES = [
    ("cnn", (1, 8, 8)),
    ("mlp", (1, 8, 8)),
    ("cnn", (1, 28, 28)),
    ("mlp", (1, 28, 28)),
    ("resnet9", (1, 28, 28)),
    ("cnn", (3, 32, 32)),
    ("mlp", (3, 32, 32)),
    ("resnet9", (3, 32, 32)),
    ("cnn_bn", (1, 8, 8)),
    ("cnn_bn", (3, 32, 32)),
]


def test_registry_lists_every_model_with_a_one_line_description():
    described = dict(MODELS.describe())
    assert set(described) == {"resnet9", "cnn", "cnn_bn", "mlp", "resnet18", "vgg16", "femnist_cnn", "resnet8", "resnet10",
                              "resnet8_cifar", "resnet10_cifar", "char_lstm", "femnist_cnn_softmax"}
    assert all(d and "\n" not in d for d in described.values())


def test_cnn_bn_has_batchnorm_after_each_conv_and_one_hidden_layer_before_the_head():
    model = build_model("cnn_bn", 1, 8, 8, 10)
    kinds = [type(m).__name__ for m in model.body.modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d, nn.Linear))]
    assert kinds == ["Conv2d", "BatchNorm2d", "Conv2d", "BatchNorm2d", "Linear"]
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Conv2d))  # BN's shift replaces it
    assert model.head.in_features == 64
    # 1*16*9 + 16*32*9 + 32*2*2*64 (+ biases, BN affine, head): 13,754, sized for 8x8 digits
    assert sum(p.numel() for p in model.parameters()) == 144 + 4_608 + 8_192 + 64 + 2 * (16 + 32) + 650 == 13_754


def test_resnet9_weight_count_matches_supplement_table4():
    model = build_model("resnet9", 3, 32, 32, 10)
    convs = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Conv2d))
    assert convs + model.head.weight.numel() == 2_568_384
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) == 8
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Conv2d))


@pytest.mark.parametrize("name, shape", SHAPES, ids=lambda v: str(v))
def test_output_shapes(name, shape):
    torch.manual_seed(0)
    model = build_model(name, *shape, num_classes=7)
    logits = model(torch.randn(3, *shape))
    assert logits.shape == (3, 7)
    logits.sum().backward()  # gradients reach the first layer of the body
    first = next(p for n, p in model.named_parameters() if n.startswith("body."))
    assert first.grad is not None and first.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["resnet9", "cnn", "cnn_bn", "mlp"])
def test_head_is_the_final_linear_and_owns_the_head_keys(name):
    model = build_model(name, 3, 32, 32, 13)
    assert model.head_name == type(model).head_name == "head"
    assert isinstance(model.head, nn.Linear) and model.head.out_features == 13
    head_keys = {k for k in model.state_dict() if k.startswith("head.")}
    assert head_keys == {f"head.{k}" for k in model.head.state_dict()}
    assert head_keys == {"head.weight", "head.bias"}
    body_keys = set(model.state_dict()) - head_keys
    assert body_keys and all(k.startswith("body.") for k in body_keys)
    # the body alone yields exactly the head's input features
    features = model.body(torch.randn(2, 3, 32, 32))
    assert features.shape == (2, model.head.in_features)


def test_same_torch_seed_gives_the_same_model():
    torch.manual_seed(1)
    a = build_model("cnn", 1, 28, 28, 10).state_dict()
    torch.manual_seed(1)
    b = build_model("cnn", 1, 28, 28, 10).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resnet9_rejects_images_too_small():
    with pytest.raises(UsageError, match="at least 11x11") as err:
        build_model("resnet9", 1, 8, 8, 10)
    assert "\n" not in str(err.value)
    model = build_model("resnet9", 1, 11, 11, 10)  # the stated minimum really works
    assert model(torch.randn(2, 1, 11, 11)).shape == (2, 10)


def test_bad_model_requests():
    choices = ("char_lstm, cnn, cnn_bn, femnist_cnn, femnist_cnn_softmax, mlp, resnet10, resnet10_cifar, resnet18, resnet8, resnet8_cifar, "
               "resnet9, vgg16")
    with pytest.raises(UsageError, match=f"unknown model 'vgg'; choose one of: {choices}"):
        build_model("vgg", 3, 32, 32, 10)
    with pytest.raises(UsageError, match="num_classes must be an integer >= 1"):
        build_model("mlp", 3, 32, 32, 0)


NARROW = ["resnet9", "cnn", "cnn_bn", "mlp", "resnet8", "resnet10", "resnet8_cifar", "resnet10_cifar", "resnet18",
          "vgg16", "femnist_cnn", "femnist_cnn_softmax"]


@pytest.mark.parametrize("name", NARROW)
def test_a_narrower_model_keeps_every_layer_and_name_with_an_eighth_of_the_channels(name):
    with torch.device("meta"):  # shapes only: VGG-16's full-width weights take seconds to draw
        full = build_model(name, 3, 32, 32, 10)
    narrow = build_model(name, 3, 32, 32, 10, width_multiplier=0.125)
    assert list(full.state_dict()) == list(narrow.state_dict())  # the methods find the same layers
    layers = lambda m: [x for x in m.body.modules() if isinstance(x, (nn.Conv2d, nn.Linear))]  # noqa: E731
    for small, big in zip(layers(narrow), layers(full), strict=True):
        out = "out_channels" if isinstance(big, nn.Conv2d) else "out_features"
        assert getattr(small, out) == getattr(big, out) // 8, small
    assert getattr(layers(narrow)[0], "in_channels", 3) == 3  # the images' channels stay
    assert (narrow.head.in_features, narrow.head.out_features) == (full.head.in_features // 8, 10)
    assert narrow(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_the_lstm_narrows_its_lstms_and_fc_and_keeps_its_embedding_and_names():
    full, narrow = build_model("char_lstm", 1, 1, 20, 80), build_model("char_lstm", 1, 1, 20, 80, width_multiplier=0.125)
    assert list(full.state_dict()) == list(narrow.state_dict())
    assert narrow.body.embedding.weight.shape == full.body.embedding.weight.shape == (100, 8)
    assert (narrow.body.lstm1.hidden_size, narrow.body.lstm2.hidden_size, narrow.body.lstm2.input_size) == (32, 32, 32)
    assert (narrow.body.fc1.in_features, narrow.body.fc1.out_features, narrow.head.in_features) == (32, 64, 64)
    assert narrow(torch.randint(0, 100, (2, 1, 1, 20)).float()).shape == (2, 80)


def test_imagenet_weights_are_refused_at_another_width_in_one_line_before_anything_is_built(monkeypatch):
    from fedfactor.models import registry

    monkeypatch.setattr(registry, "load_imagenet_weights", lambda *a: pytest.fail("weights loaded"))
    monkeypatch.setitem(registry.MODELS._entries, "vgg16", (lambda *a, **k: pytest.fail("model built"), ""))
    with pytest.raises(UsageError, match=r"^the ImageNet weights of vgg16 fit its full width only; set model\.pretrained"):
        build_model("vgg16", 3, 32, 32, 10, pretrained=True, width_multiplier=0.5)
    assert build_model("resnet9", 3, 32, 32, 10, width_multiplier=1.0).head.in_features == 256
    # however narrow, every layer keeps a unit
    assert build_model("mlp", 1, 8, 8, 10, width_multiplier=0.001).head.in_features == 1

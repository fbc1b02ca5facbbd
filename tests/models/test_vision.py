"""Tests for fedfactor.models.vision: FedFac's ResNet-18, VGG-16 and FEMNIST CNN."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from fedfactor.errors import UsageError
from fedfactor.models import build_model, femnist_cnn_min_input, weight_layers


@pytest.fixture(scope="module")
def vgg16():
    torch.manual_seed(0)
    return build_model("vgg16", 3, 32, 32, 10).eval()  # 134M weights: built once


def test_output_shapes(vgg16):
    torch.manual_seed(0)
    resnet = build_model("resnet18", 3, 32, 32, 10).eval()
    cnn = build_model("femnist_cnn", 1, 28, 28, 62).eval()
    with torch.no_grad():
        assert resnet(torch.randn(2, 3, 32, 32)).shape == (2, 10)
        assert vgg16(torch.randn(2, 3, 32, 32)).shape == (2, 10)
        assert cnn(torch.randn(2, 1, 28, 28)).shape == (2, 62)


@pytest.mark.parametrize("name, shape", [("resnet18", (1, 28, 28)), ("vgg16", (1, 32, 32)),
                                         ("resnet18", (3, 8, 8)), ("femnist_cnn", (3, 16, 16))])
def test_other_inputs_work_without_pretrained_weights(name, shape):
    with torch.device("meta"):  # shapes only
        model = build_model(name, *shape, 5)
        assert model(torch.randn(2, *shape)).shape == (2, 5)


def test_resnet18_is_torchvisions_with_an_own_head():
    model = build_model("resnet18", 3, 32, 32, 10)
    tv = torchvision.models.resnet18()
    ours = {k: v.shape for k, v in model.state_dict().items()}
    theirs = {f"body.{k}": v.shape for k, v in tv.state_dict().items() if not k.startswith("fc.")}
    assert {k: s for k, s in ours.items() if not k.startswith("head.")} == theirs
    assert isinstance(model.head, nn.Linear) and (model.head.in_features, model.head.out_features) == (512, 10)


def test_resnet18_layers_leave_out_the_projections():
    model = build_model("resnet18", 3, 32, 32, 10)
    layers = weight_layers(model)
    assert len(layers) == 18
    assert layers[1] == "body.conv1" and layers[18] == "head"
    assert (layers[16], layers[17]) == ("body.layer4.1.conv1", "body.layer4.1.conv2")
    projections = {f"body.layer{i}.0.downsample.0" for i in (2, 3, 4)}
    assert set(model.projections) == projections and not projections & set(layers.values())


def test_vgg16_layers_and_body(vgg16):
    layers = weight_layers(vgg16)
    modules = dict(vgg16.named_modules())
    assert len(layers) == 16
    assert all(isinstance(modules[layers[i]], nn.Conv2d) for i in range(1, 14))
    assert (modules[layers[14]].in_features, modules[layers[14]].out_features) == (25088, 4096)
    assert layers[15] == "body.classifier.3"
    assert (modules[layers[15]].in_features, modules[layers[15]].out_features) == (4096, 4096)
    assert layers[16] == "head" and vgg16.head.out_features == 10
    # torchvision's keys with "body." in front, but for the replaced classifier[6]
    with torch.device("meta"):
        tv = torchvision.models.vgg16_bn()
    theirs = {f"body.{k}" for k in tv.state_dict() if not k.startswith("classifier.6.")}
    assert {k for k in vgg16.state_dict() if not k.startswith("head.")} == theirs


def test_vgg16_rejects_images_too_small():
    with pytest.raises(UsageError, match="at least 32x32") as e:
        build_model("vgg16", 3, 31, 32, 10)
    assert "\n" not in str(e.value)


def test_femnist_cnn_layers_and_flatten_size():
    model = build_model("femnist_cnn", 1, 28, 28, 62)
    layers = weight_layers(model)
    modules = dict(model.named_modules())
    assert len(layers) == 4 and layers[4] == "head"
    conv2 = modules[layers[2]]
    assert isinstance(conv2, nn.Conv2d) and (conv2.in_channels, conv2.out_channels) == (32, 64)
    fc1 = modules[layers[3]]
    assert (fc1.in_features, fc1.out_features) == (1024, 512)
    assert not any(isinstance(m, nn.Softmax) for m in model.modules())  # logits out


def test_femnist_cnn_rejects_images_too_small():
    m = femnist_cnn_min_input()
    assert m == 16
    with pytest.raises(UsageError, match=f"at least {m}x{m}") as e:
        build_model("femnist_cnn", 1, m - 1, 28, 10)
    assert "\n" not in str(e.value)
    assert build_model("femnist_cnn", 1, m, m, 10).eval()(torch.randn(2, 1, m, m)).shape == (2, 10)


def test_femnist_cnn_softmax_is_femnist_cnn_ending_in_a_softmax_with_the_same_weights_and_layers():
    from fedfactor.models import weight_layers

    torch.manual_seed(0)
    plain = build_model("femnist_cnn", 1, 28, 28, 62).eval()
    torch.manual_seed(0)
    asrun = build_model("femnist_cnn_softmax", 1, 28, 28, 62).eval()
    assert plain.state_dict().keys() == asrun.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), asrun.state_dict().values()))
    assert weight_layers(asrun) == weight_layers(plain)
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        out = asrun(x)
        assert torch.allclose(out, torch.softmax(plain(x), dim=1))
    assert torch.allclose(out.sum(1), torch.ones(3)) and (out >= 0).all()

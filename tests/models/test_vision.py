"""Tests for fedfactor.models.vision and .pretrained: FedFac's ResNet-18, VGG-16 and FEMNIST CNN, ImageNet weights."""

from __future__ import annotations

import os
import urllib.error

import pytest
import torch
import torchvision
from torch import nn

from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.models import build_model, femnist_cnn_min_input, weight_layers
from fedfactor.models.pretrained import cached_weights_path, imagenet_weights


@pytest.fixture(scope="module")
def vgg16():
    torch.manual_seed(0)
    return build_model("vgg16", 3, 32, 32, 10).eval()  # 134M weights: built once


@pytest.fixture
def torch_home(tmp_path, monkeypatch):
    """An empty $TORCH_HOME: weights are read from its hub/checkpoints, never from the network."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    # torch.hub.set_dir pins the hub directory in this global, which get_dir prefers to $TORCH_HOME
    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    assert torch.hub.get_dir() == os.path.join(tmp_path, "hub")
    return tmp_path


def _no_download(*args, **kwargs):
    raise urllib.error.URLError("no network in tests")


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


def _saved_resnet18(path, keep_num_batches_tracked=True):
    """torchvision's ResNet-18 with distinctive values, saved as its ImageNet weights file is."""
    torch.manual_seed(123)
    state = torchvision.models.resnet18().state_dict()
    state["bn1.running_mean"] = torch.arange(64.0)
    state["fc.weight"].fill_(7.0)
    if not keep_num_batches_tracked:  # as in weights files saved before PyTorch 0.4.1
        state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return state


@pytest.mark.parametrize("num_classes, keep_num_batches_tracked", [(10, True), (1000, True), (10, False)])
def test_pretrained_resnet18_loads_all_but_the_head(torch_home, monkeypatch, num_classes, keep_num_batches_tracked):
    monkeypatch.setattr(torch.hub, "download_url_to_file", _no_download)
    weights, _ = imagenet_weights("resnet18")
    path = torch_home / "hub" / "checkpoints" / weights.url.rsplit("/", 1)[1]
    assert cached_weights_path("resnet18") == str(path)
    saved = _saved_resnet18(path, keep_num_batches_tracked)
    torch.manual_seed(0)
    model = build_model("resnet18", 3, 32, 32, num_classes, pretrained=True)
    state = model.state_dict()
    for key in ["conv1.weight", "bn1.running_mean", "layer4.1.conv2.weight", "layer2.0.downsample.0.weight"]:
        assert torch.equal(state[f"body.{key}"], saved[key]), key
    assert model.head.weight.shape == (num_classes, 512)
    assert not (model.head.weight == 7.0).any()  # freshly initialised, not the file's fc
    assert model.eval()(torch.randn(2, 3, 32, 32)).shape == (2, num_classes)


def test_pretrained_weights_that_cannot_be_fetched(torch_home, monkeypatch):
    monkeypatch.setattr(torch.hub, "download_url_to_file", _no_download)
    path = cached_weights_path("resnet18")
    with pytest.raises(UsageError, match="could not be fetched") as e:
        build_model("resnet18", 3, 32, 32, 10, pretrained=True)
    message = str(e.value)
    assert path in message and path.startswith(str(torch_home / "hub" / "checkpoints"))
    assert "\n" not in message


def test_a_wrong_weights_file_is_a_usage_error(torch_home):
    path = cached_weights_path("resnet18")
    os.makedirs(os.path.dirname(path))
    torch.save({"conv1.weight": torch.zeros(1)}, path)
    with pytest.raises(UsageError, match="does not hold torchvision's resnet18 weights") as e:
        build_model("resnet18", 3, 32, 32, 10, pretrained=True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name, channels, words", [
    ("cnn", 3, "model 'cnn' has no pretrained weights; model.pretrained: true needs one of: resnet18, vgg16"),
    ("femnist_cnn", 3, "has no pretrained weights"),
    ("resnet18", 1, "need 3-channel"),
    ("vgg16", 1, "need 3-channel"),
])
def test_pretrained_requests_that_cannot_be_met(torch_home, monkeypatch, name, channels, words):
    monkeypatch.setattr(torch.hub, "download_url_to_file", _no_download)
    with pytest.raises(UsageError, match=words) as e:
        build_model(name, channels, 32, 32, 10, pretrained=True)
    assert "\n" not in str(e.value)


def test_config_key_model_pretrained(tmp_path):
    assert load_config(None).model.pretrained is False
    f = tmp_path / "c.yaml"
    f.write_text("model: {name: resnet18, pretrained: true}\n")
    cfg = load_config(f)
    assert cfg.model.pretrained is True and cfg.flat()["model.pretrained"] is True
    assert load_config(f, ["model.pretrained=false"]).model.pretrained is False
    with pytest.raises(UsageError, match="model.pretrained"):
        load_config(None, ["model.pretrained=maybe"])


def test_costing_a_pretrained_config_needs_no_weights(torch_home, monkeypatch):
    from fedfactor.config import load_config
    from fedfactor.simulator import Simulator

    monkeypatch.setattr(torch.hub, "download_url_to_file", _no_download)
    cfg = load_config("config/runs/fedfac.yaml", ["method.name=fedavg", "fl.rounds=1", "fl.clients=4",
                                                  "tracking.enabled=false"])
    assert cfg.model.pretrained
    sim = Simulator(cfg, dry_run=True)  # shapes only: the weights file is neither read nor fetched
    sim.run()
    assert sim.meter.up > 0
    with pytest.raises(UsageError, match="3-channel"):  # a real run does load (and check) the weights
        Simulator(cfg.model_copy(update={"data": cfg.data.model_copy(update={"name": "digits"})}))

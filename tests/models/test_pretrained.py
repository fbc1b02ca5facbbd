"""Tests for fedfactor.models.pretrained: torchvision's ImageNet weights in FedFac's ResNet-18 and VGG-16."""

from __future__ import annotations

import os
import urllib.error

import pytest
import torch
import torchvision

from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.models import build_model
from fedfactor.models.pretrained import cached_weights_path, imagenet_weights


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
    from fedfactor.run.simulator import Simulator

    monkeypatch.setattr(torch.hub, "download_url_to_file", _no_download)
    cfg = load_config("config/runs/fedfac.yaml", ["method.name=fedavg", "fl.rounds=1", "fl.clients=4",
                                                  "tracking.enabled=false"])
    assert cfg.model.pretrained
    sim = Simulator(cfg, dry_run=True)  # shapes only: the weights file is neither read nor fetched
    sim.run()
    assert sim.meter.up > 0
    with pytest.raises(UsageError, match="3-channel"):  # a real run does load (and check) the weights
        Simulator(cfg.model_copy(update={"data": cfg.data.model_copy(update={"name": "digits"})}))

import math

import pytest
import torch
from torch import nn

from fedfactor.models import build_model, weight_layers


def _convs(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Conv2d)}


@pytest.mark.parametrize("name, widths", [("resnet8", (64, 128, 256)), ("resnet10", (64, 128, 256, 512))])
def test_official_architecture_keeps_the_imagenet_stem_and_one_block_per_stage(name, widths):
    torch.manual_seed(0)
    model = build_model(name, 3, 32, 32, 10)
    stem = model.body.conv1
    assert (stem.kernel_size, stem.stride, stem.padding) == ((7, 7), (2, 2), (3, 3))
    assert isinstance(model.body.maxpool, nn.MaxPool2d)
    stages = [model.body.get_submodule(f"layer{i + 1}") for i in range(len(widths))]
    assert [len(s) for s in stages] == [1] * len(widths)
    assert [s[0].conv2.out_channels for s in stages] == list(widths)
    assert model.head.in_features == widths[-1]
    # 8 / 10 = stem + two convs per block + head; the 1x1 projections are not counted
    layers = weight_layers(model)
    assert len(layers) == int(name.removeprefix("resnet"))
    assert not any("downsample" in n for n in layers.values())
    assert len(model.projections) == len(widths) - 1
    # 32x32 reaches the stages at 8x8: the stride-2 stem and the max-pool each halve it
    feats = model.body[:4](torch.zeros(1, 3, 32, 32))
    assert feats.shape[-2:] == (8, 8)


@pytest.mark.parametrize("name", ["resnet8_cifar", "resnet10_cifar"])
def test_cifar_stem_is_a_3x3_stride_1_conv_without_max_pool(name):
    model = build_model(name, 3, 32, 32, 100)
    stem = model.body.conv1
    assert (stem.kernel_size, stem.stride) == ((3, 3), (1, 1))
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 100)


@pytest.mark.parametrize("name", ["resnet8", "resnet10", "resnet8_cifar", "resnet10_cifar"])
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32), (3, 64, 64)])
def test_any_input_size_and_channel_count_gives_logits(name, shape):
    model = build_model(name, *shape, 7).eval()
    assert model(torch.zeros(2, *shape)).shape == (2, 7)


def test_convs_start_kaiming_normal_fan_out():
    torch.manual_seed(0)
    model = build_model("resnet10", 3, 32, 32, 10)
    conv = model.body.layer4[0].conv2  # 512 x 512 x 3 x 3: enough draws for a tight estimate
    expected = math.sqrt(2 / (conv.out_channels * 9))
    assert conv.weight.std().item() == pytest.approx(expected, rel=0.01)
    bn = model.body.layer4[0].bn2
    assert torch.equal(bn.weight, torch.ones_like(bn.weight)) and torch.equal(bn.bias, torch.zeros_like(bn.bias))


def test_parameter_counts_match_the_official_layers():
    def count(widths, classes):
        n = 3 * 64 * 49 + 2 * 64  # stem conv + its BatchNorm
        c_in = 64
        for w in widths:
            n += c_in * w * 9 + w * w * 9 + 4 * w  # two 3x3 convs and their BatchNorms
            if c_in != w:
                n += c_in * w + 2 * w  # 1x1 projection and its BatchNorm
            c_in = w
        return n + c_in * classes + classes

    for name, widths in (("resnet8", (64, 128, 256)), ("resnet10", (64, 128, 256, 512))):
        model = build_model(name, 3, 32, 32, 10)
        assert sum(p.numel() for p in model.parameters()) == count(widths, 10)

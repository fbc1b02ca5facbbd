"""Batched augmentation: checked against a slow per-sample reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedfactor.data import augment_batch
from fedfactor.data.augment import default_pad
from fedfactor.errors import UsageError


def distinct_batch(n: int, c: int, h: int, w: int | None = None) -> torch.Tensor:
    """Every value distinct and non-zero, so a crop window is identified by its content."""
    w = h if w is None else w
    return torch.arange(1, n * c * h * w + 1, dtype=torch.float32).reshape(n, c, h, w)


def windows(image: torch.Tensor, pad: int) -> list[torch.Tensor]:
    """Every crop of the zero-padded image, the slow way: (2 pad + 1)^2 slices."""
    _, h, w = image.shape
    padded = F.pad(image, (pad, pad, pad, pad))
    return [padded[:, i : i + h, j : j + w] for i in range(2 * pad + 1) for j in range(2 * pad + 1)]


def window_index(out: torch.Tensor, image: torch.Tensor, pad: int) -> int:
    matches = [k for k, win in enumerate(windows(image, pad)) if torch.equal(out, win)]
    assert len(matches) == 1, "output is not a crop of the padded input"
    return matches[0]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("kind", ["none", "crop", "crop_flip"])
def test_shape_and_dtype_are_preserved(kind):
    x = torch.randn(5, 3, 32, 32)
    out = augment_batch(x, kind, gen(0))
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device


def test_none_returns_the_input_unchanged():
    x = torch.randn(4, 3, 8, 8)
    assert augment_batch(x, "none", gen(0)) is x


@pytest.mark.parametrize("height, pad", [(32, 4), (28, 2), (8, 1), (64, 8), (4, 1)])
def test_default_pad_follows_the_usual_values(height, pad):
    assert default_pad(height) == pad


@pytest.mark.parametrize("height", [32, 28, 8])
def test_crop_is_a_window_of_the_zero_padded_input(height):
    x = distinct_batch(48, 2, height)
    pad = default_pad(height)
    out = augment_batch(x, "crop", gen(1))
    offsets = {window_index(out[i], x[i], pad) for i in range(len(x))}
    # 48 draws over (2 pad + 1)^2 offsets: the offsets are per sample, not one for the batch
    assert len(offsets) > 3


def test_crop_uses_the_pad_asked_for_and_zero_fills():
    x = distinct_batch(40, 1, 6, 5)  # non-square on purpose
    out = augment_batch(x, "crop", gen(2), pad=2)
    for i in range(len(x)):
        window_index(out[i], x[i], 2)
    # some samples were shifted: the zero padding shows up in the output
    assert (out == 0).any() and not (x == 0).any()
    assert torch.equal(augment_batch(x, "crop", gen(2), pad=0), x)


def test_crop_flip_flips_exactly_a_random_half():
    x = distinct_batch(200, 1, 8)
    out = augment_batch(x, "crop_flip", gen(3), pad=0)  # no shift: only the flip acts
    flipped = torch.tensor([torch.equal(o, xi.flip(-1)) for o, xi in zip(out, x)])
    kept = torch.tensor([torch.equal(o, xi) for o, xi in zip(out, x)])
    assert torch.all(flipped ^ kept)  # every sample is exactly one of the two
    assert 60 < flipped.sum().item() < 140


def test_crop_flip_is_a_crop_then_a_flip_of_the_same_samples():
    x = distinct_batch(64, 3, 8)
    out = augment_batch(x, "crop_flip", gen(4), pad=1)
    # with the same generator, crop_flip's crops are crop's crops: the flip comes after
    cropped = augment_batch(x, "crop", gen(4), pad=1)
    for o, c in zip(out, cropped):
        assert torch.equal(o, c) or torch.equal(o, c.flip(-1))
    assert not torch.equal(out, cropped)


@pytest.mark.parametrize("kind", ["crop", "crop_flip"])
def test_same_seed_same_output_other_seed_differs(kind):
    x = torch.randn(32, 3, 32, 32)
    a, b = augment_batch(x, kind, gen(7)), augment_batch(x, kind, gen(7))
    assert torch.equal(a, b)
    assert not torch.equal(a, augment_batch(x, kind, gen(8)))


def test_bad_arguments_are_usage_errors():
    x = torch.randn(2, 1, 8, 8)
    with pytest.raises(UsageError, match="unknown augmentation 'rotate'; choose one of: none, crop, crop_flip"):
        augment_batch(x, "rotate", gen(0))
    with pytest.raises(UsageError, match="padding"):
        augment_batch(x, "crop", gen(0), pad=-1)
    with pytest.raises(UsageError, match=r"\[N, C, H, W\]"):
        augment_batch(torch.randn(8, 8), "crop", gen(0))


# CUDA joins where a GPU is present; the CPU case always runs.
@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_runs_on_the_tensors_own_device(device):
    x = torch.randn(16, 3, 32, 32, device=device)
    g = torch.Generator(device=device).manual_seed(0)
    out = augment_batch(x, "crop_flip", g)
    assert out.device == x.device
    assert torch.equal(out, augment_batch(x, "crop_flip", torch.Generator(device=device).manual_seed(0)))

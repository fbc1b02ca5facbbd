"""Tests for fedfactor.reparam.gate: pFedGate's blocks, budgeted selection, gate and gated forward."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

from fedfactor.models import HeadedModel
from fedfactor.reparam.gate import GatedModel, SwitchNorm2d, block_sizes, select_blocks, split_blocks


def _fix_scores(model: GatedModel, scores: list[float]) -> None:
    """Make the gate say `scores` for every input: its last BatchNorm's scale 0, its shift logit(score)."""
    bn = model.gate[3]
    with torch.no_grad():
        bn.weight.zero_()
        bn.bias.copy_(torch.tensor([math.log(p / (1 - p)) for p in scores]))


def _linear_backbone() -> HeadedModel:
    """Flatten a 1x2x2 input, Linear(4, 2) with W = [[1, 2, 3, 4], [5, 6, 7, 8]], b = [1, -1]."""
    model = HeadedModel(nn.Flatten(), nn.Linear(4, 2))
    with torch.no_grad():
        model.head.weight.copy_(torch.arange(1.0, 9.0).view(2, 4))
        model.head.bias.copy_(torch.tensor([1.0, -1.0]))
    return model


# ---------------------------------------------------------------- blocks, by hand


@pytest.mark.parametrize("numel, split, sizes", [
    (25, 10, [3] * 8 + [1]),  # ceil(25 / 10) = 3 entries a block: 9 blocks, the last holds 25 - 24
    (16, 5, [4] * 4),  # ceil(16 / 5) = 4: only 4 blocks are needed
    (10, 5, [2] * 5),
    (4, 5, [1] * 4),  # fewer entries than blocks: one entry each
    (7, 1, [7]),  # split 1: a block is a whole tensor
])
def test_block_sizes_by_hand(numel, split, sizes):
    assert block_sizes(numel, split) == sizes


def test_blocks_of_a_conv_and_a_linear_model_by_hand():
    # conv 1 -> 2 channels, 1x1: weight 2 entries, bias 2; head Linear(8, 2): weight 16, bias 2
    model = HeadedModel(nn.Sequential(nn.Conv2d(1, 2, 1), nn.Flatten()), nn.Linear(8, 2))
    blocks = split_blocks(model, 5)
    assert blocks.size.tolist() == [1, 1, 1, 1, 4, 4, 4, 4, 1, 1]
    assert blocks.spans == {"body.0.weight": (0, 2, 1), "body.0.bias": (2, 2, 1), "head.weight": (4, 4, 4),
                            "head.bias": (8, 2, 1)}
    assert blocks.linear.tolist() == [False] * 4 + [True] * 6  # budgeted apart
    assert blocks.always.tolist() == [True, False, True, False, True, False, False, False, True, False]
    assert not split_blocks(model, 1).always.any()  # whole tensors: none kept by rule
    # a block's weight covers its entries in storage order; the last block is cut to the tensor
    w = torch.arange(10.0)
    assert torch.equal(blocks.expand(w, "head.weight", torch.Size([2, 8])),
                       torch.tensor([4.0] * 4 + [5.0] * 4 + [6.0] * 4 + [7.0] * 4).view(2, 8))
    three = split_blocks(nn.Linear(2, 3, bias=False), 2)  # 6 entries, blocks of 3: rows cut mid-way
    assert torch.equal(three.expand(torch.tensor([1.0, 2.0]), "weight", torch.Size([3, 2])),
                       torch.tensor([[1.0, 1.0], [1.0, 2.0], [2.0, 2.0]]))


# ---------------------------------------------------------------- the budgeted selection, by hand


def test_greedy_selection_by_score_within_each_groups_budget():
    scores = np.array([0.9, 0.2, 0.8, 0.6, 0.7, 0.3])
    size = np.array([1, 4, 3, 2, 5, 5])
    group = np.array([0, 0, 0, 0, 1, 1])
    always = np.array([True, False, False, False, True, False])
    # group 0 holds 10 entries; s = 0.5: 5 may be kept, block 0 (1) always: room 4. By score:
    # block 2 (0.8, 3 entries) fits, room 1; block 3 (0.6, 2) does not, nor block 1 (0.2, 4).
    # group 1: 10 entries, room 5 - 5 (block 4, always) = 0: block 5 is dropped.
    assert select_blocks(scores, size, group, always, 0.5).tolist() == [True, False, True, False, True, False]
    # s = 0.6: room 5 in group 0 takes block 2 (room 2), then block 3 (room 0)
    assert select_blocks(scores, size, group, always, 0.6).tolist() == [True, False, True, True, True, False]
    # a block too large for the room is passed over and a lower-scored smaller one taken instead
    assert select_blocks(np.array([0.1, 0.9, 0.5]), np.array([1, 4, 2]), np.zeros(3, dtype=int),
                         np.array([False] * 3), 0.5).tolist() == [True, False, True]  # room 3.5: 2 + 1
    # ties go to the earlier block; s = 1 keeps everything
    assert select_blocks(np.array([0.5, 0.5]), np.array([1, 1]), np.zeros(2, dtype=int), np.array([False] * 2),
                         0.5).tolist() == [True, False]
    assert select_blocks(scores, size, group, always, 1.0).all()


def test_the_official_budget_is_the_codes_room_for_the_blocks_not_always_kept():
    scores = np.array([0.9, 0.2, 0.8, 0.6, 0.7, 0.3])
    size = np.array([1, 4, 3, 2, 5, 5])
    group = np.array([0, 0, 0, 0, 1, 1])
    always = np.array([True, False, False, False, True, False])
    # s = 0.6, floor 0.2: group 0's other blocks hold 9 entries, room round(0.4 x 9) = 4: block 2
    # (3 entries) fits, room 1, block 3 (2) does not. The paper's room, 0.6 x 10 - 1 = 5, takes both.
    assert select_blocks(scores, size, group, always, 0.6, floor=0.2).tolist() == [
        True, False, True, False, True, False]
    assert select_blocks(scores, size, group, always, 0.6).tolist() == [True, False, True, True, True, False]
    # the room is rounded half to even, as torch.round: (0.75 - 0.25) x 5 = 2.5 -> 2, so the
    # 3-entry block is passed over for the 2-entry one (half up would take the 3-entry block)
    assert select_blocks(np.array([0.9, 0.8]), np.array([3, 2]), np.zeros(2, dtype=int), np.array([False] * 2),
                         0.75, floor=0.25).tolist() == [False, True]


# ---------------------------------------------------------------- the gate


def test_switch_norm_mixes_instance_layer_and_batch_statistics_by_hand():
    norm = SwitchNorm2d(1)
    x = torch.tensor([[[[1.0, 3.0]]], [[[5.0, 7.0]]]])  # two samples, one channel, 1x2
    # instance: means 2 and 6, unbiased variances 2 and 2; layer (one channel): the same;
    # batch: mean 4, variance mean(var + mean^2) - 4^2 = (6 + 38) / 2 - 16 = 6; equal thirds of each
    out = norm(x)
    a = [(v - 8 / 3) / math.sqrt(10 / 3 + 1e-5) for v in (1, 3)]
    b = [(v - 16 / 3) / math.sqrt(10 / 3 + 1e-5) for v in (5, 7)]
    assert torch.allclose(out.flatten(), torch.tensor(a + b), atol=1e-6)
    # running statistics move a tenth of the way: 0.4 and 0.6, and scoring uses them
    assert torch.allclose(norm.running_mean.flatten(), torch.tensor([0.4])) and \
        torch.allclose(norm.running_var.flatten(), torch.tensor([0.6]))
    norm.eval()
    expected = [(v - 4.4 / 3) / math.sqrt(4.6 / 3 + 1e-5) for v in (1, 3)]
    assert torch.allclose(norm(x[:1]).flatten(), torch.tensor(expected), atol=1e-6)


def test_the_gate_is_sized_by_the_input_and_seeded():
    model = GatedModel(_linear_backbone(), split=2, sparsity=0.8)
    model.build_gate((1, 2, 2), seed=3)
    assert model.gate[2].weight.shape == (4, 4)  # 1*2*2 inputs -> 4 blocks
    first = {k: v.clone() for k, v in model.gate.state_dict().items()}
    model.build_gate((1, 2, 2), seed=3)
    assert all(torch.equal(first[k], v) for k, v in model.gate.state_dict().items())
    model.build_gate((1, 2, 2), seed=4)
    assert not torch.equal(first["2.weight"], model.gate[2].weight)
    model.build_gate((3, 5, 7), seed=3)
    assert model.gate[2].weight.shape == (4, 105) and model.gate[0].weight.shape == (1, 3, 1, 1)


# ---------------------------------------------------------------- the gated forward


@pytest.mark.parametrize("train", [True, False])
def test_the_paper_styles_gated_forward_is_the_backbone_on_hand_masked_weights(train):
    # blocks (split 2): W's rows [1 2 3 4] and [5 6 7 8] (4 entries each), b's entries (1 each);
    # the first blocks of W and b are always kept. Scores 0.9, 0.95, 0.6, 0.3; floor min(max(1/2, 0.1),
    # 0.8) = 0.5 lifts the last to 0.5. s = 0.8: 8 of 10 entries, 5 always kept, room 3: W's second
    # row (0.95, 4 entries) does not fit, b's second entry (1) does.
    model = GatedModel(_linear_backbone(), split=2, sparsity=0.8, style="paper")
    model.build_gate((1, 2, 2), seed=0)
    _fix_scores(model, [0.9, 0.95, 0.6, 0.3])
    model.train(train)
    x = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]).view(2, 1, 2, 2)
    assert torch.allclose(model.block_weights(x), torch.tensor([0.9, 0.0, 0.6, 0.5]), atol=1e-6)
    hand = {"head.weight": torch.tensor([[0.9, 1.8, 2.7, 3.6], [0.0, 0.0, 0.0, 0.0]]),
            "head.bias": torch.tensor([0.6, -0.5])}
    out = model(x)
    assert torch.allclose(out, functional_call(model.backbone, hand, (x,)), atol=1e-5)
    assert torch.allclose(out, torch.tensor([[5.1, -0.5], [9.6, -0.5]]), atol=1e-5)
    # the backbone's own weights are untouched; s = 1 keeps every block, scaled by its score
    assert torch.equal(model.backbone.head.weight, torch.arange(1.0, 9.0).view(2, 4))
    dense = GatedModel(_linear_backbone(), split=2, sparsity=1.0, style="paper")
    dense.build_gate((1, 2, 2), seed=0)
    _fix_scores(dense, [0.9, 0.95, 0.6, 0.3])
    dense.train(train)
    # every block kept: W's second row scaled by 0.95 -> [4.75, 5.7, 6.65, 7.6]
    assert torch.allclose(dense(x), torch.tensor([[5.1, 4.75 + 7.6 - 0.5], [9.6, 24.7 - 0.5]]), atol=1e-5)


@pytest.mark.parametrize("train", [True, False])
def test_the_official_style_scales_kept_blocks_by_their_raw_scores(train):
    # As above at s = 0.9, in the code's way: the blocks not always kept (W's second row, 4 entries,
    # and b's second entry, 1) get round((0.9 - 0.5) x 5) = 2 entries; ranked by floored scores in
    # tenths (9 and 5), W's row does not fit and b's entry does, scaled by its raw 0.3, not the floor.
    model = GatedModel(_linear_backbone(), split=2, sparsity=0.9)
    model.build_gate((1, 2, 2), seed=0)
    _fix_scores(model, [0.9, 0.95, 0.6, 0.3])
    model.train(train)
    x = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]).view(2, 1, 2, 2)
    assert torch.allclose(model.block_weights(x), torch.tensor([0.9, 0.0, 0.6, 0.3]), atol=1e-6)
    assert torch.allclose(model(x), torch.tensor([[5.1, -0.3], [9.6, -0.3]]), atol=1e-5)
    # the paper's budget at s = 0.9 (9 entries, 5 always kept, room 4) takes W's row and drops b's entry
    paper = GatedModel(_linear_backbone(), split=2, sparsity=0.9, style="paper")
    paper.build_gate((1, 2, 2), seed=0)
    _fix_scores(paper, [0.9, 0.95, 0.6, 0.3])
    paper.train(train)
    assert torch.allclose(paper.block_weights(x), torch.tensor([0.9, 0.95, 0.6, 0.0]), atol=1e-6)
    # s = 1: nothing dropped, every block at its raw score (b's second entry at 0.3, not 0.5)
    dense = GatedModel(_linear_backbone(), split=2, sparsity=1.0)
    dense.build_gate((1, 2, 2), seed=0)
    _fix_scores(dense, [0.9, 0.95, 0.6, 0.3])
    dense.train(train)
    assert torch.allclose(dense.block_weights(x), torch.tensor([0.9, 0.95, 0.6, 0.3]), atol=1e-6)


def test_the_official_style_ranks_scores_in_tenths_with_ties_to_the_earlier_block():
    # Linear(4, 2) without bias, split 4: blocks of 2 entries, the first always kept; s = 0.6, floor
    # 0.25: room round(0.35 x 6) = 2, one block. Scores 0.61 and 0.64 are both 6 tenths: the earlier
    # block wins in the code's way; the paper's (room 0.6 x 8 - 2 = 2.8) takes the higher 0.64.
    scores = [0.7, 0.61, 0.64, 0.52]
    x = torch.randn(3, 1, 2, 2)
    kept = {}
    for style in ("official", "paper"):
        model = GatedModel(nn.Linear(4, 2, bias=False), split=4, sparsity=0.6, style=style)
        model.build_gate((1, 2, 2), seed=0)
        _fix_scores(model, scores)
        kept[style] = (model.block_weights(x) != 0).tolist()
    assert kept == {"official": [True, True, False, False], "paper": [True, False, True, False]}


def test_the_official_style_lets_the_gate_learn_through_the_keep_mask():
    # d(multiplier_j)/d(logit_j) = p(1 - p) for a kept block, times (1 + p) in the code's way where
    # p is above the floor (0.5): the straight-through keep mask. Scores 0.9, 0.95, 0.6, 0.3 at s = 0.9
    # keep blocks 0, 2, 3 (official) and 0, 1, 2 (paper, floored scores, no straight-through term).
    x = torch.ones(2, 1, 2, 2)
    grads = {}
    for style in ("official", "paper"):
        model = GatedModel(_linear_backbone(), split=2, sparsity=0.9, style=style)
        model.build_gate((1, 2, 2), seed=0)
        _fix_scores(model, [0.9, 0.95, 0.6, 0.3])
        (grads[style],) = torch.autograd.grad(model.block_weights(x).sum(), model.gate[3].bias)
    assert torch.allclose(grads["official"], torch.tensor([0.09 * 1.9, 0.0, 0.24 * 1.6, 0.21]), atol=1e-6)
    assert torch.allclose(grads["paper"], torch.tensor([0.09, 0.95 * 0.05, 0.24, 0.0]), atol=1e-6)


def test_the_model_names_its_head_and_projections_under_the_backbone():
    model = GatedModel(_linear_backbone(), split=5, sparsity=0.5)
    assert model.head_name == "backbone.head"
    assert {k for k in model.state_dict() if not k.startswith("gate.")} == {"backbone.head.weight",
                                                                              "backbone.head.bias"}

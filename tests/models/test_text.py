"""Tests for fedfactor.models.text: char_lstm, FedFac's Shakespeare model."""

from __future__ import annotations

import string

import pytest
import torch
from torch import nn

from fedfactor.errors import UsageError
from fedfactor.models import build_model, weight_layers
from fedfactor.models.text import VOCABULARY


def _ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Character ids as a token dataset gives them: float32 [B, 1, 1, T]."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, len(VOCABULARY), (batch, 1, 1, length), generator=gen).float()


def test_char_lstm_predicts_one_character_per_sequence():
    torch.manual_seed(0)
    model = build_model("char_lstm", 1, 1, 80, 100)
    logits = model(_ids(3, 80))
    assert logits.shape == (3, 100)
    logits.sum().backward()
    assert model.body.embedding.weight.grad.abs().sum() > 0  # gradients reach the first layer
    assert model(_ids(2, 5)).shape == (2, 100)  # any length: the prediction is read at the last step


def test_char_lstm_has_the_official_sizes_and_numbers_its_layers_as_the_paper():
    model = build_model("char_lstm", 1, 1, 80, 100)
    assert VOCABULARY == string.printable and len(VOCABULARY) == 100
    body = model.body
    assert (body.embedding.num_embeddings, body.embedding.embedding_dim) == (100, 8)
    lstms = [(m.input_size, m.hidden_size, m.num_layers) for m in (body.lstm1, body.lstm2)]
    assert lstms == [(8, 256, 1), (256, 256, 1)]
    assert (body.fc1.in_features, body.fc1.out_features, body.dropout.p) == (256, 512, 0.5)
    assert model.head_name == "head" and (model.head.in_features, model.head.out_features) == (512, 100)
    # the embedding is not counted: Lambda = {3} (001 Table 2) is fc1, the official --partial_cnn_layer 4
    assert weight_layers(model) == {1: "body.lstm1", 2: "body.lstm2", 3: "body.fc1", 4: "head"}
    assert all(k.startswith("body.") for k in model.state_dict() if not k.startswith("head."))


def test_char_lstm_is_the_official_two_layer_lstm_drawn_from_the_same_seed():
    """Two one-layer LSTMs equal the official nn.LSTM(8, 256, num_layers=2) (no dropout between its
    layers), and draw the same initial weights in the same order as the official model."""
    torch.manual_seed(3)
    ours = build_model("char_lstm", 1, 1, 80, 100).eval()
    torch.manual_seed(3)
    nn.Dropout(0.5)  # the official model's first module draws nothing
    encoder, rnn = nn.Embedding(100, 8), nn.LSTM(8, 256, num_layers=2, batch_first=True)
    fc1, fc2 = nn.Linear(256, 512), nn.Linear(512, 100)
    assert torch.equal(ours.body.embedding.weight, encoder.weight)
    for layer, lstm in ((0, ours.body.lstm1), (1, ours.body.lstm2)):
        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            assert torch.equal(getattr(lstm, f"{kind}_l0"), getattr(rnn, f"{kind}_l{layer}"))
    assert torch.equal(ours.body.fc1.weight, fc1.weight) and torch.equal(ours.head.weight, fc2.weight)
    x = _ids(4, 80)
    h, _ = rnn(encoder(x[:, 0, 0].long()))
    official_last_step = fc2(torch.relu(fc1(h)))[:, -1]
    assert torch.allclose(ours(x), official_last_step, atol=1e-6)


@pytest.mark.parametrize("x, words", [
    (torch.full((2, 1, 1, 8), 100.0), "ids outside its vocabulary 0..99"),
    (torch.full((2, 1, 1, 8), -1.0), "ids outside its vocabulary 0..99"),
    (torch.zeros(2, 1, 8), r"shaped \[batch, 1, 1, length\] \(got \[2, 1, 8\]\)"),
    (torch.zeros(2, 3, 1, 8), r"\(got \[2, 3, 1, 8\]\)"),
])
def test_char_lstm_refuses_what_is_not_a_batch_of_token_ids(x, words):
    with pytest.raises(UsageError, match=words) as e:
        build_model("char_lstm", 1, 1, 8, 100)(x)
    assert "\n" not in str(e.value)


def test_char_lstm_is_built_for_token_sequences_only():
    with pytest.raises(UsageError, match="char_lstm takes token sequences of shape 1x1xlength .got 3x32x32.") as e:
        build_model("char_lstm", 3, 32, 32, 10)
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="has no pretrained weights"):
        build_model("char_lstm", 1, 1, 80, 100, pretrained=True)


def test_char_lstm_builds_on_the_meta_device_for_cost():
    with torch.device("meta"):
        model = build_model("char_lstm", 1, 1, 80, 100)
    assert all(p.is_meta for p in model.parameters())
    assert model(torch.empty(2, 1, 1, 80, device="meta")).shape == (2, 100)

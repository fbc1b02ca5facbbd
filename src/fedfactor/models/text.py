"""FedFac's Shakespeare model: a next-character LSTM (`char_lstm`).

It follows the official FedFac code (ffair/FedFac, `NextCharacterLSTM`): the vocabulary is Python's
`string.printable` (100 characters), an 8-dimensional embedding, two LSTM layers of 256 units, fc1
Linear(256, 512), ReLU, dropout 0.5 and the classifier Linear(512, classes). The two LSTM layers are
two single-layer nn.LSTM modules (`body.lstm1`, `body.lstm2`) rather than one nn.LSTM(num_layers=2):
the same computation (the official LSTM has no dropout between its layers) and the same
initialisation, but each layer has entries of its own, so it is one numbered layer.

Input: a token sequence as the image-shaped float32 tensor every dataset here gives, [B, 1, 1, T]
holding integer character ids (`build_model("char_lstm", 1, 1, T, classes)`). The model predicts the
character after the sequence from the last time step: one target per sequence, LEAF's Shakespeare
task. (The official code predicts at every position with a class-weighted loss: docs/papers/fedfac.md.)

Layer numbering (`weight_layers`): 1 = lstm1, 2 = lstm2, 3 = fc1, 4 = head; the embedding is not
counted, as the paper counts (its Lambda = {3} is fc1; the official code counts the embedding and
splits `--partial_cnn_layer 4`, the same layer).
"""

from __future__ import annotations

import string

import torch
from torch import nn

from ..errors import UsageError
from .registry import MODELS, HeadedModel, scaled

VOCABULARY = string.printable  # character id i is VOCABULARY[i]
EMBED_SIZE, HIDDEN_SIZE, FC_SIZE = 8, 256, 512


class CharBody(nn.Module):
    """Token ids [B, 1, 1, T] -> the fc1 features of the last time step, [B, fc] (512)."""

    def __init__(self, vocab_size: int = len(VOCABULARY), hidden: int = HIDDEN_SIZE, fc: int = FC_SIZE):
        super().__init__()
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, EMBED_SIZE)
        self.lstm1 = nn.LSTM(EMBED_SIZE, hidden, batch_first=True)
        self.lstm2 = nn.LSTM(hidden, hidden, batch_first=True)
        self.fc1 = nn.Linear(hidden, fc)
        self.relu = nn.ReLU()
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1:3] != (1, 1):
            raise UsageError(f"char_lstm takes token ids shaped [batch, 1, 1, length] (got {list(x.shape)})")
        ids = x.reshape(x.shape[0], x.shape[3]).long()
        # One reduction (one GPU sync): an id outside the table is a device-side assert on a GPU.
        if not ids.is_meta and ((ids < 0) | (ids >= self.vocab_size)).any():
            raise UsageError(f"char_lstm's inputs hold ids outside its vocabulary 0..{self.vocab_size - 1} "
                             "(is the dataset a token dataset?)")
        h, _ = self.lstm1(self.embedding(ids))
        h, _ = self.lstm2(h)
        return self.dropout(self.relu(self.fc1(h[:, -1])))


@MODELS.register("char_lstm", "FedFac's Shakespeare model (official NextCharacterLSTM): embedding 8, 2 LSTM layers "
                 "of 256, fc 512, dropout; token ids [B,1,1,T], next character from the last step")
def char_lstm(channels: int, height: int, width: int, num_classes: int, multiplier: float = 1.0) -> nn.Module:
    if channels != 1 or height != 1:
        raise UsageError(f"char_lstm takes token sequences of shape 1x1xlength (got {channels}x{height}x{width}); "
                         "use it with a token dataset")
    # narrower (model.width_multiplier): the LSTMs and fc1; the 8-wide embedding stays
    hidden, fc = scaled(HIDDEN_SIZE, multiplier), scaled(FC_SIZE, multiplier)
    return HeadedModel(CharBody(hidden=hidden, fc=fc), nn.Linear(fc, num_classes))

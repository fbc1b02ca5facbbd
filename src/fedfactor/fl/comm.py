"""Communication meter: every tensor the round loop moves passes through here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .state import State, nbytes


@dataclass
class CommMeter:
    """Bytes sent, counted per round; a round's bytes join the totals only when the round ends.

    A round interrupted half-way (SIGTERM) is discarded with `discard_round`, so the totals always
    belong to the last completed round, the one a checkpoint holds.
    """

    up: int = 0  # client -> server, cumulative over completed rounds
    down: int = 0  # server -> client, cumulative over completed rounds
    round_up: int = 0  # the round in progress
    round_down: int = 0
    history: list[tuple[int, int]] = field(default_factory=list)  # (up, down) per completed round

    def upload(self, payload: State) -> State:
        self.round_up += nbytes(payload)
        return payload

    def download(self, payload: State) -> State:
        self.round_down += nbytes(payload)
        return payload

    def end_round(self) -> None:
        self.up += self.round_up
        self.down += self.round_down
        self.history.append((self.round_up, self.round_down))
        self.discard_round()

    def discard_round(self) -> None:
        self.round_up = self.round_down = 0

    @property
    def total(self) -> int:
        return self.up + self.down

    def state_dict(self) -> dict[str, Any]:
        return {"up": self.up, "down": self.down, "history": [list(h) for h in self.history]}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.up, self.down = int(d["up"]), int(d["down"])
        self.history = [(int(u), int(v)) for u, v in d["history"]]
        self.discard_round()

"""Communication meter: every tensor the round loop moves passes through here."""

from __future__ import annotations

from dataclasses import dataclass, field

from .state import State, nbytes


@dataclass
class CommMeter:
    up: int = 0  # client -> server, cumulative bytes
    down: int = 0  # server -> client, cumulative bytes
    round_up: int = 0
    round_down: int = 0
    history: list[tuple[int, int]] = field(default_factory=list)  # (up, down) per finished round

    def upload(self, payload: State) -> State:
        n = nbytes(payload)
        self.up += n
        self.round_up += n
        return payload

    def download(self, payload: State) -> State:
        n = nbytes(payload)
        self.down += n
        self.round_down += n
        return payload

    def end_round(self) -> None:
        self.history.append((self.round_up, self.round_down))
        self.round_up = self.round_down = 0

    @property
    def total(self) -> int:
        return self.up + self.down

"""Where the clients' states live between their rounds: on the run's device, in host memory, or in
files on local disk.

A client's state is needed only while it downloads, trains, uploads and is scored; between its rounds
it can wait anywhere. On a GPU a paper-scale run whose clients each keep a whole model (Stand-Alone
and LG-FedAvg with 100 VGG-16 clients: 50 GiB) cannot keep them all in GPU memory, and on a small
host not in memory at all. Every store hands a client's state to the run on its device and takes the
trained one back, so the run computes with the same tensors wherever they waited: results are
identical in each (tests/fl/test_store.py).

- `device`: a list of states on the run's device (no copy at all).
- `host`: in host memory (pinned under CUDA, so a copy to the GPU overlaps); each client's state is
  copied to the device when it is read, and back when it is stored. On a CPU it copies nothing.
- `disk`: a file per client under the run's folder, written when the client is stored and read
  memory-mapped (torch.load's mmap), so the host holds only the pages a client's training touches.
  Clients that have not trained yet share the initial tensors in memory, as in every store.

A round's trained states are staged and take effect together at `commit` (Simulator.run_round: an
interrupted round leaves the previous one intact); `discard` drops them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any, Iterator

import torch

from .state import State

WHERE = ("device", "host", "disk")
# The share of a memory that the states may take under `auto`: the rest is for the model's training
# (activations, gradients, optimizer state) and, on the host, the data and the process.
SHARE = 0.5


def choose(need: int, on_gpu: bool, device_memory: int | None, host_memory: int | None) -> str:
    """`auto`'s choice of store for client states of `need` bytes: the device where they fit in
    SHARE of its memory, else (on a GPU) host memory where they fit in SHARE of it, else disk. A
    memory that cannot be read (None) is taken to fit. `fedfactor plan` decides with the node's
    memories, a run with its own (Simulator)."""

    def fits(memory: int | None) -> bool:
        return memory is None or need <= SHARE * memory

    if fits(device_memory if on_gpu else host_memory):
        return "device"
    if on_gpu and fits(host_memory):
        return "host"
    return "disk"


def move(obj: Any, device: torch.device, pin: bool = False) -> Any:
    """Tensors in nested dicts and lists on `device` (pinned when `pin`, on the CPU); each tensor
    object is moved once, so tensors that states share stay shared."""
    seen: dict[int, torch.Tensor] = {}

    def one(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in seen:
            # asynchronous only towards a GPU: a copy to the host must be complete before it is read
            moved = t.to(device, non_blocking=device.type == "cuda")
            seen[id(t)] = moved.pin_memory() if pin and not moved.is_pinned() else moved
        return seen[id(t)]

    def walk(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return one(o)
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return type(o)(walk(v) for v in o)
        return o

    return walk(obj)


class ClientStates:
    """Every client's state, kept where `where` says (WHERE); read as `states[k]` on the run's device."""

    def __init__(self, states: list[State], where: str, device: torch.device, folder: Path | None = None):
        """`folder`: the disk store's (a temporary one, removed with the store, when None)."""
        if where not in WHERE:
            raise ValueError(f"client states are kept on {', '.join(WHERE)}, not {where!r}")
        if where == "disk" and folder is None:
            folder = Path(tempfile.mkdtemp(prefix="fedfactor-states-"))
            weakref.finalize(self, shutil.rmtree, folder, True)
        self.where = where  # `host` on a CPU moves nothing: its copies to and from the CPU return the tensors as they are
        self.device = device
        self.folder = folder
        self._pin = self.where == "host" and device.type == "cuda"
        self._pending: dict[int, State | Path] = {}
        self._emptied = False  # the disk store's folder cleared of an earlier run's files, at the first write
        self.load(states, to_files=False)

    # -- reading ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._states)

    def __getitem__(self, k: int) -> State:
        state = self._read(self._states[k])
        return state if self.where == "device" else move(state, self.device)

    def __iter__(self) -> Iterator[State]:
        return (self[k] for k in range(len(self)))

    def as_list(self) -> list[State]:
        """Every client's state, for a checkpoint: on the device in the device store, else on the CPU
        (the disk store's memory-mapped), shared tensors once."""
        return [self._read(s) for s in self._states]

    @staticmethod
    def _read(state: State | Path) -> State:
        """A state as kept: a disk store's file read memory-mapped, anything else as it is."""
        return torch.load(state, map_location="cpu", mmap=True, weights_only=True) if isinstance(state, Path) else state

    # -- writing ---------------------------------------------------------------------------------
    def load(self, states: list[State], to_files: bool = True) -> None:
        """Replace every client's state: a resumed checkpoint's, each written to its file in the disk
        store (`to_files`), or a new run's, whose clients share the initial tensors in memory."""
        self.discard()
        kept = move(states, torch.device("cpu"), self._pin) if self.where != "device" else list(states)
        self._states: list[State | Path] = list(kept)
        if self.where == "disk" and to_files:
            for k, state in enumerate(kept):
                self.stage(k, state)
            self.commit()

    def __setitem__(self, k: int, state: State) -> None:
        """Client k's state replaced now (outside a round: `fedfactor plan`'s copies)."""
        self.stage(k, state)
        self.commit()

    def stage(self, k: int, state: State) -> None:
        """Client k's trained state, in effect at the next `commit`; it leaves the device now unless
        the store is the device."""
        if self.where == "device":
            self._pending[k] = state
        elif self.where == "host":
            self._pending[k] = move(state, torch.device("cpu"), self._pin)
        else:
            assert self.folder is not None
            if not self._emptied:  # a killed run's files, at the first write: a checkpoint says what a resume holds
                shutil.rmtree(self.folder, ignore_errors=True)
                self.folder.mkdir(parents=True)
                self._emptied = True
            path = self.folder / f"{k}.pt.staged"
            torch.save(move(state, torch.device("cpu")), path)
            self._pending[k] = path

    def commit(self) -> None:
        for k, state in self._pending.items():
            if isinstance(state, Path):
                final = state.with_suffix("")  # k.pt
                os.replace(state, final)
                state = final
            self._states[k] = state
        self._pending = {}

    def discard(self) -> None:
        for state in self._pending.values():
            if isinstance(state, Path):
                state.unlink(missing_ok=True)
        self._pending = {}

    def close(self) -> None:
        """The disk store's files removed (the run is over; a checkpoint holds what a resume needs)."""
        if self.where == "disk" and self.folder is not None and self._emptied:
            shutil.rmtree(self.folder, ignore_errors=True)
            self._emptied = False

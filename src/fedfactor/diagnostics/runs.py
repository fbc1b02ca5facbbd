"""The runs `fedfactor diagnose` reads: their summary.json fields, what they have to analyse, FedFac's split history.

A run folder contributes when its summary.json lists `analysed_layers` ({"<index>": "<module>"}) and
it holds client_weights.npz (`weights`); a FedFac run also logs its own split per analysed round
(diagnostics/fedfac.shared.<index>/round_<r>.npy, one 0/1 vector of the layer's units each).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..report.figures import DatasetKey
from ..report.runs import find_summaries, read_summary
from ..run.weights import WEIGHTS_FILE

SHARED_PREFIX, COMMUNALITY_PREFIX = "fedfac.shared.", "fedfac.communality."
_ROUND_FILE = re.compile(r"round_(\d+)\.npy")


class _Tracking(BaseModel):
    model_config = ConfigDict(extra="ignore")
    uri: str | None = None


class _Config(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tracking: _Tracking = Field(default_factory=_Tracking)


class DiagnoseRun(DatasetKey):
    """The fields `fedfactor diagnose` reads from a summary.json."""

    analysed_layers: dict[str, str] | None = None  # {"<paper index>": "<module name>"}
    mlflow_run_id: str | None = None
    config: _Config = Field(default_factory=_Config)

    @field_validator("analysed_layers")
    @classmethod
    def _indices(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for k in v or {}:
            if not (k.isdigit() and int(k) >= 1):
                raise ValueError(f"analysed_layers key {k!r} is not a layer index (1, 2, ...)")
        return v


@dataclass
class RunInfo:
    path: Path  # the run folder
    run: DiagnoseRun
    layers: dict[int, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.run.scenario}/{self.run.method}/seed{self.run.seed}"


def read_runs(paths: Sequence[str | Path]) -> list[RunInfo]:
    """The runs under `paths` (run folders, their summary.json files, or folders searched for them)."""
    runs = []
    for f in find_summaries(paths):
        run = read_summary(f, DiagnoseRun)
        layers = {int(k): v for k, v in sorted((run.analysed_layers or {}).items(), key=lambda kv: int(kv[0]))}
        runs.append(RunInfo(f.parent, run, layers))
    return runs


def skip_reason(info: RunInfo) -> str | None:
    """Why a run has nothing to analyse, or None."""
    if not info.layers:
        return "no analysed layer (summary.json's analysed_layers is absent or empty)"
    if not (info.path / WEIGHTS_FILE).exists():  # something else by that name is a damaged file: an error row
        return f"no {WEIGHTS_FILE} (the run wrote no client weights; re-run it with a current fedfactor)"
    return None


def split_history(run_dir: Path, index: int) -> tuple[list[int], np.ndarray] | None:
    """A FedFac run's split of layer `index` per analysed round: (rounds, rounds x d 0/1 array), or
    None when the run logged none. ValueError for files that are not such vectors."""
    folder = run_dir / "diagnostics" / f"{SHARED_PREFIX}{index}"
    if not folder.is_dir():
        return None
    files = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _ROUND_FILE.fullmatch(p.name)))
    if not files:
        return None
    rows: list[np.ndarray] = []
    for _, p in files:
        try:
            a = np.load(p, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise ValueError(f"cannot read {p} ({' '.join(str(e).split())})") from None
        if a.ndim != 1 or (rows and a.shape != rows[0].shape):
            raise ValueError(f"{p} holds an array of shape {a.shape}, not a vector of "
                             f"{rows[0].shape[0] if rows else 'd'} units")
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == bool) or not np.isin(a, (0, 1)).all():
            raise ValueError(f"{p} holds values other than 0 and 1")
        rows.append(a.astype(np.uint8))
    return [r for r, _ in files], np.stack(rows)

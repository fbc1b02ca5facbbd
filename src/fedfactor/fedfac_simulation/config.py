"""The simulation study's config: its typed sections, the (p, alpha) settings and Figure 6's panels.

config/simulation/fedfac.yaml holds the defaults (see the package docstring for why each value);
`load_simulation_config` reads it with dotted `--set` overrides and checks that every setting leaves
shared and personal covariates and units and fits in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

from pydantic import BeforeValidator, Field, field_validator

from ..config import (MAX_CLIENTS, MAX_EPOCHS, MAX_ROUNDS, MAX_SEED, Float, Int, Section, apply_overrides, read_mapping,
                      validated)
from ..errors import UsageError
from ..analysis.factor import parse_tau

DECOMPOSITIONS = ("true", "oracle", "static", "dynamic", "random", "random_fixed", "all_shared", "all_personal")
FA_BASED = ("oracle", "static", "dynamic")
Decomposition = Literal["true", "oracle", "static", "dynamic", "random", "random_fixed", "all_shared", "all_personal"]


def _true_as_name(v: Any) -> Any:
    # YAML reads an unquoted `true` in `decompositions: [true, ...]` as a boolean
    return "true" if v is True else v


class SimDataConfig(Section):
    clients: Int = Field(100, ge=2, le=MAX_CLIENTS)
    d: Int = Field(100, ge=2, le=100_000)  # covariates
    m: Int = Field(200, ge=2, le=100_000)  # hidden units of teacher and student
    train_samples: Int = Field(100, ge=1, le=1_000_000)  # per client
    test_samples: Int = Field(200, ge=1, le=1_000_000)  # per client
    noise: Float = Field(1.0, ge=0)  # c: eps ~ N(0, c^2)
    label_threshold: Literal["client_median", "zero"] = "client_median"


class SimTrainConfig(Section):
    rounds: Int = Field(20, ge=1, le=MAX_ROUNDS)
    local_steps: Int = Field(5, ge=1, le=MAX_EPOCHS)  # full-batch gradient steps per round
    lr: Float = Field(0.1, gt=0)
    warmup_steps: Int = Field(10, ge=0, le=MAX_EPOCHS)  # local steps before static's factor analysis
    fraction: Float = Field(1.0, gt=0, le=1)  # share of clients taking part in a round


class SimSplitConfig(Section):
    tau: str | Float = "share"  # "share" = (1 - p) quantile of nu; else as fedfactor.analysis.factor.parse_tau
    kappa: Float = Field(0.85, gt=0, le=1)
    method: Literal["principal", "eigen"] = "principal"
    random: Literal["round", "fixed"] = "round"  # `random` redrawn every round, or drawn once

    @field_validator("tau")
    @classmethod
    def _tau(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() == "share":
            return "share"
        try:
            parse_tau(v)
        except ValueError:
            raise ValueError("must be share (the (1 - p) quantile), mean, a quantile such as 50% or q50, "
                             "inf, -inf or a number") from None
        return v


def _unit_interval(values: list[float]) -> list[float]:
    if not values or any(not 0 < v < 1 for v in values):
        raise ValueError("must be a non-empty list of numbers strictly between 0 and 1")
    return values


class SimGridConfig(Section):
    """Figure 6: p swept at alpha = alpha_fixed (top row), alpha swept at p = p_fixed (bottom row)."""

    p: list[Float] = Field(default_factory=lambda: [0.3, 0.5, 0.7])
    alpha: list[Float] = Field(default_factory=lambda: [0.2, 0.4, 0.6])
    p_fixed: Float = Field(0.5, gt=0, lt=1)
    alpha_fixed: Float = Field(0.4, gt=0, lt=1)

    @field_validator("p", "alpha")
    @classmethod
    def _in_unit_interval(cls, v: list[float]) -> list[float]:
        return _unit_interval(v)


def _default_decompositions() -> list[Decomposition]:
    return ["true", "oracle", "static", "dynamic", "random"]


class SimulationConfig(Section):
    data: SimDataConfig = Field(default_factory=SimDataConfig)
    train: SimTrainConfig = Field(default_factory=SimTrainConfig)
    split: SimSplitConfig = Field(default_factory=SimSplitConfig)
    grid: SimGridConfig = Field(default_factory=SimGridConfig)
    decompositions: list[Annotated[Decomposition, BeforeValidator(_true_as_name)]] = Field(
        default_factory=_default_decompositions)
    seeds: list[Annotated[Int, Field(ge=0, le=MAX_SEED)]] = Field(default_factory=lambda: [0, 1, 2])

    @field_validator("decompositions", "seeds")
    @classmethod
    def _distinct(cls, v: list) -> list:
        if not v or len(set(v)) != len(v):
            raise ValueError("must be a non-empty list without repeats")
        return v


# Floats one setting holds at once (every client's data, teacher and student): 2**30 is 4 GiB.
MAX_FLOATS = 2**30


def check_settings(cfg: SimulationConfig) -> None:
    """Every (p, alpha) must leave at least one shared and one personal covariate and unit, and one
    setting's arrays must fit in memory."""
    D = cfg.data
    floats = D.clients * ((D.train_samples + D.test_samples) * (D.d + 1) + 3 * D.d * D.m)
    if floats > MAX_FLOATS:
        raise UsageError(f"data.clients={D.clients:,} x (samples x d + 3 x d x m) = {floats:,} floats per setting, "
                         f"over the {MAX_FLOATS:,} (4 GiB) this simulation holds; lower clients, d, m or samples")
    for p, alpha in settings_of(cfg):
        d2, m2 = round(alpha * cfg.data.d), round(p * cfg.data.m)
        if not (1 <= d2 < cfg.data.d and 1 <= m2 < cfg.data.m):
            raise UsageError(f"p = {p:g}, alpha = {alpha:g} leave no shared or no personal covariates or units "
                             f"with d = {cfg.data.d}, m = {cfg.data.m} (d2 = {d2}, m2 = {m2})")


def settings_of(cfg: SimulationConfig) -> list[tuple[float, float]]:
    """The distinct (p, alpha) settings, in panel order (p sweep first)."""
    g = cfg.grid
    out = [(p, g.alpha_fixed) for p in g.p] + [(g.p_fixed, a) for a in g.alpha]
    return list(dict.fromkeys(out))


def panels_of(cfg: SimulationConfig) -> list[tuple[str, float, float]]:
    """Figure 6's panels: (title, p, alpha); a setting in both sweeps is drawn in both rows."""
    g = cfg.grid
    return ([(f"p = {p:g} (alpha = {g.alpha_fixed:g})", p, g.alpha_fixed) for p in g.p]
            + [(f"alpha = {a:g} (p = {g.p_fixed:g})", g.p_fixed, a) for a in g.alpha])


def load_simulation_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> SimulationConfig:
    """The typed study config from YAML and dotted `--set` overrides; every failure is one UsageError."""
    raw = read_mapping(path)
    apply_overrides(raw, overrides)
    cfg = validated(SimulationConfig, raw)
    check_settings(cfg)
    return cfg

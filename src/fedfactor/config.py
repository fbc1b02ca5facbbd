"""Typed run configuration: YAML in, dotted `--set` overrides, flat dict out for MLflow.

Every field has a default that follows the papers where they agree (see README, "Defaults and
choices the papers leave open"). Unknown keys are errors, so a typo never silently runs the
default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError


@dataclass
class DataConfig:
    name: str = "digits"
    root: str = "data"
    # Factorized-FL's official code pools train+test and cuts 80/10/10 ("pooled");
    # "official" keeps the dataset's own test set as the test pool.
    split: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])
    split_mode: str = "pooled"
    augment: str = "auto"  # "auto" = the dataset's default (crop/flip where it makes sense)
    download: bool = False


@dataclass
class PartitionConfig:
    kind: str = "iid"
    alpha: float = 0.5
    classes_per_client: int = 2
    groups: Any = None
    clients_per_group: int | None = None
    samples_per_client: dict = field(default_factory=lambda: {"train": 500, "val": 0, "test": 100})
    min_train_samples: int = 1
    permute_labels: bool = False
    permutation_seed: int = 1234
    file: str | None = None  # a partition saved by `fedfactor partition`; overrides the fields above

    def spec(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("file")
        return d


@dataclass
class ModelConfig:
    name: str = "cnn"


@dataclass
class FLConfig:
    clients: int = 20
    rounds: int = 50
    fraction: float = 1.0  # share of clients sampled per round
    epochs: int = 5
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    eval_every: int = 1
    # "auto": the head stays local whenever labels are permuted or clients hold different class
    # groups (Factorized-FL section 5.2); "local"/"shared" force it.
    head: str = "auto"
    device: str = "auto"


@dataclass
class TrackingConfig:
    enabled: bool = True
    uri: str = "sqlite:///results/mlflow.db"
    experiment: str = "fedfactor"
    experiment_id: str | None = None  # set by the workflow so parallel jobs never create experiments
    run_name: str | None = None


@dataclass
class Config:
    seed: int = 0
    scenario: str = "custom"  # a label for tables and MLflow; does not change behaviour
    method: dict = field(default_factory=lambda: {"name": "fedavg"})
    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    fl: FLConfig = field(default_factory=FLConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """Dotted keys -> values, the form MLflow params and tables use."""
        return flatten(self.to_dict())


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _build(cls, values: dict, where: str):
    if not isinstance(values, dict):
        raise UsageError(f"config section {where or 'root'!r} must be a mapping, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise UsageError(
            f"unknown config key {where + unknown[0]!r}; valid keys here: {', '.join(fields)}"
        )
    kwargs = {}
    for name, value in values.items():
        f = fields[name]
        if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
            kwargs[name] = _build(f.default_factory, value or {}, f"{where}{name}.")
        else:
            kwargs[name] = value
    return cls(**kwargs)


def _set_dotted(d: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
        if not isinstance(d, dict):
            raise UsageError(f"--set {dotted}: {k!r} is not a section")
    d[keys[-1]] = value


def parse_set(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise UsageError(f"--set expects dotted.key=value, got {item!r}")
    key, raw = item.split("=", 1)
    # YAML parsing gives 0.5 -> float, true -> bool, [1,2] -> list, as in the config file.
    return key.strip(), yaml.safe_load(raw) if raw.strip() else None


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    raw: dict = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise UsageError(f"config file {str(path)!r} does not exist") from None
        except yaml.YAMLError as e:
            raise UsageError(f"config file {str(path)!r} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"config file {str(path)!r} must hold a mapping of sections")
    if isinstance(raw.get("method"), str):  # `method: fedavg` is short for `method: {name: fedavg}`
        raw["method"] = {"name": raw["method"]}
    for item in overrides:
        _set_dotted(raw, *parse_set(item))
    method = raw.setdefault("method", {"name": "fedavg"})
    if isinstance(method, str):
        method = raw["method"] = {"name": method}
    if not isinstance(method, dict) or "name" not in method:
        raise UsageError("config key 'method' must be a name or a mapping with a 'name'")
    cfg = _build(Config, raw, "")
    _check(cfg)
    return cfg


def _check(cfg: Config) -> None:
    fl = cfg.fl
    positive = {"fl.clients": fl.clients, "fl.rounds": fl.rounds, "fl.epochs": fl.epochs,
                "fl.batch_size": fl.batch_size, "fl.eval_every": fl.eval_every}
    for key, value in positive.items():
        if not isinstance(value, int) or value < 1:
            raise UsageError(f"{key} must be a positive integer, got {value!r}")
    if not 0 < fl.fraction <= 1:
        raise UsageError(f"fl.fraction must be in (0, 1], got {fl.fraction!r}")
    if fl.lr <= 0:
        raise UsageError(f"fl.lr must be positive, got {fl.lr!r}")
    if fl.head not in ("auto", "local", "shared"):
        raise UsageError(f"fl.head must be one of auto, local, shared; got {fl.head!r}")

"""Typed run configuration: YAML in, dotted `--set` overrides, flat dict out for MLflow.

Every section is a pydantic model: values are coerced to the declared type (`--set fl.lr=1e-3`
arrives from YAML as the string "1e-3" and becomes 0.001) and range-checked, and unknown keys are
errors, so a typo never silently runs the default. Method hyperparameters are typed from the
method's own defaults (`Method.validate_params`). Every failure is one UsageError line, raised
before anything is written.

Defaults follow the papers where they agree (see README, "Defaults and choices the papers leave
open"); where they disagree (the evaluation protocol) each paper's run config says which it uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler,
                      field_validator)

from .errors import UsageError


def _not_bool(v: Any) -> Any:
    # pydantic would read `true` as 1: `--set fl.epochs=true` must be an error, not one epoch
    if isinstance(v, bool):
        raise ValueError("must be a number, not true/false")
    return v


Int = Annotated[int, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]


class Section(BaseModel):
    """A config section: typed fields, no unknown keys, no NaN or infinite numbers."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_default=True)


class DataConfig(Section):
    name: str = "digits"
    root: str = "data"
    # Factorized-FL's official code pools train+test and cuts 80/10/10 ("pooled");
    # "official" keeps the dataset's own test set as the test pool.
    split: list[Float] = Field(default_factory=lambda: [0.8, 0.1, 0.1])
    split_mode: Literal["pooled", "official"] = "pooled"
    augment: str = "auto"  # "auto" = the dataset's default (crop/flip where it makes sense)
    download: bool = False

    @field_validator("split")
    @classmethod
    def _three_shares(cls, v: list[float]) -> list[float]:
        if len(v) != 3 or min(v) < 0 or abs(sum(v) - 1) > 1e-6:
            raise ValueError("must be three non-negative fractions train, val, test summing to 1")
        return v


class SamplesPerClient(Section):
    """dirichlet_fixed (FedDecomp): samples each client draws per split."""

    train: Int = Field(500, ge=1)
    val: Int = Field(0, ge=0)
    test: Int = Field(100, ge=0)


class PartitionConfig(Section):
    kind: str = "iid"
    alpha: Float = Field(0.5, gt=0)
    classes_per_client: Int = Field(2, ge=1)
    groups: str | list[list[Int]] | None = None  # a preset name or a list of class lists
    clients_per_group: Int | None = Field(None, ge=1)
    samples_per_client: SamplesPerClient = Field(default_factory=SamplesPerClient)
    # dirichlet_fixed: True draws each client's samples independently (clients may share samples),
    # as FedDecomp's official code does; False makes clients disjoint.
    overlap: bool = True
    min_train_samples: Int = Field(1, ge=1)
    permute_labels: bool = False
    permutation_seed: Int = Field(1234, ge=0)
    file: str | None = None  # a partition saved by `fedfactor partition`; overrides the fields above

    @field_validator("groups", mode="wrap")
    @classmethod
    def _groups_hint(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # pydantic's own error would name just one branch of the union
        try:
            return handler(v)
        except ValidationError:
            raise ValueError("must be a preset name or a non-empty list of non-empty lists of classes") from None

    def spec(self) -> dict:
        return self.model_dump(exclude={"file"})


class ModelConfig(Section):
    name: str = "cnn"
    # Start from torchvision's ImageNet weights (resnet18, vgg16; 3-channel data), all but the head,
    # as FedFac's official CIFAR runs do; read from $TORCH_HOME/hub/checkpoints, downloaded if missing.
    pretrained: bool = False


class FLConfig(Section):
    clients: Int = Field(20, ge=1)
    rounds: Int = Field(50, ge=1)
    fraction: Float = Field(1.0, gt=0, le=1)  # share of clients sampled per round
    epochs: Int = Field(5, ge=1)
    batch_size: Int = Field(64, ge=1)
    optimizer: Literal["sgd", "adam"] = "sgd"  # a method's training phases may name another
    lr: Float = Field(0.01, gt=0)
    momentum: Float = Field(0.9, ge=0, lt=1)  # SGD only
    weight_decay: Float = Field(0.0, ge=0)
    eval_every: Int = Field(1, ge=1)
    # "auto": the head stays local whenever two clients map classes to outputs differently
    # (permuted labels, class groups); "local"/"shared" force it.
    head: Literal["auto", "local", "shared"] = "auto"
    device: str = "auto"
    # A client whose mean training loss in a round is NaN, infinite or above max_loss has diverged:
    # "stop" ends the run naming the round and client; "skip" drops that client's update for the
    # round (its state stays as it was, nothing is uploaded) and records it in metrics.csv.
    on_divergence: Literal["stop", "skip"] = "stop"
    max_loss: Float = Field(1e4, gt=0)
    # Train the round's clients as one batched computation (torch.func.vmap over their stacked
    # parameters) where the method trains through plans (no own loop) and their plans are equal.
    # "auto": on CUDA; on CPU only for models of Linear layers alone (there vmap's batched matmuls
    # win, its grouped convolutions lose: BENCHMARKS.md). Results equal one-by-one within float
    # rounding; dropout draws differ.
    # true/false force it (YAML reads on/off as true/false too).
    batch_clients: Literal["auto"] | bool = "auto"
    # At most this many clients in one batched computation (memory grows with it: every client's
    # parameters, gradients, optimizer state and activations at once).
    batch_clients_max: Int = Field(64, ge=2)
    # bf16: forward and loss of local training under torch.autocast(bfloat16); scoring stays float32.
    precision: Literal["float32", "bf16"] = "float32"
    # Convolution weights and inputs in channels_last memory format (faster convolutions on GPUs).
    channels_last: bool = False


class CheckpointConfig(Section):
    """Resume after any kill: OUT/checkpoint.pt holds everything the next round needs."""

    every: Int = Field(5, ge=0)  # rounds between checkpoints; 0: only when SIGTERM/SIGINT stops the run
    keep: bool = False  # keep the checkpoint after the run has finished


class EvalConfig(Section):
    """The evaluation protocol; each paper uses its own (README, "Evaluation protocols")."""

    # client: each client's own test split, cut with its own class mix (FedDecomp, FedFac).
    # shared: the pooled test split, restricted to the client's task classes and relabelled through
    # its label map (Factorized-FL, SimFed).
    test_pool: Literal["client", "shared"] = "client"
    # received: what a client holds after the server's download (FedDecomp's official code).
    # trained: the client's model after its local training of the round (Factorized-FL's code).
    model: Literal["received", "trained"] = "received"
    # The number a table reports: last round, best round of the mean, best round of the
    # test-size-weighted mean, or the test accuracy at the round best on validation.
    report: Literal["last", "best", "best_weighted", "best_val"] = "last"
    # A share of the clients held out of training (FedFac 001 section 3.2, Table 3): never sampled,
    # not in the accuracies above; after the last round each is scored by the method's strategies
    # for new clients (summary.json "new_clients").
    new_clients: Float = Field(0.0, ge=0, lt=1)


class DiagnosticsConfig(Section):
    """What a run keeps for `fedfactor diagnose` (the factor-analysis diagnostics)."""

    # Layers (1-based, models/layers.py; -1 = the layer before the classifier) whose final client
    # weights go to client_weights.npz; empty: the method's choice (FedFac: its Lambda, others: -1).
    layers: list[Int] = Field(default_factory=list)
    keep_weights: bool = True
    max_clients: Int = Field(10, ge=1)  # clients kept (those trained in the last round first)


class TrackingConfig(Section):
    enabled: bool = True
    uri: str = "sqlite:///results/mlflow.db"
    experiment: str = "fedfactor"
    experiment_id: str | None = None  # set by the workflow so parallel jobs never create experiments
    run_name: str | None = None

    @field_validator("experiment_id", mode="before")
    @classmethod
    def _id_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v  # YAML reads `1` as int


class Config(Section):
    seed: Int = Field(0, ge=0)
    scenario: str = "custom"  # a label for tables and MLflow; does not change behaviour
    # the method's label in a study (tables, MLflow; "" = the method's name): a study may run one
    # method under several labels with different hyperparameters
    label: str = ""
    # {"name": ..., hyperparameters...}; typed against the method's defaults in load_config
    method: dict[str, Any] = Field(default_factory=lambda: {"name": "fedavg"})
    data: DataConfig = Field(default_factory=DataConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    fl: FLConfig = Field(default_factory=FLConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    diagnostics: DiagnosticsConfig = Field(default_factory=DiagnosticsConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    def to_dict(self) -> dict:
        return self.model_dump()

    def result_dict(self) -> dict:
        """What determines the results: everything but where they are mirrored, checkpointed and which
        weights are kept for diagnostics."""
        return {k: v for k, v in self.to_dict().items() if k not in ("checkpoint", "diagnostics", "tracking")}

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


def validation_message(err: ValidationError, prefix: str = "") -> str:
    """The first error of a pydantic ValidationError as one line: `key: what is wrong (got value)`."""
    e = err.errors()[0]
    key = prefix + ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        return f"unknown config key {key!r}"
    got = e.get("input")
    shown = repr(got) if not isinstance(got, dict) else "a mapping"
    msg = e["msg"].removeprefix("Value error, ")
    return f"{key or 'config'}: {msg[0].lower()}{msg[1:]} (got {shown})".replace("\n", " ")


def _valid_keys(model: type[BaseModel], dotted: str) -> str:
    """The valid keys of the section an unknown key sits in, for the error message."""
    for part in dotted.split(".")[:-1]:
        field = model.model_fields.get(part)
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return ""
        model = ann
    return "; valid keys here: " + ", ".join(model.model_fields)


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
    try:
        # YAML parsing gives 0.5 -> float, true -> bool, [1,2] -> list, as in the config file.
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw  # not YAML: keep the text; the typed config says whether a string may go there
    return key.strip(), value


def read_mapping(path: str | Path | None) -> dict:
    """A YAML config file as a dict ({} without a path); every failure is one UsageError."""
    raw: Any = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise UsageError(f"config file {str(path)!r} does not exist") from None
        except IsADirectoryError:
            raise UsageError(f"config file {str(path)!r} is a folder, not a YAML file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"config file {str(path)!r} cannot be read: {e}") from None
        except yaml.YAMLError as e:
            raise UsageError(f"config file {str(path)!r} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"config file {str(path)!r} must hold a mapping of sections")
    return raw


def apply_overrides(raw: dict, overrides: list[str]) -> None:
    """Apply `--set dotted.key=value` items to a raw config mapping, in order."""
    for item in overrides:
        _set_dotted(raw, *parse_set(item))


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], raw: dict) -> M:
    """`raw` as the typed config `model`; the first problem as one UsageError naming the key."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        message = validation_message(e)
        if e.errors()[0]["type"] == "extra_forbidden":
            message += _valid_keys(model, ".".join(map(str, e.errors()[0]["loc"])))
        raise UsageError(message) from None


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    raw = read_mapping(path)
    if isinstance(raw.get("method"), str):  # `method: fedavg` is short for `method: {name: fedavg}`
        raw["method"] = {"name": raw["method"]}
    apply_overrides(raw, overrides)
    method = raw.setdefault("method", {"name": "fedavg"})
    if not isinstance(method, dict) or not isinstance(method.get("name"), str):
        raise UsageError("config key 'method' must be a name or a mapping with a 'name'")
    cfg = validated(Config, raw)
    from .methods import METHODS  # torch is imported only once a config is otherwise valid

    params = {k: v for k, v in cfg.method.items() if k != "name"}
    cfg.method = {"name": cfg.method["name"], **METHODS.get(cfg.method["name"]).validate_params(params)}
    return cfg

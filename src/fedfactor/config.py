"""Typed run configuration: YAML in, dotted `--set` overrides, flat dict out for MLflow.

Every section is a pydantic model: values are coerced to the declared type (`--set fl.lr=1e-3`
arrives from YAML as the string "1e-3" and becomes 0.001) and range-checked, and unknown keys are
errors, so a typo never silently runs the default. `method` stays data here: its hyperparameters
are typed and checked by the method (`fedfactor.methods.build`), which whoever runs the config calls.
Every failure is one UsageError line, raised before anything is written.

Defaults follow the papers where they agree (see docs/defaults.md, "Defaults and choices the
papers leave open"); where they disagree (the evaluation protocol) each paper's run config says which it uses.
"""

from __future__ import annotations

import reprlib
import stat
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, Sequence, TypeVar, cast

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError,
                      ValidatorFunctionWrapHandler, field_validator, model_serializer)

from .errors import UsageError


def _not_bool(v: Any) -> Any:
    # pydantic would read `true` as 1: `--set fl.epochs=true` must be an error, not one epoch
    if isinstance(v, bool):
        raise ValueError("must be a number, not true/false")
    return v


Int = Annotated[int, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]

# Upper bounds on counts, refused up front with the limit in the message: `fl.rounds=1e29` would
# otherwise be accepted and train until killed. Each is far above what any paper runs (FedFac:
# 3,550 FEMNIST writers; the longest runs here: 2,000 rounds, 20 local epochs).
MAX_CLIENTS = 100_000
MAX_ROUNDS = 100_000
MAX_EPOCHS = 1_000
MAX_SAMPLES = 10_000_000  # samples a client draws (dirichlet_fixed), a batch
MAX_SEED = 2**32 - 1  # numpy's and most tools' seed range; torch.manual_seed overflows above 2**64
# A method's whole-number hyperparameters (epochs, ranks, rounds of warm-up, iterations)
MethodCount = Annotated[int, BeforeValidator(_not_bool), Field(le=10_000)]


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
    # The seed of the train/val/test cut, apart from the run seed: every run of a study, its tuning
    # runs included, cuts the same samples for test, so no tuning run trains or selects on a sample
    # any final run scores (docs/data.md, "What the seeds fix").
    seed: Int = Field(0, ge=0, le=MAX_SEED)
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

    train: Int = Field(500, ge=1, le=MAX_SAMPLES)
    val: Int = Field(0, ge=0, le=MAX_SAMPLES)
    test: Int = Field(100, ge=0, le=MAX_SAMPLES)


class PartitionConfig(Section):
    kind: str = "iid"
    alpha: Float = Field(0.5, gt=0)
    classes_per_client: Int = Field(2, ge=1)
    # a preset name or a list of class lists; checked under every kind, not only the one using it
    groups: str | Annotated[list[Annotated[list[Annotated[Int, Field(ge=0)]], Field(min_length=1)]],
                            Field(min_length=1)] | None = None
    clients_per_group: Int | None = Field(None, ge=1, le=MAX_CLIENTS)
    samples_per_client: SamplesPerClient = Field(default_factory=SamplesPerClient)
    # dirichlet_fixed: True draws each client's samples independently (clients may share samples),
    # as FedDecomp's official code does; False makes clients disjoint.
    overlap: bool = True
    # dirichlet: redraw until every client has this many train samples; natural: the clients eligible
    min_train_samples: Int = Field(1, ge=1, le=MAX_SAMPLES)
    permute_labels: bool = False
    permutation_seed: Int = Field(1234, ge=0, le=MAX_SEED)
    file: str | None = None  # a partition saved by `fedfactor partition`; overrides the fields above

    @field_validator("groups", mode="wrap")
    @classmethod
    def _groups_hint(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # pydantic's own error would name just one branch of the union
        try:
            return handler(v)
        except ValidationError:
            raise ValueError("must be a preset name or a non-empty list of non-empty lists of classes") from None

    def spec(self) -> dict[str, Any]:
        return self.model_dump(exclude={"file"})


class ModelConfig(Section):
    name: str = "cnn"
    # Start from torchvision's ImageNet weights (resnet18, vgg16; 3-channel data), all but the head,
    # as FedFac's official CIFAR runs do; read from $TORCH_HOME/hub/checkpoints, downloaded if missing.
    pretrained: bool = False
    # Every layer's channels or units times this (at least 1 each; the head's outputs stay the classes):
    # the tests' smoke runs train the papers' architectures at 1/8 width, in seconds. Full width (1)
    # is every paper's, and the only one the ImageNet weights fit.
    width_multiplier: Float = Field(1.0, gt=0, le=1)

    @model_serializer(mode="wrap")
    def _full_width_unwritten(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The key came after runs were written: at full width it stays out of config.yaml, the
        # fingerprint and MLflow's params, so those runs keep theirs and resume.
        data = handler(self)
        if self.width_multiplier == 1.0:
            data.pop("width_multiplier", None)
        return cast(dict[str, Any], data)


class FLConfig(Section):
    clients: Int = Field(20, ge=1, le=MAX_CLIENTS)
    rounds: Int = Field(50, ge=1, le=MAX_ROUNDS)
    fraction: Float = Field(1.0, gt=0, le=1)  # share of clients sampled per round
    epochs: Int = Field(5, ge=1, le=MAX_EPOCHS)
    batch_size: Int = Field(64, ge=1, le=MAX_SAMPLES)
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
    # round (its state stays as it was, nothing is uploaded) and records it in metrics.csv; a round
    # left with no update at all stops the run as "stop" does.
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

    every: Int = Field(5, ge=0)  # rounds between checkpoints; 0: by time, and when SIGTERM/SIGINT stops the run
    # also write one at the end of a round once this much wall time has passed since the last (a
    # SIGKILL or a node failure loses at most about that much); 0: never by time
    minutes: Float = Field(30.0, ge=0)
    # a checkpoint due by rounds waits while its last write took more than this share of the time
    # since (and over a second): a large checkpoint costs at most a few per cent of a run
    max_share: Float = Field(0.05, gt=0, le=1)
    keep: bool = False  # keep the checkpoint after the run has finished


class StoreConfig(Section):
    """Where the clients' states wait between their rounds (fl/store.py); the results are the same in each."""

    # auto: on the run's device where they fit half its memory, else in host memory (a GPU run) where
    # they fit half of it, else in files on local disk (under the run's folder, memory-mapped when read)
    client_states: Literal["auto", "device", "host", "disk"] = "auto"


class EvalConfig(Section):
    """The evaluation protocol; each paper uses its own (docs/protocols.md)."""

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


# MLflow's tracking stores: a database through SQLAlchemy, a folder, a server
TRACKING_SCHEMES = {"sqlite", "postgresql", "mysql", "mssql", "file", "http", "https", "databricks"}


def sqlite_file(uri: str) -> str | None:
    """The database file a `sqlite:` URI names ("" for none: `sqlite://`, `:memory:`); None for any
    other store. The one reading of a SQLite URI: the config check, the CLI's output check and the
    tracker's store all go through it."""
    if not uri.startswith("sqlite:"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0] if uri.startswith("sqlite:///") else ""
    return "" if path == ":memory:" else path


def check_tracking_uri(uri: str, key: str = "tracking.uri") -> str:
    """A store URI MLflow would not silently replace: `sqlite:///` without a file logs to ./mlruns."""
    if not uri.strip():
        raise UsageError(f"{key} is empty; give a store, e.g. sqlite:///results/mlflow.db")
    scheme = uri.split("://", 1)[0].split("+", 1)[0] if "://" in uri else ""  # postgresql+psycopg2://
    if scheme and scheme not in TRACKING_SCHEMES:  # MLflow would fail at the first call, and the job train on untracked
        raise UsageError(f"{key} {uri!r}: unknown scheme {scheme!r}; use one of {', '.join(sorted(TRACKING_SCHEMES))}, "
                         "or a local folder")
    if sqlite_file(uri) == "":
        raise UsageError(f"{key} {uri!r} names no database file; write sqlite:///PATH, e.g. "
                         "sqlite:///results/mlflow.db (four slashes for an absolute path)")
    return uri


class TrackingConfig(Section):
    enabled: bool = True
    uri: str = "sqlite:///results/mlflow.db"
    experiment: str = Field("fedfactor", min_length=1)
    experiment_id: str | None = None  # set by the workflow so parallel jobs never create experiments
    run_name: str | None = None

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        try:
            return check_tracking_uri(v)
        except UsageError as e:
            raise ValueError(str(e).removeprefix("tracking.uri ")) from None

    @field_validator("experiment_id", mode="before")
    @classmethod
    def _id_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v  # YAML reads `1` as int


class Config(Section):
    seed: Int = Field(0, ge=0, le=MAX_SEED)
    scenario: str = "custom"  # a label for tables and MLflow; does not change behaviour
    # the method's label in a study (tables, MLflow; "" = the method's name): a study may run one
    # method under several labels with different hyperparameters
    label: str = ""
    # {"name": ..., hyperparameters...}; typed and checked by fedfactor.methods.build
    method: dict[str, Any] = Field(default_factory=lambda: {"name": "fedavg"})
    data: DataConfig = Field(default_factory=DataConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    fl: FLConfig = Field(default_factory=FLConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    diagnostics: DiagnosticsConfig = Field(default_factory=DiagnosticsConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def result_dict(self) -> dict[str, Any]:
        """What determines the results: everything but where they are mirrored, checkpointed and which
        weights are kept for diagnostics, and where the clients' states wait (identical results)."""
        return {k: v for k, v in self.to_dict().items()
                if k not in ("checkpoint", "store", "diagnostics", "tracking")}

    def flat(self) -> dict[str, Any]:
        """Dotted keys -> values, the form MLflow params and tables use."""
        return flatten(self.to_dict())


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# A value shown in a message is cut short: a YAML alias bomb's list must not be printed whole.
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxstring, _SHORT.maxother = 3, 6, 80, 80


def validation_message(err: ValidationError, prefix: str = "") -> str:
    """The first error of a pydantic ValidationError as one line: `key: what is wrong (got value)`."""
    e = err.errors()[0]
    key = prefix + ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        return f"unknown config key {key!r}"
    got = e.get("input")
    shown = _SHORT.repr(got) if not isinstance(got, dict) else "a mapping"
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


def _set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
        if not isinstance(d, dict):
            raise UsageError(f"--set {dotted}: {k!r} is not a section")
    d[keys[-1]] = value


class _Refused(yaml.constructor.ConstructorError):
    """A YAML document that parses but is no config: reported with its line and column."""


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing what a config never holds: a key given twice in one mapping
    (PyYAML keeps the last silently, so a second `fl:` block or `rounds: 1` then `rounds: 3` would win
    unnoticed), a key that is a list or a mapping (`? [a]`: unhashable, a TypeError in PyYAML), and
    `!!binary` bytes (pydantic would coerce b"1" to the number 1)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: explicit keys may override it
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict, set)):
                raise _Refused(None, None, "a key is a list or a mapping; config keys are names", key_node.start_mark)
            if key in seen:
                raise _Refused(None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_yaml_binary(self, node: Any) -> NoReturn:
        raise _Refused(None, None, "a !!binary value; config values are text, numbers, lists or mappings",
                       node.start_mark)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)
_StrictLoader.add_constructor("tag:yaml.org,2002:binary", _StrictLoader.construct_yaml_binary)

# Values a YAML document may expand to, aliases counted at every use: ours hold a few hundred,
# and an alias bomb (each level repeating the one before) holds billions that every later walk
# of the config would visit.
MAX_YAML_VALUES = 100_000
# YAML events (scalars, starts and ends of mappings) a document may hold as written, counted by
# libyaml before PyYAML's slow loader builds it: the largest file here (a tuned study's chosen values)
# holds under 2,000, and a 60,000-key file would otherwise take seconds to build before its refusal.
MAX_YAML_EVENTS = 50_000
MAX_CONFIG_BYTES = 2**20
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _too_many_events(text: str) -> bool:
    try:
        for n, _ in enumerate(yaml.parse(text, Loader=_FAST_LOADER)):
            if n >= MAX_YAML_EVENTS:
                return True
    except yaml.YAMLError:  # the strict loader reports it, in its own words
        pass
    return False


def _too_many_values(doc: Any, budget: int = MAX_YAML_VALUES) -> bool:
    stack = [doc]
    while stack:
        budget -= 1
        if budget < 0:
            return True
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def load_yaml(text: str, source: str) -> Any:
    """A YAML document as Python values, safely (no tags that build objects); UsageError naming
    `source` for invalid YAML, what _StrictLoader refuses, or a document of over MAX_YAML_EVENTS
    keys and values as written or MAX_YAML_VALUES with its aliases expanded."""
    if _too_many_events(text):
        raise UsageError(f"{source} holds over {MAX_YAML_EVENTS:,} YAML keys and values as written; a config "
                         "holds a few hundred")
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except _Refused as e:
        mark = e.problem_mark
        raise UsageError(f"{source}: {e.problem} (line {mark.line + 1}, column {mark.column + 1})") from None
    except yaml.YAMLError as e:
        problem = " ".join(str(e).split())
        raise UsageError(f"{source} is not valid YAML: {problem[:300]}") from None
    except RecursionError:
        raise UsageError(f"{source} is nested too deeply to be a config") from None
    if _too_many_values(doc):
        raise UsageError(f"{source} expands to over {MAX_YAML_VALUES:,} values (YAML aliases repeating "
                         "each other?); a config holds far fewer")
    return doc


def parse_set(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise UsageError(f"--set expects dotted.key=value, got {item!r}")
    key, raw = item.split("=", 1)
    try:
        # YAML parsing gives 0.5 -> float, true -> bool, [1,2] -> list, as in the config file.
        value = load_yaml(raw, f"--set {key.strip()}") if raw.strip() else None
    except UsageError as e:
        if "not valid YAML" not in str(e):
            raise
        value = raw  # not YAML: keep the text; the typed config says whether a string may go there
    return key.strip(), value


def regular_file(path: str | Path, what: str, missing: str = "") -> Path:
    """`path` as a Path once it is a regular file; otherwise one UsageError saying what it is (and
    `missing` after "does not exist"). Only regular files are opened: open() on a named pipe blocks
    until a writer comes, for ever."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UsageError(f"{what} {str(path)!r} does not exist{missing}") from None
    except OSError as e:
        raise UsageError(f"{what} {str(path)!r} cannot be read: {' '.join(str(e).split())[:200]}") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"{what} {str(path)!r} is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise UsageError(f"{what} {str(path)!r} is not a regular file (a pipe, socket or device); give a file")
    return path


def read_mapping(path: str | Path | None) -> dict[str, Any]:
    """A YAML config file as a dict ({} without a path, or for a file that is empty or holds
    comments only); every failure is one UsageError."""
    if path is None:
        return {}
    regular_file(path, "config file")
    try:
        with open(path, "rb") as f:  # read at most a byte past the limit: the file may grow meanwhile
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise UsageError(f"config file {str(path)!r} is over {MAX_CONFIG_BYTES // 2**20} MiB; a config is a few KiB")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"config file {str(path)!r} cannot be read: {' '.join(str(e).split())[:200]}") from None
    raw = load_yaml(text, f"config file {str(path)!r}")
    if raw is None and _nothing_written(text):
        return {}
    if not isinstance(raw, dict):
        shown = "null" if raw is None else _SHORT.repr(raw)
        raise UsageError(f"config file {str(path)!r} must hold a mapping of sections, not {shown}")
    return raw


def _nothing_written(text: str) -> bool:
    """An empty document (no text, comments only, a bare `---`): no settings. `null` or `~` written
    out is refused as `false` or `0` are: each would otherwise read as "no settings" too."""
    node = yaml.compose(text, Loader=_FAST_LOADER)
    return node is None or (isinstance(node, yaml.ScalarNode) and node.value == "" and node.tag.endswith(":null"))


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> None:
    """Apply `--set dotted.key=value` items to a raw config mapping, in order."""
    for item in overrides:
        _set_dotted(raw, *parse_set(item))


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], raw: dict[str, Any]) -> M:
    """`raw` as the typed config `model`; the first problem as one UsageError naming the key."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        message = validation_message(e)
        if e.errors()[0]["type"] == "extra_forbidden":
            message += _valid_keys(model, ".".join(map(str, e.errors()[0]["loc"])))
        raise UsageError(message) from None


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    raw = read_mapping(path)
    if isinstance(raw.get("method"), str):  # `method: fedavg` is short for `method: {name: fedavg}`
        raw["method"] = {"name": raw["method"]}
    # the default method before the overrides: `--set method.bogus=1` alone is then FedAvg's bogus
    # hyperparameter (which its build names), not a method section without a name
    raw.setdefault("method", {"name": "fedavg"})
    apply_overrides(raw, overrides)
    method = raw["method"]
    if not isinstance(method, dict) or not isinstance(method.get("name"), str):
        raise UsageError("config key 'method' must be a name or a mapping with a 'name'")
    return validated(Config, raw)

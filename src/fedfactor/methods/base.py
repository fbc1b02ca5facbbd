"""FedAvg, written as the hooks every other method overrides a few of.

A method never touches the network: the round loop calls `download` and `upload` and counts
whatever they return, so communication cost is measured from what is sent.

Server side
    init_server(init_state) -> server   the method's own dict of tensors
    download(server, k) -> payload      what client k receives (personalised per client if needed)
    aggregate(server, uploads, weights) how the server combines uploads into its state (where a method
                                        keeps this one, the round sums uploads as they arrive: set_global)
Client side
    init_client(k, init_state) -> state the client's state: the model's entries plus any extras
    receive(k, state, payload) -> state how the client merges what it received (pure)
    plan(k, state, received) -> phases  local training as data (which parameters, how long, optimizer, loss)
    local_train(k, state, received)     executes the plan; override only what a plan cannot say
    upload(k, state) -> payload         what client k sends (which entries are shared)
    replaced_on_receive() -> keys       what every receive overwrites: a trained client need not keep it
    evaluation_state(k, state) -> state what is scored, given the model the protocol picked
After the run
    run_warnings(diagnostics) -> lines how the run degenerated, if it did (read from logged scalars)
Before the run
    prepare_model(model) -> model       swap layers (factorized, low-rank, ...) before the first state

Every hook can read the round as `self.ctx.round`. Client state is a plain dict of tensors the
simulator keeps per client: the model's state dict plus any entries a method adds (extra models,
mixture weights, kept optimizer state); only what a hook returns as a payload is sent and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ..config import Float, MethodCount, validation_message
from ..errors import UsageError
from ..fl.state import State, WeightedSum, clone, select
from ..fl.train import Batch, Optim, Phase, Split
from ..models import resolve_layers
from ..models.layers import recurrent_layer
from ..registry import Registry

M = TypeVar("M", bound="type[Method]")


class _Methods(Registry["type[Method]"]):
    """The method registry; registering a class names it (`Method.name`), so the name is written once."""

    def register(self, name: str, description: str) -> Callable[[M], M]:  # a class keeps its own type
        add = super().register(name, description)

        def named(cls: M) -> M:
            cls.name = name
            add(cls)
            return cls

        return named


METHODS = _Methods("method")
Count = MethodCount  # a whole-number hyperparameter: epochs, ranks, rounds, iterations (at most 10,000)
__all__ = ["METHODS", "Context", "Count", "Float", "Method", "Params", "one_of", "variant"]


@dataclass(frozen=True)
class _OneOf:
    allowed: tuple[str, ...]


def one_of(*allowed: str) -> _OneOf:
    """A hyperparameter that takes one of a few names, `mode: Annotated[str, one_of("a", "b")] = "a"`
    (checked once every field has its type, naming the choices)."""
    return _OneOf(allowed)


class Params(BaseModel):
    """A method's hyperparameters: `method.<key>` in a config sets them. A method declares its own
    as a subclass (typed fields with defaults, ranges as Field(ge=...), checks across fields as
    validators raising UsageError); the base has none (FedAvg's)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    @model_validator(mode="after")
    def _names(self) -> "Params":
        for key, info in type(self).model_fields.items():
            allowed = next((m.allowed for m in info.metadata if isinstance(m, _OneOf)), None)
            if allowed is not None and getattr(self, key) not in allowed:
                raise UsageError(f"method.{key} must be one of {', '.join(allowed)} (got {getattr(self, key)!r})")
        return self


def at_least(key: str, value: float, low: float, note: str = "") -> None:
    """A UsageError unless value >= low: `method.<key> must be >= <low> (got <value>)`."""
    if value < low:
        raise UsageError(f"method.{key} must be >= {low} ({note}got {value})")


def refuse_recurrent(method: "Method", model: torch.nn.Module) -> None:
    """A one-line UsageError when `model` has a recurrent layer (char_lstm's LSTMs) and `method`
    declares (`recurrent_refused`) why it cannot run on one; the simulator asks before prepare_model."""
    layer = recurrent_layer(model)
    if layer is not None and method.recurrent_refused:
        raise UsageError(f"method {method.name} cannot run on a recurrent model (layer {layer} is an LSTM): "
                         f"{method.recurrent_refused}")


def positive_or_none(key: str, value: Any, meaning: str) -> Any:
    """A step size that may be null (then `meaning`, e.g. the run's fl.lr): a finite number > 0."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 < value < math.inf):
        raise UsageError(f"method.{key} must be a number > 0, or null for {meaning} (got {value!r})")
    return value


@dataclass
class Context:
    """What the simulator tells a method about the run, and the client-side services it offers."""

    model: torch.nn.Module  # the one model object shared by all clients
    num_clients: int
    train_sizes: list[int]
    param_keys: list[str]  # learnable parameters
    buffer_keys: list[str]  # floating-point buffers (BatchNorm running statistics)
    head_keys: list[str]  # the classifier's entries (parameters and buffers)
    head_local: bool  # clients map classes to outputs differently: the head is never aggregated
    epochs: int  # the config's local epochs (fl.epochs)
    optim: Optim  # the config's optimizer
    # fit(k, state, phases) -> (state, mean loss): train client k's state on its train split
    fit: Callable[[int, State, Sequence[Phase]], tuple[State, float]]
    # evaluate(k, state, split) -> (correct, count, summed loss) on client k's "val", "test" or "own_val"
    evaluate: Callable[[int, State, str], tuple[int, int, float]]
    # split(k, name) -> client k's "train", "val" or "test" data as the protocol defines it (under
    # eval.test_pool shared, val and test are the pooled splits, the same for all clients of a task),
    # or "own_val": the client's own validation cut under every pool, for a method that weighs or
    # picks models on the client's validation data
    split: Callable[[int, str], Split]
    # batches(k, epochs=None, steps=None, split="train", seed=None) -> shuffled, augmented minibatches
    # from the client's stream of the round, or from a stream of their own when a seed is given;
    # inside local_train they stop on a stop signal and leave out a batch of one where skip_single
    batches: Callable[..., Iterator[Batch]]
    # log(name, value): a per-round diagnostic; scalars go to metrics.csv and MLflow, arrays to files
    log: Callable[[str, Any], None]
    round: int = 0  # the current round, 1-based; 0 before the first
    input_shape: tuple[int, ...] = ()  # one input's (channels, height, width)
    seed: int = 0  # the run's seed, for a method's own random draws (derive_seed(seed, round, k))
    # domains[k]: an id shared by the clients whose tasks hold the same classes (one id for all
    # clients in label-heterogeneous scenarios); for diagnostics such as in-domain matching
    domains: list[int] = field(default_factory=list)
    # the config's fl.max_loss: a method with its own training loop passes it to fl.train.mean_loss
    max_loss: float = math.inf
    # the model has BatchNorm, which cannot train on one sample: training skips a batch of one
    skip_single: bool = False
    float_keys: list[str] = field(init=False)  # parameters and float buffers: what FedAvg shares

    def __post_init__(self) -> None:
        self.float_keys = [*self.param_keys, *self.buffer_keys]


class Method:
    name = "fedavg"
    Params: ClassVar[type[Params]] = Params  # the hyperparameters, `self.hp` once validated
    preset: ClassVar[dict[str, Any]] = {}  # a variant's values for them (`variant`), before the config's
    # True when what is sent depends on trained values (sparse or pruned payloads): `fedfactor cost`
    # cannot project it from shapes and says so.
    payload_depends_on_values: bool = False  # a method may set it per instance, from its hyperparameters
    # Why the method cannot run on a recurrent model (char_lstm), or "" when it can (refuse_recurrent).
    recurrent_refused: ClassVar[str] = ""
    spec: dict[str, Any]  # {"name": ..., every hyperparameter}: the config's method as `build` fills it in

    def __init__(self, **params: Any):
        try:
            self.hp = self.Params.model_validate({**self.preset, **params})
        except ValidationError as e:
            first = e.errors()[0]
            if first["type"] == "extra_forbidden":
                valid = ", ".join(self.Params.model_fields) or "none"
                raise UsageError(f"method {self.name!r} has no parameter {first['loc'][0]!r}; valid: {valid}") from None
            raise UsageError(validation_message(e, prefix="method.")) from None

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Change the model before the run starts (runs on the meta device for `fedfactor cost`)."""
        return model

    def bind(self, ctx: Context) -> None:
        self.ctx = ctx
        self.model_keys = list(ctx.model.state_dict())  # the model's entries in a client's state
        self.shared = self.shared_keys()

    def shared_keys(self) -> list[str]:
        """The state entries clients upload and the server averages."""
        personal = set(self.ctx.head_keys) if self.ctx.head_local else set()
        return [k for k in self.ctx.float_keys if k not in personal]

    # -- server side ---------------------------------------------------------------------------
    def init_server(self, init_state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        return {"global": clone(select(init_state, self.shared))}

    def download(self, server: dict[str, Any], k: int) -> State:
        return dict(server["global"])

    def aggregate(self, server: dict[str, Any], uploads: dict[int, State], weights: dict[int, float]) -> dict[str, Any]:
        # A method that keeps this aggregate has its uploads summed by the round loop as they arrive
        # (Simulator.run_round), with the same WeightedSum: a round then holds one sum, not K uploads.
        total = WeightedSum()
        for k, u in uploads.items():
            if u:
                total.add(u, weights[k])
        return self.set_global(server, total)

    def set_global(self, server: dict[str, Any], total: WeightedSum) -> dict[str, Any]:
        """The server after the base aggregate: the weighted mean of the non-empty uploads, if any
        (and if their weights do not all vanish)."""
        if total.count and total.weight > 0:
            server["global"] = total.mean()
        return server

    # -- client side ---------------------------------------------------------------------------
    def init_client(self, k: int, init_state: Mapping[str, torch.Tensor]) -> State:
        # The initial tensors are shared by every client, not copied K times: no hook changes a
        # state's tensors in place (training and merging make new ones), so a client's entries
        # become its own when it first trains (BENCHMARKS.md, memory against K).
        return dict(init_state)

    def receive(self, k: int, state: State, payload: State) -> State:
        return {**state, **payload}

    def plan(self, k: int, state: State, received: State) -> list[Phase]:
        """All parameters, the config's epochs and optimizer."""
        return [Phase(epochs=self.ctx.epochs)]

    def local_train(self, k: int, state: State, received: State) -> tuple[State, float]:
        return self.ctx.fit(k, state, self.plan(k, state, received))

    def upload(self, k: int, state: State) -> State:
        return select(state, self.shared)

    def replaced_on_receive(self) -> set[str]:
        """The entries every `receive` overwrites whole with what `download` sends, whatever the client
        held: a trained client need not keep them until its next round. Under `eval.model: received`
        the simulator drops them from a trained client's state, so a client holds what it keeps
        personal (docs/methods.md, "What a client holds"). A method that overrides download or receive states
        its own set; until it does, its clients keep everything."""
        plain = type(self).download is Method.download and type(self).receive is Method.receive
        return set(self.shared) if plain else set()

    def descend(self, k: int, opt: torch.optim.Optimizer, objective: Callable[[Batch], torch.Tensor],
                before_step: Callable[[], None] | None = None) -> tuple[torch.Tensor, int]:
        """The steps of a method's own training loop (one a Phase cannot say): on each of client k's
        minibatches for the run's epochs, `objective(batch)` is minimised by one step of `opt`
        (`before_step` runs between backward and step, e.g. to clip). Returns the summed losses,
        detached, and the number of steps; the caller makes its mean with fl.train.mean_loss."""
        device = opt.param_groups[0]["params"][0].device
        total, steps = torch.zeros((), device=device), 0
        for batch in self.ctx.batches(k, epochs=self.ctx.epochs):
            loss = objective(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if before_step is not None:
                before_step()
            opt.step()
            total += loss.detach()
            steps += 1
        return total, steps

    # -- diagnostics and new clients -------------------------------------------------------------
    def analysed_layers(self) -> dict[int, str]:
        """Layers whose final client weights a run keeps for the factor-analysis diagnostics.

        {paper index: module name}; the layer before the classifier unless a method says otherwise
        (FedFac: its Lambda). A factorized, low-rank or Hadamard layer counts as the layer it replaced;
        its effective weight is analysed (models.layers.effective_weight). Empty when the model has
        no such layer before its classifier.
        """
        try:
            return resolve_layers(self.ctx.model, [-1])
        except UsageError:
            return {}

    def new_client_models(self, server: dict[str, Any], k: int, fresh: State,
                          members: Callable[[], list[State]]) -> dict[str, State | list[State]]:
        """What a client held out of training (`eval.new_clients`) is scored with, per strategy.

        `fresh` is its initial state, `members()` the scored states of the clients that trained; a
        list of states is scored as an ensemble (mean of predicted probabilities). Every method has
        `received` (the download as received: FedAvg's global model) and `finetune` (that model
        trained on the new client's own data for the run's local epochs and optimizer: 001 Table 3's
        FedAvg+ / FedProx+); a method adds its own rule to these (FedFac: localtrain, ensemble).
        """
        received = self.receive(k, fresh, self.download(server, k))
        return {"received": received, "finetune": self.ctx.fit(k, received, [Phase(epochs=self.ctx.epochs)])[0]}

    def run_warnings(self, diagnostics: Sequence[Mapping[str, float]]) -> list[str]:
        """One line per way this run degenerated (matched nobody, kept no update), from the scalars
        the method logged each round (`diagnostics[i]` is round i + 1's). Read when the run ends, so
        a resumed run sees every round; the job logs each line and writes it to the summary and MLflow.
        """
        return []

    def evaluation_state(self, k: int, state: State) -> State:
        """What client k is scored with, given the model the evaluation protocol picked.

        The protocol (`eval.model`) picks what the client received or what it trained; a method
        that scores something else (Per-FedAvg's adaptation step) changes it here.
        """
        return state


def variant(base: type[Method], name: str, description: str, **preset: Any) -> type[Method]:
    """Register a preset of `base`'s hyperparameters under its own name (an ablation)."""
    unknown = set(preset) - set(base.Params.model_fields)
    if unknown:
        raise ValueError(f"{name}: unknown hyperparameters {sorted(unknown)}")
    cls = type(name, (base,), {"preset": {**base.preset, **preset}, "__module__": base.__module__})
    return METHODS.register(name, description)(cls)

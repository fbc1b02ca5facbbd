"""FedSplit / FedFac (Wang, Tang and Li; paper 001): factor analysis splits units into shared and personal.

For every layer in Lambda (`layers`) the server runs a factor analysis of the sampled clients' weights
of that layer: a unit is shared iff its communality is >= tau; shared units are averaged, personal
ones stay with their client, other layers are shared as in FedAvg. Dynamic (every round, the default)
or static (one analysis after a warm-up). The default is the official code as run; `fedfac_text`, the text.

Choices the paper leaves open: docs/methods/fedfac.md
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any, Callable, Mapping, Self, cast

import torch
from pydantic import field_validator, model_validator

from ..analysis.factor import FAMethod, factor_analysis, parse_tau, split, unit_matrix
from ..errors import UsageError
from ..fl.state import State, select, weighted_average
from ..fl.train import Phase, derive_seed
from ..models import resolve_layers, unit_entries
from ..models.layers import effective_weight, layer_entries, layer_units, unit_rows
from .base import METHODS, Context, Count, Float, Method, Params as BaseParams, at_least, one_of, variant

MASK = "fedfac.mask."  # payload entry: the split of layer <index>, one bool per unit


@METHODS.register("fedfac", "FedFac (001): factor analysis splits the units of the Lambda layers into shared and "
                  "personal; dynamic (every round) by default")
class FedFac(Method):
    class Params(BaseParams):
        layers: list = [-1]  # Lambda, 1-based (models/layers.py); -1: the last layer before the classifier
        # dynamic (Algorithm 2) | static (Algorithm 1)
        mode: Annotated[str, one_of("dynamic", "static")] = "dynamic"
        warmup: Count = 1  # static: rounds of local training of the Lambda layers before the one analysis
        kappa: Float = 0.85  # G: smallest number of factors explaining this share of the eigenvalues
        # inf (as run: the official scripts' --given_threshold keeps its default, +inf: every unit of
        # Lambda personal) | mean (the text's default) | a quantile (50% or q50) | -inf (all shared) | a number
        tau: str = "inf"
        # eigen (the official --direct_eigDecom) | principal (eq. 7, iterated)
        fa_method: Annotated[str, one_of("principal", "eigen")] = "eigen"
        # G: official (the code's count, one fewer) | paper (the smallest m reaching kappa)
        factors: Annotated[str, one_of("official", "paper")] = "official"
        max_iter: Count = 100  # principal-factor iterations at most
        tol: Float = 1e-4  # ... until the specific variances change by less than this
        split: Annotated[str, one_of("factor", "random")] = "factor"  # factor | random (Table 8 panel B)
        # none | shared | personal (Table 8 panel A)
        mask: Annotated[str, one_of("none", "shared", "personal")] = "none"
        # local (official) | follow: a split layer's bias and BatchNorm affine parameters
        unit_params: Annotated[str, one_of("follow", "local")] = "local"
        share_bn_stats: bool = False  # share BatchNorm running statistics (FedAvg does; FedFac's code does not)
        global_lr: Float = 1.0  # eta_g: shared = previous + eta_g * (weighted mean - previous)

        @field_validator("tau", mode="before")
        @classmethod
        def _tau_as_text(cls, v: Any) -> Any:
            return v if isinstance(v, str) else str(v)  # YAML reads 0.5 and .inf as numbers

        @field_validator("layers", mode="before")
        @classmethod
        def _one_layer(cls, v: Any) -> Any:
            return [v] if isinstance(v, int) else v

        @model_validator(mode="after")
        def _check(self) -> Self:
            try:
                parse_tau(self.tau)
            except ValueError as e:
                raise UsageError(f"method.{e}") from None
            if not self.layers or not all(isinstance(i, int) and not isinstance(i, bool) and i != 0
                                          for i in self.layers):
                raise UsageError(f"method.layers must be a non-empty list of layer numbers (1..L, or -1 for the layer "
                                 f"before the classifier), got {self.layers!r}")
            if not 0 < self.kappa <= 1:
                raise UsageError(f"method.kappa must be in (0, 1] (got {self.kappa})")
            at_least("warmup", self.warmup, 1)
            at_least("max_iter", self.max_iter, 0)
            if self.global_lr <= 0 or self.tol <= 0:
                raise UsageError("method.global_lr and method.tol must be > 0")
            return self

    hp: FedFac.Params

    def __init__(self, **params: Any):
        super().__init__(**params)
        tau = parse_tau(self.hp.tau)
        self.fixed = tau if isinstance(tau, float) and math.isinf(tau) else None  # +-inf: no analysis needed
        # Without a fixed split, the shared rows sent depend on the analysis of trained values.
        self.payload_depends_on_values = self.fixed is None

    # -- which entries are what ------------------------------------------------------------------
    def bind(self, ctx: Context) -> None:
        self.ctx = ctx
        self.layers = resolve_layers(ctx.model, self.hp.layers)  # {index: module name}
        head = getattr(ctx.model, "head_name", "head")
        if ctx.head_local and head in self.layers.values():
            raise UsageError("method.layers includes the classifier, which stays local in this scenario "
                             "(clients map classes to outputs differently)")
        stats = set(ctx.buffer_keys) if not self.hp.share_bn_stats else set()
        self.units: dict[int, list[str]] = {}  # entries averaged unit by unit
        self.sizes = {idx: layer_units(ctx.model, name) for idx, name in self.layers.items()}  # units per layer
        kept: set[str] = set(stats)  # entries that never leave the client
        for idx, name in self.layers.items():
            entries = unit_entries(ctx.model, name)
            weights = layer_entries(ctx.model, name)  # a plain layer's weight; an LSTM's weight_ih and weight_hh
            follow = [e for e in entries if e in weights or self.hp.unit_params == "follow"]
            self.units[idx] = [e for e in follow if e not in stats]
            kept |= set(entries) - set(self.units[idx])
        split_keys = {e for keys in self.units.values() for e in keys}
        # A split layer's own entries that never leave the client (unit_params: local): trained with
        # the personal units when a new client trains locally.
        self.layer_local = [e for idx, name in self.layers.items() for e in unit_entries(ctx.model, name)
                            if e in kept and e in ctx.param_keys]
        if ctx.head_local:
            kept |= set(ctx.head_keys)
        self.shared = [k for k in ctx.float_keys if k not in kept and k not in split_keys]

    def analysed_layers(self) -> dict[int, str]:
        return dict(self.layers)

    def _analyses(self, rnd: int) -> bool:
        """Whether this round ends with a factor analysis (and so needs whole layers uploaded)."""
        # tau = +-inf fixes the split from round 1 (mode and warmup then play no part).
        if self.fixed is not None:
            return False
        return self.hp.mode == "dynamic" or rnd == self.hp.warmup

    # -- server ------------------------------------------------------------------------------------
    def init_server(self, init_state: Mapping[str, torch.Tensor]) -> dict:
        units = {k: init_state[k].detach().clone() for keys in self.units.values() for k in keys}
        return {"global": {k: init_state[k].detach().clone() for k in self.shared}, "units": units, "mask": {}}

    def _masks(self, server: dict) -> dict[int, torch.Tensor]:
        if self.fixed is not None:
            first = {idx: server["units"][keys[0]] for idx, keys in self.units.items()}
            return {idx: torch.full((self.sizes[idx],), self.fixed < 0, dtype=torch.bool, device=t.device)
                    for idx, t in first.items()}
        return {int(i): m for i, m in server["mask"].items()}

    @staticmethod
    def _rows(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The rows of entry t that belong to the units in mask: an LSTM layer's unit is a hidden unit,
        which owns a row of each of the four gates in its entries (models.layers.unit_rows)."""
        return unit_rows(mask, len(t))

    def download(self, server: dict, k: int) -> State:
        payload = dict(server["global"])
        for idx, mask in self._masks(server).items():
            payload[f"{MASK}{idx}"] = mask
            for key in self.units[idx]:
                t = server["units"][key]
                payload[key] = t[self._rows(t, mask)]
        return payload

    def aggregate(self, server: dict, uploads: dict[int, State], weights: dict[int, float]) -> dict:
        clients = [k for k, u in uploads.items() if u]
        if not clients:
            return server
        w = [weights[k] for k in clients]
        server["global"] = self._step(server["global"], weighted_average([select(uploads[k], self.shared)
                                                                           for k in clients], w))
        rnd = self.ctx.round
        analysed = self._analyses(rnd)
        if analysed:
            server["mask"] = self._analyse(server, {k: uploads[k] for k in clients})
        for idx, mask in self._masks(server).items():
            if not mask.any():
                continue
            # An analysed round's uploads hold whole layers; afterwards only the shared rows.
            rows: list[Mapping[str, torch.Tensor]] = [
                {key: uploads[k][key][self._rows(uploads[k][key], mask)] if analysed else uploads[k][key]
                 for key in self.units[idx]} for k in clients]
            held = {key: self._rows(server["units"][key], mask) for key in self.units[idx]}
            prev = {key: server["units"][key][held[key]] for key in self.units[idx]}
            new = self._step(prev, weighted_average(rows, w))
            for key in self.units[idx]:
                server["units"][key][held[key]] = new[key]
        return server

    def _step(self, prev: State, mean: State) -> State:
        if self.hp.global_lr == 1.0:
            return mean  # exactly FedAvg's average, not prev + (mean - prev) rounded
        return {k: prev[k] + self.hp.global_lr * (mean[k] - prev[k]) for k in mean}

    def _analyse(self, server: dict, uploads: dict[int, State]) -> dict[str, torch.Tensor]:
        """The new split of every Lambda layer from the uploaded weights; logs the diagnostics."""
        start = time.perf_counter()
        masks = {}
        for idx, name in self.layers.items():
            # one row per unit: a plain layer's weight as uploaded, an LSTM's gates side by side
            weights = torch.stack([effective_weight(self.ctx.model, name, u) for u in uploads.values()])
            try:
                fa = factor_analysis(unit_matrix(weights), self.hp.kappa, cast(FAMethod, self.hp.fa_method),
                                     max_iter=self.hp.max_iter, tol=self.hp.tol, count=self.hp.factors)
            except ValueError as e:
                raise ValueError(f"FedFac round {self.ctx.round}, layer {idx} ({name}): {e}") from None
            mask = split(fa.communalities, self.hp.tau)
            if self.hp.split == "random":
                gen = torch.Generator().manual_seed(derive_seed(self.ctx.seed, self.ctx.round, idx, 17))
                chosen = torch.randperm(len(mask), generator=gen)[: int(mask.sum())]
                mask = torch.zeros_like(mask).index_fill_(0, chosen.to(mask.device), True)
            previous = server["mask"].get(str(idx))
            self.ctx.log(f"fedfac.shared.{idx}", mask.to(torch.uint8))
            self.ctx.log(f"fedfac.communality.{idx}", fa.communalities)
            self.ctx.log(f"fedfac.shared_share.{idx}", mask.double().mean())
            self.ctx.log(f"fedfac.factors.{idx}", fa.n_factors)
            if previous is not None:
                self.ctx.log(f"fedfac.stable_share.{idx}", (previous == mask).double().mean())
            masks[str(idx)] = mask
        self.ctx.log("fedfac.fa_seconds", time.perf_counter() - start)
        return masks

    # -- client ------------------------------------------------------------------------------------
    def receive(self, k: int, state: State, payload: State) -> State:
        out = dict(state)
        out.update({key: t for key, t in payload.items() if key in self.shared})
        for idx, keys in self.units.items():
            mask = payload.get(f"{MASK}{idx}")
            if mask is None:
                continue
            out[f"{MASK}{idx}"] = mask  # the client knows its split: static FedFac then sends only shared rows
            for key in keys:
                t = out[key].clone()
                t[self._rows(t, mask)] = payload[key]
                out[key] = t
            if self.hp.mask != "none":
                out = self._masked(k, out, idx, mask if self.hp.mask == "shared" else ~mask)
        return out

    def _masked(self, k: int, state: State, idx: int, units: torch.Tensor) -> State:
        """The units' rows of a split layer's weight (an LSTM's two weights) replaced by N(0, 1) draws
        (001 Table 8 panel A)."""
        gen = torch.Generator().manual_seed(derive_seed(self.ctx.seed, self.ctx.round, k, idx, 23))
        out = dict(state)
        for key in layer_entries(self.ctx.model, self.layers[idx]):
            t = state[key].clone()
            rows = self._rows(t, units)
            t[rows] = torch.randn((int(rows.sum()), *t.shape[1:]), generator=gen, dtype=t.dtype).to(t.device)
            out[key] = t
        return out

    def replaced_on_receive(self) -> set[str]:
        # the shared entries arrive whole; a split layer's units arrive only as its shared rows
        return set(self.shared)

    def upload(self, k: int, state: State) -> State:
        out = {key: state[key] for key in self.shared}
        analysed = self._analyses(self.ctx.round)
        for idx, keys in self.units.items():
            mask = state.get(f"{MASK}{idx}")
            if analysed:
                out.update({key: state[key] for key in keys})  # whole layers: the analysis needs every unit
            elif mask is not None and mask.any():
                out.update({key: state[key][self._rows(state[key], mask)] for key in keys})
            # else: static FedFac's warm-up, the Lambda layers train locally
        return out

    # -- new clients (001 section 3.2) ---------------------------------------------------------------
    def new_client_models(self, server: dict, k: int, fresh: State,
                          members: Callable[[], list[State]]) -> dict[str, State | list[State]]:
        models = super().new_client_models(server, k, fresh, members)
        received = cast(State, models["received"])  # the base's "received" is one state, not an ensemble
        trained = self._local_train_personal(k, received, self._masks(server))
        return {**models, "localtrain": trained, "ensemble": members()}

    def _local_train_personal(self, k: int, state: State, masks: dict[int, torch.Tensor]) -> State:
        """Train the personal units of the split layers with every shared unit held fixed."""
        params = dict(self.ctx.model.named_parameters())
        names = [key for keys in self.units.values() for key in keys if key in params] + self.layer_local
        hooks = []
        for idx, mask in masks.items():
            for key in self.units[idx]:
                if key in params and mask.any():
                    rows = self._rows(params[key], mask)
                    keep = (~rows).to(params[key].dtype).view(-1, *[1] * (params[key].dim() - 1))
                    hooks.append(params[key].register_hook(lambda g, keep=keep: g * keep))
        try:
            out, _ = self.ctx.fit(k, state, [Phase(params=names, epochs=self.ctx.epochs)])
        finally:
            for h in hooks:
                h.remove()
        # Weight decay moves even a zero-gradient row: put the shared units back exactly.
        for idx, mask in masks.items():
            for key in self.units[idx]:
                t = out[key].clone()
                rows = self._rows(t, mask)
                t[rows] = state[key][rows]
                out[key] = t
        return out


variant(FedFac, "fedfac_text",
        "FedFac as the paper's text describes it (ablation of the as-run default): iterated principal factors, "
        "units shared at communality >= the mean, a unit's bias and BN go with it",
        tau="mean", fa_method="principal", factors="paper", unit_params="follow")
variant(FedFac, "fedfac_static",
        "FedFac static (001 Algorithm 1): one factor analysis after a warm-up round, split fixed",
        mode="static")
variant(FedFac, "fedfac_random",
        "FedFac, tau = mean, with a random split of as many shared units as the factor analysis picks (001 "
        "Table 8 panel B)",
        split="random", tau="mean")
variant(FedFac, "fedfac_mask_shared",
        "FedFac, tau = 50%, shared units of the split layers replaced by N(0,1) values (001 Table 8 panel A, "
        "mask-shared)",
        tau="50%", mask="shared")
variant(FedFac, "fedfac_mask_personal",
        "FedFac, tau = 50%, personal units of the split layers replaced by N(0,1) values (001 Table 8 panel A, "
        "mask-personalized)",
        tau="50%", mask="personal")

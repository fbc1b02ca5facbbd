"""FedFOMO (Zhang, Sapra, Fidler, Yeung & Alvarez, ICLR 2021; a baseline of 000/002 C.1 and 003).

The server stores every client's latest model. Each round client k downloads H = `models_downloaded`
other clients' models, scores each on its own validation data, weighs model n by the first-order
gain per distance w_n = max(0, (L_k(theta_k) - L_k(theta_n)) / ||theta_n - theta_k||) and moves
towards the helpful ones.

Choices the paper leaves open: docs/methods/fedfomo.md
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch
from pydantic import Field

from ..errors import UsageError
from ..fl.state import State, clone, latest, select
from ..fl.train import derive_seed
from .base import METHODS, Context, Count, Float, Method, Params as BaseParams

PEER = "peer."  # payload entries of another client's model: "peer.<client>.<entry>"
WEIGHTS = "fomo.weights"  # the client's w_n for the models it received, in the order sent
SELECT_STREAM = 2**31 + 3  # the random stream of the server's model selection


def fomo_weights(own_loss: float, losses: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """w_n = (L(theta_k) - L(theta_n)) / ||theta_n - theta_k||, unclipped; 0 for an identical model."""
    gain = own_loss - losses.to(torch.float64)
    d = distances.to(torch.float64)
    return torch.where(d > 0, gain / d.clamp_min(1e-300), torch.zeros_like(gain))


def mixing_weights(raw: torch.Tensor) -> torch.Tensor:
    """The positive weights normalised to sum 1; all zero when no model helps."""
    w = raw.clamp_min(0)
    return w / w.sum() if w.sum() > 0 else w


def select_peers(affinity: np.ndarray, h: int, epsilon: float, rng: np.random.Generator) -> list[int]:
    """Indices of h candidates: each pick explores (the next of a random order) with probability
    epsilon, else exploits (the next by affinity, ties in random order); already picked ones skipped."""
    n = len(affinity)
    by_affinity = list(np.lexsort((rng.random(n), affinity))[::-1])
    shuffled = list(rng.permutation(n))
    picked: list[int] = []
    for _ in range(min(h, n)):
        order = shuffled if rng.random() < epsilon else by_affinity
        while (j := int(order.pop(0))) in picked:
            pass
        picked.append(j)
    return picked


@METHODS.register("fedfomo", "FedFOMO (Zhang et al., ICLR 2021): each client mixes in the downloaded models that "
                  "lower its validation loss, weighted by loss gain per distance")
class FedFOMO(Method):
    class Params(BaseParams):
        models_downloaded: Count = Field(10, ge=1)  # H (002 C.4)
        epsilon: Float = Field(0.3, ge=0, le=1)  # exploration probability in round 1 (official code)
        epsilon_decay: Float = Field(0.05, ge=0)  # subtracted each round (official code)
        own_from_server: bool = True  # the client's own model comes with the H others (the "+1")

    hp: FedFOMO.Params

    def bind(self, ctx: Context) -> None:
        super().bind(ctx)
        self.distance_keys = [k for k in self.shared if k in ctx.param_keys]
        # What each client weighs the models on: its own validation cut (the paper's); a client whose
        # cut is empty (a tiny client of a skewed partition under a shared test pool) falls back on
        # the protocol's val split, and the run says how many did (run_warnings).
        self.val_split = ["own_val"] * ctx.num_clients
        self.fallbacks = 0
        if next(ctx.model.parameters()).device.type == "meta":
            return  # `fedfactor cost`: no data to check
        self.val_split = ["own_val" if len(ctx.split(k, "own_val")) else "val" for k in range(ctx.num_clients)]
        self.fallbacks = self.val_split.count("val")
        empty = [k for k in range(ctx.num_clients) if len(ctx.split(k, self.val_split[k])) == 0]
        if empty:
            raise UsageError(f"method fedfomo scores models on each client's own validation split, but client "
                             f"{empty[0]} ({len(empty)} of {ctx.num_clients}) has none; give data.split a val share "
                             "(e.g. [0.8, 0.1, 0.1]) or set partition.samples_per_client.val")

    # -- server side -----------------------------------------------------------------------------
    def init_server(self, init_state: Mapping[str, torch.Tensor]) -> dict:
        K = self.ctx.num_clients
        return {"init": clone(select(init_state, self.shared)), "models": {},
                "affinity": torch.zeros(K, K, dtype=torch.float64)}

    def epsilon(self) -> float:
        return max(0.0, self.hp.epsilon - self.hp.epsilon_decay * (self.ctx.round - 1))

    def peers(self, server: dict, k: int) -> list[int]:
        """The clients whose models k receives this round (a pure function of server, round and k)."""
        others = [j for j in range(self.ctx.num_clients) if j != k]
        rng = np.random.default_rng(derive_seed(self.ctx.seed, self.ctx.round, k, SELECT_STREAM))
        row = server["affinity"][k, others].numpy()
        return [others[i] for i in select_peers(row, self.hp.models_downloaded, self.epsilon(), rng)]

    def download(self, server: dict, k: int) -> State:
        payload = dict(latest(server["models"], server["init"], k)) if self.hp.own_from_server else {}
        for j in self.peers(server, k):
            payload.update({f"{PEER}{j}.{key}": t for key, t in latest(server["models"], server["init"], j).items()})
        return payload

    def aggregate(self, server: dict, uploads: dict[int, State], weights: dict[int, float]) -> dict:
        K = self.ctx.num_clients
        models, affinity = dict(server["models"]), server["affinity"].clone()
        this_round = torch.full((K, K), float("nan"), dtype=torch.float64)
        helpful = []
        for k, payload in uploads.items():
            if not payload:
                continue
            model = dict(payload)
            raw = model.pop(WEIGHTS)
            models[str(k)] = model
            if raw.device.type == "meta":
                continue
            sent = self.peers(server, k)  # what `download` sent k from this same server state
            raw = raw.detach().cpu().to(torch.float64)
            affinity[k, sent] += raw
            this_round[k, sent] = raw
            helpful.append(int((raw > 0).sum()))
        if helpful:
            self.ctx.log("affinity", affinity)
            self.ctx.log("fomo_weights", this_round)
            self.ctx.log("fomo_helpful_models", float(np.mean(helpful)))
            self.ctx.log("fomo_epsilon", self.epsilon())
        return {**server, "models": models, "affinity": affinity}

    # -- client side -----------------------------------------------------------------------------
    def replaced_on_receive(self) -> set[str]:
        # the client's own latest model from the server, when it is sent, before the peers are mixed in
        return set(self.shared) if self.hp.own_from_server else set()

    def receive(self, k: int, state: State, payload: State) -> State:
        peers: dict[int, State] = {}
        own = {}
        for key, t in payload.items():
            if key.startswith(PEER):
                j, entry = key[len(PEER):].split(".", 1)
                peers.setdefault(int(j), {})[entry] = t
            else:
                own[key] = t
        state = {**state, **own}
        models = list(peers.values())
        device = next(iter(state.values())).device
        if device.type == "meta" or not models:  # a dry run scores nothing; its sizes are the same
            return {**state, WEIGHTS: torch.zeros(len(models), device=device)}
        raw = self.weights(k, state, models)
        return {**self.mix(state, models, mixing_weights(raw)), WEIGHTS: raw.to(device, torch.float32)}

    def val_loss(self, k: int, state: State) -> float:
        # the client's own validation cut (the paper's), not the pooled split a shared test pool
        # scores on: that one is every client's data, and H + 1 passes over it took most of a round
        _, count, loss = self.ctx.evaluate(k, state, self.val_split[k])
        return loss / count

    def weights(self, k: int, state: State, models: list[State]) -> torch.Tensor:
        """Each received model's unclipped w_n on client k's own validation split, scored with k's other
        entries (its head when heads are local)."""
        losses = torch.tensor([self.val_loss(k, {**state, **m}) for m in models], dtype=torch.float64)
        distances = torch.tensor([float(torch.linalg.vector_norm(torch.cat(
            [(m[key] - state[key]).reshape(-1).double() for key in self.distance_keys]))) for m in models])
        return fomo_weights(self.val_loss(k, state), losses, distances)

    def mix(self, state: State, models: list[State], w: torch.Tensor) -> State:
        """theta_k + sum_n w_n (theta_n - theta_k) over the shared entries; theta_k when w is all 0."""
        if not (w > 0).any():
            return state
        out = dict(state)
        for key in self.shared:
            base = state[key].to(torch.float64)
            step = sum(float(wn) * (m[key].to(torch.float64) - base) for wn, m in zip(w, models) if wn > 0)
            out[key] = (base + step).to(state[key].dtype)
        return out

    def run_warnings(self, diagnostics: Sequence[Mapping[str, float]]) -> list[str]:
        if not self.fallbacks:
            return []
        return [f"fedfomo: {self.fallbacks} of {self.ctx.num_clients} clients have no validation cut of their own "
                "and weighed the downloaded models on the protocol's val split (the pooled one under "
                "eval.test_pool shared); give data.split a larger val share to weigh every client on its own"]

    def upload(self, k: int, state: State) -> State:
        return {**select(state, self.shared), WEIGHTS: state[WEIGHTS]}

"""Clustered-FL (Sattler, Mueller & Samek, IEEE TNNLS 2020; a baseline of 000/002 C.1 and 003).

FedAvg within clusters: the server keeps one model per cluster and bi-partitions a cluster, by the
cosine similarity of its members' updates, once its federation has stalled (||mean dW|| < eps1) while
its members still disagree (max ||dW_k|| > eps2).

Choices the paper leaves open: docs/methods/clustered_fl.md
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
import torch
from pydantic import Field

from ..fl.state import State, clone, select, weighted_average
from .base import METHODS, Count, Float, Method, Params as BaseParams, one_of


def update_gram(updates: list[State], keys: list[str]) -> torch.Tensor:
    """G[i, j] = <dW_i, dW_j> over `keys`, in float64: norms, cosines and the norm of any subset's
    mean update all follow from it without stacking the flattened models."""
    gram = torch.zeros(len(updates), len(updates), dtype=torch.float64)
    for key in keys:
        d = torch.stack([u[key].reshape(-1) for u in updates]).to(torch.float64)
        gram += (d @ d.T).cpu()
    return gram


def cosine_from_gram(gram: torch.Tensor) -> torch.Tensor:
    norms = gram.diagonal().clamp_min(0).sqrt().clamp_min(1e-12)
    return gram / norms.unsqueeze(0) / norms.unsqueeze(1)


def mean_update_norm(gram: torch.Tensor) -> float:
    """||mean_i dW_i|| = sqrt(sum_ij <dW_i, dW_j>) / n."""
    return float(gram.sum().clamp_min(0).sqrt()) / len(gram)


def bipartition(similarity: np.ndarray) -> np.ndarray:
    """Two groups (labels 0/1) by complete linkage on the negated similarity, as the authors' code."""
    # imported on first use: scikit-learn adds about a second to every training job's start
    from sklearn.cluster import AgglomerativeClustering

    return AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(-similarity).labels_


@METHODS.register("clustered_fl", "Clustered-FL (Sattler, Mueller & Samek, IEEE TNNLS 2020): FedAvg within "
                  "clusters, bi-partitioned by the cosine similarity of the clients' updates once they stall")
class ClusteredFL(Method):
    class Params(BaseParams):
        eps1: Float = Field(0.4, gt=0)  # split only when the mean update's norm is below it (stalled)
        eps2: Float = Field(1.6, gt=0)  # ... and some client's update norm is above it (disagreement)
        min_split_size: Count = Field(3, ge=2)  # uploaders a cluster needs to be split
        warmup_rounds: Count = Field(20, ge=0)  # no split in rounds 1..warmup_rounds
        # uniform | size: how a cluster averages its members' uploads
        weighting: Annotated[str, one_of("uniform", "size")] = "uniform"

    hp: Params

    def bind(self, ctx) -> None:
        super().bind(ctx)
        self.update_keys = [k for k in self.shared if k in ctx.param_keys]

    def init_server(self, init_state):
        return {"clusters": [list(range(self.ctx.num_clients))], "models": [clone(select(init_state, self.shared))]}

    @staticmethod
    def cluster_of(server: dict, k: int) -> int:
        return next(i for i, members in enumerate(server["clusters"]) if k in members)

    def replaced_on_receive(self) -> set[str]:
        return set(self.shared)  # the cluster's model: every shared entry

    def download(self, server: dict, k: int) -> State:
        return dict(server["models"][self.cluster_of(server, k)])

    def aggregate(self, server: dict, uploads: dict[int, State], weights: dict[int, float]) -> dict:
        sent = {k: u for k, u in uploads.items() if u}
        if not sent:
            return server
        # Only the round's uploaders enter the split test (in a fixed order, so the run is deterministic).
        voters = sorted(sent)
        meta = next(iter(sent[voters[0]].values())).device.type == "meta"
        gram = None
        if not meta:  # `fedfactor cost`: no values, and a split never changes what is sent
            received = {k: server["models"][self.cluster_of(server, k)] for k in voters}
            updates = [{key: sent[k][key] - received[k][key] for key in self.update_keys} for k in voters]
            gram = update_gram(updates, self.update_keys)
        pos = {k: i for i, k in enumerate(voters)}
        clusters, models, norms, splits = [], [], [], 0
        for members, model in zip(server["clusters"], server["models"]):
            up = [k for k in members if k in sent]
            groups = [members]
            norms.append((float("nan"), float("nan")))
            if gram is not None and up:
                g = gram[[pos[k] for k in up]][:, [pos[k] for k in up]]
                mean_norm, max_norm = mean_update_norm(g), float(g.diagonal().clamp_min(0).sqrt().max())
                norms[-1] = (mean_norm, max_norm)
                if (self.ctx.round > self.hp.warmup_rounds and len(up) >= self.hp.min_split_size
                        and mean_norm < self.hp.eps1 and max_norm > self.hp.eps2):
                    labels = bipartition(cosine_from_gram(g).numpy())
                    halves = sorted(([k for k, lab in zip(up, labels) if lab == side] for side in (0, 1)),
                                    key=min)
                    rest = [k for k in members if k not in sent]
                    groups = halves + ([rest] if rest else [])
                    splits += 1
            for group in groups:
                voted = [k for k in group if k in sent]
                w = [weights[k] if self.hp.weighting == "size" else 1.0 for k in voted]
                clusters.append(sorted(group))
                models.append(weighted_average([sent[k] for k in voted], w) if voted else model)
        server = {**server, "clusters": clusters, "models": models}
        if gram is not None:
            self._diagnose(server, voters, gram, norms, splits)
        return server

    def _diagnose(self, server: dict, voters: list[int], gram: torch.Tensor,
                  norms: list[tuple[float, float]], splits: int) -> None:
        K = self.ctx.num_clients
        log = self.ctx.log
        log("clusters", len(server["clusters"]))
        log("cluster_splits", splits)
        # Over all of the round's uploaders: the quantities of the first split test.
        log("update_norm_mean", mean_update_norm(gram))
        log("update_norm_max", float(gram.diagonal().clamp_min(0).sqrt().max()))
        # Per cluster as it was before this round's splits (NaN: none of its members uploaded).
        log("cluster_update_norm_mean", np.array([n[0] for n in norms]))
        log("cluster_update_norm_max", np.array([n[1] for n in norms]))
        sim = torch.full((K, K), float("nan"), dtype=torch.float64)
        idx = torch.tensor(voters)
        sim[idx.unsqueeze(1), idx] = cosine_from_gram(gram)
        log("update_similarity", sim)
        log("cluster_of_client", np.array([self.cluster_of(server, k) for k in range(K)]))

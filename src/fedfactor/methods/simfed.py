"""SimFed (paper 003, the earlier submission of Factorized-FL) and its ablations.

Factorized layers as Factorized-FL; the server matches clients by the cosine similarity of their embeddings of a fixed
Gaussian "criteria input" (eqs. 2-3, threshold tau) and reflects knowledge per client with softmax(alpha * sigma)
weights over the matched clients (eq. 8; alpha is `epsilon`). Choices the paper leaves open: docs/methods/simfed.md
"""

from __future__ import annotations

from typing import Annotated, Mapping

import torch

from ..fl.state import State
from ..fl.train import run_with
from .base import METHODS, Count, one_of, variant
from .factorized_fl import FactorizedFL

CRITERIA = "simfed.criteria"  # the client's copy of x_N, kept in its state


@METHODS.register("simfed", "SimFed (003): factorized layers, clients matched by their embeddings of a "
                  "shared random input, personalised knowledge reflection")
class SimFed(FactorizedFL):
    # No SimFed code was published: its text, and Factorized-FL's code where it is silent (docs/methods/simfed.md)
    preset = dict(layout="simfed", l1=1e-4, mu_threshold=1e-4, share="uvm", share_bn=True, tau=0.9, epsilon=30.0,
                  num_matched=2, weighting="paper", minimum_aggr=1, match_layer="before_head", reset_head=False)

    class Params(FactorizedFL.Params):
        criteria_inputs: Count = 1  # Gaussian inputs x_N the embeddings are taken of
        # eval: BatchNorm with the client's running statistics (official: it embeds after evaluating) | train: x_N's own
        criteria_mode: Annotated[str, one_of("eval", "train")] = "eval"
        # concat: the inputs' embeddings end to end (official) | mean: the client as a "set encoder" of x_N (003, 4.1)
        criteria_pool: Annotated[str, one_of("concat", "mean")] = "concat"

    hp: SimFed.Params
    key_name = "similarity_z"
    recurrent_refused = ("it matches clients on their embeddings of a Gaussian criteria input, which a model of "
                         "token ids cannot take")

    def personal_head(self) -> bool:
        return self.ctx.head_local

    def init_server(self, init_state: Mapping[str, torch.Tensor]) -> dict:
        return {**super().init_server(init_state), "criteria": torch.randn(  # x_N, seeded, drawn after the model's init
            self.hp.criteria_inputs, *self.ctx.input_shape, device=next(iter(init_state.values())).device)}

    def download(self, server: dict, k: int) -> State:
        first = str(k) not in server["latest"]  # x_N is sent once: until the client's first upload arrives
        return {**super().download(server, k), **({CRITERIA: server["criteria"]} if first else {})}

    def match_key(self, k: int, state: State) -> torch.Tensor:
        training = self.hp.criteria_mode == "train"  # then copied, lest BatchNorm fold x_N into the client's stats
        body = {key[len("body."):]: t.clone() if training else t for key, t in state.items() if key.startswith("body.")}
        z = run_with(self.ctx.model.get_submodule("body"), body, state[CRITERIA], training=training).flatten(1)
        return (z.mean(0) if self.hp.criteria_pool == "mean" else z).reshape(-1)


variant(SimFed, "simfed_text", "SimFed as its text describes it (ablation of the default): L1 with a gradient, mu from "
        "zero, M sent pruned, optimizer restarted every round",
        l1_mode="paper", mu_init="zero", bias_init="layer", mu_send="pruned", keep_optimizer=False)
variant(SimFed, "simfed_random", "SimFed reflecting 2 random clients (003 Table 3)", matching="random")
variant(SimFed, "simfed_worst", "SimFed reflecting the 2 least similar clients (003 Table 3)", matching="worst")
variant(SimFed, "simfed_no_mask", "SimFed without the sparse masks phi (003 Table 4)", use_mu=False)


@METHODS.register("simfed_no_factorization", "SimFed's similarity matching and reflection on the unfactorized "
                  "model (003 Table 2 'Similarity Matching', Table 4 'w/o Factorization')")
class SimFedNoFactorization(SimFed):
    factorized = False

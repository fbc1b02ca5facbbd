"""Factorized-FL (Jeong & Hwang, NeurIPS 2022; papers 000 and 002) and its ablations.

Every Conv2d and Linear is factorized as W = pi(u v^T + mu) (`fedfactor.reparam.factorize`). After each
round the server holds every client's last upload; client k then downloads its own mixture of the
clients whose key v (of the last convolution as run; v^{L-1} in the text) is most similar to its
own (eqs. 4-5).

The default is the official code as run; the `_text` variants follow the paper's text, switch by switch.

Choices the paper leaves open: docs/methods/factorized_fl.md
"""

from __future__ import annotations

from typing import Annotated, Any, Mapping, Self, Sequence, cast

import torch
from pydantic import model_validator
from torch import nn

from ..errors import UsageError
from ..analysis.similarity import Matching, Weighting, cosine_matrix, mixing_weights
from ..fl.state import State, clone, pack_sparse, select, unpack_sparse, weighted_average
from ..fl.train import Batch, Phase, derive_seed
from ..reparam import LAYOUTS, factorize, factorized_layers
from ..reparam.factorized import BIAS_INITS, MU_INITS, Layout
from .base import METHODS, Context, Count, Float, Method, Params as BaseParams, at_least, one_of, variant

BITS, VALUES = ".bits", ".values"  # suffixes of a sparse-sent entry: bitmap of non-zeros, their values
MATCH = "match.key"  # the vector the server matches clients on (v^{L-1} or an embedding)


@METHODS.register("factorized_fl_alpha", "Factorized-FL alpha (000): rank-1 factorized layers; shares U, "
                  "personalised by similarity of v^{L-1}")
class FactorizedFL(Method):
    class Params(BaseParams):
        # official: (u @ v).view(O, I, k, k) | paper (eq. 3) | simfed (000 Fig. 7 (k))
        layout: Annotated[str, one_of(*LAYOUTS)] = "official"
        # official: Xavier u and v | scaled: at the replaced layer's weight scale
        init: Annotated[str, one_of("official", "scaled")] = "official"
        # official: dense mu Xavier, conv mu zero | zero: mu = 0 (000, after eq. 2)
        mu_init: Annotated[str, one_of(*MU_INITS)] = "official"
        # official: Xavier-uniform biases | layer: the model's own
        bias_init: Annotated[str, one_of(*BIAS_INITS)] = "official"
        rank: Count = 1  # gamma, the number of columns of u and v (000 Figure 7 (h))
        use_mu: bool = True  # the sparse bias matrix mu (000 Figure 7 (g): "w/o mu")
        l1: Float = 5e-4  # lambda_sparsity (002 C.2: 5e-4 to 1e-3)
        # official: no effect (detached in the code) | paper: a real gradient
        l1_mode: Annotated[str, one_of("paper", "official")] = "official"
        mu_threshold: Float = 5e-4  # |mu| below it counts as zero when evaluated (official: lambda)
        # dense: M sent unpruned (official) | pruned: below mu_threshold dropped, sparse
        mu_send: Annotated[str, one_of("dense", "pruned")] = "dense"
        # u (alpha) | uvm (beta) | none (the factorized model trained locally)
        share: Annotated[str, one_of("u", "uvm", "none")] = "u"
        share_bn: bool = True  # share BatchNorm affine parameters (the official code) | False (alpha's text)
        share_bias: bool = True  # alpha also shares the body's biases (the official code) | False (text)
        # fedavg: no matching (Factorized-FedAvg)
        matching: Annotated[str, one_of("similarity", "fedavg", "random", "worst")] = "similarity"
        # official: top-n + softmax | paper: threshold + softmax
        weighting: Annotated[str, one_of("paper", "official")] = "official"
        tau: Float = 0.0  # similarity threshold (002 C.2: 0 to 0.75; official label tasks: 0)
        epsilon: Float = 1.0  # softmax scale of the similarity (002 C.2: 1 to 20; official label tasks: 1)
        minimum_aggr: Count = 0  # official weighting: at least this many clients (self included); 0: the code's rule
        num_matched: Count = 3  # random / worst matching: clients mixed in besides self
        # last_conv: the official code | before_head: the paper's v^{L-1}
        match_layer: Annotated[str, one_of("before_head", "last_conv")] = "last_conv"
        reset_head: bool = True  # where heads are shared, reset the head to the initial one every round (official)
        keep_optimizer: bool = True  # each client's SGD momentum carries over to its next round (official) | restart

        @model_validator(mode="after")
        def _check(self) -> Self:
            for key in ("rank", "num_matched", "criteria_inputs"):
                if hasattr(self, key):
                    at_least(key, getattr(self, key), 1)
            at_least("minimum_aggr", self.minimum_aggr, 0, "0: the official code's rule; ")
            return self

    hp: FactorizedFL.Params
    factorized = True  # False: similarity matching on an unfactorized model (SimFed ablation)
    key_name = "similarity_v"  # the diagnostic name of the similarity clients are matched on
    # why a model with LSTM layers is refused (docs/methods/factorized_fl.md)
    recurrent_refused = ("it factorizes Conv2d and Linear kernels only, so the LSTM weights would stay outside "
                         "u v^T + mu (and under share u never be shared)")

    def __init__(self, **params: Any):
        super().__init__(**params)
        # Sparse M's size depends on trained values: `fedfactor cost` cannot project it.
        self.payload_depends_on_values = (
            self.factorized and self.hp.use_mu and self.hp.share == "uvm" and self.hp.mu_send == "pruned")

    # -- the model -------------------------------------------------------------------------------
    def prepare_model(self, model: nn.Module) -> nn.Module:
        if not self.factorized:
            return model
        hp = self.hp
        return factorize(model, cast(Layout, hp.layout), hp.rank, hp.use_mu, hp.mu_threshold, hp.init, hp.mu_init,
                         hp.bias_init)

    def bind(self, ctx: Context) -> None:
        self.mu_keys = [f"{n}.mu" for n, m in factorized_layers(ctx.model).items() if m.mu is not None]
        self.match_layer = self._match_layer(ctx.model) if self.factorized else None
        self._mu_counts: dict[int, list[tuple[int, int]]] = {}
        super().bind(ctx)

    def _match_layer(self, model: nn.Module) -> str:
        """The body layer whose v is matched on: the one before the classifier, or the last conv."""
        layers = {n: m for n, m in factorized_layers(model).items() if n.startswith("body.")}
        convs = {n: m for n, m in layers.items() if m.conv}
        if self.hp.match_layer == "last_conv" and convs:  # a model without convolutions (mlp): v^{L-1}
            layers = convs
        if not layers:
            raise UsageError(f"method.match_layer={self.hp.match_layer}: the model has no such factorized layer")
        return list(layers)[-1]

    def personal_head(self) -> bool:
        return True  # eq. 5 mixes layers 1..L-1 only

    def shared_keys(self) -> list[str]:
        head = set(self.ctx.head_keys) if self.personal_head() else set()
        bn = {f"{n}.{p}" for n, m in self.ctx.model.named_modules()
              if isinstance(m, nn.modules.batchnorm._NormBase) for p, _ in m.named_parameters(recurse=False)}
        params = [k for k in self.ctx.param_keys if k not in head]
        if self.hp.share == "none":
            return []
        if self.hp.share == "u":
            biases = {f"{n}.bias" for n in factorized_layers(self.ctx.model)} if self.hp.share_bias else set()
            return [k for k in params if k.endswith(".u") or (self.hp.share_bn and k in bn) or k in biases]
        return [k for k in params if self.hp.share_bn or k not in bn]

    # -- payload encoding ------------------------------------------------------------------------
    def encode(self, state: State) -> State:
        """Entries as sent: under mu_send=pruned, mu below the threshold dropped and the rest sent as
        bitmap + values."""
        out = {}
        for key, t in state.items():
            if key in self.mu_keys and self.hp.mu_send == "pruned":
                kept = t * (t.abs() >= self.hp.mu_threshold)
                out[key + BITS], out[key + VALUES] = pack_sparse(kept)
            else:
                out[key] = t
        return out

    def decode(self, payload: State) -> State:
        out = {}
        for key, t in payload.items():
            if key.endswith(VALUES):
                continue
            if key.endswith(BITS):
                base = key[: -len(BITS)]
                shape = self.ctx.model.get_parameter(base).shape
                out[base] = unpack_sparse(t, payload[base + VALUES], shape)
            else:
                out[key] = t
        return out

    # -- server side -----------------------------------------------------------------------------
    def init_server(self, init_state: Mapping[str, torch.Tensor]) -> dict:
        self._init_head = clone(select(init_state, self.ctx.head_keys))
        K = self.ctx.num_clients
        return {"init": clone(select(init_state, self.shared)), "latest": {}, "keys": {}, "sizes": {},
                "weights": torch.zeros(K, K, dtype=torch.float64), "counts": torch.zeros(K, K, dtype=torch.long)}

    def replaced_on_receive(self) -> set[str]:
        return set(self.shared)  # the mixture of the matched clients' shared entries

    def download(self, server: dict, k: int) -> State:
        latest = server["latest"]
        if not self.shared:
            return {}
        if str(k) in latest:
            row = server["weights"][k]
            mix = {str(j): float(row[j]) for j in range(len(row)) if row[j] > 0}
            state = weighted_average([latest[j] for j in mix], list(mix.values()))
        elif latest:
            state = weighted_average(list(latest.values()), [server["sizes"][j] for j in latest])
        else:
            state = dict(server["init"])
        return self.encode(state)

    def aggregate(self, server: dict, uploads: dict[int, State], weights: dict[int, float]) -> dict:
        server = {**server, "latest": dict(server["latest"]), "keys": dict(server["keys"]),
                  "sizes": dict(server["sizes"])}
        for k, payload in uploads.items():
            if not payload:
                continue
            decoded = self.decode(payload)
            key = decoded.pop(MATCH, None)  # None: the key travels inside the shared entries (beta's V)
            server["keys"][str(k)] = decoded[f"{self.match_layer}.v"] if key is None else key
            server["latest"][str(k)] = decoded
            server["sizes"][str(k)] = weights[k]
        present = sorted(int(j) for j in server["keys"])
        if not present:
            return server
        keys = torch.stack([server["keys"][str(j)].reshape(-1) for j in present])
        sim = cosine_matrix(keys)
        if keys.device.type == "meta":  # `fedfactor cost`: who is matched does not change any size
            W = self._full(present, torch.full((len(present),) * 2, 1.0 / len(present)), fill=0.0)
        else:
            gen = torch.Generator().manual_seed(self._draw_seed())
            sizes = torch.tensor([server["sizes"][str(j)] for j in present])
            W = self._full(present, mixing_weights(
                sim.cpu(), cast(Matching, self.hp.matching), cast(Weighting, self.hp.weighting), self.hp.tau,
                self.hp.epsilon, self._minimum_aggr(), self.hp.num_matched, sizes, gen), fill=0.0)
            server["counts"] = server["counts"] + (W > 0).long()
            self._diagnose(server, present, sim.cpu(), W)
        server["weights"] = W
        return server

    def _minimum_aggr(self) -> int:
        """minimum_aggr, or for 0 the official code's count: its 20 of 20 clients where heads are
        shared (standard tasks), 10 of 20 under permuted labels (main.py's set_config)."""
        if self.hp.minimum_aggr:
            return self.hp.minimum_aggr
        K = self.ctx.num_clients
        return -(-K // 2) if self.ctx.head_local else K

    def _draw_seed(self) -> int:
        return derive_seed(self.ctx.seed, self.ctx.round, 2**31 + 1)

    def _full(self, present: list[int], small: torch.Tensor, fill: float = float("nan")) -> torch.Tensor:
        """An n x n matrix among the present clients as K x K, `fill` for clients without an upload."""
        K = self.ctx.num_clients
        out = torch.full((K, K), fill, dtype=torch.float64)
        idx = torch.tensor(present)
        out[idx.unsqueeze(1), idx] = small.to(torch.float64)
        return out

    def _diagnose(self, server: dict, present: list[int], sim: torch.Tensor, W: torch.Tensor) -> None:
        log = self.ctx.log
        log(self.key_name, self._full(present, sim))
        for factor in ("u", "v") if self.factorized else ():
            key, name = f"{self.match_layer}.{factor}", f"similarity_{factor}"
            if name != self.key_name and all(key in server["latest"][str(j)] for j in present):
                vectors = torch.stack([server["latest"][str(j)][key].reshape(-1) for j in present])
                log(name, self._full(present, cosine_matrix(vectors.cpu())))
        log("matching_weights", W)
        log("matching_counts", server["counts"])
        log("matched_clients_mean", float((W[present] > 0).sum(1).double().mean()))
        if len(present) > 1:
            self._log_spread(sim[~torch.eye(len(present), dtype=torch.bool)])
        counts = server["counts"].double().clone()
        counts.fill_diagonal_(0)
        dom = torch.tensor(self.ctx.domains) if self.ctx.domains else torch.zeros(self.ctx.num_clients)
        same = dom.unsqueeze(0) == dom.unsqueeze(1)
        rows = counts.sum(1) > 0
        if rows.any():
            # Of each client's matches with others so far, the share inside its own domain (000 Fig. 7 f).
            log("matches_in_domain_share", float(((counts * same).sum(1)[rows] / counts.sum(1)[rows]).mean()))
        counted = self._mu_counts.pop(self.ctx.round, [])
        if counted:
            nonzero, total = sum(c for c, _ in counted), sum(t for _, t in counted)
            log("mu_nonzero", nonzero / len(counted))  # per client, mean over this round's uploads
            log("mu_nonzero_share", nonzero / max(total, 1))

    def _log_spread(self, others: torch.Tensor) -> None:
        """Scalars of the similarities between distinct clients, to set against tau round by round;
        the max is also the no-match warning's evidence."""
        log = self.ctx.log
        log("similarity_max_other", float(others.max()))
        log("similarity_mean_other", float(others.mean()))
        for q in (0.1, 0.5, 0.9):
            log(f"similarity_q{round(100 * q)}_other", float(others.quantile(q)))

    # -- client side -----------------------------------------------------------------------------
    def run_warnings(self, diagnostics: Sequence[Mapping[str, float]]) -> list[str]:
        matched = [d["matched_clients_mean"] for d in diagnostics if "matched_clients_mean" in d]
        if self.ctx.num_clients < 2 or not matched or max(matched) > 1:
            return []
        best = max((d.get("similarity_max_other", float("nan")) for d in diagnostics), default=float("nan"))
        # the numbers first: the terminal's line keeps a warning's first 160 characters
        return [f"{self.name} matched no other client in any of its {len(matched)} rounds (highest similarity "
                f"{best:.4f} < method.tau={self.hp.tau:g}): each client mixed only itself, so this run is the "
                f"factorized model trained alone (lower tau, or use weighting: official with minimum_aggr > 1)"]

    def receive(self, k: int, state: State, payload: State) -> State:
        state = {**state, **self.decode(payload)}
        if self.hp.reset_head and not self.ctx.head_local:
            state.update(clone(self._init_head))
        return state

    def plan(self, k: int, state: State, received: State) -> list[Phase]:
        # The official client saves its optimizer with its state and reloads it the next round.
        keep = "factorized" if self.hp.keep_optimizer else None
        if not (self.factorized and self.hp.use_mu and self.hp.l1_mode == "paper" and self.hp.l1 > 0):
            return [Phase(epochs=self.ctx.epochs, keep_optimizer=keep)]  # official: its L1 is on detached tensors
        # A bound method, equal for every client: clients' plans compare equal and can train batched.
        return [Phase(epochs=self.ctx.epochs, loss=self._sparsity, loss_name="l1", keep_optimizer=keep)]

    def _sparsity(self, params: Mapping[str, torch.Tensor], batch: Batch, logits: torch.Tensor) -> torch.Tensor:
        # planned only with mu, so the sum runs over at least one tensor: a tensor, never sum()'s int 0
        return cast(torch.Tensor, self.hp.l1 * sum(params[key].abs().sum() for key in self.mu_keys))

    def match_key(self, k: int, state: State) -> torch.Tensor | None:
        """The vector client k sends for matching; None when it is inside the shared entries."""
        key = f"{self.match_layer}.v"
        return None if key in self.shared else state[key].reshape(-1)

    def upload(self, k: int, state: State) -> State:
        if not self.shared:
            return {}
        self._count_mu(state)
        payload = self.encode(select(state, self.shared))
        key = self.match_key(k, state)
        if key is not None:
            payload[MATCH] = key
        return payload

    def _count_mu(self, state: State) -> None:
        if not self.mu_keys or state[self.mu_keys[0]].device.type == "meta":
            return
        nonzero = sum(int((state[key].abs() >= self.hp.mu_threshold).sum()) for key in self.mu_keys)
        total = sum(state[key].numel() for key in self.mu_keys)
        self._mu_counts.setdefault(self.ctx.round, []).append((nonzero, total))


variant(FactorizedFL, "factorized_fl_beta",
        "Factorized-FL beta (000): shares U, V and sparse M, personalised by similarity of v^{L-1}",
        share="uvm", share_bn=True)
# The paper's text as written, where it differs from the official code (README's table).
TEXT = dict(layout="paper", mu_init="zero", bias_init="layer", l1_mode="paper", mu_send="pruned", share_bn=False,
            share_bias=False, weighting="paper", minimum_aggr=1, match_layer="before_head", reset_head=False,
            keep_optimizer=False)
variant(FactorizedFL, "factorized_fl_alpha_text",
        "Factorized-FL alpha as the paper's text describes it (ablation of the as-run default): L1 with a "
        "gradient, mu from zero, U alone shared, threshold matching on v^{L-1}",
        **TEXT)
variant(FactorizedFL, "factorized_fl_beta_text",
        "Factorized-FL beta as the paper's text describes it (ablation of the as-run default)",
        **{**TEXT, "share": "uvm", "share_bn": True})
variant(FactorizedFL, "factorized_fedavg",
        "Factorized-FedAvg (000 Fig. 7 g): beta without matching, sample-weighted mean",
        share="uvm", share_bn=True, matching="fedavg")
variant(FactorizedFL, "factorized_fedavg_no_mu",
        "Factorized-FedAvg without mu (000 Fig. 7 g)",
        share="uvm", share_bn=True, matching="fedavg", use_mu=False)
variant(FactorizedFL, "factorized_fl_random",
        "Factorized-FL alpha mixing 3 random clients (000 Fig. 7 g)",
        matching="random")
variant(FactorizedFL, "factorized_fl_worst",
        "Factorized-FL alpha mixing the 3 least similar clients (000 Fig. 7 g)",
        matching="worst")
variant(FactorizedFL, "factorized_fl_axes",
        "Factorized-FL alpha with SimFed's axes u in R^{I*F}, v in R^{O*F} (000 Fig. 7 k)",
        layout="simfed")
variant(FactorizedFL, "factorized_local",
        "The factorized model trained locally, nothing shared (000 Fig. 7 j)",
        share="none", reset_head=False)

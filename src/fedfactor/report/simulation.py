"""FedFac's simulation study (paper 001, section 4.3, Figures 6 and 7), on a CPU in minutes.

Does factor analysis recover a useful split of a hidden layer into client-shared and personal units?
C clients draw data from a two-layer ReLU teacher whose hidden units are partly shared (eq. 8); a
student MLP (one hidden layer of m ReLU units, one logit) is trained FedSplit-style under five
decompositions of its hidden layer, and their test accuracies are compared (Figure 6); for dynamic
FedFac the share of units whose state did not change since the previous round is recorded (Figure 7).

Data (section 4.3.1, as written). Client c has covariates x = (x_p, x_s): d2 = round(alpha * d)
shared ones x_s ~ N(0, I) and d1 = d - d2 personal ones x_p ~ N(mu_c, Sigma), mu_c ~ N(0, I_d1),
Sigma_ij = 0.5^|i-j|. The teacher has m hidden units, m2 = round(p * m) shared (indices m1..m-1, as
eq. 8) and m1 = m - m2 personal: w^sp_r ~ U(-0.1, 0.1) (d1 entries), w^ss_r ~ U(-1, 1) (d2 entries),
a ~ N(0, I_m), fixed for all clients; w^pp_cq ~ N(mu_c, I) (d1), w^ps_cq ~ U(-0.1, 0.1) (d2) per
client. h*_c(x) = sum_j a_j relu(w_cj . x) (eq. 8), y* = h*_c(x) + eps with eps ~ N(0, c^2), and
y = 1 iff sigmoid(y* - t_c) > 0.5.

The one departure, `data.label_threshold`: the paper's rule has t_c = 0 ("zero"). Written that way
the labels are (nearly) all one class: w^pp_cq . x_p has mean |mu_c|^2 ~ d1, so every personal unit
is active with pre-activation ~ d1 +- 20 and h*_c carries an offset ~ d1 * sum_{q<=m1} a_q (hundreds,
sign fixed by a) against a within-client spread of ~150; measured on three draws at the paper's size
(C = d = 100, m = 200, p = 0.5, alpha = 0.4): 98-100% of all labels are one class and 47 to 100 of
the 100 clients see a single class, so any model scores ~95% by predicting it. The default
"client_median" takes t_c = the median of h*_c over client c's own samples (train and test
together): a client-specific intercept in h*_c, so each client's classes are balanced and the rest
of the model is unchanged.

Student and training (FedSplit, section 3.2, with a logistic loss). All C clients and their tensors
are batched (W: C x m x d, b: C x m, a: C x m, b0: C) and differentiated together by autograd, so a
round of C = 100 clients is a handful of batched matrix products. Each client runs `local_steps`
full-batch gradient steps on its mean logistic loss; then the server replaces, for every client, the
rows of the shared hidden units (and their biases) by their sample-weighted mean over the round's
participants, and the output layer (a, b0: outside Lambda, so shared as in FedAvg) likewise;
personal units keep each participant's own update. All clients start from one common initialisation
(nn.Linear's uniform(+-1/sqrt(fan_in))) and first train locally for `warmup_steps` steps with no
communication; every decomposition starts from that same warm-up state, uses the same participants
each round and the same learning rate, so only the mask differs.

Decompositions of the hidden layer (a mask over the m units, True = shared):
- true: the teacher's mask (units m1..m-1 shared), fixed.
- oracle: factor analysis on the teacher's weights of all C clients (`unit_matrix` rows = client x
  fan-in d, columns = the m units), fixed.
- static: factor analysis on the clients' weights after the warm-up (Algorithm 1), fixed.
- dynamic: factor analysis on the participants' updated weights every round, before aggregation
  (Algorithm 2); its initial mask is static's.
- random: a random mask with m2 shared units, drawn afresh every round (`split.random: round`,
  following the text: "split by random guess", and "in the true and oracle methods the structure of
  the DNN stays the same", implying it need not in the others) or once (`fixed`).
- random_fixed (optional, not in the default list): the same, drawn once. A check worth knowing:
  the student's hidden units are exchangeable (common i.i.d. initialisation), so any FIXED mask with
  m2 shared units is, in distribution, the same model as the true one; a student unit j is not the
  teacher's unit j. What can make a fixed mask better or worse is only how many units it shares (and,
  for static, which warm-up units it picks), and what makes dynamic or random worse is units changing
  state. For the same reason the mask agreement with the truth is meaningful for `oracle` (same
  unit indexing as the teacher) and is chance (p^2 + (1-p)^2 for m2 units) for static, dynamic and
  random, whose units are the student's.

Fair threshold: every factor-analysis split uses one rule, `split.tau`. The default "share" is the
(1 - p) quantile of the communalities nu, so each picks as many shared units as the truth has (m2)
and only WHICH units differs (taken as the m2 largest nu: the same unless nu has ties, as Heywood
communalities clipped to 1 can have on tiny layers; ties are broken by unit index). "mean" (the
official code's default), any quantile "q<P>" / "<P>%", or a number are the alternatives
(`fedfactor.analysis.factor.parse_tau`); `random` always shares m2 units. kappa = 0.85 (the paper's
Tables 4-6) and the iterated principal-factor estimate (eq. 7, `method: principal`).

Values the paper leaves open, chosen so the default study (5 settings x 5 decompositions x 3 seeds)
runs in a few minutes on 2 CPU cores (C = 100, d = 100, m = 200 are the paper's); config/simulation/
fedfac.yaml holds them:
- 100 training and 200 test samples per client: the cost is linear in the training samples; with
  100 the accuracy of the fixed splits levels off near 71%, far above sharing everything (~53%), so
  the decompositions have room to differ; with 200 test samples a client's accuracy has a standard
  error of ~3 points, the mean over 100 clients ~0.3;
- noise c = 1: h*_c varies by ~150 within a client, so labels are nearly noise-free;
- 20 rounds of 5 full-batch gradient steps at learning rate 0.1: plain gradient descent as in
  section 3.2 (no optimiser state, so the server step is exactly the paper's); the fixed splits'
  accuracy levels off by round ~15 (chosen on the true split's curve, then used for all);
- 10 warm-up steps of local training before static's factor analysis;
- every client in every round (section 3.2: "all clients are available"); `train.fraction` < 1
  samples round(fraction * C) of them;
- Figure 6's grid: p in {0.3, 0.5, 0.7} at alpha = 0.4 and alpha in {0.2, 0.4, 0.6} at p = 0.5
  (three panels each, as the paper's; the (0.5, 0.4) setting is run once and drawn in both rows);
  seeds 0, 1, 2;
- kappa = 0.85 (the paper's Tables 4-6), the principal-factor estimate, tau as above.

Optional reference decompositions (not in the default list): `random_fixed` (above), `all_shared`
(every hidden unit shared: FedAvg) and `all_personal` (none shared: only the output layer is averaged).

Threads: the factor analysis runs on one thread (eigh of an m x m matrix is ~4x faster so, and much
more when the cores are busy); training uses torch's setting (OMP_NUM_THREADS).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import numpy as np
import torch
from pydantic import BeforeValidator, Field, field_validator

from ..config import (MAX_CLIENTS, MAX_EPOCHS, MAX_ROUNDS, MAX_SEED, Float, Int, Section, apply_overrides, read_mapping,
                      validated)
from ..errors import UsageError
from ..analysis.factor import factor_analysis, parse_tau, split, unit_matrix

DECOMPOSITIONS = ("true", "oracle", "static", "dynamic", "random", "random_fixed", "all_shared", "all_personal")
FA_BASED = ("oracle", "static", "dynamic")
Decomposition = Literal["true", "oracle", "static", "dynamic", "random", "random_fixed", "all_shared", "all_personal"]


# ------------------------------------------------------------------------------------------ config


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


class SimulationConfig(Section):
    data: SimDataConfig = Field(default_factory=SimDataConfig)
    train: SimTrainConfig = Field(default_factory=SimTrainConfig)
    split: SimSplitConfig = Field(default_factory=SimSplitConfig)
    grid: SimGridConfig = Field(default_factory=SimGridConfig)
    decompositions: list[Annotated[Decomposition, BeforeValidator(_true_as_name)]] = Field(
        default_factory=lambda: ["true", "oracle", "static", "dynamic", "random"])
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


def load_simulation_config(path: str | Path | None = None, overrides: list[str] = ()) -> SimulationConfig:
    """The typed study config from YAML and dotted `--set` overrides; every failure is one UsageError."""
    raw = read_mapping(path)
    apply_overrides(raw, overrides)
    cfg = validated(SimulationConfig, raw)
    check_settings(cfg)
    return cfg


# -------------------------------------------------------------------------------------- generator


@dataclass
class SimData:
    """One setting's clients: train/test tensors and the teacher."""

    x_train: torch.Tensor  # C x n_train x d
    y_train: torch.Tensor  # C x n_train, float 0/1
    x_test: torch.Tensor  # C x n_test x d
    y_test: torch.Tensor  # C x n_test
    weights: torch.Tensor  # C x m x d: W_c = (W_c^p, W^s), one row per hidden unit (fan-in d)
    a: torch.Tensor  # m, the teacher's output weights
    mu: torch.Tensor  # C x d1, the clients' means of x_p (and of w^pp)
    shared: torch.Tensor  # m, bool: the true mask (units m1..m-1)
    d1: int
    m1: int


def ar1_cholesky(d1: int) -> torch.Tensor:
    """Lower Cholesky factor of Sigma = (0.5^|i-j|), d1 x d1."""
    i = torch.arange(d1, dtype=torch.float64)
    return torch.linalg.cholesky(0.5 ** (i[:, None] - i[None, :]).abs())


def teacher_output(weights: torch.Tensor, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """h*_c(x) of eq. (8) for every client: C x n from weights C x m x d and x C x n x d."""
    return torch.relu(torch.bmm(x, weights.transpose(1, 2))) @ a


def generate(clients: int, d: int, m: int, p: float, alpha: float, n_train: int, n_test: int,
             noise: float = 1.0, label_threshold: str = "client_median",
             generator: torch.Generator | None = None) -> SimData:
    """Section 4.3.1's data: see the module docstring."""
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    d2, m2 = round(alpha * d), round(p * m)
    d1, m1 = d - d2, m - m2
    if not (1 <= d2 < d and 1 <= m2 < m):
        raise ValueError(f"p = {p}, alpha = {alpha} leave no shared or no personal covariates or units")
    C = clients
    mu = torch.randn(C, d1, generator=g, dtype=torch.float64)
    # shared teacher units (fixed for all clients) and output weights
    w_sp = torch.empty(m2, d1, dtype=torch.float64).uniform_(-0.1, 0.1, generator=g)
    w_ss = torch.empty(m2, d2, dtype=torch.float64).uniform_(-1, 1, generator=g)
    a = torch.randn(m, generator=g, dtype=torch.float64)
    # personal teacher units
    w_pp = mu[:, None, :] + torch.randn(C, m1, d1, generator=g, dtype=torch.float64)
    w_ps = torch.empty(C, m1, d2, dtype=torch.float64).uniform_(-0.1, 0.1, generator=g)
    weights = torch.cat([torch.cat([w_pp, w_ps], 2),
                         torch.cat([w_sp, w_ss], 1).expand(C, m2, d)], 1)
    n = n_train + n_test
    chol = ar1_cholesky(d1)
    x_p = mu[:, None, :] + torch.randn(C, n, d1, generator=g, dtype=torch.float64) @ chol.T
    x_s = torch.randn(C, n, d2, generator=g, dtype=torch.float64)
    x = torch.cat([x_p, x_s], 2)
    h = teacher_output(weights, a, x)
    y_star = h + noise * torch.randn(C, n, generator=g, dtype=torch.float64)
    if label_threshold == "client_median":
        t = h.median(1, keepdim=True).values
    elif label_threshold == "zero":
        t = torch.zeros(C, 1, dtype=torch.float64)
    else:
        raise ValueError(f"label_threshold must be 'client_median' or 'zero' (got {label_threshold!r})")
    y = (torch.sigmoid(y_star - t) > 0.5).float()
    shared = torch.arange(m) >= m1
    x = x.float()
    return SimData(x[:, :n_train], y[:, :n_train], x[:, n_train:], y[:, n_train:], weights.float(),
                   a.float(), mu.float(), shared, d1, m1)


# ------------------------------------------------------------------------------- student, batched


@dataclass
class MLP:
    """C clients' one-hidden-layer MLPs: logit = a . relu(W x + b) + b0."""

    W: torch.Tensor  # C x m x d
    b: torch.Tensor  # C x m
    a: torch.Tensor  # C x m
    b0: torch.Tensor  # C

    def clone(self) -> "MLP":
        return MLP(self.W.clone(), self.b.clone(), self.a.clone(), self.b0.clone())


def init_mlp(clients: int, m: int, d: int, generator: torch.Generator) -> MLP:
    """One common initialisation (nn.Linear's uniform +-1/sqrt(fan_in)), copied to every client."""
    def u(shape, fan_in):
        bound = 1 / math.sqrt(fan_in)
        return torch.empty(shape).uniform_(-bound, bound, generator=generator)

    W, b, a, b0 = u((m, d), d), u((m,), d), u((m,), m), u((1,), m)
    return MLP(W.expand(clients, m, d).clone(), b.expand(clients, m).clone(), a.expand(clients, m).clone(),
               b0.expand(clients).clone())


def logits(model: MLP, x: torch.Tensor) -> torch.Tensor:
    """C x n logits."""
    h = torch.baddbmm(model.b[:, None, :], x, model.W.transpose(1, 2)).relu_()
    return torch.bmm(h, model.a[:, :, None]).squeeze(2) + model.b0[:, None]


def loss_and_grads(model: MLP, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, MLP]:
    """Each client's mean logistic loss (C) and its gradients; clients are independent, so the
    gradient of the summed losses is every client's own."""
    with torch.enable_grad():
        leaves = MLP(*(t.detach().requires_grad_(True) for t in (model.W, model.b, model.a, model.b0)))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits(leaves, x), y, reduction="none").mean(1)
        grads = torch.autograd.grad(loss.sum(), [leaves.W, leaves.b, leaves.a, leaves.b0])
    return loss.detach(), MLP(*grads)


def local_train(model: MLP, x: torch.Tensor, y: torch.Tensor, lr: float, steps: int,
                participants: torch.Tensor | None = None) -> torch.Tensor:
    """`steps` full-batch gradient steps in place for the participants (C bool); returns their last loss."""
    loss = torch.zeros(x.shape[0])
    for _ in range(steps):
        loss, grad = loss_and_grads(model, x, y)
        keep = 1.0 if participants is None else participants.float()
        for name in ("W", "b", "a", "b0"):
            g = getattr(grad, name)
            scale = keep if participants is None else keep.view(-1, *([1] * (g.dim() - 1)))
            getattr(model, name).sub_(lr * scale * g)
    return loss


def aggregate(model: MLP, shared: torch.Tensor, participants: torch.Tensor, n_samples: torch.Tensor) -> None:
    """FedSplit's server step, in place: shared hidden units (rows of W, entries of b) and the output
    layer (a, b0) become the participants' sample-weighted mean for every client; personal units keep
    each client's own values."""
    w = n_samples.to(model.W.dtype) * participants.to(model.W.dtype)
    w = w / w.sum()
    mean_W = torch.einsum("c,cmd->md", w, model.W)
    mean_b = w @ model.b
    model.W[:, shared] = mean_W[shared]
    model.b[:, shared] = mean_b[shared]
    model.a[:] = w @ model.a
    model.b0[:] = w @ model.b0


def accuracy(model: MLP, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-client test accuracy (C)."""
    return ((logits(model, x) > 0).float() == y).float().mean(1)


# ---------------------------------------------------------------------------------- decompositions


def fa_mask(weights: torch.Tensor, tau: Any, p: float, kappa: float, method: str) -> torch.Tensor:
    """Shared mask from a factor analysis of K clients' weights (K x m x d): nu_j >= tau."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # eigh of an m x m matrix: one thread is 4x faster than two, and far more under load
    try:
        fa = factor_analysis(unit_matrix(weights), kappa=kappa, method=method)
    finally:
        torch.set_num_threads(threads)
    nu = fa.communalities.cpu()
    if tau != "share":
        return split(nu, tau)
    # nu >= its (1 - p) quantile, i.e. the m2 = round(p * m) largest; ties (Heywood communalities
    # clipped to 1) would let the quantile rule pick more, so they are broken by unit index
    mask = torch.zeros(nu.numel(), dtype=torch.bool)
    mask[torch.argsort(nu, descending=True, stable=True)[:round(p * nu.numel())]] = True
    return mask


def random_mask(m: int, m2: int, generator: torch.Generator) -> torch.Tensor:
    mask = torch.zeros(m, dtype=torch.bool)
    mask[torch.randperm(m, generator=generator)[:m2]] = True
    return mask


def _seed(*parts: float | int | str) -> int:
    """A 63-bit seed from the seed, the setting and a purpose, independent of the grid's other settings."""
    key = [int(x) if isinstance(x, int) else (round(x * 1e6) if isinstance(x, float) else sum(map(ord, x)))
           for x in parts]
    return int(np.random.SeedSequence(key).generate_state(2, np.uint64)[0] >> np.uint64(1))


def _gen(*parts) -> torch.Generator:
    return torch.Generator().manual_seed(_seed(*parts))


def run_setting(cfg: SimulationConfig, p: float, alpha: float, seed: int,
                decompositions: list[str] | None = None) -> dict[str, dict[str, list[float]]]:
    """Train every decomposition on one setting and seed; per decomposition, per round 0..R:
    accuracy (mean over clients), stability (share of units in the same state as the round
    before; NaN at round 0), agreement (with the true mask), n_shared."""
    dc, tc, sc = cfg.data, cfg.train, cfg.split
    data = generate(dc.clients, dc.d, dc.m, p, alpha, dc.train_samples, dc.test_samples, dc.noise,
                    dc.label_threshold, _gen(seed, p, alpha, "data"))
    C, m = dc.clients, dc.m
    m2 = int(data.shared.sum())
    start = init_mlp(C, m, dc.d, _gen(seed, p, alpha, "init"))
    local_train(start, data.x_train, data.y_train, tc.lr, tc.warmup_steps)
    n_samples = torch.full((C,), float(dc.train_samples))
    fixed: dict[str, torch.Tensor] = {"true": data.shared, "all_shared": torch.ones(m, dtype=torch.bool),
                                      "all_personal": torch.zeros(m, dtype=torch.bool)}
    todo = list(decompositions or cfg.decompositions)
    if "oracle" in todo:
        fixed["oracle"] = fa_mask(data.weights, sc.tau, p, sc.kappa, sc.method)
    if "static" in todo or "dynamic" in todo:
        fixed["static"] = fa_mask(start.W, sc.tau, p, sc.kappa, sc.method)
    k = max(1, round(tc.fraction * C))
    out = {}
    for name in todo:
        model = start.clone()
        part_gen = _gen(seed, p, alpha, "participants")  # the same participants for every decomposition
        rand_gen = _gen(seed, p, alpha, "random")
        redraw = name == "random" and sc.random == "round"
        if name in ("random", "random_fixed"):
            mask = random_mask(m, m2, rand_gen)
        else:  # dynamic starts from static's mask (Algorithm 2's initialisation)
            mask = fixed["static" if name == "dynamic" else name]
        hist = {"accuracy": [float(accuracy(model, data.x_test, data.y_test).mean())], "stability": [math.nan],
                "agreement": [float((mask == data.shared).float().mean())], "n_shared": [int(mask.sum())],
                "train_loss": [math.nan]}
        for _ in range(tc.rounds):
            if k == C:
                participants = torch.ones(C, dtype=torch.bool)
            else:
                participants = torch.zeros(C, dtype=torch.bool)
                participants[torch.randperm(C, generator=part_gen)[:k]] = True
            loss = local_train(model, data.x_train, data.y_train, tc.lr, tc.local_steps, participants)
            previous = mask
            if name == "dynamic":
                mask = fa_mask(model.W[participants], sc.tau, p, sc.kappa, sc.method)
            elif redraw:
                mask = random_mask(m, m2, rand_gen)
            aggregate(model, mask, participants, n_samples)
            hist["accuracy"].append(float(accuracy(model, data.x_test, data.y_test).mean()))
            hist["stability"].append(float((mask == previous).float().mean()))
            hist["agreement"].append(float((mask == data.shared).float().mean()))
            hist["n_shared"].append(int(mask.sum()))
            hist["train_loss"].append(float(loss[participants].mean()))
        out[name] = hist
    return out


# ------------------------------------------------------------------------------------------ study


def run_study(cfg: SimulationConfig, progress: Callable[[str], None] | None = None):
    """Every setting x seed; returns (per-run summary rows, per-round rows) as DataFrames."""
    import pandas as pd

    rows, rounds = [], []
    for p, alpha in settings_of(cfg):
        for seed in cfg.seeds:
            t0 = time.perf_counter()
            result = run_setting(cfg, p, alpha, seed)
            for name, h in result.items():
                rows.append({"p": p, "alpha": alpha, "decomposition": name, "seed": seed,
                             "final_accuracy": h["accuracy"][-1], "best_accuracy": max(h["accuracy"][1:]),
                             "agreement": h["agreement"][-1], "stability": h["stability"][-1],
                             "n_shared": h["n_shared"][-1]})
                for r in range(len(h["accuracy"])):
                    rounds.append({"p": p, "alpha": alpha, "decomposition": name, "seed": seed, "round": r,
                                   **{k: h[k][r] for k in ("accuracy", "stability", "agreement", "n_shared",
                                                           "train_loss")}})
            if progress:
                accs = ", ".join(f"{n} {100 * h['accuracy'][-1]:.1f}" for n, h in result.items())
                progress(f"p = {p:g}, alpha = {alpha:g}, seed {seed}: final accuracy % {accs} "
                         f"({time.perf_counter() - t0:.1f} s)")
    return pd.DataFrame(rows), pd.DataFrame(rounds)


CLAIM = ("Paper 001, section 4.3.2 (Figure 6): the true, oracle, static FedFac and dynamic FedFac "
         "decompositions give nearly identical test accuracies (here: within about a point of each other), "
         "while the random decomposition is much inferior (clearly lower).")


def _setting_label(p: float, alpha: float) -> str:
    return f"p = {p:g}, alpha = {alpha:g}"


def summary_markdown(cfg: SimulationConfig, runs, seconds: float | None = None) -> str:
    """Mean +- std over seeds: settings as rows, decompositions as columns; the claim and a check."""
    names = [n for n in cfg.decompositions if n in set(runs["decomposition"])]
    settings = settings_of(cfg)

    def table(column: str, scale: float, digits: int, only: list[str] | None = None) -> list[str]:
        cols = [n for n in names if only is None or n in only]
        lines = ["| setting | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for p, alpha in settings:
            cells = []
            for n in cols:
                v = scale * runs[(runs.p == p) & (runs.alpha == alpha) & (runs.decomposition == n)][column]
                cells.append(f"{v.mean():.{digits}f} ± {v.std(ddof=0):.{digits}f}" if len(v) else "")
            lines.append(f"| {_setting_label(p, alpha)} | " + " | ".join(cells) + " |")
        return lines

    seeds = ", ".join(map(str, cfg.seeds))
    lines = ["# FedFac simulation study (paper 001, section 4.3)", "",
             f"Test accuracy after the last round ({cfg.train.rounds}), in %, mean ± std over seeds {seeds}; "
             f"C = {cfg.data.clients} clients, d = {cfg.data.d}, m = {cfg.data.m}, threshold tau = "
             f"{cfg.split.tau!s}" + (" (the (1 - p) quantile of nu: as many shared units as the truth)"
                                    if cfg.split.tau == "share" else "") + ".", ""]
    lines += table("final_accuracy", 100, 1)
    lines += ["", CLAIM, ""]
    close = [n for n in ("true", "oracle", "static", "dynamic") if n in names]
    if close:
        per = runs[runs.decomposition.isin(close)].groupby(["p", "alpha", "decomposition"])["final_accuracy"].mean()
        spread = 100 * per.groupby(["p", "alpha"]).agg(lambda s: s.max() - s.min())
        text = (f"Measured: the largest spread among {', '.join(close)} in one setting is "
                f"{spread.max():.1f} points (mean over settings {spread.mean():.1f})")
        if "random" in names:
            lo = per.groupby(["p", "alpha"]).min()
            rnd = runs[runs.decomposition == "random"].groupby(["p", "alpha"])["final_accuracy"].mean()
            gap = 100 * (lo - rnd)
            text += (f"; random is below the lowest of them by {gap.min():.1f} to {gap.max():.1f} points "
                     f"(mean {gap.mean():.1f})")
        lines += [text + ".", ""]
    lines += ["Best accuracy over rounds, in %:", ""] + table("best_accuracy", 100, 1)
    lines += ["", "Agreement of the final mask with the true mask (share of units), in %. Meaningful for oracle "
              "(the teacher's own units); for static, dynamic and random it is the student's units against the "
              "teacher's indices, which no method can match (exchangeable units): chance is p² + (1 - p)².", ""]
    lines += table("agreement", 100, 1)
    if "dynamic" in names:
        lines += ["", "Dynamic FedFac: share of units that kept their state in the last round, in % (Figure 7).", ""]
        lines += table("stability", 100, 1, only=["dynamic"])
    if seconds is not None:
        lines += ["", f"Wall time: {seconds:.0f} s."]
    return "\n".join(lines) + "\n"


def figure6(cfg: SimulationConfig, rounds, out: str | Path) -> None:
    """Six panels (p sweep, alpha sweep): mean client test accuracy per round per decomposition."""
    from .figures import legend_outside, mean_band, method_styles, pyplot, rounds_axis, save_figure

    plt = pyplot()
    panels = panels_of(cfg)
    names = [n for n in cfg.decompositions if n in set(rounds["decomposition"])]
    styles = method_styles(names)
    cols = max(len(cfg.grid.p), len(cfg.grid.alpha))
    fig, axes = plt.subplots(2, cols, figsize=(4.2 * cols, 6.4), squeeze=False, sharey=True, layout="constrained")
    slots = [axes[0, i] for i in range(len(cfg.grid.p))] + [axes[1, i] for i in range(len(cfg.grid.alpha))]
    for ax, (title, p, alpha) in zip(slots, panels):
        for name in names:
            d = rounds[(rounds.p == p) & (rounds.alpha == alpha) & (rounds.decomposition == name)]
            mean_band(ax, d, "accuracy", label=name, **styles[name])
        ax.set_title(title)
        rounds_axis(ax)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("mean client test accuracy [%]")
    for ax in axes.flat:
        if ax not in slots:
            ax.set_visible(False)
    legend_outside(fig, slots, title="decomposition (mean ± std over seeds)")
    fig.suptitle("Test accuracy under different decompositions (paper 001, Figure 6)")
    save_figure(fig, out)


def figure7(cfg: SimulationConfig, rounds, out: str | Path) -> None:
    """Dynamic FedFac: share of units that did not change state since the previous round."""
    from .figures import legend_outside, pyplot, rounds_axis, save_figure

    fig, ax = pyplot().subplots(figsize=(6.4, 4.0), layout="constrained")
    d = rounds[(rounds.decomposition == "dynamic") & (rounds["round"] > 0)]
    for i, (p, alpha) in enumerate(settings_of(cfg)):
        g = d[(d.p == p) & (d.alpha == alpha)].groupby("round")["stability"].mean()
        if len(g):
            ax.plot(g.index, 100 * g, color=f"C{i}", label=_setting_label(p, alpha))
    rounds_axis(ax)
    ax.set_ylabel("units that kept their state [%]")
    ax.set_title("Dynamic FedFac: stability of the split (paper 001, Figure 7)")
    ax.grid(alpha=0.3)
    if len(d):
        legend_outside(fig, [ax], title="setting")
    else:
        ax.text(0.5, 0.5, "dynamic not among the decompositions", ha="center", va="center", transform=ax.transAxes)
    save_figure(fig, out)


def simulate(cfg: SimulationConfig, out: str | Path, progress: Callable[[str], None] | None = None) -> str:
    """Run the study and write OUT/simulation.csv, rounds.csv, simulation.md (and .html, for the
    workflow's report), figure6.png, figure7.png (each figure with a .pdf twin)."""
    import html

    from ..io import atomic_write_text

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file, not a folder")
    say = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    runs, rounds = run_study(cfg, say)
    seconds = time.perf_counter() - t0
    md = summary_markdown(cfg, runs, seconds)
    atomic_write_text(out / "simulation.csv", runs.to_csv(index=False))
    atomic_write_text(out / "rounds.csv", rounds.to_csv(index=False))
    figure6(cfg, rounds, out / "figure6.png")
    figure7(cfg, rounds, out / "figure7.png")
    atomic_write_text(out / "simulation.html", "<!DOCTYPE html><html><head><meta charset='utf-8'><title>FedFac "
                      f"simulation</title></head><body><pre>{html.escape(md)}</pre></body></html>\n")
    atomic_write_text(out / "simulation.md", md)
    return md

"""The baselines' constants the paper studies rely on: every hyperparameter default that some study in
config/studies/ leaves unset, pinned to its value with the source docs/baselines.md and the method's
page under docs/methods/ give for it. A changed constant fails here, naming where the value comes from.
"""

import re
from pathlib import Path

import pytest
import yaml

from fedfactor.methods import METHODS

REPO = Path(__file__).resolve().parents[2]

# (method, parameter, default, source)
DEFAULTS = [
    ("fedper", "personal_layers", 1, "001 5.1: the last layer private; FL-bench"),
    ("lg_fedavg", "global_layers", 1, "official code --num_layers_keep, FL-bench num_global_layers, PFLlib"),
    ("fedrep", "head_epochs", 10, "FedRep paper: ten head epochs per round"),
    ("per_fedavg", "alpha", None, "null = fl.lr: FL-bench and PFLlib take it from the local optimizer"),
    ("per_fedavg", "beta", None, "null = fl.lr: PFLlib"),
    ("per_fedavg", "variant", "fo", "first order: FL-bench's default"),
    ("per_fedavg", "steps", 0, "0: fl.epochs passes in meta-steps of 2 (3) batches, FL-bench and PFLlib"),
    ("per_fedavg_hf", "variant", "hf", "the Hessian-free variant (exact Hessian-vector product)"),
    ("clustered_fl", "eps1", 0.4, "the authors' code, FL-bench"),
    ("clustered_fl", "eps2", 1.6, "the authors' code, FL-bench"),
    ("clustered_fl", "min_split_size", 3, "the authors' code, FL-bench"),
    ("clustered_fl", "warmup_rounds", 20, "the authors' code, FL-bench"),
    ("clustered_fl", "weighting", "uniform", "uniform mean: the authors' code, FL-bench"),
    ("fedfomo", "models_downloaded", 10, "H = 10: 002 C.4"),
    ("fedfomo", "epsilon", 0.3, "epsilon-greedy start: official code (NVlabs/FedFomo)"),
    ("fedfomo", "epsilon_decay", 0.05, "per round: official code (NVlabs/FedFomo)"),
    ("fedfomo", "own_from_server", True, "002's (H+1) W: the client's own model sent back"),
    ("pfedpara", "capacity", 0.95, "002 C.2: 90-99 % of the original parameters"),
    ("pfedpara", "gamma", None, "unset: capacity decides the rank (FedPara's rank rule)"),
    ("pfedpara", "share_other", False, "only W1's factors shared, as Flower's pFedPara client"),
    ("pfedpara", "init", "fedpara", "He-normal factors: the authors' code"),
    ("fedem", "components", 3, "M = 3: 001 5.1, as its authors suggest"),
    ("fedem", "reinit", "all", "components 2..M freshly initialised: the official code"),
    ("fedamp", "lam", 1.0, "Fling lamda (the FedDecomp authors' config)"),
    ("fedamp", "alpha", 1e4, "Fling alphaK"),
    ("fedamp", "sigma", 100.0, "Fling sigma"),
    ("fedamp", "alpha_decay", 0.1, "Fling decay_rate"),
    ("fedamp", "alpha_decay_every", 30, "Fling decay_frequency"),
    ("fedrod", "body_loss", "generic", "PFLlib (Fling: both)"),
    ("pfedsd", "temperature", 3.0, "T = 3: Fling, the FedDecomp authors' config"),
    ("pfedsd", "lam", 0.5, "lambda = 0.5: Fling, the FedDecomp authors' config"),
    ("pfedsd", "teacher_mode", "train", "the authors' code and Fling"),
    ("pfedgate", "sparsity", 0.5, "s = 0.5: the authors' scripts (--sparse_factor 0.5)"),
    ("pfedgate", "split", 5, "--fine_grained_block_split 5: all the authors' scripts"),
    ("pfedgate", "gate_lr", None, "null = fl.lr: most scripts set lr_gating = lr_model"),
    ("pfedgate", "clip", 10.0, "gradient norm clip 10: the authors' code"),
    ("pfedgate", "style", "official", "the authors' code's budget, ranking and scaling"),
    ("pfedgate", "keep_optimizer", True, "each client's optimizers kept across rounds: the authors' code"),
    ("fedcac", "tau", 0.5, "the authors' CIFAR-10 config (Fling)"),
    ("fedcac", "beta", 100, "the authors' CIFAR-10 config (Fling)"),
    ("agnostic_fl", "gamma_lambda", 0.01, "fair_flearn run.sh, FLGo (the paper gives no number)"),
    ("agnostic_fl", "lambda_min", 0.0, "0: the whole simplex (the paper)"),
]
# The papers' own methods and their variants: docs/methods.md links each to its paper's page. Every other
# method a study lists is a baseline, whose defaults the studies rely on unless they set them.
PAPERS_METHODS = set(re.findall(r"^\| `(\w+)` \| [^|]*\[paper\]\(papers/", (REPO / "docs/methods.md").read_text(), re.M))
# The baselines docs/baselines.md documents (its table's first column)
DOCUMENTED = set(re.findall(r"`(\w+)`", "".join(
    line.split("|")[1] for line in (REPO / "docs/baselines.md").read_text().splitlines() if line.startswith("| `"))))


@pytest.mark.parametrize("method, param, value, source", DEFAULTS, ids=[f"{m}.{p}" for m, p, *_ in DEFAULTS])
def test_a_baselines_default_is_its_sources_value(method, param, value, source):
    """Catches: a baseline's constant changed (pFedGate's sparsity, FedCAC's beta, ...)."""
    got = getattr(METHODS.get(method)().hp, param)
    assert got == value and type(got) is type(value), f"{method}.{param} = {got!r}, but {source} gives {value!r}"


def _study_methods():
    """{method name: [the keys each study entry sets]} over config/studies/*.yaml."""
    out: dict[str, list[set[str]]] = {}
    for path in sorted((REPO / "config/studies").glob("*.yaml")):
        for label, spec in (yaml.safe_load(path.read_text()).get("methods") or {}).items():
            out.setdefault(spec.get("name", label), []).append(set(spec) - {"name", "run"})
    return out


def test_every_default_a_study_relies_on_is_pinned():
    """Catches: a baseline parameter (new, or newly left unset by a study) whose default nothing pins."""
    studies = _study_methods()
    pinned = {(m, p) for m, p, *_ in DEFAULTS}
    baselines = set(studies) - PAPERS_METHODS
    # the index read as meant: the papers' methods found there, and none of them a documented baseline
    assert {"fedfac", "simfed", "feddecomp", "factorized_fl_alpha"} <= PAPERS_METHODS
    assert DOCUMENTED and not PAPERS_METHODS & DOCUMENTED
    missing = []
    for method in sorted(baselines):
        for param in METHODS.get(method).Params.model_fields:
            relied = any(param not in keys for keys in studies.get(method, []))
            if relied and (method, param) not in pinned:
                missing.append(f"{method}.{param}")
    assert not missing, f"defaults the studies rely on but no row of DEFAULTS pins: {missing}"

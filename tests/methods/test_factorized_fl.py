import math

import numpy as np
import pytest
import torch

from fedfactor.config import load_config
from fedfactor.run.simulator import Simulator
from fedfactor.methods import METHODS, build
from fedfactor.methods.factorized_fl import BITS, MATCH, VALUES
from fedfactor.methods.simfed import CRITERIA
from fedfactor.reparam import Factorized

PERMUTED = ["partition.permute_labels=true"]


def _sim(tiny, *extra):
    # Factorized-FL's protocol: a client is scored with, and keeps, its whole trained model
    return Simulator(load_config(None, tiny + ["eval.model=trained", *extra]))


def _numel(state, keys):
    return sum(state[k].numel() for k in keys)


def test_every_layer_is_factorized_and_the_model_still_has_weights(tiny):
    sim = _sim(tiny, "method.name=factorized_fl_alpha")
    layers = [m for m in sim.model.modules() if isinstance(m, Factorized)]
    assert len(layers) == 4  # cnn: 2 conv + 1 fc in the body, the head
    assert not any(isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) for m in sim.model.modules())
    assert all(layer.weight.shape == layer.shape for layer in layers)
    assert sim.method.match_layer == "body.3"  # as run: v of the last convolution (official server.py)
    text = _sim(tiny, "method.name=factorized_fl_alpha_text")
    assert text.method.match_layer == "body.7"  # the fc layer before the classifier: the paper's v^{L-1}


def test_alpha_text_uploads_exactly_U_and_v_before_the_head_and_downloads_U(tiny):
    sim = _sim(tiny, "method.name=factorized_fl_alpha_text", *PERMUTED)
    state = sim.states[0]
    U = [k for k in sim.ctx.param_keys if k.endswith(".u") and k.startswith("body.")]
    sent = sim.method.upload(0, state)
    assert set(sent) == {*U, MATCH}
    assert torch.equal(sent[MATCH], state["body.7.v"].reshape(-1))
    per_client = _numel(state, U) + state["body.7.v"].numel()
    sim.run_round(1)
    up, down = sim.meter.history[-1]
    assert up == 4 * per_client * 4  # 4 clients, float32
    received = sim.method.download(sim.server, 0)
    assert set(received) == set(U)
    assert down == 4 * _numel(state, U) * 4


def test_alpha_cost_projects_from_shapes_and_pruned_beta_is_refused(tiny):
    sim = Simulator(load_config(None, tiny + ["eval.model=trained", "method.name=factorized_fl_alpha_text"]),
                    dry_run=True)
    sim.run()
    state = sim.states[0]
    U = [k for k in sim.ctx.param_keys if k.endswith(".u") and k.startswith("body.")]
    assert sim.meter.up == 2 * 4 * 4 * (_numel(state, U) + state["body.7.v"].numel())
    with pytest.raises(Exception, match="depends on trained values"):
        Simulator(load_config(None, tiny + ["method.name=factorized_fl_beta_text"]), dry_run=True)
    # as run, M travels unpruned: its size no longer depends on trained values
    dense = Simulator(load_config(None, tiny + ["eval.model=trained", "method.name=factorized_fl_beta"]), dry_run=True)
    dense.run()
    assert dense.meter.up == 2 * 4 * 4 * _numel(dense.states[0], dense.method.shared)


def test_beta_sends_U_V_and_M_with_M_counted_as_its_non_zeros(tiny):
    sim = _sim(tiny, "method.name=factorized_fl_beta_text", "method.mu_threshold=1e-3", *PERMUTED)
    sim.run_round(1)
    up, _ = sim.meter.history[-1]
    expected, nonzero, entries = 0, 0, 0
    for k in range(4):
        state = sim.states[k]
        for key in sim.method.shared:
            t = state[key]
            if key.endswith(".mu"):
                nnz = int((t.abs() >= 1e-3).sum())
                nonzero, entries = nonzero + nnz, entries + t.numel()
                expected += math.ceil(t.numel() / 8) + 4 * nnz
            else:
                expected += 4 * t.numel()
    assert 0 < nonzero < entries  # mu has moved, and not all of it above the threshold
    assert up == expected
    kinds = {key.rsplit(".", 1)[-1] for key in sim.method.shared}
    assert {"u", "v", "mu"} <= kinds and not any(k.startswith("head.") for k in sim.method.shared)
    assert not any("running" in k for k in sim.method.shared)  # BN statistics stay local


def test_sparse_mu_round_trips_through_the_server(tiny):
    sim = _sim(tiny, "method.name=factorized_fl_beta_text", "method.tau=2")  # tau > 1: only itself
    sim.run_round(1)
    payload = sim.method.download(sim.server, 2)
    mu_key = sim.method.mu_keys[0]
    assert mu_key + BITS in payload and mu_key + VALUES in payload and mu_key not in payload
    got = sim.method.receive(2, sim.states[2], payload)
    mu = sim.states[2][mu_key]
    assert torch.equal(got[mu_key], mu * (mu.abs() >= sim.method.hp.mu_threshold))


def test_a_threshold_above_every_score_leaves_each_client_with_its_own_U(tiny):
    sim = _sim(tiny, "method.name=factorized_fl_alpha_text", "method.tau=1.5")
    sim.run_round(1)
    W = sim.server["weights"]
    assert torch.equal(W, torch.eye(4, dtype=W.dtype))
    for k in range(4):
        got = sim.method.download(sim.server, k)
        assert all(torch.equal(got[key], sim.states[k][key]) for key in got)


def test_similarity_weights_are_a_softmax_over_the_matched_clients(tiny):
    sim = _sim(tiny, "method.name=factorized_fl_alpha_text", "method.tau=0", "method.epsilon=5")
    sim.run_round(1)
    keys = torch.stack([sim.states[k]["body.7.v"].reshape(-1) for k in range(4)]).double()
    cos = torch.nn.functional.cosine_similarity(keys.unsqueeze(1), keys.unsqueeze(0), dim=2)
    W = sim.server["weights"]
    for k in range(4):
        kept = cos[k] >= 0
        kept[k] = True
        expected = torch.where(kept, torch.exp(5 * cos[k]), torch.zeros(4, dtype=torch.float64))
        expected[k] = math.exp(5.0)  # the client's own score is 1
        assert torch.allclose(W[k], expected / expected.sum())
    got = sim.method.download(sim.server, 1)
    mix = sum(W[1, j] * sim.states[j]["body.0.u"].double() for j in range(4))
    assert torch.allclose(got["body.0.u"].double(), mix, atol=1e-6)


@pytest.mark.slow
def test_l1_pulls_mu_towards_zero_only_in_paper_mode(tiny):
    sim = _sim(tiny, "method.name=factorized_local", "method.l1=0.01", "method.l1_mode=paper")
    (phase,) = sim.method.plan(0, sim.states[0], {})
    params = {k: torch.randn_like(p).requires_grad_() for k, p in sim.model.named_parameters()}
    phase.loss(params, None, None).backward()
    for key, p in params.items():
        # the gradient of lambda ||mu||_1 is lambda sign(mu): a step moves every mu entry towards 0
        expected = 0.01 * torch.sign(p.detach()) if key in sim.method.mu_keys else None
        assert (p.grad is None) if expected is None else torch.allclose(p.grad, expected)
    official = _sim(tiny, "method.name=factorized_local", "method.l1=0.01", "method.l1_mode=official")
    assert all(ph.loss is None for ph in official.method.plan(0, official.states[0], {}))

    def trained(*extra):
        s = _sim(tiny, "method.name=factorized_local", *extra)
        s.run_round(1)
        return s.states[0][s.method.mu_keys[0]]

    assert not torch.equal(trained("method.l1=0.01", "method.l1_mode=paper"), trained("method.l1=0"))
    assert torch.equal(trained("method.l1=0.01", "method.l1_mode=official"), trained("method.l1=0"))
    assert torch.equal(trained("method.l1=0.01"), trained("method.l1=0"))  # as run: official


def test_mu_is_pruned_when_evaluated_and_counted_per_round(tiny):
    sim = _sim(tiny, "method.name=factorized_fl_alpha", "method.mu_threshold=1e-3")
    sim.run_round(1)
    assert 0 < sim._scalars["mu_nonzero_share"] < 1
    layer = sim.model.get_submodule(sim.method.mu_keys[0][: -len(".mu")])
    assert layer.threshold == 1e-3


@pytest.mark.parametrize("name,reference", [
    ("factorized_fl_alpha", "factorized_local"),
    ("factorized_fl_beta", "factorized_local"),
    ("factorized_fedavg", "factorized_local"),
    ("factorized_fl_worst", "factorized_local"),
    ("simfed", "factorized_local"),
    ("simfed_no_factorization", "local"),
])
@pytest.mark.slow
def test_with_one_client_every_method_is_local_training(tiny, name, reference):
    # scored with the trained model (their protocol): the client keeps it whole, compared below
    base = [*tiny, "fl.clients=1", "fl.rounds=2", "eval.model=trained"]
    # nothing pruned in transit, and no head reset (factorized_local shares nothing to reset for)
    params = ["method.mu_threshold=0", "method.reset_head=false", "method.keep_optimizer=false"]
    if name.startswith("simfed") and reference != "local":
        params += ["method.layout=simfed", "method.l1=1e-4"]

    def run(method, extra):
        cfg_extra = [f"method.name={method}", *(extra if method != "local" else [])]
        sim = Simulator(load_config(None, base + cfg_extra))
        records = sim.run()
        return sim, [r.test.per_client.tolist() for r in records]

    sim, acc = run(name, params)
    ref, ref_acc = run(reference, params[:1] + params[1:] if reference != "local" else [])
    assert sim.meter.total > 0 or name.startswith("factorized_local")
    assert acc == ref_acc
    for key in ref.states[0]:
        assert torch.equal(sim.states[0][key], ref.states[0][key]), key


def _reflect(theta, z, tau, alpha):
    """SimFed's eq. 8 written out: theta_k + sum_j softmax(alpha sigma)_j (theta_j - theta_k)."""
    out = []
    for k in range(len(theta)):
        sigma = [float(np.dot(z[k], z[j]) / np.linalg.norm(z[k]) / np.linalg.norm(z[j])) for j in range(len(z))]
        sigma[k] = 1.0
        matched = [j for j in range(len(z)) if sigma[j] >= tau]
        norm = sum(math.exp(alpha * sigma[j]) for j in matched)
        out.append(theta[k] + sum(math.exp(alpha * sigma[j]) / norm * (theta[j] - theta[k]) for j in matched))
    return out


def test_simfed_reflection_on_three_clients_by_hand(tiny):
    sim = _sim(tiny, "fl.clients=3", "method.name=simfed", "method.tau=0.5", "method.epsilon=2")
    z = [np.array([1.0, 0.0]), np.array([0.6, 0.8]), np.array([0.0, 1.0])]  # cos: 0.6, 0, 0.8
    theta = [0.0, 1.0, 3.0]
    uploads = {k: {"w": torch.tensor([theta[k]]), MATCH: torch.tensor(z[k], dtype=torch.float32)} for k in range(3)}
    server = sim.method.aggregate(sim.server, uploads, {k: 1.0 for k in range(3)})
    got = [float(sim.method.download(server, k)["w"]) for k in range(3)]
    # by hand: client 1 matches itself and 2 (0.6 >= 0.5), client 3 only 2 and itself (0.8), 2 all
    e = math.exp
    by_hand = [e(1.2) / (e(2) + e(1.2)) * 1.0,
               1.0 + (e(1.2) * (0 - 1) + e(1.6) * (3 - 1)) / (e(1.2) + e(2) + e(1.6)),
               3.0 + e(1.6) * (1 - 3) / (e(1.6) + e(2))]
    assert by_hand == pytest.approx([0.31003, 1.42050, 2.19738], abs=1e-5)
    assert got == pytest.approx(by_hand, abs=1e-6)
    assert got == pytest.approx(_reflect(theta, z, 0.5, 2.0), abs=1e-6)
    assert server["weights"][0, 2] == 0 and server["weights"][2, 0] == 0  # below tau: excluded


@pytest.mark.slow
def test_simfed_sends_the_criteria_input_once_and_matches_on_embeddings(tiny):
    sim = _sim(tiny, "method.name=simfed", *PERMUTED)
    first = sim.method.download(sim.server, 0)
    assert CRITERIA in first and first[CRITERIA].shape == (1, 1, 8, 8)
    sim.run_round(1)
    assert CRITERIA not in sim.method.download(sim.server, 0)
    assert torch.equal(sim.states[0][CRITERIA], first[CRITERIA])
    sent = sim.method.upload(0, sim.states[0])
    assert sent[MATCH].shape == (512,)  # the cnn body's features of x_N
    assert not any(k.startswith("head.") for k in sim.method.shared)  # permuted labels: heads stay
    shared_head = _sim(tiny, "method.name=simfed")
    assert any(k.startswith("head.") for k in shared_head.method.shared)  # 003 reflects heads otherwise


@pytest.mark.slow
def test_random_matching_mixes_the_chosen_number_of_clients(tiny):
    sim = _sim(tiny, "fl.clients=6", "method.name=factorized_fl_random", "method.num_matched=2")
    sim.run_round(1)
    assert ((sim.server["weights"] > 0).sum(1) == 3).all()  # itself and two others
    assert torch.equal(sim.server["counts"], (sim.server["weights"] > 0).long())


def test_domains_come_from_the_clients_classes(tiny):
    groups = "partition.groups=[[0,1,2,3,4],[5,6,7,8,9]]"
    sim = _sim(tiny, "method.name=simfed", "partition.kind=class_groups", groups, "partition.clients_per_group=2")
    assert sim.ctx.domains == [0, 0, 1, 1]
    assert _sim(tiny, "method.name=simfed", *PERMUTED).ctx.domains == [0, 0, 0, 0]


@pytest.mark.slow
def test_diagnostics_land_in_the_run_folder(tiny, tmp_path):
    from fedfactor.run.job import train

    cfg = load_config(None, tiny + ["method.name=factorized_fl_beta", *PERMUTED])
    train(cfg, tmp_path)
    for name in ("similarity_u", "similarity_v", "matching_weights", "matching_counts"):
        files = sorted((tmp_path / "diagnostics" / name).glob("round_*.npy"))
        assert [f.name for f in files] == ["round_0001.npy", "round_0002.npy"]
        assert np.load(files[-1]).shape == (4, 4)
    counts = np.load(tmp_path / "diagnostics" / "matching_counts" / "round_0002.npy")
    assert (np.diag(counts) == 2).all()  # every client mixed itself in both rounds
    import pandas as pd

    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert {"mu_nonzero", "mu_nonzero_share", "matches_in_domain_share", "matched_clients_mean"} <= set(metrics)


def test_every_variant_is_registered_with_its_preset():
    assert build({"name": "factorized_fl_beta"}).hp.share == "uvm"
    assert build({"name": "factorized_fedavg_no_mu"}).hp.use_mu is False
    assert build({"name": "factorized_fl_axes"}).hp.layout == "simfed"
    assert build({"name": "simfed_worst"}).hp.num_matched == 2
    assert METHODS.get("simfed_no_factorization").factorized is False


def test_bad_hyperparameters_are_one_line_errors(tiny):
    from fedfactor.errors import UsageError

    for bad in ("method.layout=diagonal", "method.share=all", "method.rank=0", "method.matching=best",
                "method.criteria_inputs=0"):
        with pytest.raises(UsageError, match=f"^{bad.split('=')[0]} must be"):
            build(load_config(None, tiny + ["method.name=simfed", bad]).method)


# -- as run: the official code's behaviour is the default ----------------------------------------

def test_alpha_as_run_shares_every_body_entry_but_v_and_mu_and_sends_v_of_the_last_conv(tiny):
    sim = _sim(tiny, "method.name=factorized_fl_alpha", *PERMUTED)
    state = sim.states[0]
    body = [k for k in sim.ctx.param_keys if k.startswith("body.")]
    assert set(sim.method.shared) == {k for k in body if not k.endswith((".v", ".mu"))}
    assert any(k.endswith(".bias") for k in sim.method.shared)  # the cnn's conv and fc biases
    sent = sim.method.upload(0, state)
    assert set(sent) == {*sim.method.shared, MATCH}
    assert torch.equal(sent[MATCH], state["body.3.v"].reshape(-1))


@pytest.mark.slow
def test_beta_as_run_sends_M_dense_and_counts_all_of_it(tiny):
    sim = _sim(tiny, "method.name=factorized_fl_beta", *PERMUTED)
    sim.run_round(1)
    up, _ = sim.meter.history[-1]
    assert up == 4 * 4 * _numel(sim.states[0], sim.method.shared)  # 4 clients, every entry float32
    mu_keys = [k for k in sim.method.mu_keys if k in sim.method.shared]
    payload = sim.method.download(sim.server, 0)
    assert mu_keys and all(k in payload for k in mu_keys) and not any(k.endswith(BITS) for k in payload)
    # unpruned: entries below the threshold travel too (the official server mixes them)
    small = {k: sim.states[0][k].abs() < sim.method.hp.mu_threshold for k in mu_keys}
    assert any(m.any() for m in small.values())
    sent = sim.method.upload(0, sim.states[0])
    assert all(torch.equal(sent[k], sim.states[0][k]) for k in mu_keys)


@pytest.mark.parametrize("permuted,expected", [(False, 4), (True, 2)])
@pytest.mark.slow
def test_minimum_aggr_zero_is_the_official_count_all_clients_or_half_under_permuted_labels(tiny, permuted,
                                                                                           expected):
    extra = PERMUTED if permuted else []
    sim = _sim(tiny, "method.name=factorized_fl_alpha", "method.tau=1.5", *extra)  # tau above every score
    sim.run_round(1)
    assert ((sim.server["weights"] > 0).sum(1) == expected).all()


@pytest.mark.slow
def test_head_is_reset_to_the_initial_head_only_where_heads_are_shared(tiny):
    for extra, reset in (([], True), (PERMUTED, False)):
        sim = _sim(tiny, "method.name=factorized_fl_alpha", *extra)
        init = {k: sim.states[0][k].clone() for k in sim.ctx.head_keys}
        sim.run_round(1)
        got = sim.method.receive(0, sim.states[0], sim.method.download(sim.server, 0))
        same = all(torch.equal(got[k], init[k]) for k in init)
        assert same == reset


@pytest.mark.slow
def test_a_run_that_matched_nobody_says_so_with_the_best_similarity_against_tau(tiny):
    sim = _sim(tiny, "method.name=factorized_fl_alpha_text", "method.tau=1.5")  # nobody reaches 1.5
    records = sim.run()
    diagnostics = [r.diagnostics for r in records]
    best = max(d["similarity_max_other"] for d in diagnostics)
    assert all(d["matched_clients_mean"] == 1 for d in diagnostics) and -1 <= best <= 1
    (line,) = sim.method.run_warnings(diagnostics)
    assert "matched no other client in any of its 2 rounds" in line
    # the numbers within the 160 characters the terminal's line keeps (progress._shorten)
    assert f"{best:.4f}" in line[:157] and "method.tau=1.5" in line[:157]
    matched = _sim(tiny, "method.name=factorized_fl_alpha_text", "method.tau=-1")
    assert matched.method.run_warnings([r.diagnostics for r in matched.run()]) == []


@pytest.mark.slow
def test_as_run_keeps_each_clients_momentum_across_rounds_and_the_text_restarts_it(tiny):
    sim = _sim(tiny, "method.name=factorized_fl_alpha")
    sim.run_round(1)
    kept = {k: t for k, t in sim.states[0].items() if k.startswith("optim.factorized.")}
    assert set(kept) == {f"optim.factorized.{p}.momentum_buffer" for p in sim.ctx.param_keys}
    assert not any(k.startswith("optim.") for k in sim.method.upload(0, sim.states[0]))  # never sent
    (phase,) = sim.method.plan(0, sim.states[0], {})
    assert phase.keep_optimizer == "factorized"
    text = _sim(tiny, "method.name=factorized_fl_alpha_text")
    text.run_round(1)
    assert not any(k.startswith("optim.") for k in text.states[0])

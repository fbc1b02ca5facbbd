import numpy as np
import pytest
import torch

from fedfactor.analysis.factor import factor_analysis, split, unit_matrix
from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.fl.train import Phase
from fedfactor.methods import build
from fedfactor.methods.fedfac import MASK

from ..conftest import TINY, record_uploads

# cnn on digits: layers 1 body.0 (conv 32), 2 body.3 (conv 64), 3 body.7 (fc 512), 4 head
FC = "body.7"


# These tests exercise the factor-analysis split, so they start from the text's rule (units at or above
# the mean communality shared, a unit's bias and BN with it); the as-run default (tau = +inf: no unit
# of Lambda shared) has tests of its own below. A test's own settings come after and win.
TEXT = ["method.tau=mean", "method.fa_method=principal", "method.unit_params=follow", "method.factors=paper"]


def _sim(tiny, *extra):
    # A few principal-factor iterations keep these tests fast; tests/analysis/test_factor.py checks
    # the converged estimate. The variants that set their own tau (random split, masks) keep it.
    fast = []
    if any(e.startswith("method.name=fedfac") for e in extra):
        own_tau = any(e.startswith(("method.name=fedfac_random", "method.name=fedfac_mask")) for e in extra)
        fast = ["method.max_iter=3", *(TEXT[1:] if own_tau else TEXT)]
    return Simulator(load_config(None, tiny + fast + list(extra)))


def _accuracies(sim):
    return [(r.test.correct.tolist(), r.train_loss) for r in sim.run()]


@pytest.mark.slow
def test_tau_minus_inf_everywhere_is_fedavg_round_for_round(tiny):
    every = "method.layers=[1,2,3,4]"
    fedfac = _sim(tiny, "method.name=fedfac", every, "method.tau=-inf", "fl.rounds=3")
    fedavg = _sim(tiny, "method.name=fedavg", "fl.rounds=3")
    assert _accuracies(fedfac) == _accuracies(fedavg)
    for key, value in fedavg.server["global"].items():
        kept = fedfac.server["global"].get(key, fedfac.server["units"].get(key))
        assert torch.equal(kept, value)


@pytest.mark.slow
def test_tau_inf_everywhere_is_local_training_and_sends_nothing(tiny):
    fedfac = _sim(tiny, "method.name=fedfac", "method.layers=[1,2,3,4]", "method.tau=inf", "fl.rounds=3")
    local = _sim(tiny, "method.name=local", "fl.rounds=3")
    assert _accuracies(fedfac) == _accuracies(local)
    assert fedfac.meter.up == 0
    assert all(torch.equal(a[k], b[k]) for a, b in zip(fedfac.states, local.states) for k in local.ctx.param_keys)


@pytest.mark.slow
def test_server_splits_by_factor_analysis_and_averages_only_shared_units(tiny):
    sim = _sim(tiny, "method.name=fedfac", "method.layers=[3]", "method.tau=50%")
    m = sim.method
    assert m.layers == {3: FC}
    assert set(m.units[3]) == {f"{FC}.weight", f"{FC}.bias"}
    sim.ctx.round = 1
    gen = torch.Generator().manual_seed(0)
    uploads = {}
    for k in range(4):
        state = dict(sim.states[k])
        state[f"{FC}.weight"] = torch.randn(state[f"{FC}.weight"].shape, generator=gen)
        state[f"{FC}.bias"] = torch.full_like(state[f"{FC}.bias"], float(k))
        uploads[k] = m.upload(k, state)
    assert uploads[0][f"{FC}.weight"].shape == (512, 256)  # an analysed round sends the whole layer
    weights = {0: 1.0, 1: 1.0, 2: 2.0, 3: 4.0}
    server = m.aggregate(m.init_server(sim.init), uploads, weights)
    stacked = torch.stack([uploads[k][f"{FC}.weight"] for k in range(4)])
    expected = split(factor_analysis(unit_matrix(stacked), max_iter=3).communalities, "50%")
    mask = server["mask"]["3"]
    assert torch.equal(mask, expected) and mask.sum() == 256
    mean = (stacked * torch.tensor([1.0, 1, 2, 4]).view(4, 1, 1)).sum(0) / 8
    assert torch.allclose(server["units"][f"{FC}.weight"][mask], mean[mask], atol=1e-6)
    assert torch.equal(server["units"][f"{FC}.weight"][~mask], sim.init[f"{FC}.weight"][~mask])
    assert torch.allclose(server["units"][f"{FC}.bias"][mask], torch.full((256,), (0 + 1 + 4 + 12) / 8))
    # a client receives the shared rows and the split, and keeps its own personal rows
    payload = m.download(server, 2)
    assert payload[f"{FC}.weight"].shape == (256, 256) and torch.equal(payload[f"{MASK}3"], mask)
    mine = m.receive(2, uploads[2] | {k: v for k, v in sim.states[2].items() if k not in uploads[2]}, payload)
    assert torch.equal(mine[f"{FC}.weight"][~mask], uploads[2][f"{FC}.weight"][~mask])
    assert torch.allclose(mine[f"{FC}.weight"][mask], mean[mask], atol=1e-6)


def test_bias_stays_local_under_unit_params_local(tiny):
    sim = _sim(tiny, "method.name=fedfac", "method.layers=[3]", "method.unit_params=local")
    assert sim.method.units[3] == [f"{FC}.weight"]
    assert f"{FC}.bias" not in sim.method.upload(0, sim.states[0])


def test_batchnorm_follows_its_conv_and_running_statistics_stay_local(tiny):
    from fedfactor.methods import METHODS
    from fedfactor.models import build_model, resolve_layers

    model = build_model("resnet9", 3, 32, 32, 10)  # has BatchNorm after every conv
    assert resolve_layers(model, [-1]) == {8: "body.6.0"}
    ctx = _sim(tiny).ctx  # a real context with resnet9's keys swapped in
    ctx.model = model
    ctx.param_keys = [k for k, _ in model.named_parameters()]
    ctx.buffer_keys = [k for k, b in model.named_buffers() if b.is_floating_point()]
    ctx.float_keys = [*ctx.param_keys, *ctx.buffer_keys]
    ctx.head_keys = ["head.weight", "head.bias"]
    method = METHODS.get("fedfac_text")(layers=[8])
    method.bind(ctx)
    assert method.units[8] == ["body.6.0.weight", "body.6.1.weight", "body.6.1.bias"]
    assert not any("running" in k for k in method.shared)
    shared_stats = METHODS.get("fedfac_text")(layers=[8], share_bn_stats=True)
    shared_stats.bind(ctx)
    assert "body.6.1.running_mean" in shared_stats.units[8] and "body.0.1.running_var" in shared_stats.shared


@pytest.mark.slow
def test_static_fedfac_analyses_once_then_sends_only_shared_rows(tiny, tmp_path):
    static = _sim(tiny, "method.name=fedfac_static", "fl.rounds=3")
    dynamic = _sim(tiny, "method.name=fedfac", "fl.rounds=3")
    srec, drec = static.run(), dynamic.run()
    assert [("fedfac.shared_share.3" in r.diagnostics) for r in srec] == [True, False, False]
    assert all("fedfac.shared_share.3" in r.diagnostics for r in drec)
    assert "fedfac.stable_share.3" in drec[1].diagnostics and 0 <= drec[1].diagnostics["fedfac.stable_share.3"] <= 1
    shared = int(static.server["mask"]["3"].sum())
    full = static.states[0][f"{FC}.weight"].numel() + 512
    # rounds 2 and 3 of static send the shared rows (and biases) instead of the whole layer
    saving = (full - shared * (256 + 1)) * 4 * 4
    assert srec[0].bytes_up_round == drec[0].bytes_up_round
    assert srec[1].bytes_up_round == drec[0].bytes_up_round - saving
    assert torch.equal(static.server["mask"]["3"], static.states[1][f"{MASK}3"])


@pytest.mark.slow
def test_random_split_keeps_the_number_of_shared_units(tiny):
    fac = _sim(tiny, "method.name=fedfac", "fl.rounds=1")
    rnd = _sim(tiny, "method.name=fedfac_random", "fl.rounds=1")
    fac.run(), rnd.run()
    a, b = fac.server["mask"]["3"], rnd.server["mask"]["3"]
    assert a.sum() == b.sum() and not torch.equal(a, b)


@pytest.mark.parametrize("name, group", [("fedfac_mask_shared", True), ("fedfac_mask_personal", False)])
@pytest.mark.slow
def test_masking_replaces_one_group_by_standard_normal_values(tiny, name, group):
    sim = _sim(tiny, f"method.name={name}", "fl.rounds=1")
    sim.run()
    sim.ctx.round = 2
    mask = sim.server["mask"]["3"]
    assert mask.sum() == 256  # tau = 50%
    got = sim.method.receive(0, sim.states[0], sim.method.download(sim.server, 0))[f"{FC}.weight"]
    rows = mask if group else ~mask
    assert abs(float(got[rows].std()) - 1) < 0.05
    kept = sim.server["units"][f"{FC}.weight"][mask] if not group else sim.states[0][f"{FC}.weight"][~mask]
    assert torch.equal(got[~rows], kept)


@pytest.mark.slow
def test_new_clients_are_held_out_and_scored_three_ways(tiny):
    sim = _sim(tiny, "method.name=fedfac", "fl.clients=5", "eval.new_clients=0.2")
    assert len(sim.newcomers) == 1 and sim.newcomers[0] not in sim.members
    records = sim.run()
    assert all(len(r.test.count) == 4 for r in records)  # the held-out client is never scored as a member
    scores = sim.evaluate_new_clients()
    assert set(scores) == {"received", "finetune", "localtrain", "ensemble"}
    assert all(0 <= s.mean <= 1 and s.count.sum() > 0 for s in scores.values())
    # LocalTrain moves only personal units of the split layer; shared units and other layers stay fixed
    k = sim.newcomers[0]
    fresh = sim.method.init_client(k, sim.init)
    received = sim.method.receive(k, fresh, sim.method.download(sim.server, k))
    trained = sim.method._local_train_personal(k, received, sim.method._masks(sim.server))
    mask = sim.server["mask"]["3"]
    assert torch.equal(trained[f"{FC}.weight"][mask], received[f"{FC}.weight"][mask])
    assert not torch.equal(trained[f"{FC}.weight"][~mask], received[f"{FC}.weight"][~mask])
    assert torch.equal(trained["body.0.weight"], received["body.0.weight"])


@pytest.mark.slow
def test_fedavg_scores_new_clients_with_the_global_model_and_fine_tuned(tiny):
    sim = _sim(tiny, "method.name=fedavg", "fl.clients=5", "eval.new_clients=0.4")
    sim.run()
    assert set(sim.evaluate_new_clients()) == {"received", "finetune"}
    assert len(sim.newcomers) == 2 and all(k not in sim.sample(r) for r in (1, 2) for k in sim.newcomers)
    k = sim.newcomers[0]
    sim._generators = {}
    models = sim.method.new_client_models(sim.server, k, sim.method.init_client(k, sim.init), lambda: [])
    received, tuned = models["received"], models["finetune"]
    assert all(torch.equal(received[key], sim.server["global"][key]) for key in sim.server["global"])
    # FedAvg+ (001 Table 3): the global model trained, all of it, on the new client's own data for
    # the run's local epochs, from the same random stream as a member's local training
    sim._generators = {}
    expected, _ = sim.ctx.fit(k, received, [Phase(epochs=sim.ctx.epochs)])
    assert all(torch.equal(tuned[key], expected[key]) for key in expected)
    assert all(not torch.equal(tuned[key], received[key]) for key in sim.ctx.param_keys)


@pytest.mark.parametrize("setting, message", [
    ("method.tau=median", "tau must be"),
    ("method.layers=[9]", "out of range"),
    ("method.layers=[0]", "layers must be"),
    ("method.mode=sometimes", "mode must be"),
    ("method.kappa=0", "kappa"),
])
def test_bad_settings_are_one_clear_error(tiny, setting, message):
    with pytest.raises(UsageError, match=message):
        _sim(tiny, "method.name=fedfac", setting)


def test_the_classifier_cannot_be_split_when_heads_are_local(tiny):
    with pytest.raises(UsageError, match="classifier"):
        _sim(tiny, "method.name=fedfac", "method.layers=[4]", "partition.permute_labels=true")


def test_tau_accepts_numbers_and_quantiles_from_the_command_line(tiny):
    for raw, kept in (("0.5", "0.5"), (".inf", "inf"), ("90%", "90%"), ("q25", "q25")):
        assert build(load_config(None, tiny + ["method.name=fedfac", f"method.tau={raw}"]).method).hp.tau == kept
    assert build(load_config(None, tiny + ["method.name=fedfac", "method.layers=17"]).method).hp.layers == [17]


@pytest.mark.slow
def test_client_weights_and_split_history_are_kept_for_diagnostics(tiny, tmp_path):
    from fedfactor.run.job import train

    cfg = load_config(None, tiny + ["method.name=fedfac", "method.max_iter=3", *TEXT])
    summary = train(cfg, tmp_path / "run")
    weights = np.load(tmp_path / "run" / "client_weights.npz", allow_pickle=False)
    assert summary["analysed_layers"] == {"3": FC}
    assert weights[f"{FC}.weight"].shape == (4, 512, 256)
    history = sorted((tmp_path / "run" / "diagnostics" / "fedfac.shared.3").glob("round_*.npy"))
    assert len(history) == 2 and set(np.unique(np.load(history[0]))) <= {0, 1}


@pytest.mark.slow
def test_as_run_keeps_every_unit_of_lambda_personal_with_its_bias_and_runs_no_analysis(tiny):
    sim = Simulator(load_config(None, tiny + ["method.name=fedfac", "fl.rounds=2"]))
    m = sim.method
    assert (m.hp.tau, m.hp.fa_method, m.hp.unit_params, m.hp.factors) == ("inf", "eigen", "local", "official")
    assert m.layers == {3: FC} and m.fixed == float("inf")
    assert not any(k.startswith(FC + ".") for k in m.shared)  # weight and bias: nothing of Lambda sent
    uploads = record_uploads(sim)
    sim.run()
    assert uploads and all(not k.startswith(FC + ".") or k.startswith(MASK) for u in uploads.values() for k in u)
    text = Simulator(load_config(None, tiny + ["method.name=fedfac_text", "method.max_iter=3", "fl.rounds=1"]))
    assert (text.method.hp.tau, text.method.hp.fa_method, text.method.hp.unit_params) == \
        ("mean", "principal", "follow")
    assert text.method.fixed is None  # the text's split needs the analysis every round


def test_the_units_whose_communality_reaches_tau_are_averaged_and_the_others_stay_each_clients():
    """Catches: the split inverted (the personal units shared), or shared units not averaged: after a
    round, every client receives the same rows for the units at or above tau (the text's mean) and
    keeps its own trained rows for the rest."""
    sim = Simulator(load_config(None, [*TINY, "method.name=fedfac_text", "method.layers=[2]", "fl.rounds=1"]))
    (record,) = sim.run()
    nu, shared = record.arrays["fedfac.communality.2"], record.arrays["fedfac.shared.2"].astype(bool)
    assert (shared == (nu >= nu.mean())).all() and 0 < shared.sum() < len(shared)
    key = sim.method.units[2][0]  # the split layer's weight, a row per unit
    got = {k: sim.method.receive(k, sim.states[k], sim.method.download(sim.server, k))[key] for k in (0, 1)}
    assert torch.equal(got[0][shared], got[1][shared])
    for k in (0, 1):
        assert torch.equal(got[k][~shared], sim.states[k][key][~shared])
    assert not torch.equal(got[0][~shared], got[1][~shared])

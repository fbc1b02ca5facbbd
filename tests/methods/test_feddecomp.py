import pytest
import torch

from fedfactor.config import load_config
from fedfactor.errors import UsageError
from fedfactor.run.simulator import Simulator
from fedfactor.methods import build
from fedfactor.models import build_model

# The cnn on digits, decomposed: body.0 conv 1->32 (5x5), body.3 conv 32->64, body.7 fc 256->512, head fc 512->10
LAYERS = ["body.0", "body.3", "body.7", "head"]
TAU = {f"{n}.{p}" for n in LAYERS for p in ("tau_a", "tau_b")}


def _sim(tiny, *extra):
    # Two epochs, one per phase, unless a test says otherwise (later settings win).
    decomp = "method.e_lora=1" if any(e.startswith("method.name=feddecomp") for e in extra) else "fl.epochs=2"
    return Simulator(load_config(None, tiny + ["fl.epochs=2", decomp, *extra]))


def _history(sim):
    return [(r.test.correct.tolist(), r.train_loss, r.bytes_up_round, r.bytes_down_round) for r in sim.run()]


@pytest.mark.slow
def test_e_lora_zero_is_fedavg_round_for_round(tiny):
    """Section 3.4: with E_lora = 0 tau never trains, and FedDecomp is FedAvg with the same seed."""
    run = ["fl.rounds=3", "fl.epochs=2"]
    fedavg = _sim(tiny, *run, "method.name=fedavg")
    decomp = _sim(tiny, *run, "method.name=feddecomp", "method.e_lora=0", "method.weighting=samples")
    assert _history(decomp) == _history(fedavg)
    for key, value in fedavg.server["global"].items():
        assert torch.equal(decomp.server["global"][key], value)
    assert all(torch.count_nonzero(s[f"{n}.tau_b"]) == 0 for s in decomp.states for n in LAYERS)


@pytest.mark.slow
def test_e_global_zero_is_local_low_rank_training_that_sends_nothing(tiny):
    sim = _sim(tiny, "fl.rounds=2", "fl.epochs=2", "method.name=feddecomp", "method.e_lora=2")
    assert sim.method.shared == []
    records = sim.run()
    assert sim.meter.up == 0 and sim.meter.down == 0 and records[-1].bytes_up == 0
    for state in sim.states:  # sigma (weights, biases) never moved; every client's tau did
        assert all(torch.equal(state[k], sim.init[k]) for k in sim.method.sigma_group)
        assert all(torch.count_nonzero(state[f"{n}.tau_b"]) > 0 for n in LAYERS)


@pytest.mark.slow
def test_uploads_are_sigma_and_cost_what_fedavg_sends(tiny):
    sim = _sim(tiny, "fl.rounds=1", "fl.epochs=2", "method.name=feddecomp", "method.e_lora=1")
    m = sim.method
    assert set(m.tau_keys) == TAU
    assert set(m.shared) == set(sim.ctx.float_keys) - TAU
    sim.run()
    plain = build_model("cnn", 1, 8, 8, 10)
    sigma_bytes = sum(p.numel() * p.element_size() for p in plain.parameters())
    assert sim.meter.up == 4 * sigma_bytes and sim.meter.down == 4 * sigma_bytes
    assert sim.meter.up == _sim(tiny, "fl.rounds=1", "method.name=fedavg").run()[-1].bytes_up


@pytest.mark.slow
def test_the_cost_command_projects_the_same_bytes(tiny):
    cfg = load_config(None, tiny + ["fl.rounds=3", "fl.epochs=2", "method.name=feddecomp", "method.e_lora=1"])
    dry = Simulator(cfg, dry_run=True)
    dry.run()
    real = Simulator(cfg)
    real.run()
    assert (dry.meter.up, dry.meter.down) == (real.meter.up, real.meter.down)


@pytest.mark.slow
def test_tau_phase_freezes_sigma_and_batchnorm_affine_then_sigma_phase_freezes_tau(tiny):
    # resnet8 has BatchNorm: its affine parameters belong to sigma, its running statistics update
    sim = _sim(tiny, "model.name=resnet8", "fl.epochs=2", "method.name=feddecomp", "method.e_lora=1")
    m = sim.method
    start = sim.states[0]
    tau_phase, sigma_phase = m.plan(0, start, {})
    assert set(tau_phase.params) == set(m.tau_keys) and tau_phase.epochs == 1
    assert set(sigma_phase.params) == set(sim.ctx.param_keys) - set(m.tau_keys) and sigma_phase.epochs == 1
    assert "body.bn1.weight" in sigma_phase.params

    after_tau, _ = sim.ctx.fit(0, start, [tau_phase])
    for key in sigma_phase.params:
        assert torch.equal(after_tau[key], start[key]), key
    assert not torch.equal(after_tau["body.bn1.running_mean"], start["body.bn1.running_mean"])
    assert all(not torch.equal(after_tau[k], start[k]) for k in m.tau_keys if k.endswith("tau_b"))

    after_sigma, _ = sim.ctx.fit(0, after_tau, [sigma_phase])
    for key in m.tau_keys:
        assert torch.equal(after_sigma[key], after_tau[key]), key
    assert not torch.equal(after_sigma["body.conv1.weight"], after_tau["body.conv1.weight"])
    assert not torch.equal(after_sigma["body.bn1.weight"], after_tau["body.bn1.weight"])


def test_simultaneous_training_is_one_phase_of_every_parameter(tiny):
    sim = _sim(tiny, "fl.epochs=3", "method.name=feddecomp_simultaneous")
    (phase,) = sim.method.plan(0, sim.states[0], {})
    assert phase.params is None and phase.epochs == 3
    # e_lora plays no part: one local epoch is fine with the default e_lora = 2
    one = _sim(tiny, "fl.epochs=1", "method.name=feddecomp_simultaneous", "method.e_lora=2").method
    assert one.plan(0, {}, {})[0].epochs == 1 and one.shared


def test_server_averages_uniformly_unless_asked_to_weigh_by_samples(tiny):
    for weighting, expected in (("uniform", (0 + 1 + 2 + 3) / 4), ("samples", (0 * 1 + 1 * 1 + 2 * 2 + 3 * 4) / 8)):
        sim = _sim(tiny, "method.name=feddecomp", f"method.weighting={weighting}")
        m = sim.method
        uploads = {k: {key: torch.full_like(sim.init[key], float(k)) for key in m.shared} for k in range(4)}
        server = m.aggregate(m.init_server(sim.init), uploads, {0: 1.0, 1: 1.0, 2: 2.0, 3: 4.0})
        assert torch.allclose(server["global"]["body.7.weight"], torch.tensor(expected))
        assert set(server["global"]) == set(m.shared)


def test_receive_keeps_the_clients_own_tau(tiny):
    sim = _sim(tiny, "method.name=feddecomp")
    m = sim.method
    own = dict(sim.states[1])
    own["head.tau_b"] = torch.ones_like(own["head.tau_b"])
    got = m.receive(1, own, m.download(sim.server, 1))
    assert torch.equal(got["head.tau_b"], own["head.tau_b"])
    assert not set(m.download(sim.server, 1)) & TAU


@pytest.mark.slow
def test_reverse_shares_tau_and_keeps_sigma(tiny):
    sim = _sim(tiny, "fl.epochs=2", "fl.rounds=2", "method.name=feddecomp_reverse", "method.e_lora=1")
    m = sim.method
    assert set(m.shared) == TAU
    sim.run()
    tau_bytes = sum(sim.init[k].numel() * 4 for k in TAU)
    assert sim.meter.up == 2 * 4 * tau_bytes
    # sigma differs between clients (personal), tau is the server's after the download
    assert not torch.equal(sim.states[0]["body.7.weight"], sim.states[1]["body.7.weight"])
    received = [m.receive(k, sim.states[k], m.download(sim.server, k)) for k in range(2)]
    assert torch.equal(received[0]["head.tau_a"], received[1]["head.tau_a"])


def test_table_4_variants_share_everything_or_nothing(tiny):
    fedavg_lr = _sim(tiny, "method.name=feddecomp_lowrank_fedavg").method
    local_lr = _sim(tiny, "method.name=feddecomp_lowrank_local").method
    assert set(fedavg_lr.shared) == set(fedavg_lr.ctx.float_keys) and local_lr.shared == []
    assert fedavg_lr.hp.training == local_lr.hp.training == "simultaneous"


def test_a_local_head_stays_out_of_the_upload(tiny):
    sim = _sim(tiny, "method.name=feddecomp", "partition.permute_labels=true")
    assert sim.head_local
    assert not [k for k in sim.method.shared if k.startswith("head.")]


@pytest.mark.slow
def test_diagnostics_are_the_papers_distances(tiny):
    sim = _sim(tiny, "fl.epochs=2", "method.name=feddecomp", "method.e_lora=1")
    m = sim.method
    logged = {}
    m.ctx.log = lambda name, value: logged.__setitem__(name, float(value))
    server = m.init_server(sim.init)
    sim.ctx.round = 1
    trained = {k: m.local_train(k, m.receive(k, sim.states[k], m.download(server, k)), {})[0] for k in range(4)}
    uploads = {k: m.upload(k, s) for k, s in trained.items()}
    server = m.aggregate(server, uploads, {k: 1.0 for k in range(4)})

    def norm(tensors):
        return torch.sqrt(sum(t.double().square().sum() for t in tensors)).item()

    sigma = [f"{n}.weight" for n in LAYERS]
    mean = {k: torch.stack([uploads[i][k] for i in range(4)]).mean(0) for k in sigma}
    expected_distance = sum(norm([uploads[i][k] - mean[k] for k in sigma]) for i in range(4)) / 4
    assert logged["feddecomp.sigma_distance"] == pytest.approx(expected_distance, rel=1e-5)
    assert logged["feddecomp.delta_sigma"] == pytest.approx(norm([mean[k] - sim.init[k] for k in sigma]), rel=1e-5)
    layers = dict(sim.model.named_modules())
    taus = [norm([layers[n].tau(trained[i][f"{n}.tau_b"], trained[i][f"{n}.tau_a"]) for n in LAYERS]) for i in range(4)]
    assert logged["feddecomp.delta_tau"] == pytest.approx(sum(taus) / 4, rel=1e-6)
    assert logged["feddecomp.delta_tau"] > 0


@pytest.mark.slow
def test_diagnostics_reach_the_metrics_and_start_from_zero_tau(tiny):
    records = _sim(tiny, "fl.epochs=2", "fl.rounds=2", "method.name=feddecomp", "method.e_lora=1").run()
    assert {"feddecomp.sigma_distance", "feddecomp.delta_sigma", "feddecomp.delta_tau"} <= set(records[-1].metrics())
    # E_lora = 0: tau never moves (Table 6's first column)
    records = _sim(tiny, "fl.epochs=2", "fl.rounds=1", "method.name=feddecomp", "method.e_lora=0").run()
    assert records[-1].diagnostics["feddecomp.delta_tau"] == 0


@pytest.mark.slow
def test_official_style_runs_with_an_absolute_linear_rank(tiny):
    sim = _sim(tiny, "fl.epochs=2", "method.name=feddecomp", "method.style=official", "method.linear_rank=40",
               "method.e_lora=1")
    assert sim.states[0]["head.tau_a"].shape == (40, 512) and sim.states[0]["head.tau_b"].shape == (10, 40)
    assert sim.run()[-1].test.mean > 0


@pytest.mark.parametrize("sets, message", [
    (["method.e_lora=6"], "e_lora=6 exceeds the 5 local epochs"),
    (["method.training=lora"], "method.training must be one of alternating, simultaneous"),
    (["method.share=both"], "method.share must be one of sigma, tau, all, none"),
    (["method.conv_ratio=0"], r"method.conv_ratio must be in \(0, 1\]"),
    (["method.linear_ratio=1.2"], r"method.linear_ratio must be in \(0, 1\]"),
    (["method.e_lora=-1"], "method.e_lora must be >= 0"),
    (["method.style=loralib"], "method.style must be one of paper, official"),
])
def test_bad_hyperparameters_fail_with_one_clear_line(tiny, sets, message):
    with pytest.raises(UsageError, match=message):
        _sim(tiny, "fl.epochs=5", "method.name=feddecomp", *sets)


def test_every_variant_is_registered_with_its_change():
    assert build({"name": "feddecomp_simultaneous"}).hp.training == "simultaneous"
    assert build({"name": "feddecomp_reverse"}).hp.share == "tau"
    assert build({"name": "feddecomp_lowrank_fedavg"}).hp.share == "all"
    assert build({"name": "feddecomp_lowrank_local"}).hp.share == "none"


def _expected_rank(style, kind, out_features, in_features, conv_ratio, linear_ratio):
    """The rank rule, written out here rather than imported: R_c of a convolution's output channels
    as run (the official loralib), of min(I, O) in the text (eq. 4); R_l of min(I, O) for a fully
    connected layer in both (eq. 3); floor, at least 1."""
    ratio = conv_ratio if kind == "conv" else linear_ratio
    n = out_features if (kind, style) == ("conv", "official") else min(out_features, in_features)
    return max(1, int(ratio * n + 1e-9))


@pytest.mark.parametrize("style", ["official", "paper"])
def test_each_low_rank_layer_takes_its_rank_from_r_c_or_r_l_by_its_kind(style):
    # R_c and R_l far apart, so that taking one for the other changes every layer's rank
    hp = {"conv_ratio": 0.8, "linear_ratio": 0.25}
    model = build({"name": "feddecomp", "style": style, **hp}).prepare_model(build_model("cnn", 1, 8, 8, 10))
    generator = torch.Generator().manual_seed(0)
    seen = []
    for name, layer in model.named_modules():
        if not hasattr(layer, "tau_rank"):
            continue
        kind = "conv" if isinstance(layer, torch.nn.Conv2d) else "linear"
        O, I = layer.weight.shape[:2]
        rank = _expected_rank(style, kind, O, I, **hp)
        # the rank tau can reach, from random factors: B starts at zero, so tau itself starts at rank 0
        b = torch.randn(layer.tau_b.shape, generator=generator, dtype=torch.float64)
        tau = layer.tau(b, layer.tau_a.detach().double())
        if kind == "conv":  # the (r K)-rank matrix B A the kernel is made from, undone as each style makes it
            K = tau.shape[-1]
            matrix = tau.reshape(O * K, I * K) if style == "official" else tau.permute(1, 2, 0, 3).reshape(I * K, O * K)
            reached, bound = torch.linalg.matrix_rank(matrix).item(), min(rank * K, *matrix.shape)
        else:
            reached, bound = torch.linalg.matrix_rank(tau).item(), min(rank, O, I)
        assert (layer.tau_rank, reached) == (rank, bound), name
        seen.append((name, kind, rank))
    assert [(n, k) for n, k, _ in seen] == [("body.0", "conv"), ("body.3", "conv"), ("body.7", "linear"),
                                          ("head", "linear")]
    assert {"official": [25, 51, 64, 2], "paper": [1, 25, 64, 2]}[style] == [r for *_, r in seen]

"""The round loop and the evaluation protocols, on a constructed case with hand-computed accuracy.

The data: 4 classes, each image a 1x4 one-hot pattern of its class; 10 training images per class
and an official test part with 1, 2, 3 and 4 images of classes 0..3. Client k trains on class k
only and its own test split holds the test images of class k. The scored models are set by hand:
`constant(j)` predicts output j for every input, so every accuracy below is a count over that
test part.
"""

import io
import weakref

import numpy as np
import pytest
import torch

from fedfactor.config import load_config
from fedfactor.data.partition import Partition, labels_sha1
from fedfactor.errors import UsageError
from fedfactor.run.records import RoundRecord
from fedfactor.run.simulator import Simulator
from fedfactor.methods import METHODS
from fedfactor.models.layers import layer_entries

from ..conftest import record_uploads

TEST_COUNTS = [1, 2, 3, 4]  # official test images of classes 0..3


def _data(tmp_path):
    y_train = np.repeat(np.arange(4), 10)
    y_test = np.repeat(np.arange(4), TEST_COUNTS)
    onehot = lambda y: (10.0 * np.eye(4, dtype=np.float32)[y]).reshape(-1, 1, 1, 4)  # noqa: E731
    path = tmp_path / "onehot.npz"
    np.savez(path, x=onehot(y_train), y=y_train, x_test=onehot(y_test), y_test=y_test)
    return path, np.concatenate([y_train, y_test])


def _partition(tmp_path, y, label_maps, num_outputs):
    test = np.arange(40, 50)
    clients = [{"train": np.flatnonzero(y[:40] == k), "val": np.flatnonzero(y[:40] == k)[:2],
                "test": test[y[test] == k]} for k in range(4)]
    for c in clients:  # val is cut from train
        c["train"] = c["train"][2:]
    pools = {"val": np.sort(np.concatenate([c["val"] for c in clients])), "test": test}
    part = Partition(4, num_outputs, clients, np.asarray(label_maps, dtype=np.int64), pools,
                     {"kind": "hand", "labels_sha1": labels_sha1(y)})
    path = tmp_path / "part.json"
    part.save(path, y)
    return path


def _sim(tmp_path, label_maps=None, num_outputs=4, *sets):
    data, y = _data(tmp_path)
    label_maps = np.tile(np.arange(4), (4, 1)) if label_maps is None else label_maps
    part = _partition(tmp_path, y, label_maps, num_outputs)
    cfg = load_config(None, [f"data.name=npz:{data}", f"partition.file={part}", "fl.clients=4", "model.name=mlp",
                             "fl.device=cpu", "fl.batch_size=8", "fl.epochs=1", "tracking.enabled=false", *sets])
    return Simulator(cfg)


def constant(sim, j):
    """A state of the simulator's model that predicts output j for every input."""
    state = {k: v.clone() for k, v in sim.model.state_dict().items()}
    state["head.weight"] = torch.zeros_like(state["head.weight"])
    state["head.bias"] = torch.nn.functional.one_hot(torch.tensor(j), len(state["head.bias"])).float()
    return state


def _trained(sim, states):
    sim.states = states
    return sim.evaluate()["test"]


def test_client_pool_scores_each_client_on_its_own_test_split(tmp_path):
    sim = _sim(tmp_path, None, 4, "eval.test_pool=client", "eval.model=trained")
    scores = _trained(sim, [constant(sim, k) for k in range(4)])
    assert scores.count.tolist() == TEST_COUNTS  # client k's own split: the test images of class k
    assert scores.per_client.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_shared_pool_scores_every_client_on_the_pooled_test_split(tmp_path):
    sim = _sim(tmp_path, None, 4, "eval.test_pool=shared", "eval.model=trained")
    scores = _trained(sim, [constant(sim, k) for k in range(4)])
    assert scores.count.tolist() == [10, 10, 10, 10]
    assert scores.per_client.tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4])  # class k's share of the pool
    assert scores.mean == pytest.approx(0.25) and scores.weighted == pytest.approx(10 / 40)


def test_received_scores_what_the_server_sends_not_what_the_client_trained(tmp_path):
    for pool, expected in (("shared", [0.4] * 4), ("client", [0, 0, 0, 1])):
        sim = _sim(tmp_path, None, 4, f"eval.test_pool={pool}", "eval.model=received")
        assert not sim.head_local  # identity label maps: the head is shared
        sim.server["global"] = {k: constant(sim, 3)[k] for k in sim.server["global"]}
        scores = _trained(sim, [constant(sim, k) for k in range(4)])
        assert scores.per_client.tolist() == pytest.approx(expected)


def test_shared_pool_goes_through_each_clients_label_map_and_heads_follow_the_file(tmp_path):
    perms = [[0, 1, 2, 3], [1, 0, 2, 3], [3, 2, 1, 0], [1, 2, 3, 0]]  # client k: class c -> perms[k][c]
    sim = _sim(tmp_path, perms, 4, "eval.test_pool=shared", "eval.model=trained")
    # the config never says permute_labels: the partition file's label maps make heads local
    assert sim.head_local and not sim.cfg.partition.permute_labels
    scores = _trained(sim, [constant(sim, 0) for _ in range(4)])
    # output 0 is class 0, 1, 3 and 3 for the four clients: 1, 2, 4 and 4 of the 10 pooled images
    assert scores.per_client.tolist() == pytest.approx([0.1, 0.2, 0.4, 0.4])
    sent = sim.method.upload(0, sim.states[0])
    assert "head.weight" not in sent and "body.1.weight" in sent


def test_shared_pool_of_a_domain_is_its_classes_of_the_pooled_split(tmp_path):
    domains = [[0, 1, -1, -1], [0, 1, -1, -1], [-1, -1, 0, 1], [-1, -1, 0, 1]]
    sim = _sim(tmp_path, domains, 2, "eval.test_pool=shared", "eval.model=trained")
    scores = _trained(sim, [constant(sim, 0) for _ in range(4)])
    assert scores.count.tolist() == [3, 3, 7, 7]
    # output 0 is class 0 (1 of 3 images) in the first domain, class 2 (3 of 7) in the second
    assert scores.per_client.tolist() == pytest.approx([1 / 3, 1 / 3, 3 / 7, 3 / 7])
    assert sim.ctx.split(2, "val").y.tolist() == [0, 0, 1, 1]  # val follows the same protocol


@pytest.mark.parametrize("pool", ["shared", "client"])
def test_own_val_is_the_clients_own_validation_cut_under_either_pool(tmp_path, pool):
    """What a method weighs models on (FedFomo): the client's own validation images, never the pool."""
    domains = [[0, 1, -1, -1], [0, 1, -1, -1], [-1, -1, 0, 1], [-1, -1, 0, 1]]
    sim = _sim(tmp_path, domains, 2, f"eval.test_pool={pool}")
    for k in range(4):
        own = sim.ctx.split(k, "own_val")
        assert own.idx.tolist() == sim.partition.clients[k]["val"].tolist()  # its 2 images of class k
        assert own.y.tolist() == [k % 2] * 2  # through its label map
        assert sim.ctx.evaluate(k, constant(sim, k % 2), "own_val")[:2] == (2, 2)
    # the protocol's val: the domain's classes of the pooled split under shared, the own cut under client
    assert len(sim.ctx.split(2, "val")) == (4 if pool == "shared" else 2)


def test_trained_keeps_unsampled_clients_last_model(tmp_path):
    sim = _sim(tmp_path, None, 4, "eval.model=trained", "fl.fraction=0.5", "fl.lr=0.5")
    init = [dict(s) for s in sim.states]
    sim.run_round(1)
    sampled = set(sim.sample(1))
    assert len(sampled) == 2
    for k in range(4):
        scored = sim.scored_state(k)
        received = sim.method.receive(k, sim.states[k], sim.method.download(sim.server, k))
        if k in sampled:  # its own trained model, not the average it would receive
            assert torch.equal(scored["head.weight"], sim.states[k]["head.weight"])
            assert not torch.equal(scored["head.weight"], received["head.weight"])
        else:  # never trained: still the initial model
            assert all(torch.equal(scored[key], init[k][key]) for key in init[k])


@pytest.mark.slow
def test_run_records_every_round_and_evaluates_every_eval_every(tiny):
    sim = Simulator(load_config(None, [s for s in tiny if not s.startswith("fl.rounds")]
                                + ["fl.rounds=3", "fl.eval_every=2"]))
    records = sim.run()
    assert [r.round for r in records] == [1, 2, 3]
    assert [r.test is not None for r in records] == [False, True, True]  # round 3 is the last
    assert records[1].val is not None and records[1].metrics()["val_accuracy_mean"] >= 0
    assert "accuracy_mean" not in records[0].metrics() and records[0].metrics()["bytes_up"] > 0


def test_each_client_is_scored_from_one_download_for_all_splits(tiny):
    sim = Simulator(load_config(None, tiny + ["eval.model=received"]))
    calls = []
    download = sim.method.download
    sim.method.download = lambda server, k: calls.append(k) or download(server, k)
    scores = sim.evaluate(("test", "val"))
    assert sorted(calls) == [0, 1, 2, 3]  # not once per split
    assert set(scores) == {"test", "val"} and scores["val"].count.sum() > 0


@pytest.mark.parametrize("model, skipped", [("resnet8", True), ("cnn", False)])
def test_a_methods_own_training_loop_gets_trainers_rule_for_a_batch_of_one(tiny, model, skipped):
    sim = Simulator(load_config(None, [*tiny, f"model.name={model}"]))
    n = len(sim.clients[0]["train"])
    sim.trainer.batch_size = n - 1  # one epoch: a batch of n - 1 samples, then a batch of one
    sizes = lambda: [len(b.y) for b in sim.ctx.batches(0, epochs=1)]  # noqa: E731
    assert sizes() == [n - 1, 1]  # scoring (outside local_train) gets every batch
    sim._training = True
    assert sim.ctx.skip_single == skipped and sizes() == ([n - 1] if skipped else [n - 1, 1])


def _fast(method: str) -> list[str]:
    """Settings that keep a method's round to a second on the tiny run (as tests/run/test_job.py's)."""
    if method.startswith("fedfac"):  # the 64-channel conv, not the 512-unit fc: fast factor analyses;
        # the masking ablations' N(0, 1) filters diverge at the tiny run's lr
        return ["method.layers=[2]", "fl.on_divergence=skip", "fl.lr=0.01"]
    if method.startswith("feddecomp"):  # two epochs, so both of FedDecomp's phases run
        return ["fl.epochs=2", "method.e_lora=1"]
    if method == "fedrep":
        return ["method.head_epochs=2"]
    if method == "fedfomo":
        return ["partition.samples_per_client.val=5"]
    return []


@pytest.mark.parametrize("method", METHODS.names())
@pytest.mark.slow
def test_a_trained_client_keeps_only_its_own_entries_and_the_run_is_unchanged(tiny, method):
    """Every method: dropping what receive overwrites (replaced_on_receive) changes nothing a run
    computes, and a trained client holds the rest, plus the layers the diagnostics read."""
    sets = [*tiny, "fl.rounds=3", "fl.fraction=0.5", "eval.model=received", "diagnostics.max_clients=2",
            f"method.name={method}", *_fast(method)]
    trimmed, whole = Simulator(load_config(None, sets)), Simulator(load_config(None, sets))
    assert trimmed._trim
    # the plain path: every trained client keeps its whole model, and aggregate gets every upload
    whole._trim = whole._stream = False
    sent = [record_uploads(sim) for sim in (trimmed, whole)]
    records = [sim.run() for sim in (trimmed, whole)]
    assert [r.test.per_client.tolist() for r in records[0]] == [r.test.per_client.tolist() for r in records[1]]
    assert sent[0].keys() == sent[1].keys()
    for k, payload in sent[0].items():
        assert payload.keys() == sent[1][k].keys() and all(torch.equal(t, sent[1][k][key]) for key, t in payload.items())
    dropped = trimmed.method.replaced_on_receive()
    diagnosed = {key for name in trimmed.diagnostic_layers().values() for key in layer_entries(trimmed.model, name)}
    with_weights = set(trimmed.diagnosed_clients())
    for k in range(len(trimmed.states)):
        if k not in sent[0]:
            continue  # never trained: its initial state
        kept = set(trimmed.states[k])
        assert kept == set(whole.states[k]) - (dropped - (diagnosed if k in with_weights else set()))
        assert all(torch.equal(trimmed.states[k][key], whole.states[k][key]) for key in kept)


def test_what_a_trained_client_drops_is_the_shared_part_where_receive_overwrites_it(tiny):
    """The methods that send a personalised or partial model declare what it overwrites; those whose
    receive keeps the client's own model (FedAMP) drop nothing."""
    for method, extra, personal in [
        ("fedavg", [], set()), ("fedper", [], {"head.weight", "head.bias"}), ("fedamp", [], None),
        ("fedfac", ["method.layers=[2]"], None), ("fedfomo", ["partition.samples_per_client.val=5"], set()),
        ("fedfomo", ["partition.samples_per_client.val=5", "method.own_from_server=false"], None),
    ]:
        sim = Simulator(load_config(None, [*tiny, "fl.rounds=1", f"method.name={method}", *extra]))
        dropped = sim.method.replaced_on_receive()
        if personal is None:  # nothing, or (FedFac) all but the split layer and the BatchNorm statistics
            assert dropped == (set(sim.method.shared) if method == "fedfac" else set()), method
            continue
        assert dropped == set(sim.ctx.float_keys) - personal, method
    fedfac = Simulator(load_config(None, [*tiny, "method.name=fedfac", "method.layers=[2]"]))
    split = set(fedfac.method.units[2])
    assert split and not split & fedfac.method.replaced_on_receive()  # a split layer's personal rows stay


def test_the_trained_model_protocol_and_methods_with_their_own_receive_keep_whole_states(tiny):
    for extra in (["eval.model=trained"], ["method.name=fedamp"]):
        sim = Simulator(load_config(None, [*tiny, "fl.rounds=1", *extra]))
        sim.run_round(1)
        assert all(set(sim.init) <= set(s) for s in sim.states)


@pytest.mark.parametrize("method", ["fedavg", "fedper", "fedbn", "pfedpara"])
@pytest.mark.slow
def test_uploads_summed_as_they_arrive_give_the_server_that_aggregate_gives(tiny, method):
    sets = [*tiny, "fl.rounds=2", "fl.fraction=0.75", "partition.kind=dirichlet", "eval.model=trained",
            f"method.name={method}"]
    streamed, plain = Simulator(load_config(None, sets)), Simulator(load_config(None, sets))
    assert streamed._stream and not streamed._trim  # the trained-model protocol keeps whole states
    plain._stream = False
    for rnd in (1, 2):
        for sim in (streamed, plain):
            sim.run_round(rnd)
        assert streamed.server["global"].keys() == plain.server["global"].keys()
        assert all(torch.equal(streamed.server["global"][k], v) for k, v in plain.server["global"].items())
    assert streamed.meter.up == plain.meter.up


@pytest.mark.parametrize("stream_and_trim", [True, False])
def test_a_round_lets_go_of_each_upload_once_it_is_summed(tiny, stream_and_trim):
    """Streamed and trimmed, a round holds no earlier client's upload while the next trains (nor its
    state, where a store keeps states off the device); on the plain path every sampled client's model
    lives until the round ends."""
    sim = Simulator(load_config(None, [*tiny, "fl.batch_clients=false", "eval.model=received",
                                       "diagnostics.keep_weights=false"]))
    assert sim._stream and sim._trim
    sim._stream = sim._trim = stream_and_trim
    alive, sent = [], []
    upload = sim.method.upload

    def recording(k, state):
        alive.append(sum(ref() is not None for ref in sent))  # earlier clients' uploaded tensors still held
        payload = upload(k, state)
        sent.extend(weakref.ref(t) for t in payload.values())
        return payload

    sim.method.upload = recording
    sim.run_round(1)
    per_client = len(sim.server["global"])
    assert per_client and alive == ([0, 0, 0, 0] if stream_and_trim else [0, per_client, 2 * per_client, 3 * per_client])


@pytest.mark.slow
def test_a_run_records_its_extra_losses_and_checkpoints_them_weights_only(tiny):
    sim = Simulator(load_config(None, tiny + ["method.name=fedprox", "method.mu=0.5"]))
    records = sim.run()
    assert [set(r.loss_terms) for r in records] == [{"proximal"}] * 2
    assert all(r.loss_terms["proximal"] > 0 and r.metrics()["train_proximal"] == r.loss_terms["proximal"]
               for r in records)
    buf = io.BytesIO()
    torch.save(sim.state_dict(), buf)
    buf.seek(0)
    loaded = [RoundRecord.from_dict(r) for r in torch.load(buf, weights_only=True)["records"]]
    assert [r.metrics() for r in loaded] == [r.metrics() for r in records]
    with pytest.raises(ValueError, match="train_"):  # a diagnostic may not take an extra loss's column
        sim.ctx.log("train_proximal", 1.0)


@pytest.mark.parametrize("extra, copies", [
    ([], 1),  # FedAvg scored on what it receives: a trained client keeps nothing of its own
    (["eval.model=trained"], 5),  # the model, and every client's whole trained model
    (["method.name=local"], 5),  # nothing is received: every client keeps its whole model
])
def test_clients_whose_states_cannot_fit_in_memory_are_refused_before_training(monkeypatch, extra, copies):
    import fedfactor.run.simulator as simulator

    cfg = load_config(None, ["data.name=digits", "fl.clients=4", "model.name=mlp", "tracking.enabled=false", *extra])
    model_bytes = (64 * 200 + 200 + 200 * 10 + 10) * 4
    monkeypatch.setattr(simulator, "memory_bytes", lambda device: copies * model_bytes - 1)
    with pytest.raises(UsageError, match=rf"^4 clients trained x {0.1 if copies > 1 else 0:.1f} MiB of a 0.1 MiB "
                                         r"model kept per client = 0.0 GiB of client states"):
        Simulator(cfg)
    monkeypatch.setattr(simulator, "memory_bytes", lambda device: copies * model_bytes)
    Simulator(cfg)


def test_only_the_clients_a_run_can_train_count_against_its_store(monkeypatch):
    """A client holds a state of its own once trained: one round of one client in four needs the
    model and one client's state, not four. Catches: a short rehearsal of a large run (one round of
    100 VGG-16 clients) refused for the states of clients it never trains."""
    import fedfactor.run.simulator as simulator

    sets = ["data.name=digits", "fl.clients=4", "model.name=mlp", "tracking.enabled=false", "method.name=local"]
    model_bytes = (64 * 200 + 200 + 200 * 10 + 10) * 4
    monkeypatch.setattr(simulator, "memory_bytes", lambda device: 2 * model_bytes)
    Simulator(load_config(None, [*sets, "fl.rounds=1", "fl.fraction=0.25"]))
    with pytest.raises(UsageError, match=r"^2 clients trained x"):  # two rounds may train two clients
        Simulator(load_config(None, [*sets, "fl.rounds=2", "fl.fraction=0.25"]))
    with pytest.raises(UsageError, match=r"^4 clients trained x"):  # one round of every client
        Simulator(load_config(None, [*sets, "fl.rounds=1", "fl.fraction=1.0"]))


def test_token_inputs_refuse_image_augmentation():
    cfg = load_config(None, ["data.name=synthetic:shakespeare", "data.augment=crop", "tracking.enabled=false"])
    with pytest.raises(UsageError, match="data.augment 'crop' does not apply to synthetic:shakespeare's token inputs"):
        Simulator(cfg)

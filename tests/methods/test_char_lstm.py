"""Every method on char_lstm (FedFac's Shakespeare LSTM): it runs, or it refuses in one line.

The runs use the real Simulator on a tiny in-test token dataset: the simulator's dataset lookup is
replaced by `token_dataset`, whose x holds character ids as the token datasets give them (float32
[N, 1, 1, T]) and whose y is a character too, so no data file and no data-loading code is involved.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedfactor.run import simulator
from fedfactor.config import load_config
from fedfactor.data.datasets import Dataset, DatasetInfo
from fedfactor.errors import UsageError
from fedfactor.run.weights import save_client_weights
from fedfactor.methods import METHODS
from fedfactor.models.layers import effective_weight
from fedfactor.diagnostics.layer_analysis import analyse_weights

from ..conftest import record_uploads

LENGTH, VOCAB = 8, 100  # short sequences keep a round of the full-size LSTM at a fraction of a second
SAMPLES, CLIENTS, TARGETS = 200, 5, 4  # few target classes: every client gets test samples of each

# The methods that refuse a recurrent model, each with the reason its class declares (`recurrent_refused`,
# which a variant inherits): those must refuse with it, every other registered name must train.
REFUSING = {name: METHODS.get(name).recurrent_refused for name in METHODS.names() if METHODS.get(name).recurrent_refused}
# FedFac's Table 2 trains these on Shakespeare's LSTM (001): none of them may refuse it
TABLE2 = ["fedavg", "fedprox", "fedper", "lg_fedavg", "fedem", "fedrep", "fedfac", "fedfac_static", "local"]


def token_dataset(name: str = "tokens", root: str = "data", download: bool = False, device="cpu") -> Dataset:
    """SAMPLES sequences of LENGTH random character ids; the target is a character too (one of the
    first TARGETS of the 100), the last id's remainder mod TARGETS, which the LSTM can learn."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (SAMPLES, 1, 1, LENGTH), generator=gen)
    return Dataset(token_info(), ids.float().to(device), (ids[:, 0, 0, -1] % TARGETS).to(device), SAMPLES)


def token_info(name: str = "tokens", root: str = "data") -> DatasetInfo:
    return DatasetInfo("tokens", 1, 1, LENGTH, VOCAB, "none")


@pytest.fixture
def token_sim(monkeypatch, tiny):
    """token_sim(method, *overrides): a Simulator of char_lstm on the token dataset, 5 clients, one
    of them held out as a new client."""
    monkeypatch.setattr(simulator, "dataset_info", token_info)
    monkeypatch.setattr("fedfactor.run.clients.load_dataset", token_dataset)

    def make(method: str, *extra: str) -> simulator.Simulator:
        overrides = [*tiny, "data.name=tokens", "model.name=char_lstm", f"fl.clients={CLIENTS}", "fl.rounds=1",
                     "fl.lr=0.01", "fl.optimizer=adam", "eval.new_clients=0.2", f"method.name={method}", *extra]
        return simulator.Simulator(load_config(None, overrides))

    return make


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_runs_a_round_on_char_lstm_or_refuses_in_one_line(token_sim, name):
    extra = ["method.head_epochs=1"] if name == "fedrep" else []
    if name in REFUSING:
        with pytest.raises(UsageError) as e:
            token_sim(name, *extra)
        message = str(e.value)
        assert "\n" not in message and message.startswith(f"method {name} cannot run on a recurrent model")
        assert REFUSING[name] in message
        return
    sim = token_sim(name, *extra)
    assert sim.batched is None  # vmap has no rule for an LSTM: clients train one by one
    loss, skipped = sim.run_round(1)
    assert math.isfinite(loss) and not skipped
    scores = sim.evaluate(("test",))["test"]
    assert scores.count.sum() > 0 and 0 <= scores.mean <= 1 and math.isfinite(scores.mean_loss)
    for strategy in sim.evaluate_new_clients().values():
        assert strategy.count.sum() > 0


def test_the_refusals_are_one_line_reasons_and_spare_fedfacs_shakespeare_methods():
    # the declared refusals are the layer-replacing and image-reading methods, each a one-line reason;
    # the methods of FedFac's Shakespeare table are not among them
    assert REFUSING and all(reason.strip() and "\n" not in reason for reason in REFUSING.values())
    assert set(TABLE2) <= set(METHODS.names()) - set(REFUSING)


def test_batching_an_lstm_model_is_refused_when_forced(token_sim):
    with pytest.raises(UsageError, match="fl.batch_clients: true cannot batch .* recurrent layer body.lstm1") as e:
        token_sim("fedavg", "fl.batch_clients=true")
    assert "\n" not in str(e.value)


def test_fedfac_lambda_3_splits_the_512_units_of_fc1(token_sim):
    sim = token_sim("fedfac", "method.layers=[3]", "method.tau=mean")
    assert sim.method.layers == {3: "body.fc1"} and sim.method.sizes == {3: 512}
    assert sim.method.units[3] == ["body.fc1.weight"]  # unit_params local: fc1's bias stays with the client
    sim.run_round(1)
    mask = sim.server["mask"]["3"]
    assert mask.shape == (512,) and 0 < int(mask.sum()) < 512
    # the LSTMs are outside Lambda: shared whole, as in FedAvg
    assert {"body.lstm1.weight_ih_l0", "body.lstm2.bias_hh_l0", "body.embedding.weight"} <= set(sim.method.shared)


def test_fedfac_on_an_lstm_layer_moves_a_units_rows_of_all_four_gates_together(token_sim):
    sim = token_sim("fedfac", "method.layers=[2]", "method.tau=mean", "method.unit_params=follow")
    name, H = "body.lstm2", 256
    assert sim.method.sizes == {2: H}
    entries = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    assert sim.method.units[2] == [f"{name}.{k}" for k in entries]
    sent = record_uploads(sim)
    sim.run_round(1)
    mask = sim.server["mask"]["2"]
    assert mask.shape == (H,) and 0 < int(mask.sum()) < H
    # the analysis read one row per hidden unit (its weights of the four gates side by side)
    assert sim._arrays["fedfac.communality.2"].shape == (H,)
    rows = mask.repeat(4)  # row g H + j of every entry belongs to unit j
    clients = sorted(sent)
    weights = [sim.ctx.train_sizes[k] for k in clients]
    for key in sim.method.units[2]:
        mean = sum(w * sent[k][key].double() for k, w in zip(clients, weights)) / sum(weights)
        assert torch.allclose(sim.server["units"][key][rows].double(), mean[rows], atol=1e-6)
    # a client receives the shared units' rows of every gate and keeps its own personal rows
    k = clients[0]
    payload = sim.method.download(sim.server, k)
    assert payload[f"{name}.weight_ih_l0"].shape == (4 * int(mask.sum()), 256)
    received = sim.method.receive(k, sent[k], payload)
    for key in sim.method.units[2]:
        assert torch.equal(received[key][rows], sim.server["units"][key][rows])
        assert torch.equal(received[key][~rows], sent[k][key][~rows])


def test_fedfac_masking_an_lstm_layer_redraws_both_weights_of_the_masked_units(token_sim):
    sim = token_sim("fedfac_mask_personal", "method.layers=[1]")
    sim.run_round(1)
    mask = sim.server["mask"]["1"]
    k = sim.members[0]
    state = sim.method.receive(k, sim.states[k], sim.method.download(sim.server, k))
    assert 0 < int(mask.sum()) < 256  # tau = 50 %
    personal = (~mask).repeat(4)
    for key in ("body.lstm1.weight_ih_l0", "body.lstm1.weight_hh_l0"):
        # N(0, 1) draws, far wider than the LSTM's uniform(+-1/16) initialisation; the shared rows as sent
        assert state[key][personal].std() > 0.5 and state[key][~personal].abs().max() < 0.5
        assert torch.equal(state[key][~personal], sim.server["units"][key][~personal])
    # one row per unit as the diagnostics read them: a personal unit's row is drawn throughout
    weights = effective_weight(sim.model, "body.lstm1", state)
    assert weights.shape == (256, 4 * (8 + 256))
    assert weights[mask].abs().max() < 0.5 and weights[~mask].std(dim=1).min() > 0.5


def test_fedfac_static_on_char_lstm_sends_only_shared_rows_after_its_analysis(token_sim):
    sim = token_sim("fedfac_static", "method.layers=[2]", "method.tau=mean", "fl.rounds=2")
    sim.run_round(1)
    mask = sim.server["mask"]["2"]
    sent = record_uploads(sim)
    sim.run_round(2)
    k = sorted(sent)[0]
    assert sent[k]["body.lstm2.weight_hh_l0"].shape == (4 * int(mask.sum()), 256)


def test_a_token_dataset_reaches_the_model_as_ids():
    ds = token_dataset()
    assert ds.x.dtype == torch.float32 and ds.x.shape == (SAMPLES, 1, 1, LENGTH)
    assert np.array_equal(ds.x.numpy(), ds.x.numpy().round()) and ds.x.max() < VOCAB


def test_the_diagnostics_keep_and_analyse_an_lstm_layer_one_row_per_hidden_unit(token_sim, tmp_path):
    sim = token_sim("fedavg", "diagnostics.layers=[2,3]")
    sim.run_round(1)
    layers, clients = save_client_weights(sim.cfg.diagnostics.keep_weights, sim, tmp_path / "client_weights.npz")
    assert layers == {2: "body.lstm2", 3: "body.fc1"} and clients
    with np.load(tmp_path / "client_weights.npz") as archive:
        weights = archive["body.lstm2.weight"]
        assert weights.shape == (len(clients), 256, 4 * (256 + 256))
        _, nu, _ = analyse_weights(weights, 0.85, "eigen")
    assert nu.shape == (256,) and np.isfinite(nu).all()


@pytest.mark.parametrize("name", ["fedavg", "fedper", "lg_fedavg"])
def test_cost_projects_a_char_lstm_run_on_the_meta_device(monkeypatch, tiny, name):
    monkeypatch.setattr(simulator, "dataset_info", token_info)
    cfg = load_config(None, [*tiny, "data.name=tokens", "model.name=char_lstm", f"method.name={name}"])
    sim = simulator.Simulator(cfg, dry_run=True)
    sim.run_round(1)
    assert sim.meter.total > 0 and all(p.is_meta for p in sim.model.parameters())

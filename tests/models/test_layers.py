import pytest
import torch
from torch import nn

from fedfactor.errors import UsageError
from fedfactor.models import build_model, resolve_layers, unit_entries, weight_layers
from fedfactor.models.layers import effective_weight, layer_entries, layer_units, unit_rows
from fedfactor.reparam import factorize, hadamardize
from fedfactor.reparam.lowrank import decompose


def test_layers_are_numbered_from_the_input_with_the_head_last():
    cnn = build_model("cnn", 1, 8, 8, 10)
    assert weight_layers(cnn) == {1: "body.0", 2: "body.3", 3: "body.7", 4: "head"}
    assert resolve_layers(cnn, [-1]) == {3: "body.7"} and resolve_layers(cnn, [4, -2, 2]) == {2: "body.3", 4: "head"}
    assert len(weight_layers(build_model("resnet9", 3, 32, 32, 10))) == 9


@pytest.mark.parametrize("index", [0, 5, -4])
def test_an_index_outside_the_model_names_the_valid_range(index):
    with pytest.raises(UsageError, match=r"layers 1\.\.4"):
        resolve_layers(build_model("cnn", 1, 8, 8, 10), [index])


@pytest.mark.parametrize("swap", [lambda m: factorize(m, "paper", 1, True, 5e-4, "official"),
                                  lambda m: hadamardize(m, 0.5), lambda m: decompose(m, 0.5, 0.5)],
                         ids=["factorized", "hadamard", "lowrank"])
def test_a_reparameterised_layer_keeps_the_number_of_the_layer_it_replaced(swap):
    model = swap(build_model("cnn", 1, 8, 8, 10))
    assert weight_layers(model) == {1: "body.0", 2: "body.3", 3: "body.7", 4: "head"}
    assert resolve_layers(model, [-1]) == {3: "body.7"}


def test_a_model_without_layers_has_none_to_number():
    with pytest.raises(UsageError, match="no Conv2d or Linear"):
        resolve_layers(nn.Sequential(nn.Flatten()), [-1])


def test_a_factorized_layer_has_no_entries_per_unit():
    with pytest.raises(UsageError, match="computes its weight from factors"):
        unit_entries(factorize(build_model("cnn", 1, 8, 8, 10)), "body.3")


def _tiny_factorized(threshold=0.5):
    # W = (u v^T + mu)^T for a Linear(3 -> 2): u in R^3, v in R^2, mu 3 x 2
    return factorize(nn.Sequential(nn.Linear(3, 2)), "paper", 1, True, threshold, "official")


def test_a_factorized_weight_is_u_v_plus_mu_as_trained_in_the_layers_shape():
    model = _tiny_factorized().eval()
    state = {"0.u": torch.tensor([[1.0], [2.0], [3.0]]), "0.v": torch.tensor([[1.0], [-1.0]]),
             "0.mu": torch.tensor([[0.1, 0.0], [0.0, 0.0], [0.0, 1.0]]), "0.bias": torch.zeros(2)}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    w = effective_weight(model, "0", state)
    # u v^T = [[1, -1], [2, -2], [3, -3]], + mu, transposed; mu's 0.1 is below the threshold 0.5 that
    # the layer prunes at when evaluated, and kept: the weight as trained
    assert torch.equal(w, torch.tensor([[1.1, 2.0, 3.0], [-1.0, -2.0, -2.0]]))
    assert not model.training and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    model.load_state_dict(state)
    assert torch.equal(model.train()[0].weight, w)
    assert layer_entries(model, "0") == ["0.u", "0.v", "0.mu"]  # what the weight reads: no bias


@pytest.mark.parametrize("layout", ["paper", "official", "simfed"])
def test_a_factorized_conv_weight_is_the_layers_own_for_that_state(layout):
    torch.manual_seed(0)
    model = factorize(nn.Sequential(nn.Conv2d(2, 3, 3)), layout, 2, True, 0.0, "official")
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    w = effective_weight(model, "0", state)
    assert w.shape == (3, 2, 3, 3) and not torch.equal(w, model[0].weight)
    model.load_state_dict(state)
    assert torch.equal(w, model[0].weight)


def test_a_hadamard_weight_is_w1_times_w2_plus_one():
    model = hadamardize(nn.Sequential(nn.Linear(2, 2)), 0.0)  # rank 2: x_j, y_j are 2 x 2
    state = {"0.x1": torch.eye(2), "0.y1": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
             "0.x2": torch.eye(2), "0.y2": torch.tensor([[0.0, 1.0], [1.0, 0.0]]), "0.bias": torch.zeros(2)}
    # W_1 = x1 y1^T = [[1, 3], [2, 4]], W_2 = [[0, 1], [1, 0]]: W = W_1 o (W_2 + 1)
    assert torch.equal(effective_weight(model, "0", state), torch.tensor([[1.0, 6.0], [4.0, 4.0]]))
    model.load_state_dict(state)
    assert torch.equal(effective_weight(model, "0", state), model[0].weight)


def test_a_lowrank_weight_is_sigma_plus_tau():
    model = decompose(nn.Sequential(nn.Linear(2, 2)), 0.5, 0.5)  # paper style, rank 1: tau = (B A)^T
    state = {"0.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "0.bias": torch.zeros(2),
             "0.tau_a": torch.tensor([[1.0, 10.0]]), "0.tau_b": torch.tensor([[1.0], [2.0]])}
    # B A = [[1, 10], [2, 20]] (I x O), transposed to O x I: [[1, 2], [10, 20]]
    assert torch.equal(effective_weight(model, "0", state), torch.tensor([[2.0, 4.0], [13.0, 24.0]]))
    assert layer_entries(model, "0") == ["0.weight", "0.tau_a", "0.tau_b"]


def test_a_plain_weight_is_the_states_own():
    model = nn.Sequential(nn.Linear(2, 2))
    w = torch.arange(4.0).view(2, 2)
    assert torch.equal(effective_weight(model, "0", {"0.weight": w}), w) and layer_entries(model, "0") == ["0.weight"]


def test_unit_entries_are_the_layer_and_the_batchnorm_after_it():
    resnet9 = build_model("resnet9", 3, 32, 32, 10)
    assert unit_entries(resnet9, "body.0.0") == ["body.0.0.weight", "body.0.1.weight", "body.0.1.bias",
                                                 "body.0.1.running_mean", "body.0.1.running_var"]
    cnn = build_model("cnn", 1, 8, 8, 10)
    assert unit_entries(cnn, "body.3") == ["body.3.weight", "body.3.bias"]  # no BatchNorm: the next conv stops


def test_lstm_layers_are_numbered_and_own_their_four_entries_per_unit():
    model = build_model("char_lstm", 1, 1, 80, 100)
    assert weight_layers(model) == {1: "body.lstm1", 2: "body.lstm2", 3: "body.fc1", 4: "head"}
    assert resolve_layers(model, [-1]) == {3: "body.fc1"}
    assert unit_entries(model, "body.lstm2") == [f"body.lstm2.{k}" for k in
                                                 ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")]
    assert layer_entries(model, "body.lstm2") == ["body.lstm2.weight_ih_l0", "body.lstm2.weight_hh_l0"]
    assert layer_units(model, "body.lstm1") == 256 and layer_units(model, "body.fc1") == 512


def test_an_lstm_weight_has_one_row_per_hidden_unit_with_its_four_gates():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LSTM(3, 2))  # I = 3, H = 2: weight_ih 8 x 3, weight_hh 8 x 2
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    w = effective_weight(model, "0", state)
    assert w.shape == (2, 4 * (3 + 2))
    ih, hh = state["0.weight_ih_l0"], state["0.weight_hh_l0"]
    for j in range(2):  # unit j: rows j, H + j, 2H + j, 3H + j of both weights, gate by gate
        expected = torch.cat([torch.cat([ih[g * 2 + j], hh[g * 2 + j]]) for g in range(4)])
        assert torch.equal(w[j], expected)
    assert torch.equal(effective_weight(model, "0", model.state_dict()),
                       effective_weight(model, "0", {k: v.clone() for k, v in model.state_dict().items()}))


def test_a_unit_mask_covers_an_lstm_entrys_rows_gate_by_gate():
    mask = torch.tensor([True, False, True])
    assert unit_rows(mask, 3) is mask  # a plain layer's entry: the mask itself
    assert unit_rows(mask, 12).tolist() == [True, False, True] * 4


def test_an_lstm_of_several_layers_has_no_units_of_its_own():
    model = nn.Sequential(nn.LSTM(3, 2, num_layers=2))
    assert weight_layers(model) == {1: "0"}
    with pytest.raises(UsageError, match="layer 0 is an LSTM of 2 layer.*build one nn.LSTM per layer") as e:
        unit_entries(model, "0")
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="only a one-layer, one-directional LSTM"):
        effective_weight(model, "0", model.state_dict())

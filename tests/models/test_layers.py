import pytest

from fedfactor.errors import UsageError
from fedfactor.models import build_model, resolve_layers, unit_entries, weight_layers
from fedfactor.nn import factorize


def test_layers_are_numbered_from_the_input_with_the_head_last():
    cnn = build_model("cnn", 1, 8, 8, 10)
    assert weight_layers(cnn) == {1: "body.0", 2: "body.3", 3: "body.7", 4: "head"}
    assert resolve_layers(cnn, [-1]) == {3: "body.7"} and resolve_layers(cnn, [4, -2, 2]) == {2: "body.3", 4: "head"}
    assert len(weight_layers(build_model("resnet9", 3, 32, 32, 10))) == 9


@pytest.mark.parametrize("index", [0, 5, -4])
def test_an_index_outside_the_model_names_the_valid_range(index):
    with pytest.raises(UsageError, match=r"layers 1\.\.4"):
        resolve_layers(build_model("cnn", 1, 8, 8, 10), [index])


def test_a_fully_factorized_model_has_no_layers_to_number():
    model = factorize(build_model("cnn", 1, 8, 8, 10), "paper", 1, True, 5e-4, "official")
    assert weight_layers(model) == {}
    with pytest.raises(UsageError, match="no Conv2d or Linear"):
        resolve_layers(model, [-1])


def test_unit_entries_are_the_layer_and_the_batchnorm_after_it():
    resnet9 = build_model("resnet9", 3, 32, 32, 10)
    assert unit_entries(resnet9, "body.0.0") == ["body.0.0.weight", "body.0.1.weight", "body.0.1.bias",
                                                 "body.0.1.running_mean", "body.0.1.running_var"]
    cnn = build_model("cnn", 1, 8, 8, 10)
    assert unit_entries(cnn, "body.3") == ["body.3.weight", "body.3.bias"]  # no BatchNorm: the next conv stops

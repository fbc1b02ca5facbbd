import pytest

from fedfactor.config import load_config
from fedfactor.errors import UsageError


def test_file_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("fl: {rounds: 7, lr: 0.1}\nmethod: fedprox\n")
    cfg = load_config(f, ["fl.lr=0.5", "partition.groups=[[0, 1], [2]]", "method.mu=0.2"])
    assert cfg.fl.rounds == 7 and cfg.fl.lr == 0.5
    assert cfg.partition.groups == [[0, 1], [2]]
    assert cfg.method == {"name": "fedprox", "mu": 0.2}
    flat = cfg.flat()
    assert flat["fl.rounds"] == 7 and flat["method.mu"] == 0.2 and flat["data.name"] == "digits"


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["fl.roundz=3"], "fl.roundz"),
        (["fl.rounds=0"], "fl.rounds"),
        (["fl.fraction=1.5"], "fl.fraction"),
        (["fl.head=maybe"], "fl.head"),
        (["nonsense"], "dotted.key=value"),
        (["fl.epochs=true"], "fl.epochs"),
        (["fl.lr=0"], "fl.lr"),
        (["fl.momentum=1"], "fl.momentum"),
        (["data.split=[0.8, 0.1]"], "data.split"),
        (["partition.alpha=.nan"], "partition.alpha"),
        (["partition.samples_per_client.train=0"], "partition.samples_per_client.train"),
        (["eval.report=median"], "eval.report"),
        (["method.name=fedprox", "method.mu=-0.5"], "method.mu"),
        (["method.name=fedprox", "method.nu=0.5"], "nu"),
    ],
)
def test_bad_settings_are_usage_errors(overrides, words):
    with pytest.raises(UsageError) as e:
        load_config(None, overrides)
    assert words.split("=")[0] in str(e.value).lower()
    assert "\n" not in str(e.value)


def test_missing_file_is_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_values_are_coerced_to_their_declared_types():
    cfg = load_config(None, ["fl.lr=1e-3", "fl.rounds=7.0", "method.name=fedprox", "method.mu=1", "seed=3",
                             "tracking.experiment_id=12"])
    assert cfg.fl.lr == 0.001 and isinstance(cfg.fl.lr, float)
    assert cfg.fl.rounds == 7 and isinstance(cfg.fl.rounds, int)
    assert cfg.method["mu"] == 1.0 and isinstance(cfg.method["mu"], float)  # typed from its default 0.01
    assert cfg.tracking.experiment_id == "12"


def test_partial_nested_sections_keep_their_defaults():
    cfg = load_config(None, ["partition.samples_per_client.train=300"])
    assert cfg.partition.spec()["samples_per_client"] == {"train": 300, "val": 0, "test": 100}


def test_a_folder_is_not_a_config_file(tmp_path):
    with pytest.raises(UsageError, match="folder"):
        load_config(tmp_path)

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

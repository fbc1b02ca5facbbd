import re
import subprocess
import sys

import pytest

from fedfactor.config import Config, load_config, load_yaml
from fedfactor.errors import UsageError
from fedfactor.methods import build


def _checked(path=None, overrides=()):
    """A config as a run takes it: loaded, then its method built (hyperparameters typed and checked)."""
    cfg = load_config(path, list(overrides))
    cfg.method = build(cfg.method).spec
    return cfg


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
        _checked(None, overrides)
    assert words.split("=")[0] in str(e.value).lower()
    assert "\n" not in str(e.value)


def test_missing_file_is_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_values_are_coerced_to_their_declared_types():
    cfg = _checked(None, ["fl.lr=1e-3", "fl.rounds=7.0", "method.name=fedprox", "method.mu=1", "seed=3",
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


# -- strict YAML ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, where", [
    ("fl:\n  rounds: 1\n  rounds: 3\n", "key 'rounds' appears twice in one mapping (line 3"),
    ("fl: {rounds: 1}\nseed: 2\nfl: {epochs: 2}\n", "key 'fl' appears twice in one mapping (line 3"),
])
def test_a_key_given_twice_is_refused(tmp_path, text, where):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(UsageError, match=re.escape(where)):
        load_config(f)


def test_a_merged_mapping_may_be_overridden_by_its_own_keys():
    doc = load_yaml("base: &b {rounds: 1, lr: 0.1}\nrun:\n  <<: *b\n  rounds: 3\n", "study")
    assert doc["run"] == {"rounds": 3, "lr": 0.1}


@pytest.mark.parametrize("text", ["false\n", "0\n", "[]\n", "just text\n", "[fl, rounds]\n"])
def test_a_config_file_that_is_not_a_mapping_is_refused(tmp_path, text):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(UsageError, match="must hold a mapping of sections"):
        load_config(f)


def test_a_file_of_comments_only_is_the_defaults(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("# nothing set yet\n")
    assert load_config(f) == load_config(None)


def _alias_bomb(levels: int) -> str:
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["diagnostics: {layers: *a8}", "fl: {rounds: *a8}", "partition: {groups: *a8}",
                                   "method: {name: fedprox, mu: *a8}"])
def test_an_alias_bomb_is_refused_at_once(tmp_path, where):
    f = tmp_path / "c.yaml"
    f.write_text(_alias_bomb(9) + where + "\n")  # 10**9 values once expanded
    with pytest.raises(UsageError, match="expands to over 100,000 values"):
        load_config(f)


def test_a_bad_value_is_shown_cut_short():
    with pytest.raises(UsageError) as e:
        load_config(None, ["diagnostics.layers=[" + ", ".join(["[1, 2, 3, 4, 5, 6, 7, 8]"] * 50) + "]"])
    assert len(str(e.value)) < 300 and "..." in str(e.value)


# -- bounds -------------------------------------------------------------------------------------


@pytest.mark.parametrize("setting, limit", [
    ("fl.rounds=1.0e+29", "fl.rounds"), ("fl.rounds=100001", "100000"), ("fl.epochs=1001", "1000"),
    ("fl.clients=1000000000", "100000"), ("seed=99999999999999999999", "4294967295"),
    ("partition.samples_per_client.train=100000000", "10000000"),
])
def test_counts_have_upper_bounds_named_in_the_message(setting, limit):
    with pytest.raises(UsageError, match=limit):
        load_config(None, [setting])


def test_the_largest_allowed_counts_are_accepted():
    cfg = load_config(None, ["fl.rounds=100000", "fl.epochs=1000", "seed=4294967295"])
    assert (cfg.fl.rounds, cfg.fl.epochs, cfg.seed) == (100000, 1000, 2**32 - 1)


def test_a_methods_whole_number_hyperparameters_are_bounded():
    with pytest.raises(UsageError, match="method.head_epochs: input should be less than or equal to 10000"):
        _checked(None, ["method.name=fedrep", "method.head_epochs=1000000000"])
    assert _checked(None, ["method.name=fedrep", "method.head_epochs=10000"]).method["head_epochs"] == 10000


def test_the_config_keeps_the_method_as_data_and_never_imports_the_methods():
    # the one-way import: methods/ builds on config, never the reverse; build() checks the method
    cfg = load_config(None, ["method.name=fedprox", "method.mu=-1"])
    assert cfg.method == {"name": "fedprox", "mu": -1}
    with pytest.raises(UsageError, match=r"method.mu: input should be greater than or equal to 0 \(got -1\)"):
        build(cfg.method)
    code = "import sys, fedfactor.config; sys.exit('fedfactor.methods' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_build_fills_in_every_default_and_a_variant_its_preset():
    assert build({"name": "fedprox"}).spec == {"name": "fedprox", "mu": 0.01}
    spec = build({"name": "fedfac_static", "warmup": 2}).spec
    assert spec["mode"] == "static" and spec["warmup"] == 2 and spec["tau"] == "inf"
    with pytest.raises(UsageError, match="unknown method 'nope'"):
        build({"name": "nope"})


# -- settings another kind or command reads -------------------------------------------------------


@pytest.mark.parametrize("setting", ["partition.groups=[[]]", "partition.groups=[]", "partition.groups=[[-1]]",
                                     "partition.groups=nope"])
def test_class_groups_are_checked_under_every_partition_kind(setting):
    from fedfactor.data.partition_labels import task_label_maps

    with pytest.raises(UsageError, match="partition.groups"):
        cfg = load_config(None, ["partition.kind=iid", setting])
        task_label_maps(cfg.partition.spec(), 10, 4)  # the preset name is checked where presets live


@pytest.mark.parametrize("uri", ["sqlite:///", "sqlite://", "sqlite:///:memory:", "sqlite:///?mode=ro", " "])
def test_a_tracking_uri_without_a_store_is_refused(uri):
    with pytest.raises(UsageError, match="tracking.uri"):
        load_config(None, [f"tracking.uri={uri}"])


@pytest.mark.parametrize("uri, database", [
    ("sqlite:///results/mlflow.db", "results/mlflow.db"), ("sqlite:////abs/m.db?mode=rwc", "/abs/m.db"),
    ("sqlite:///", ""), ("sqlite://", ""), ("sqlite:///:memory:", ""), ("sqlite:///?mode=ro", ""),
    ("postgresql://h/db", None), ("file:///tmp/mlruns", None), ("mlruns", None)])
def test_one_reading_of_a_sqlite_uri_gives_its_file(uri, database):
    from fedfactor.config import sqlite_file

    assert sqlite_file(uri) == database


# ---------------------------------------------------------------------------------------------
# issue 39: bad input refused in one line before anything is read further


@pytest.mark.parametrize("text", ["? [a]\n: 1\n", "? {a: 1}\n: 2\n", "fl: {[rounds]: 1}\n"])
def test_a_key_that_is_a_list_or_a_mapping_is_one_line(text):
    with pytest.raises(UsageError, match=r"^cfg: a key is a list or a mapping; config keys are names \(line"):
        load_yaml(text, "cfg")


def test_a_set_whose_value_has_a_mapping_as_a_key_is_one_line():
    with pytest.raises(UsageError, match="^--set fl: a key is a list or a mapping"):
        load_config(None, ["fl={{a: 1}: 2}"])


@pytest.mark.parametrize("text", ["fl: {rounds: !!binary MQ==}\n", "!!binary aGVsbG8=\n"])
def test_binary_values_are_refused_not_coerced(tmp_path, text):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(UsageError, match="a !!binary value"):
        load_config(f)
    with pytest.raises(UsageError, match="^--set fl.rounds: a !!binary value"):
        load_config(None, ["fl.rounds=!!binary MQ=="])


@pytest.mark.parametrize("text", ["null\n", "~\n", "--- null\n"])
def test_a_null_document_is_refused_as_false_is(tmp_path, text):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(UsageError, match="must hold a mapping of sections, not null"):
        load_config(f)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_a_config_file_with_nothing_written_is_the_defaults(tmp_path, text):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    assert load_config(f) == load_config(None)


def test_a_config_of_60000_keys_is_refused_fast_for_its_size(tmp_path):
    import time

    f = tmp_path / "c.yaml"
    f.write_text("".join(f"k{i}: {i}\n" for i in range(60_000)))
    start = time.monotonic()
    with pytest.raises(UsageError, match="holds over 50,000 YAML keys and values as written") as err:
        load_config(f)
    assert "alias" not in str(err.value)
    assert time.monotonic() - start < 2  # PyYAML's pure-Python loader took seconds to build it first


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_only_a_regular_file_is_read_as_a_config(tmp_path, kind):
    import os

    path = tmp_path / "c.yaml"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()  # open() on a FIFO blocks for ever
    expected = "is not a regular file" if kind == "fifo" else "is a folder"
    with pytest.raises(UsageError, match=expected):
        load_config(path)


def test_a_hyperparameter_without_a_method_name_is_the_default_methods():
    with pytest.raises(UsageError, match="^method 'fedavg' has no parameter 'bogus'; valid: none$"):
        _checked(None, ["method.bogus=1"])
    with pytest.raises(UsageError, match="^method 'fedprox' has no parameter 'bogus'; valid: mu$"):
        _checked(None, ["method.name=fedprox", "method.bogus=1"])
    assert _checked(None, ["method.mu=0.5", "method.name=fedprox"]).method == {"name": "fedprox", "mu": 0.5}


def test_full_width_stays_out_of_what_a_run_writes_and_a_narrower_one_is_written():
    # config.yaml, the fingerprint and MLflow's params of full-width runs are those written before the
    # key existed, so those runs resume; a narrower run says so in all three
    full = load_config(None, [])
    assert "width_multiplier" not in full.to_dict()["model"] and full.model.width_multiplier == 1.0
    narrow = load_config(None, ["model.width_multiplier=0.125"])
    assert narrow.result_dict()["model"]["width_multiplier"] == 0.125
    assert load_config(None, ["model.width_multiplier=1"]).to_dict() == full.to_dict()
    with pytest.raises(UsageError, match="width_multiplier"):
        load_config(None, ["model.width_multiplier=2"])


def _numeric_keys(model, prefix=""):
    """Every int or float field of the run config, dotted, found by walking its sections."""
    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from _numeric_keys(kind, f"{prefix}{name}.")
        elif kind in (int, float):
            yield f"{prefix}{name}"


@pytest.mark.parametrize("key", sorted(_numeric_keys(Config)))
def test_every_number_of_the_run_config_refuses_true_false_nan_infinity_and_negatives(key):
    # every count, rate, share and seed of the config is at least 0
    for value in ("true", "false", ".nan", ".inf", "-1"):
        with pytest.raises(UsageError, match=re.escape(key)):
            _checked(None, [f"{key}={value}"])

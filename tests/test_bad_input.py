"""Damaged input files: every one ends as one `fedfactor: error:` line naming the file, exit 2, no output.

Hypothesis draws the damage: (a) a partition file read by `fedfactor train`, (b) the summary.json
and metrics.csv of finished runs read by `fedfactor table` and `fedfactor curves`.
"""

import contextlib
import io
import json

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from fedfactor.cli import main
from fedfactor.data import load_dataset
from fedfactor.data.partition import Partition
from fedfactor.data.partition_kinds import SPLITS
from fedfactor.errors import UsageError

from .conftest import write_content

pytestmark = pytest.mark.slow  # damaged inputs fed to training and report commands

SETTINGS = settings(max_examples=25, deadline=None)
BASE = ["data.name=digits", "fl.clients=4"]


def _sets(items):
    return [a for s in items for a in ("--set", s)]


def _run_cli(argv):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(argv)
    return code, err.getvalue(), out.getvalue()


def assert_refused(argv, bad_file, outputs):
    code, message, printed = _run_cli(argv)
    assert code == 2, (argv, message)
    assert message.startswith("fedfactor: error:") and message.count("\n") == 1, message
    assert str(bad_file) in message and "Traceback" not in message, message
    assert printed == ""
    assert not any(p.exists() for p in outputs)


_text = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6).map(lambda s: "x" + s)


# --------------------------------------------------------------------------------------------
# (a) partition files


@pytest.fixture(scope="session")
def partition(tmp_path_factory):
    """(document of a valid digits partition for 4 clients, the dataset's labels)."""
    path = tmp_path_factory.mktemp("partition") / "partition.json"
    code, message, _ = _run_cli(["partition", *_sets(BASE), "--out", str(path)])
    assert code == 0, message
    return json.loads(path.read_text()), load_dataset("digits").y.numpy()


def _pick_client(draw, doc):
    return doc["clients"][draw(st.integers(0, doc["num_clients"] - 1))]


def _bad_index(draw, doc, n):
    idx = _pick_client(draw, doc)[draw(st.sampled_from(SPLITS))]
    idx[draw(st.integers(0, len(idx) - 1))] = draw(st.sampled_from([-1, n, n + 5, 1.5, "x", True, None]))


def _bad_pool_index(draw, doc, n):
    pool = doc["pools"][draw(st.sampled_from(["val", "test"]))]
    pool[draw(st.integers(0, len(pool) - 1))] = draw(st.sampled_from([-1, n, 2**63]))


def _own_test_in_train(draw, doc, n):
    client = _pick_client(draw, doc)
    client["train"].append(draw(st.sampled_from(client["test"])))


def _pooled_sample_in_train(draw, doc, n):
    # a val or test sample of any client (the pools hold them all) trained on
    pool = doc["pools"][draw(st.sampled_from(["val", "test"]))]
    _pick_client(draw, doc)["train"].append(draw(st.sampled_from(pool)))


def _empty_train(draw, doc, n):
    _pick_client(draw, doc)["train"] = []


def _duplicate_target(draw, doc, n):
    row = draw(st.sampled_from(doc["label_maps"]))
    a, b = draw(st.lists(st.integers(0, len(row) - 1), min_size=2, max_size=2, unique=True))
    row[a] = row[b]


def _bad_target(draw, doc, n):
    row = draw(st.sampled_from(doc["label_maps"]))
    row[draw(st.integers(0, len(row) - 1))] = draw(st.sampled_from([-2, doc["num_classes"], 2**70, 0.5, "0", True]))


def _class_outside_task(draw, doc, n):
    # iid: every client trains on every class, so none may leave its task
    row = draw(st.sampled_from(doc["label_maps"]))
    row[draw(st.integers(0, len(row) - 1))] = -1


def _short_label_maps(draw, doc, n):
    rows = doc["label_maps"]
    for row in rows if draw(st.booleans()) else [draw(st.sampled_from(rows))]:
        row.pop()


PARTITION_DAMAGE = [_bad_index, _bad_pool_index, _own_test_in_train, _pooled_sample_in_train, _empty_train,
                    _duplicate_target, _bad_target, _class_outside_task, _short_label_maps]


def _damaged_partition(data, partition, folder):
    doc, y = json.loads(json.dumps(partition[0])), partition[1]
    damage = data.draw(st.sampled_from(PARTITION_DAMAGE))
    damage(data.draw, doc, len(y))
    path = folder / "damaged-partition.json"
    path.write_text(json.dumps(doc))
    return path


@SETTINGS
@given(data=st.data())
def test_damaged_partitions_fail_load_or_validate_naming_the_file(tmp_path_factory, partition, data):
    path = _damaged_partition(data, partition, tmp_path_factory.mktemp("bad"))
    with pytest.raises(UsageError) as err:
        Partition.load(path).validate(partition[1], str(path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


# Shrinking would rerun trainings that a missing check lets through; the damage drawn is small.
@settings(SETTINGS, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_train_refuses_damaged_partitions_before_any_output(tmp_path_factory, partition, data):
    folder = tmp_path_factory.mktemp("bad")
    path = _damaged_partition(data, partition, folder)
    out = folder / "out"
    sets = BASE + ["fl.rounds=1", "fl.epochs=1", "fl.device=cpu", "tracking.enabled=false",
                   f"partition.file={path}"]
    assert_refused(["train", *_sets(sets), "--out", str(out)], path, [out])


# --------------------------------------------------------------------------------------------
# (b) run folders read by `fedfactor table` and `fedfactor curves`

PROTOCOL = {"test_pool": "shared", "model": "trained", "report": "best"}
METRICS = "round,train_loss,accuracy_mean,accuracy_std\n1,2.1,0.31,0.05\n2,1.4,0.52,0.04\n"


def _summary(seed):
    return {"scenario": "s", "method": "fedavg", "seed": seed, "accuracy": 0.52, "accuracy_mean": 0.52,
            "accuracy_best_mean": 0.52, "accuracy_weighted": 0.5, "bytes_total": 12345, "rounds": 2,
            "clients": 4, "protocol": dict(PROTOCOL), "dataset": "digits"}


_protocol_key = st.sampled_from(sorted(PROTOCOL))
_non_numbers = st.one_of(_text, st.booleans(), st.none(), st.lists(st.integers(), max_size=2))
_not_accuracy = st.one_of(_text, st.booleans(), st.lists(st.integers(), max_size=2),
                          st.floats(min_value=1, exclude_min=True), st.floats(max_value=0, exclude_max=True))
WRONG = {  # a value of the wrong type or range for each field a report reads
    "scenario": st.one_of(st.integers(), st.none(), st.booleans(), st.lists(_text, max_size=1)),
    "method": st.one_of(st.integers(), st.none(), st.booleans(), st.dictionaries(_text, _text, max_size=1)),
    "seed": st.one_of(_non_numbers, st.floats(), st.integers(max_value=-1)),
    "accuracy": _not_accuracy,  # may be null or NaN: eval.report best_val without validation data
    "accuracy_mean": st.one_of(_not_accuracy, st.none(), st.just(float("nan"))),
    "accuracy_best_mean": st.one_of(_not_accuracy, st.none(), st.just(float("nan"))),
    "accuracy_weighted": st.one_of(_not_accuracy, st.none(), st.just(float("nan"))),
    "bytes_total": st.one_of(_non_numbers, st.just(float("nan")), st.integers(max_value=-1)),
    "rounds": st.one_of(_non_numbers, st.floats(), st.integers(max_value=0)),
    "clients": st.one_of(_non_numbers, st.floats(), st.integers(max_value=0)),
    "protocol": st.one_of(_non_numbers, st.integers(), _protocol_key.map(lambda k: {**PROTOCOL, k: "xyz"}),
                          _protocol_key.map(lambda k: {x: v for x, v in PROTOCOL.items() if x != k})),
}
CURVES_KEYS = ["scenario", "method", "seed"]


def _damaged_summary(draw, keys):
    """The text of a summary.json that cannot be used: not JSON, not an object, a key bad or gone."""
    text = json.dumps(_summary(1))
    how = draw(st.sampled_from(["empty", "truncated", "not an object", "key gone", "key wrong"]))
    if how == "empty":
        return draw(st.sampled_from(["", " \n"]))
    if how == "truncated":
        return text[: draw(st.integers(0, len(text) - 1))]
    if how == "not an object":
        return json.dumps(draw(st.one_of(_non_numbers, st.integers(), st.floats())))
    doc, key = _summary(1), draw(st.sampled_from(keys))
    if how == "key gone":
        del doc[key]
    else:
        doc[key] = draw(WRONG[key])
    return json.dumps(doc)


def _damaged_metrics(draw):
    """The content of a metrics.csv that cannot be plotted, or None for no file at all."""
    header_end = METRICS.index("\n")
    return draw(st.one_of(
        st.just(None),
        st.just(""),
        st.integers(0, header_end - 1).map(lambda i: METRICS[:i]),  # cut inside the header
        st.sampled_from(["round", "accuracy_mean"]).map(lambda c: METRICS.replace(c, "x" + c)),
        _text.map(lambda t: METRICS.replace("0.52", t)),  # a non-numeric accuracy
        st.just(METRICS + "3,1.0,0.6,0.1,7,8\n"),  # a garbled row with extra fields
        st.just("round,train_loss\n1,2.1\n"),  # no round was evaluated
        st.binary(max_size=40).filter(lambda b: b"round" not in b),
    ))


def _write_run(folder, seed):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(_summary(seed)))
    (folder / "metrics.csv").write_text(METRICS)


@SETTINGS
@given(data=st.data(), command=st.sampled_from(["table", "curves"]))
def test_reports_refuse_damaged_run_files_before_any_output(tmp_path_factory, data, command):
    root = tmp_path_factory.mktemp("runs")
    _write_run(root / "s/fedavg/0", 0)
    _write_run(root / "s/fedavg/1", 1)
    damaged = root / "s/fedavg/1"
    if command == "curves" and data.draw(st.booleans()):
        bad, content = damaged / "metrics.csv", _damaged_metrics(data.draw)
    else:
        bad = damaged / "summary.json"
        content = _damaged_summary(data.draw, CURVES_KEYS if command == "curves" else sorted(WRONG))
    write_content(bad, content)
    report = root / "report"
    if command == "table":
        outputs = [report / "t.md", report / "t.csv"]
        argv = ["table", str(root), "--out-md", str(outputs[0]), "--out-csv", str(outputs[1])]
    else:
        outputs = [report / "curves.png"]
        argv = ["curves", str(root), "--out", str(outputs[0])]
    assert_refused(argv, bad, [report, *outputs])


def test_the_undamaged_run_folders_make_reports(tmp_path):
    # the property above is only meaningful if the same folders, undamaged, work
    _write_run(tmp_path / "s/fedavg/0", 0)
    _write_run(tmp_path / "s/fedavg/1", 1)
    md, csv, png = tmp_path / "t.md", tmp_path / "t.csv", tmp_path / "c.png"
    assert _run_cli(["table", str(tmp_path / "s"), "--out-md", str(md), "--out-csv", str(csv)])[0] == 0
    assert _run_cli(["curves", str(tmp_path / "s"), "--out", str(png)])[0] == 0
    assert md.exists() and csv.exists() and png.exists()

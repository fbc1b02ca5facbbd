import json

import pandas as pd
import pytest
from PIL import Image

from fedfactor.errors import UsageError
from fedfactor.report.figures import SMOKE_TITLE, accuracy_curves, load_curves

from ..conftest import write_content


def _run(path, scenario, method, seed, accs, dataset=None):
    path.mkdir(parents=True)
    summary = {"scenario": scenario, "method": method, "seed": seed, **({"dataset": dataset} if dataset else {})}
    (path / "summary.json").write_text(json.dumps(summary))
    pd.DataFrame({"round": range(1, len(accs) + 1), "accuracy_mean": accs}).to_csv(path / "metrics.csv", index=False)


def test_curves_tag_runs_and_draw_one_panel_per_scenario(tmp_path):
    _run(tmp_path / "b/fedavg/0", "b", "fedavg", 0, [0.1, 0.2])
    _run(tmp_path / "b/fedavg/1", "b", "fedavg", 1, [0.3, 0.4])
    _run(tmp_path / "a/local/0", "a", "local", 0, [0.5, 0.6, 0.7])
    curves = load_curves([tmp_path / "b", tmp_path / "a"])
    assert len(curves) == 7
    assert set(curves[curves.scenario == "b"].seed) == {0, 1}
    assert curves[(curves.method == "local")].accuracy_mean.tolist() == [0.5, 0.6, 0.7]
    out = tmp_path / "fig" / "curves.png"
    assert accuracy_curves(curves, out, title="t") == ["b", "a"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"  # its twin for papers
    assert Image.open(out).text["Title"] == "t"


@pytest.mark.slow
def test_curves_of_runs_on_synthetic_data_say_so(tmp_path):
    _run(tmp_path / "a/fedavg/0", "a", "fedavg", 0, [0.1, 0.2], dataset="digits")
    _run(tmp_path / "a/fedavg/1", "a", "fedavg", 1, [0.3, 0.4], dataset="synthetic:blobs")
    out = tmp_path / "curves.png"
    accuracy_curves(load_curves([tmp_path]), out, title="t")
    assert Image.open(out).text["Title"] == f"{SMOKE_TITLE}: t"
    assert not out.with_suffix(".pdf").exists()  # a smoke run's figure is for no paper: PNG only
    accuracy_curves(load_curves([tmp_path / "a/fedavg/0"]), out)
    assert "Title" not in Image.open(out).text and out.with_suffix(".pdf").exists()
    accuracy_curves(load_curves([tmp_path / "a/fedavg/0"]), out, smoke=True)
    assert Image.open(out).text["Title"] == SMOKE_TITLE
    assert not out.with_suffix(".pdf").exists()  # the earlier PDF would disagree with the PNG: removed


def test_a_figure_file_must_be_png_or_pdf(tmp_path):
    _run(tmp_path / "a/fedavg/0", "a", "fedavg", 0, [0.1])
    with pytest.raises(UsageError, match="must end in .png"):
        accuracy_curves(load_curves([tmp_path]), tmp_path / "curves.svg")
    assert not list(tmp_path.glob("curves.*"))


def test_no_runs_is_usage_error(tmp_path):
    with pytest.raises(UsageError):
        load_curves([tmp_path])


BAD_SUMMARIES = [  # (text of summary.json, what the message says)
    ("", "cannot read run summary"),
    ('{"scenario": "a", "method": "fedavg", "se', "cannot read run summary"),
    ('["a", "fedavg", 0]', "holds an array, not a JSON object"),
    ("7", "holds a number, not a JSON object"),
    ('{"scenario": "a", "method": "fedavg"}', "lacks 'seed'"),
    ('{"scenario": "a", "method": "fedavg", "seed": "1"}', "seed: input should be a valid integer"),
    ('{"scenario": "a", "method": ["fedavg"], "seed": 1}', "method: input should be a valid string"),
    ('{"scenario": "a", "method": "fedavg", "seed": NaN}', "seed: input should be a valid integer"),
]


BAD_METRICS = [  # (content of metrics.csv or None for no file, what the message says)
    (None, "metrics.csv does not exist, though its run has a summary.json"),
    ("", r"cannot read .*metrics.csv \(No columns to parse from file\)"),
    ("round,accuracy_mean\n1,0.1\n2,0.2,0.5,7\n", r"cannot read .*metrics.csv \(Error tokenizing data"),
    (b"\xff\xfe\x00garbage\x00\n\x81", "cannot read .*metrics.csv"),
    ("round,accuracy_mean\n", "has no evaluated round"),
    ("round,train_loss\n1,0.5\n", "has no column 'accuracy_mean'"),
    ("accuracy_mean\n0.5\n", "has no column 'round'"),
    ("round,accuracy_mean\n1,0.1\n2,high\n", "accuracy_mean holds something other than numbers"),
    ("round,accuracy_mean\n1,0.1\nx,0.2\n", "the round column holds something other than whole numbers"),
    ("round,accuracy_mean\n1,0.1\n2,inf\n", "accuracy_mean holds values outside 0..1"),
    ("round,accuracy_mean\n1,0.1\n2,37.5\n", "accuracy_mean holds values outside 0..1"),
    ("round,accuracy_mean\n0,0.1\n-1,0.2\n", "the round column holds something other than whole numbers >= 1"),
    ("round,accuracy_mean\n1,0.1\n1,0.9\n", "holds round 1 twice"),  # would be averaged into one point
    ("round,accuracy_mean\n1,True\n2,False\n", "accuracy_mean holds something other than numbers"),
]


@pytest.mark.parametrize("name, content, pattern", [("summary.json", *c) for c in BAD_SUMMARIES]
                         + [("metrics.csv", *c) for c in BAD_METRICS])
def test_damaged_run_files_are_one_line_usage_errors(tmp_path, name, content, pattern):
    _run(tmp_path / "a/fedavg/0", "a", "fedavg", 0, [0.1, 0.2])
    _run(tmp_path / "a/fedavg/1", "a", "fedavg", 1, [0.3, 0.4])
    bad = tmp_path / "a/fedavg/1" / name
    write_content(bad, content)
    with pytest.raises(UsageError, match=pattern) as err:
        load_curves([tmp_path])
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_rounds_without_accuracy_are_left_out(tmp_path):
    _run(tmp_path / "a/fedavg/0", "a", "fedavg", 0, [None, 0.2, None, 0.4])  # fl.eval_every = 2
    assert load_curves([tmp_path])["round"].tolist() == [2, 4]


def test_a_path_that_does_not_exist_is_named(tmp_path):
    _run(tmp_path / "a/fedavg/0", "a", "fedavg", 0, [0.1])
    with pytest.raises(UsageError, match=f"^{tmp_path / 'b'} does not exist"):
        load_curves([tmp_path / "a", tmp_path / "b"])

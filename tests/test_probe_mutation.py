"""probes/mutation.py: mutmut's per-mutant results summed per module, as docs/testing.md shows them."""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # probes/ sits beside src/ and is not installed
    sys.path.insert(0, str(REPO))

from probes import mutation  # noqa: E402


def _meta(root, module, codes):
    path = root / "mutants" / "src" / "fedfactor" / f"{module}.meta"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": {f"m{i}": c for i, c in enumerate(codes)}}))


def test_scores_count_timeouts_as_killed_and_keep_unreached_mutants_apart(tmp_path, capsys):
    _meta(tmp_path, "fl/state.py", [1, 1, 1, 0, 33, 24])  # 3 killed, 1 timeout, 1 survived, 1 unreached
    _meta(tmp_path, "job.py", [1, None, None, None])  # one of four run
    _meta(tmp_path, "simulator.py", [None, None])  # none run
    rows = {r["module"]: r for r in mutation.scores(tmp_path)}
    assert (rows["fl/state.py"]["killed"], rows["fl/state.py"]["survived"], rows["fl/state.py"]["no tests"]) == (4, 1, 1)
    assert rows["fl/state.py"]["score"] == 100 * 4 / 6
    assert rows["job.py"]["run"] == 1 and rows["simulator.py"]["score"] is None
    assert mutation.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| `fl/state.py` | 6 | 4 | 1 | 1 | 66.7 % |" in out and "| `job.py` | 4 | 1 | 0 | 0 | 100.0 % (1 of 4 run) |" in out
    assert "| `simulator.py` | 2 | 0 | 0 | 0 | not run |" in out
    assert "7 of 12 mutants run: 5 killed, 1 survived, 1 reached by no fast test" in out
    assert mutation.main([str(tmp_path), "--complete"]) == 0
    assert "job.py" not in capsys.readouterr().out.split("\n\n")[0]


def test_no_results_is_one_line_and_exit_2(tmp_path, capsys):
    assert mutation.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1

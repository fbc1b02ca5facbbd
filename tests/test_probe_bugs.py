"""The probe of plausible bugs (probes/bugs.py) stays runnable: each bug still applies to today's code.

Running the probe takes the fast tier once per bug (about 20 minutes on 2 cores; docs/testing.md);
this only checks that every change it makes still finds its one place, so that a refactoring that
moves the code says which bug to update instead of leaving the probe broken until its next run.
"""

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # probes/ sits beside src/ and is not installed
    sys.path.insert(0, str(REPO))

from probes import bugs as probe  # noqa: E402


@pytest.mark.parametrize("bug", probe.BUGS, ids=[b.name for b in probe.BUGS])
def test_each_plausible_bug_still_changes_one_place_of_the_code(bug, tmp_path):
    target = tmp_path / "fedfactor" / bug.path
    target.parent.mkdir(parents=True)
    shutil.copy(REPO / "src" / "fedfactor" / bug.path, target)
    before = target.read_text()
    probe.apply(bug, tmp_path)
    after = target.read_text()
    assert after != before and after.count(bug.new) >= 1


def test_a_bug_whose_code_moved_is_refused_with_its_name(tmp_path):
    target = tmp_path / "fedfactor" / "x.py"
    target.parent.mkdir(parents=True)
    target.write_text("a = 1\na = 1\n")
    with pytest.raises(SystemExit, match="'twice'.*occurs 2 times in x.py"):
        probe.apply(probe.Bug("twice", "x.py", "a = 1", "a = 2"), tmp_path)

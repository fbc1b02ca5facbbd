"""The CPU-scale studies (config/studies/cpu/, docs/cpu_scale.md) on equal terms: each tunes every method's
learning rate on validation under one budget, on a tuning seed no final run uses, or, a study of one
method's settings only, runs every setting at the learning rate its paper's main study chose for that
method (committed), so no study's points differ in anything but what they compare."""

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CPU_STUDIES = sorted((REPO / "config" / "studies" / "cpu").glob("*.yaml"))
# study -> (the main study whose chosen learning rate it runs at, that study's scenario, its method)
AT_MAIN_CHOICE = {"feddecomp_ranks": ("feddecomp", "a0.1", "feddecomp")}


def _read(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", CPU_STUDIES, ids=lambda p: p.stem)
def test_every_cpu_study_is_tuned_on_validation_or_runs_at_its_main_studys_choice(path):
    study = _read(path)
    if path.stem not in AT_MAIN_CHOICE:
        tuning = study["tuning"]
        assert tuning["points"] == 4 and set(tuning["common"]) == {"fl.lr"} and not tuning.get("methods")
        assert tuning["file"] == f"config/tuned/{study['study']}.yaml"
        assert not set(tuning["seeds"]) & set(study["seeds"])  # validation on a seed of its own
        return
    main, scenario, method = AT_MAIN_CHOICE[path.stem]
    assert "tuning" not in study
    assert {entry["name"] for entry in study["methods"].values()} == {method}  # settings of one method only
    assert list(study["scenarios"]) == [scenario]
    chosen = _read(REPO / "config" / "tuned" / f"cpu_{main}.yaml")["chosen"][scenario][method]["values"]
    assert study["overrides"]["fl"]["lr"] == chosen["fl.lr"]

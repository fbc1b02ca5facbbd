import contextlib
import io
import os
from pathlib import Path

import pytest
import yaml
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n N runs N workers, one a core: torch's default of a thread a core would
    # oversubscribe them N times over, and the jobs the tests start inherit the setting.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# A tiny but real run: digits, 4 clients, 2 rounds, one epoch; seconds on a CPU.
TINY = [
    "data.name=digits", "model.name=cnn", "fl.clients=4", "fl.rounds=2", "fl.epochs=1",
    "fl.batch_size=32", "fl.lr=0.05", "fl.device=cpu", "tracking.enabled=false",
]

# Run config -> what keeps one of its smoke jobs to seconds on a CPU (config/scale/smoke.yaml's
# `smoke_scale`, which the workflow applies in a smoke study), for the study smoke runs
# (tests/test_study_smoke.py) and every baseline under its study's protocol
# (tests/methods/test_in_studies.py).
SMOKE_SCALE = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "scale" / "smoke.yaml").read_text(
    encoding="utf-8"))["smoke_scale"]


@pytest.fixture(scope="session")
def fedfactor_env(tmp_path_factory):
    """os.environ in which `fedfactor` and `snakemake` are served by a fork server that imported torch,
    MLflow, Snakemake and the package once (tests/forkserver.py): for tests that run many short
    workflow jobs, whose processes would otherwise spend most of their time starting up. The commands
    and Snakemake's rules stay real."""
    from .forkserver import env, start

    folder = tmp_path_factory.mktemp("fedfactor-command")
    server = start(folder)
    yield env(folder)
    server.kill()
    server.wait()


@pytest.fixture
def tiny():
    return list(TINY)


def write_content(path, content):
    """Damage a run file: None removes it, bytes and text replace it."""
    if content is None:
        path.unlink()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def record_uploads(sim):
    """{client: its latest upload}, filled as `sim` runs rounds.

    Under `eval.model: received` a trained client keeps only its own entries in `sim.states` (the
    shared ones arrive again from the server), so a test that needs what a client trained and sent
    reads it here.
    """
    sent = {}
    upload = sim.method.upload

    def recording(k, state):
        sent[k] = payload = upload(k, state)
        return payload

    sim.method.upload = recording
    return sent


def snakemake_in_process(*argv: str) -> str:
    """Snakemake's command line on the repository's Snakefile in this process (a subprocess would import
    torch again); asserts it succeeded and returns what it printed."""
    from snakemake.cli import args_to_api, parse_args

    out, cwd = io.StringIO(), os.getcwd()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            parser, args = parse_args(["--snakefile", str(Path(__file__).resolve().parents[1] / "Snakefile"), *argv])
            ok = args_to_api(args, parser)
    finally:
        os.chdir(cwd)
    assert ok, out.getvalue()[-3000:]
    return out.getvalue()


@pytest.fixture
def drawn(monkeypatch):
    """(title, has a watermark) of every figure rendered to PNG, in the order they were saved."""
    from matplotlib.figure import Figure

    from fedfactor.report.figures import is_watermarked

    seen = []
    savefig = Figure.savefig

    def spy(self, fname, *args, **kwargs):
        if kwargs.get("format") == "png":
            seen.append((self.get_suptitle(), is_watermarked(self)))
        return savefig(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen

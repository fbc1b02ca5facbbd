"""The `fedfactor` and `snakemake` commands with their start-up paid once: a fork server for the
workflow tests.

A study's smoke run is a chain of short jobs, and each job's process spends seconds importing torch,
MLflow, pandas and matplotlib before it does a second of work; Snakemake itself spends seconds on its
own imports and the Snakefile's. `start(folder)` starts a server that imports them once, and writes
`folder/fedfactor` and `folder/snakemake`: clients that a test runs, and that Snakemake's rules find
first on `PATH` (`env(folder)`). A client hands the server its argv, working directory, environment
and standard streams (SCM_RIGHTS); the server forks, and the child runs `fedfactor.cli.main` (or
Snakemake's) exactly as the installed command does, writing to the job's own log files. The client
exits with the child's status and passes SIGINT and SIGTERM on to it. Everything the workflow does,
and every rule's command, stays real: only the interpreter's start-up is shared.

What this cannot see: a module that forgets an import another module made for it. The server has
imported everything, so such a command works here and fails alone. The tests that start real
processes (tests/test_cli.py, test_job.py's killed jobs, test_workflow_terminal.py, test_slurm.py,
the README's commands) start every command without the server.

The server is single-threaded and opens nothing (no store, no device) before it forks, so each child
starts from the state a fresh process has after its imports.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
from pathlib import Path

# The commands served: `fedfactor`, and `snakemake` itself (its start-up and the Snakefile's imports of
# the package, torch among them, are seconds a study).
COMMANDS = ("fedfactor", "snakemake")
# What the commands import; a module left out is imported by the child that needs it.
PRELOAD = ["snakemake.cli", "snakemake.api", "torch", "torchvision", "numpy", "pandas", "scipy.stats", "sklearn",
           "matplotlib", "mlflow", "fedfactor.cli", "fedfactor.run.job", "fedfactor.run.simulator", "fedfactor.tracking",
           "fedfactor.methods", "fedfactor.models", "fedfactor.data.datasets", "fedfactor.data.partition",
           "fedfactor.report.table", "fedfactor.report.figures", "fedfactor.diagnostics.diagnose",
           "fedfactor.report.claims", "fedfactor.report.paper", "fedfactor.study.figures", "fedfactor.study.plan",
           "fedfactor.study.workflow", "fedfactor.study.tuning", "fedfactor.report.spec", "fedfactor.report.study",
           "fedfactor.study.progress",
           # imported on first use: MLflow's SQL store and its migrations (every tracked job), the PDF
           # backend and its font subsetting (every figure); 2.4 s a job that needs them
           "mlflow.store.tracking.sqlalchemy_store", "alembic", "matplotlib.pyplot", "matplotlib.backends.backend_pdf",
           "fontTools.subset"]

CLIENT = '''\
#!{python} -IS
# The `{command}` command, run by the fork server at {sock} (tests/forkserver.py).
import json, os, signal, socket, sys
conn = socket.socket(socket.AF_UNIX)
conn.connect({sock!r})
msg = json.dumps({{"command": {command!r}, "argv": sys.argv[1:], "cwd": os.getcwd(),
                  "env": dict(os.environ)}}).encode()
socket.send_fds(conn, [len(msg).to_bytes(8, "big") + msg], [0, 1, 2])
f = conn.makefile("r")
pid = int(f.readline())
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda s, _: os.kill(pid, s))
line = f.readline()
sys.exit(int(line) if line else 70)
'''


def _serve(sock_path: str) -> None:
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(sock_path)
    listener.listen(64)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}  # child pid -> its client's connection
    while True:
        ready, _, _ = select.select([listener], [], [], 0.02)
        if ready:
            conn, _ = listener.accept()
            head, fds, _, _ = socket.recv_fds(conn, 8 + 2**20, 3)
            size = int.from_bytes(head[:8], "big")
            body = head[8:]
            while len(body) < size:
                body += conn.recv(size - len(body))
            request = json.loads(body)
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                _child(request, fds)
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            code = os.waitstatus_to_exitcode(status)  # -N: killed by signal N, which a shell reports as 128 + N
            try:
                conn.sendall(f"{128 - code if code < 0 else code}\n".encode())
            except OSError:
                pass  # the client was killed
            conn.close()


def _child(request: dict, fds: list[int]) -> None:
    import atexit
    import logging

    code = 70
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["command"], *request["argv"]]
        if request["command"] == "snakemake":
            from snakemake.cli import main
        else:
            from fedfactor.cli import main

        try:
            code = int(main() or 0)  # fedfactor's main returns its status; Snakemake's raises SystemExit
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        atexit._run_exitfuncs()
        logging.shutdown()
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def start(folder: Path) -> subprocess.Popen:
    """Start the server (its socket and the clients in `folder`); returns once it is ready."""
    folder.mkdir(parents=True, exist_ok=True)
    sock = str(folder / "fedfactor.sock")
    Path(sock).unlink(missing_ok=True)
    for command in COMMANDS:
        client = folder / command
        client.write_text(CLIENT.format(python=sys.executable, sock=sock, command=command))
        client.chmod(0o755)
    server = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                               f"import forkserver; forkserver._serve({sock!r})"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert server.stdout is not None
    if server.stdout.readline().strip() != "ready":  # "" once a server that failed to start has exited
        server.kill()
        raise RuntimeError("the fedfactor fork server did not start")
    return server


def env(folder: Path) -> dict[str, str]:
    """os.environ with the client first on PATH."""
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


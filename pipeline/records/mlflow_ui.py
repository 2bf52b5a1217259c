"""MLflow's UI server on Archipelago's store: started, waited for, and stopped with every process it started.

`mlflow server` runs in a session of its own (its web workers and job runner are its children), so
`stop` ends the whole group: nothing is left holding the port, whether the command ends by Ctrl-C,
SIGTERM or SIGHUP. Its stderr goes to a log file, not a pipe nobody reads (a full pipe would stall it).

MLflow's server imports `starlette.middleware.wsgi`, which Starlette has deprecated; every worker
prints that notice at start. It concerns MLflow's own code, not the user's, so the server runs
with a warnings filter for exactly that message (PYTHONWARNINGS); every other warning shows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from pipeline.errors import ConfigError
from pipeline.records.tracking import runs_view_url

QUIET = "ignore:starlette.middleware.wsgi is deprecated"  # MLflow's import, not ours (module docstring)
STOP_WAIT_S = 10.0  # SIGTERM, then this long, then SIGKILL


@dataclass(frozen=True)
class Server:
    proc: subprocess.Popen[bytes]
    log: Path  # its stderr

    def wait(self) -> int:
        return self.proc.wait()


def start(uri: str, port: int, timeout_s: float = 90.0) -> Server:
    """An MLflow server on `uri` at 127.0.0.1:`port`, answering; ConfigError when it does not come up."""
    if urlparse(uri).scheme == "sqlite" and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(f"no MLflow store at {uri}: run a search first (python -m pipeline.search), or give --uri")
    env = {**os.environ, "PYTHONWARNINGS": ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), QUIET])),
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # fmt: skip
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]  # fmt: skip
    with tempfile.NamedTemporaryFile(prefix="archipelago-mlflow-ui-", suffix=".log", delete=False) as log:
        server = Server(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True),
                        Path(log.name))  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            lines = server.log.read_text(errors="replace").strip().splitlines()
            code = server.proc.returncode
            stop(server)
            raise ConfigError(f"the MLflow server stopped at start: {lines[-1] if lines else f'exit {code}'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(0.5)
    stop(server)
    raise ConfigError(f"the MLflow server did not answer on port {port} within {timeout_s:.0f} s: is the port taken?")


def stop(server: Server) -> None:
    """End the server and every process of its session: SIGTERM, then SIGKILL after `STOP_WAIT_S`."""
    proc = server.proc
    for sig, wait in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _group_alive(proc.pid):
            proc.poll()
            time.sleep(0.1)
        if not _group_alive(proc.pid):
            break
    proc.poll()
    server.log.unlink(missing_ok=True)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def experiment_urls(uri: str, port: int) -> dict[str, str]:
    """The UI address of each Archipelago experiment in the store (it opens on the runs)."""
    from mlflow.tracking import MlflowClient

    out = {}
    for exp in MlflowClient(uri).search_experiments():
        if exp.name.startswith("archipelago"):
            out[exp.name] = runs_view_url(f"http://127.0.0.1:{port}", exp.experiment_id)
    return out

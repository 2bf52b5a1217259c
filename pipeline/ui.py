"""The MLflow UI on Archipelago's store: `python -m pipeline.ui [--port 5000] [--uri URI]`.

Starts `mlflow server` on the local SQLite store (or `--uri`) bound to 127.0.0.1, with one worker,
waits until it answers and prints the address of each Archipelago experiment: `archipelago`
(searches), `archipelago-simulate` (simulations) and `archipelago-experiments`. Ctrl-C stops it.

MLflow's server imports `starlette.middleware.wsgi`, which Starlette has deprecated; every worker
prints that notice at start. It concerns MLflow's own code, not the user's, so the server runs
with a warnings filter for exactly that message (PYTHONWARNINGS); every other warning shows.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from pipeline.errors import ConfigError
from pipeline.tracking import default_uri, runs_view_url

QUIET = "ignore:starlette.middleware.wsgi is deprecated"  # MLflow's import, not ours (module docstring)


def start(uri: str, port: int, timeout_s: float = 90.0) -> subprocess.Popen[bytes]:
    """An MLflow server on `uri` at 127.0.0.1:`port`, answering; ConfigError when it does not come up."""
    if urlparse(uri).scheme == "sqlite" and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(f"no MLflow store at {uri}: run a search first (python -m pipeline.search), or give --uri")
    env = {**os.environ, "PYTHONWARNINGS": ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), QUIET]))}
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip().splitlines()
            raise ConfigError(f"the MLflow server stopped at start: {err[-1] if err else f'exit {proc.returncode}'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise ConfigError(f"the MLflow server did not answer on port {port} within {timeout_s:.0f} s: is the port taken?")


def experiment_urls(uri: str, port: int) -> dict[str, str]:
    """The UI address of each Archipelago experiment in the store (it opens on the runs)."""
    from mlflow.tracking import MlflowClient

    out = {}
    for exp in MlflowClient(uri).search_experiments():
        if exp.name.startswith("archipelago"):
            out[exp.name] = runs_view_url(f"http://127.0.0.1:{port}", exp.experiment_id)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.ui", description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--uri", default=None, help="tracking store (default: the local SQLite store of the searches)")
    args = ap.parse_args(argv)
    uri = args.uri or default_uri()
    try:
        proc = start(uri, args.port)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[ui] MLflow UI at http://127.0.0.1:{args.port} on {uri} (Ctrl-C stops it)", flush=True)
    for name, url in experiment_urls(uri, args.port).items():
        print(f"[ui]   {name}: {url}", flush=True)
    try:
        proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

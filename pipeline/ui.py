"""The MLflow UI on Archipelago's store: `python -m pipeline.ui [--port 5000] [--uri URI]`.

Starts `mlflow server` on the local SQLite store (or `--uri`; `mlflow.tracking_uri=URI` and `port=N`
as the other commands spell them work too) bound to 127.0.0.1, with one worker, waits until it
answers and prints the address of each Archipelago experiment: `archipelago` (searches),
`archipelago-simulate` (simulations) and `archipelago-experiments`. Ctrl-C or SIGTERM stops it and
every process it started (pipeline/records/mlflow_ui.py).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from costmodel.cli import ArgumentParser, run
from pipeline.records.mlflow_ui import experiment_urls, start, stop
from pipeline.records.tracking import default_uri

SPELLINGS = {"mlflow.tracking_uri": "--uri", "uri": "--uri", "port": "--port"}  # `key=value` as --key value


def arguments(argv: list[str]) -> list[str]:
    """`mlflow.tracking_uri=URI` and `port=N` (how the Hydra commands take them) as `--uri URI`, `--port N`."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        out += [SPELLINGS[key], value] if eq and key in SPELLINGS else [arg]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m pipeline.ui", description="MLflow's UI on Archipelago's store.")
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--uri", default=None, help="tracking store (default: the local SQLite store of the searches)")
    args = ap.parse_args(arguments(sys.argv[1:] if argv is None else argv))
    uri = args.uri or default_uri()
    server = start(uri, args.port)

    def ended(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, ended)
    signal.signal(signal.SIGHUP, ended)
    try:
        print(f"[ui] MLflow UI at http://127.0.0.1:{args.port} on {uri} (Ctrl-C stops it)", flush=True)
        for name, url in experiment_urls(uri, args.port).items():
            print(f"[ui]   {name}: {url}", flush=True)
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(server)
    return 0


if __name__ == "__main__":
    run(main)

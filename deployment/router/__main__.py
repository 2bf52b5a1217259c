"""`python -m deployment.router routing.json [--host 0.0.0.0] [--port 8000]`: the plan's router (deployment/router)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from aiohttp import web

from deployment.router.app import app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m deployment.router", description="The plan's router.")
    ap.add_argument("routing", help="routing.json written by python -m pipeline.deploy")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    try:
        config = json.loads(Path(args.routing).read_text())
        application = app(config)
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"error: {args.routing}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    counts = {role: len(isl) for role, isl in config["islands"].items()}
    print(f"[router] {args.routing}: {counts.get('prefill', 0)} prefill and {counts.get('decode', 0)} decode islands; "
          f"listening on http://{args.host}:{args.port} (GET /health; Ctrl-C stops it)", flush=True)  # fmt: skip
    web.run_app(application, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()

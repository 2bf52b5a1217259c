"""`python -m deployment.router routing.json [--port 8000] [--host 127.0.0.1] ...`: the plan's router.

Listens on loopback unless told `--host 0.0.0.0`; with an API key (`ARCHIPELAGO_ROUTER_API_KEY`, or
`--api-key`) every endpoint but /health asks for it. SIGTERM or Ctrl-C stops taking requests and
waits up to `--drain-seconds` for those in flight. Every option is checked (a finite number within its
bounds, `app.LIMITS`); a bad one, like a routing.json the router cannot read or apply, is one `error:`
line and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import resource
import signal
import socket
import sys

from aiohttp import web

from deployment.router.app import HEALTH_CHECKS_AT_ONCE, IDLE_ROOM, STATE, Settings, app, out_of_bounds
from deployment.router.clients import listen
from deployment.router.table import RoutingError, read

FDS_PER_REQUEST = 3  # the client's connection and up to two engine connections


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (1-65535)")
    return port


def _setting(name: str, kind: type) -> object:
    """An argparse type for the setting `name`: a `kind` within its bounds (app.LIMITS), finite."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole number' if kind is int else 'number'}") \
                from None  # fmt: skip
        if why := out_of_bounds(name, value, kind is int):
            raise argparse.ArgumentTypeError(why)
        return value

    parse.__name__ = kind.__name__
    return parse


def parser() -> argparse.ArgumentParser:
    from costmodel.cli import ArgumentParser

    d = Settings()
    ap = ArgumentParser(prog="python -m deployment.router", description="The plan's router (deployment/router).")
    ap.add_argument("routing", help="routing.json written by python -m pipeline.deploy")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback; 0.0.0.0: all)")
    ap.add_argument("--port", type=_port, default=8000)
    ap.add_argument(
        "--api-key",
        default=os.environ.get("ARCHIPELAGO_ROUTER_API_KEY"),
        help="Bearer key every endpoint but /health asks for (default: $ARCHIPELAGO_ROUTER_API_KEY)",
    )
    ap.add_argument("--tokenizer", help="the model's tokenizer.json (or its folder) for exact prompt lengths; the "
                    "router stops if it cannot read it (default: routing.json's `tokenizer` where this host has that "
                    "file, else lengths estimated from characters, as the start line says)")  # fmt: skip
    ap.add_argument(
        "--max-in-flight",
        type=_setting("max_in_flight", int),
        default=0,
        help="requests admitted at once, past it 503 (default: 2 x the plan's in flight, >= 1024)",
    )
    ap.add_argument("--timeout", type=_setting("timeout_s", float), default=d.timeout_s,
                    help="seconds an engine may stay silent")  # fmt: skip
    ap.add_argument("--connect-timeout", type=_setting("connect_timeout_s", float), default=d.connect_timeout_s)
    ap.add_argument("--health-interval", type=_setting("health_interval_s", float), default=d.health_interval_s,
                    help="seconds between health checks of every engine (0: none)")  # fmt: skip
    ap.add_argument("--retries", type=_setting("retries", int), default=d.retries)
    ap.add_argument("--drain-seconds", type=_setting("drain_seconds", float), default=30.0,
                    help="on SIGTERM, seconds to let requests in flight finish")  # fmt: skip
    ap.add_argument("--header-timeout", type=_setting("header_timeout_s", float), default=d.header_timeout_s,
                    help="seconds a client connection may take to send a request's head, from its opening or its last "
                    "answer; then it is closed (an idle kept-alive connection too)")  # fmt: skip
    ap.add_argument("--body-timeout", type=_setting("body_timeout_s", float), default=d.body_timeout_s,
                    help="seconds a request's body may take to arrive after its head; then 408 and the connection "
                    "closed")  # fmt: skip
    ap.add_argument("--max-connections", type=_setting("max_connections", int), default=d.max_connections,
                    help="client connections open at most; one more closes the one idle longest (no request in "
                    "progress), never a busy one (default: --max-in-flight + 1,024)")  # fmt: skip
    return ap


def _fail(message: str) -> None:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)


def _descriptors(wanted: int) -> int:
    """Raise the open-file limit toward `wanted`; the limit there is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        table = read(args.routing)
    except RoutingError as err:
        _fail(f"{args.routing}: {err}")
    try:
        settings = Settings(api_key=args.api_key or None, max_in_flight=args.max_in_flight, timeout_s=args.timeout,
                            connect_timeout_s=args.connect_timeout, health_interval_s=args.health_interval,
                            retries=args.retries, tokenizer=args.tokenizer, header_timeout_s=args.header_timeout,
                            body_timeout_s=args.body_timeout,
                            max_connections=args.max_connections)  # fmt: skip
        application = app(table, settings)
    except ValueError as err:
        _fail(str(err))
    router = application[STATE]
    # a request in flight takes its client's connection and up to two engines'; past them: the idle client
    # connections (the cap's room past the requests admitted), the health checks, and a margin
    others = router.clients.cap - router.capacity + HEALTH_CHECKS_AT_ONCE + 256
    limit = _descriptors(FDS_PER_REQUEST * router.capacity + others)
    if FDS_PER_REQUEST * router.capacity + others > limit:
        router.capacity = max((limit - others) // FDS_PER_REQUEST, 1)
        if not settings.max_connections:
            router.clients.cap = router.capacity + IDLE_ROOM
        print(f"[router] warning: the open-file limit ({limit}) admits {router.capacity} requests in flight, not "
              f"{settings.admitted(table)}: raise `ulimit -n`", file=sys.stderr)  # fmt: skip
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    logging.basicConfig(level=logging.INFO, format="[router] %(message)s", stream=sys.stderr)
    # thousands of requests in flight are many live objects: the cyclic collector's full passes over them stall
    # every request at once, so what was made at start is frozen out of them and young collections are rarer
    gc.freeze()
    gc.set_threshold(50_000, 20, 50)
    asyncio.run(serve(application, args, table))


async def serve(application: web.Application, args: argparse.Namespace, table: object) -> None:
    router = application[STATE]
    try:  # bound before the router starts (its health checks), so a taken port is the only thing said
        sock = socket.create_server((args.host, args.port), backlog=4096)
    except OSError as err:
        _fail(f"cannot listen on {args.host}:{args.port} ({err.strerror or err}): choose another --port or stop what "
              "listens there")  # fmt: skip
    runner = web.AppRunner(application, access_log=None, handle_signals=False, shutdown_timeout=args.drain_seconds)
    await runner.setup()
    listener = await listen(runner, sock, router.clients)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    counts = {ph: len(router.table.islands[ph]) for ph in router.table.islands}
    lengths = (
        "exact (the model's tokenizer)"
        if router.count.exact
        else f"estimated as characters / {router.table.chars_per_token:g} ("
        + (f"routing.json's tokenizer {router.table.tokenizer} is not on this host: " if router.table.tokenizer else "")
        + "give --tokenizer for exact counts)"
    )
    fleet = router.fleet
    served = (f" of {len(fleet.tables)} models ({', '.join(fleet.tables)}: a request goes to the model its `model` "
              "names, then by its length)") if fleet else ""  # fmt: skip
    print(f"[router] {args.routing}: {counts['prefill']} prefill and {counts['decode']} decode islands{served}, "
          f"{len(router.table.engines)} engines; prompt lengths {lengths}; up to {router.capacity} requests in "
          f"flight; client connections: a request's head within {router.settings.header_timeout_s:g} s, its body "
          f"within {router.settings.body_timeout_s:g} s, at most {router.clients.cap} open; "
          f"{'API key required' if router.settings.api_key else 'no API key'}; listening on "
          f"http://{args.host}:{args.port} (GET /health, /metrics; SIGTERM drains)", flush=True)  # fmt: skip
    await stop.wait()
    router.draining = True
    print(f"[router] stopping: no new requests; waiting up to {args.drain_seconds:g} s for {router.in_flight} in "
          "flight", flush=True)  # fmt: skip
    listener.close()
    await runner.cleanup()
    print("[router] stopped", flush=True)


if __name__ == "__main__":
    main()

"""The router under load: requests per second and in flight through `deployment.router`, against the
same stand-in engines asked directly, in one run.

Stand-in engines (tests/standin.py, bare asyncio: an answer after a fixed delay) listen on
loopback in one process, the router in another, and a closed-loop load generator here keeps
`--concurrency` requests in flight over keep-alive connections. Each protocol is measured twice
side by side: straight to one decode stand-in (what the engines and the load generator alone
sustain on this machine) and through the router (prefill + decode, length routing, metrics). The
ratio is what the router costs; the CPU columns say which process ran out of a core.

With `--idle N` each protocol is measured through the router twice instead: alone, and beside N
connections that send nothing or part of a request head (opening again as soon as the router closes
them, so N are held the whole time): the ratio is what the idle ones cost the clients it serves, and
the idle columns say how long the router kept them (its `--header-timeout`) and how many it had not
closed 10 s past it.

    python benchmarks/router_bench.py                        # both protocols, 6,000 in flight, 2.5 s answers
    python benchmarks/router_bench.py --concurrency 2000 --delay 1 --seconds 10 --protocols vllm
    python benchmarks/router_bench.py --idle 1000 --concurrency 300 --header-timeout 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from standin import idle, load  # noqa: E402

BODY = json.dumps({"prompt": [1] * 300, "max_tokens": 16}).encode()


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_ready(proc: subprocess.Popen[str], port: int, what: str) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not listen on {port}")


def measure(protocol: str, concurrency: int, delay: float, seconds: float, direct: bool, *, idle_conns: int = 0,
            header_timeout: float = 15.0) -> dict[str, float]:  # fmt: skip
    ports = free_ports(5)
    engines = subprocess.Popen([sys.executable, str(ROOT / "tests" / "standin.py"), "engines", *map(str, ports[:4]),
                                "--delays", "0.05", "0.05", str(delay), str(delay)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    router = None
    try:
        wait_ready(engines, ports[3], "the stand-in engines")
        target = ports[3]
        if not direct:
            url = [f"http://127.0.0.1:{p}" for p in ports[:4]]
            config = {"protocol": protocol, "bootstrap_port": 8998, "chars_per_token": 4.0, "in_flight": concurrency,
                      "islands": {"prefill": {"0": {"engines": url[:2], "ranges": [[0, 100000, 1.0]]}},
                                  "decode": {"1": {"engines": url[2:], "ranges": [[0, 100000, 1.0]]}}}}  # fmt: skip
            path = Path(tempfile.mkdtemp()) / "routing.json"
            path.write_text(json.dumps(config))
            timeout = ["--header-timeout", str(header_timeout)] if idle_conns else []
            router = subprocess.Popen([sys.executable, "-m", "deployment.router", str(path), "--port", str(ports[4]),
                                       "--health-interval", "1", *timeout], cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            wait_ready(router, ports[4], "the router")
            target = ports[4]
        me, them = os.getpid(), [p.pid for p in (engines, router) if p is not None]
        before = [cpu_s(p) for p in (me, *them)]
        t0 = time.perf_counter()
        seen, held = asyncio.run(_run(target, concurrency, delay, seconds, idle_conns, header_timeout))
        wall = time.perf_counter() - t0
        used = [(cpu_s(p) - b) / wall for p, b in zip((me, *them), before, strict=True)]
        bad = sum(n for s, n in seen.statuses.items() if s != 200) + sum(seen.errors.values())
        return {
            "rate": seen.rate,
            "peak": seen.peak_in_flight,
            "bad": bad,
            "resent": seen.stale,  # requests sent again on a new connection: their kept-alive one closed idle
            "load_cpu": used[0],
            "engines_cpu": used[1],
            "router_cpu": used[2] if router else 0.0,
            "p50_s": sorted(seen.latencies)[len(seen.latencies) // 2] if seen.latencies else float("nan"),
            "p99_s": sorted(seen.latencies)[int(len(seen.latencies) * 0.99)] if seen.latencies else float("nan"),
            "idle_closed": len(held.kept_s) if held else 0,
            "idle_kept_max_s": max(held.kept_s, default=float("nan")) if held else float("nan"),
            "idle_kept_min_s": min(held.kept_s, default=float("nan")) if held else float("nan"),
            "idle_open": held.still_open if held else 0,
        }
    finally:
        for p in (router, engines):
            if p is not None:
                p.terminate()
                p.wait(10)


async def _run(port: int, concurrency: int, delay: float, seconds: float, idle_conns: int,
               header_timeout: float) -> tuple[Any, Any]:  # fmt: skip
    """The closed-loop clients' load, and beside it (`idle_conns` > 0) the idle connections held for as long."""
    clients = load(port, BODY, concurrency, seconds, ramp_s=2 * delay)
    if not idle_conns:
        return await clients, None
    # the idle ones open first (over 1 s) and stay for the whole run: each waits for the router past its timeout
    held = idle(port, idle_conns, seconds=2 * delay + seconds, patience_s=header_timeout + 10, ramp_s=1.0)
    got = await asyncio.gather(clients, held)
    return got[0], got[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=6000)
    ap.add_argument("--delay", type=float, default=2.5, help="the decode stand-ins' answer time, s")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--protocols", nargs="+", default=["sglang", "vllm"])
    ap.add_argument("--idle", type=int, default=0, help="connections that send nothing or part of a head, held beside "
                    "the clients (0: none; compare the router with the stand-ins asked directly instead)")  # fmt: skip
    ap.add_argument("--header-timeout", type=float, default=15.0, help="the router's --header-timeout, s")
    args = ap.parse_args()
    print(
        f"closed loop, {args.concurrency} clients, decode answers after {args.delay:g} s, {args.seconds:g} s measured"
    )
    if args.idle:
        idle_table(args)
        return
    print(f"{'protocol':9} {'path':7} {'req/s':>7} {'peak in flight':>15} {'errors':>7} {'p50 s':>6} {'p99 s':>6} "
          f"{'CPU load':>9} {'engines':>8} {'router':>7}")  # fmt: skip
    for protocol in args.protocols:
        rows = {}
        for direct in (True, False):
            r = rows[direct] = measure(protocol, args.concurrency, args.delay, args.seconds, direct)
            print(f"{protocol:9} {'direct' if direct else 'router':7} {r['rate']:7.0f} {r['peak']:15.0f} "
                  f"{r['bad']:7.0f} {r['p50_s']:6.2f} {r['p99_s']:6.2f} {r['load_cpu']:9.2f} {r['engines_cpu']:8.2f} "
                  f"{r['router_cpu']:7.2f}")  # fmt: skip
        print(f"{protocol:9} router / direct rate: {rows[False]['rate'] / rows[True]['rate']:.2f}")


def idle_table(args: argparse.Namespace) -> None:
    """Through the router, its clients' rate alone and beside `args.idle` idle connections, side by side."""
    print(f"beside {args.idle} idle connections (the router's --header-timeout {args.header_timeout:g} s)")
    print(f"{'protocol':9} {'idle':>5} {'req/s':>7} {'errors':>7} {'resent':>7} {'p50 s':>6} {'p99 s':>6} "
          f"{'router':>7} {'idle closed':>12} {'kept s min':>11} {'kept s max':>11} {'not closed':>11}")  # fmt: skip
    for protocol in args.protocols:
        rows = {}
        for n in (0, args.idle):
            r = rows[n] = measure(protocol, args.concurrency, args.delay, args.seconds, False, idle_conns=n,
                                  header_timeout=args.header_timeout)  # fmt: skip
            print(f"{protocol:9} {n:5d} {r['rate']:7.0f} {r['bad']:7.0f} {r['resent']:7.0f} {r['p50_s']:6.2f} "
                  f"{r['p99_s']:6.2f} "
                  f"{r['router_cpu']:7.2f} {r['idle_closed']:12.0f} {r['idle_kept_min_s']:11.2f} "
                  f"{r['idle_kept_max_s']:11.2f} {r['idle_open']:11.0f}")  # fmt: skip
        ratio = rows[args.idle]["rate"] / rows[0]["rate"]
        print(f"{protocol:9} clients' rate with / without {args.idle} idle: {ratio:.2f}")


if __name__ == "__main__":
    main()

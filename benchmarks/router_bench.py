"""The router under load: requests per second and in flight through `deployment.router`, against the
same stand-in engines asked directly, in one run.

Stand-in engines (tests/standin.py, bare asyncio: an answer after a fixed delay) listen on
loopback in one process, the router in another, and a closed-loop load generator here keeps
`--concurrency` requests in flight over keep-alive connections. Each protocol is measured twice
side by side: straight to one decode stand-in (what the engines and the load generator alone
sustain on this machine) and through the router (prefill + decode, length routing, metrics). The
ratio is what the router costs; the CPU columns say which process ran out of a core.

    python benchmarks/router_bench.py                        # both protocols, 6,000 in flight, 2.5 s answers
    python benchmarks/router_bench.py --concurrency 2000 --delay 1 --seconds 10 --protocols vllm
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from standin import load  # noqa: E402

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


def measure(protocol: str, concurrency: int, delay: float, seconds: float, direct: bool) -> dict[str, float]:
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
            router = subprocess.Popen([sys.executable, "-m", "deployment.router", str(path), "--port", str(ports[4]),
                                       "--health-interval", "1"], cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            wait_ready(router, ports[4], "the router")
            target = ports[4]
        me, them = os.getpid(), [p.pid for p in (engines, router) if p is not None]
        before = [cpu_s(p) for p in (me, *them)]
        t0 = time.perf_counter()
        seen = asyncio.run(load(target, BODY, concurrency, seconds, ramp_s=2 * delay))
        wall = time.perf_counter() - t0
        used = [(cpu_s(p) - b) / wall for p, b in zip((me, *them), before, strict=True)]
        bad = sum(n for s, n in seen.statuses.items() if s != 200) + sum(seen.errors.values())
        return {
            "rate": seen.rate,
            "peak": seen.peak_in_flight,
            "bad": bad,
            "load_cpu": used[0],
            "engines_cpu": used[1],
            "router_cpu": used[2] if router else 0.0,
            "p50_s": sorted(seen.latencies)[len(seen.latencies) // 2] if seen.latencies else float("nan"),
            "p99_s": sorted(seen.latencies)[int(len(seen.latencies) * 0.99)] if seen.latencies else float("nan"),
        }
    finally:
        for p in (router, engines):
            if p is not None:
                p.terminate()
                p.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=6000)
    ap.add_argument("--delay", type=float, default=2.5, help="the decode stand-ins' answer time, s")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--protocols", nargs="+", default=["sglang", "vllm"])
    args = ap.parse_args()
    print(
        f"closed loop, {args.concurrency} clients, decode answers after {args.delay:g} s, {args.seconds:g} s measured"
    )
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


if __name__ == "__main__":
    main()

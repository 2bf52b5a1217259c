"""Simulator speed: the whole Azure conversation trace on a 256-GPU plan, simulated requests per second.

    python benchmarks/sim_bench.py [--rate-scale 0.8] [--routers plan,p2c,sal,mapper]

The plan is the exact optimum's layout for hetero_a (64 H200 + 64 H800 + 128 H20) on the Azure
conversation workload (`pipeline.search search.sampler=exact`, built here directly), and the
requests are the trace's 19,366 rows with their own lengths and timestamps, compressed so the
offered rate is `rate-scale` x the plan's Λ. Needs `../shared/data/traces/`. Target: >= 10,000
simulated requests per wall-clock second. Each router is timed in the same run; the ratio to the
target is printed, not an absolute claim (the machine is shared).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common import exact_plan

from costmodel.catalog import load_gpu
from pipeline.planning.traces import load_trace
from simulator.arrivals import from_trace
from simulator.build import build
from simulator.core import Simulation
from simulator.metrics import summary
from simulator.requests import Requests

TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
TARGET = 10_000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate-scale", type=float, default=0.8)
    ap.add_argument("--routers", default="plan,p2c,sal,mapper,dp_select")
    ap.add_argument("--extra", nargs="*", default=[], help="config overrides of the plan, e.g. search.shapes=any")
    args = ap.parse_args()
    if not TRACE.is_file():
        sys.exit(f"needs the Azure conversation trace at {TRACE} (../shared beside the checkout)")
    t = time.perf_counter()
    _, _, plan = exact_plan(["+inventory=hetero_a", "workload=azure_conv", *args.extra])
    islands = plan.serving
    lam = plan.rate_req_s
    print(
        f"plan: exact optimum for hetero_a / azure_conv {' '.join(args.extra)}, {sum(i.size for i in islands)} GPUs "
        f"in {len(islands)} "
        f"islands, Λ = {lam:.1f} req/s ({time.perf_counter() - t:.1f} s to plan)"
    )
    trace = load_trace(TRACE)
    assert trace.arrival_s is not None
    span = float(trace.arrival_s.max() - trace.arrival_s.min())
    scale = args.rate_scale * lam / (len(trace) / span)
    base = from_trace(trace.arrival_s, trace.input_tokens, trace.output_tokens, scale)
    gpus = {g: load_gpu(g) for g in {i.gpu for i in islands}}
    print(f"requests: the whole trace, {len(base):,}, timestamps / {scale:.1f} -> {args.rate_scale} x Λ offered\n")
    print(
        "| router | engines (prefill / decode) | simulated req/s | vs target 10,000 | served / offered | p99 TTFT ms |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for router in args.routers.split(","):
        r = Requests(base.arrival, base.input_len, base.output_len)
        stats = {"mean_input": r.input_len.mean(), "mean_output": r.output_len.mean(), "std_output": r.output_len.std()}
        pre, dec, rt = build(plan, gpus, router=router, max_len=int(r.input_len.max()),
                             max_context=int((r.input_len + r.output_len).max()), stats=stats)  # fmt: skip
        sim = Simulation(r, pre, dec, rt)
        t = time.perf_counter()
        sim.run()
        wall = time.perf_counter() - t
        m = summary(sim, float(r.arrival[len(r) // 10]))
        speed = len(r) / wall
        served = m["throughput_req_s"] / m["offered_req_s"] if m["offered_req_s"] > 0 else 0.0
        print(f"| {router} | {len(pre)} / {len(dec)} | {speed:,.0f} | {speed / TARGET:.2f}x | {served:.3f} | "
              f"{m['ttft_ms_p99']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()

"""Prefix caches on Mooncake's traces: the hit rates the traces allow, and what routing keeps of them.

    python benchmarks/prefix_cache_bench.py            # A and B
    python benchmarks/prefix_cache_bench.py --part A   # A only (seconds)

A. Against the published figures (never fitted): each shipped Mooncake trace (pipeline/data/mooncake_*.npz, from
   kvcache-ai/Mooncake's FAST'25 release, Apache 2.0) replayed through one prefix cache (`simulator.cache`, LRU,
   leaves first) of unbounded capacity, the share of its prompt tokens found cached, beside the cache ratio the
   paper's Table 2 gives each trace (conversation 40 %, synthetic 66 %); and through one cache of 3 M tokens, the
   paper's local cache (its section 5.3.1: such a cache reaches under half the unbounded hit rate in most of its
   workloads).
B. Routing that keeps the cache: hetero_a's exact plan of the conversation trace (slo=mooncake), simulated on the
   trace's own requests in order, its timestamps compressed to the plan's stated rate (arrivals=trace_compressed),
   with the caches off, and on under three routers: `plan` (the plan's length routing, the least loaded engine of
   the island), `cache` (cache affinity alone) and `plan_cache` (length routing, then cache affinity within the
   island under a load bound): the hit rate of the whole stream and per island, the share of requests within the
   SLOs, TTFT p99 and the throughput over the offered rate.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.planning.simulation import Runner, SimSettings
from pipeline.planning.traces import DATA_DIR, Trace, load_trace
from simulator.arrivals import from_trace
from simulator.cache import PrefixCache, cached_tokens

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = {"conversation": 0.40, "synthetic": 0.66}  # Mooncake FAST'25, Table 2, "Cache Ratio"
LOCAL_CACHE_TOKENS = 3_000_000  # the paper's local DRAM cache, section 5.3.1


def replay_hits(trace: Trace, capacity_tokens: float | None) -> float:
    """The share of `trace`'s prompt tokens one prefix cache of `capacity_tokens` (None: unbounded) finds."""
    b = trace.blocks
    assert b is not None
    cache = PrefixCache(10**12 if capacity_tokens is None else int(capacity_tokens // b.block_tokens))
    hit = 0
    for i in range(len(trace)):
        ids = b.of(i)
        hit += cached_tokens(cache.match(ids), b.block_tokens, int(trace.input_tokens[i]))
        cache.insert(ids)
    return hit / float(trace.input_tokens.sum())


def published() -> None:
    print("## A. Hit rates the traces allow, against Mooncake's published cache ratios\n")
    print("| trace | requests | prompt tokens | unbounded cache | paper (Table 2) | 3 M-token cache "
          "| of the unbounded |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, paper in PUBLISHED.items():
        t = load_trace(DATA_DIR / f"mooncake_{name}.npz")
        full, local = replay_hits(t, None), replay_hits(t, LOCAL_CACHE_TOKENS)
        print(f"| {name} | {len(t):,} | {int(t.input_tokens.sum()):,} | {full:.1%} | {paper:.0%} | {local:.1%} | "
              f"{local / full:.0%} |", flush=True)  # fmt: skip


def routing(seed: int) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import context

    from pipeline.planning.build import build_plan
    from pipeline.planning.simulation import island_caches
    from pipeline.search.reference import exact_layout, reference

    t0 = time.perf_counter()
    settings, ctx = context(["+inventory=hetero_a", "workload=mooncake_conversation", "slo=mooncake"])
    layout = exact_layout(reference(settings, ctx, ctx.planner))
    plan = build_plan(ctx.planner, layout, ctx.inner_time_limit_s, ctx.backend)
    trace = load_trace(DATA_DIR / "mooncake_conversation.npz")
    rate = plan.rates.rate_req_s
    own = len(trace) / trace.span_s
    reqs = from_trace(trace.arrival_s, trace.input_tokens, trace.output_tokens, rate / own, None, trace.blocks)
    print(f"\n## B. Routing that keeps the cache: hetero_a's exact plan of the conversation trace\n\n"
          f"Planned in {time.perf_counter() - t0:.0f} s: {plan.rate_req_s:.2f} req/s stated, "
          f"{len(plan.serving)} serving islands: "
          + ", ".join(f"{k}: {isl.size} x {isl.gpu} {isl.role}" for k, isl in enumerate(plan.serving))
          + f". The trace's {len(trace):,} requests at {rate:.2f} req/s (its timestamps / {rate / own:.1f}), "
          f"seed {seed}.\n")  # fmt: skip
    print("| caches | router | hit rate | per island | within the SLOs | TTFT p99 (s) | TPOT p99 (ms) | throughput / "
          "offered | verdict | s |")  # fmt: skip
    print("|---|---|---:|---|---:|---:|---:|---:|---|---:|")
    for on, router in ((False, "plan"), (True, "plan"), (True, "cache"), (True, "plan_cache")):
        t1 = time.perf_counter()
        runner = Runner(plan, plan.slo, SimSettings(seed=seed, prefix_cache=on))
        sim, m, _ = runner.simulate(reqs, router)
        per = "; ".join(f"{k}: {st.hit_rate:.0%}" for k, st in sorted(island_caches(plan, sim).items())) if on else ""
        why = runner.verdict(m)
        print(f"| {'on' if on else 'off'} | {router} | {m.get('cache_hit_rate', 0.0):.1%} | {per} | "
              f"{m['slo_attainment']:.1%} | {m['ttft_ms_p99'] / 1e3:.2f} | {m['tpot_ms_p99']:.1f} | "
              f"{m['throughput_req_s'] / m['offered_req_s']:.3f} | {why or 'held'} | "
              f"{time.perf_counter() - t1:.0f} |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("A", "B"), default=None, help="one part only")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.part in (None, "A"):
        published()
    if args.part in (None, "B"):
        routing(args.seed)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()

"""Prefix caches on Mooncake's traces: the hit rates the traces allow, and what routing keeps of them.

    python benchmarks/prefix_cache_bench.py            # A, B and C
    python benchmarks/prefix_cache_bench.py --part A   # A only (seconds)

A. Against the published figures (never fitted): each shipped Mooncake trace (pipeline/data/mooncake_*.npz, from
   kvcache-ai/Mooncake's FAST'25 release, Apache 2.0) replayed through one prefix cache (`simulator.cache`, LRU,
   leaves first) of unbounded capacity, the share of its prompt tokens found cached, beside the cache ratio the
   paper's Table 2 gives each trace (conversation 40 %, synthetic 66 %); and through one cache of 3 M tokens, the
   paper's local cache (its section 5.3.1: such a cache reaches under half the unbounded hit rate in most of its
   workloads).
B. Routing that keeps the cache: hetero_a's exact plan of the conversation trace (slo=mooncake), priced with its
   prefix caches, simulated on the trace's own requests in order (Poisson arrivals at `--scale` x the stated rate,
   caches empty at the start) with the caches off, and on under three routers: `length` (the plan's length
   routing, the least loaded engine of the island), `cache` (cache-aware alone, over every prefill engine) and
   `plan` (length routing, then the cache-aware choice within the island): the hit rate of the whole stream and
   per island beside the expected one the plan was priced at, the share of requests within the SLOs, TTFT and
   the throughput over the offered rate.
C. The plan priced with and without the caches (search.prefix_cache): its stated rate, and the search's
   simulated check of it (caches on): simulated over stated, within the SLOs, and the rate that holds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.planning.simulation import Runner, SimSettings
from pipeline.planning.traces import DATA_DIR, Trace, load_trace
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


def exact(prefix_cache: bool) -> tuple[object, float]:
    """hetero_a's exact plan of the conversation trace (slo=mooncake), priced with or without its prefix caches."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import context

    from pipeline.planning.build import build_plan
    from pipeline.search.reference import exact_layout, reference

    t0 = time.perf_counter()
    settings, ctx = context(["+inventory=hetero_a", "workload=mooncake_conversation", "slo=mooncake",
                             f"search.prefix_cache={str(prefix_cache).lower()}"])  # fmt: skip
    layout = exact_layout(reference(settings, ctx, ctx.planner))
    return build_plan(ctx.planner, layout, ctx.inner_time_limit_s, ctx.backend), time.perf_counter() - t0


def routing(seed: int, scale: float) -> None:
    from pipeline.planning.simulation import island_caches, request_mix

    plan, took = exact(True)
    mix = request_mix(plan.workload, plan.spec_of_workload)
    trace = mix.trace
    assert trace is not None
    rate = plan.rates.rate_req_s * scale
    reqs = mix.requests(len(trace), rate, "poisson", seed)
    print(f"\n## B. Routing that keeps the cache: hetero_a's exact plan of the conversation trace\n\n"
          f"Planned with its prefix caches in {took:.0f} s: {plan.rate_req_s:.2f} req/s stated, serving islands "
          + ", ".join(f"{k}: {isl.size} x {isl.gpu} {isl.role}" + (f" (hit rate {isl.cache_hit_expected:.0%} "
                      "expected)" if isl.cache_hit_expected is not None else "")
                      for k, isl in enumerate(plan.serving))
          + f". The trace's {len(trace):,} requests in order, Poisson arrivals at {rate:.2f} req/s ({scale:g} x "
          f"stated), seed {seed}, caches empty at the start.\n")  # fmt: skip
    print("| caches | router | hit rate | per island: simulated (expected) | within the SLOs | TTFT p50 / p99 (s) | "
          "TPOT p99 (ms) | throughput / offered | verdict | s |")  # fmt: skip
    print("|---|---|---:|---|---:|---:|---:|---:|---|---:|")
    for on, router in ((False, "plan"), (True, "length"), (True, "cache"), (True, "plan")):
        t1 = time.perf_counter()
        runner = Runner(plan, plan.slo, SimSettings(seed=seed, prefix_cache=on))
        sim, m, _ = runner.simulate(reqs, router)
        caches = sorted(island_caches(plan, sim).items()) if on else []
        per = "; ".join(f"{k}: {st.hit_rate:.0%} ({plan.serving[k].cache_hit_expected or 0:.0%})"
                        for k, st in caches if st.prompt_tokens)  # fmt: skip
        why = runner.verdict(m)
        print(f"| {'on' if on else 'off'} | {router} | {m.get('cache_hit_rate', 0.0):.1%} | {per} | "
              f"{m['slo_attainment']:.1%} | {m['ttft_ms_p50'] / 1e3:.1f} / {m['ttft_ms_p99'] / 1e3:.1f} | "
              f"{m['tpot_ms_p99']:.1f} | {m['throughput_req_s'] / m['offered_req_s']:.3f} | {why or 'held'} | "
              f"{time.perf_counter() - t1:.0f} |", flush=True)  # fmt: skip


def planned(seed: int) -> None:
    from pipeline.planning.check import check
    from pipeline.planning.simulation import request_mix

    print("\n## C. The plan with and without its prefix caches priced\n")
    print("hetero_a's exact plan of the conversation trace each way, checked as the search checks it (the trace's "
          "requests in order, Poisson arrivals at the stated rate, caches on; where the SLOs break, the highest "
          "rate below that holds).\n")  # fmt: skip
    print("| priced | stated (req/s) | expected hit rate | simulated / stated | within the SLOs | TTFT p99 (s) | "
          "sustained (req/s) | s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for on in (False, True):
        plan, took = exact(on)
        t0 = time.perf_counter()
        v = check(plan, request_mix(plan.workload, plan.spec_of_workload), SimSettings(seed=seed))
        pre = [isl for isl in plan.serving if isl.cache_hit_expected is not None]
        share = sum(isl.traffic_share * isl.cache_hit_expected for isl in pre)  # type: ignore[operator]
        hit = f"{share / max(sum(isl.traffic_share for isl in pre), 1e-9):.0%}" if pre else "-"
        print(f"| {'with caches' if on else 'without'} | {plan.rate_req_s:.2f} | {hit} | "
              f"{v.simulated_over_stated:.3f} | {v.slo_attainment:.1%} | {v.ttft_ms_p99 / 1e3:.1f} | "
              f"{v.sustained_req_s:.2f} | {took + time.perf_counter() - t0:.0f} |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("A", "B", "C"), default=None, help="one part only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=0.8, help="part B's rate, a multiple of the stated")
    args = ap.parse_args()
    if args.part in (None, "A"):
        published()
    if args.part in (None, "B"):
        routing(args.seed, args.scale)
    if args.part in (None, "C"):
        planned(args.seed)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()

"""Prefix caches on Mooncake's traces and the sessions fitted to them: the hit rates the traces allow, what routing
keeps of them, what the plan gains, and the session model against its trace.

    python benchmarks/prefix_cache_bench.py            # A, B, C and D
    python benchmarks/prefix_cache_bench.py --part A   # A only (seconds)

A. Against the published figures (never fitted): each shipped Mooncake trace (pipeline/data/mooncake_*.npz, from
   kvcache-ai/Mooncake's FAST'25 release, Apache 2.0) replayed through one prefix cache (`simulator.cache`, LRU,
   leaves first) of unbounded capacity, the share of its prompt tokens found cached, beside the cache ratio the
   paper's Table 2 gives each trace (conversation 40 %, tool-and-agent 59 %, synthetic 66 %; the tool-and-agent
   trace is not in the stored snapshot of the release and is not shipped: its row says how to ship it); and through
   one cache of 3 M tokens, the paper's local cache (its section 5.3.1: such a cache reaches under half the
   unbounded hit rate in most of its workloads).
B. Routing that keeps the cache: hetero_a's exact plan of each workload (the conversation trace replayed in order,
   and the chat sessions fitted to it; slo=mooncake), priced with its prefix caches, simulated (Poisson arrivals at
   `--scale` x the stated rate, caches empty at the start, hit rates past the warm-up) with the caches off, and on
   under the routers: `length` (the plan's length routing, the least loaded engine of the island), `cache`
   (cache-aware alone, over every prefill engine), `plan` (length routing, then the cache-aware choice among the
   range's islands) and, for the sessions, `session` (the deployment router's policy: the range by length, then
   the session's engine by weighted rendezvous hashing with bounded loads): the hit rate of the whole stream and
   per island beside the expected one the plan was priced at, the share of requests within the SLOs, TTFT and
   the throughput over the offered rate.
C. The plan priced with and without the caches (search.prefix_cache), on each workload: its stated rate, and the
   search's simulated check of it (caches on): simulated over stated, within the SLOs, and the rate that holds.
D. The session model against the trace it was fitted to (conf/workload/chat_sessions.yaml): its sessions at the
   trace's own rate beside the trace: hit rates of one unbounded, 10 M- and 3 M-token cache, prompt lengths, the
   share of next turns.
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
PUBLISHED = {"conversation": 0.40, "toolagent": 0.59, "synthetic": 0.66}  # Mooncake FAST'25, Table 2, "Cache Ratio"
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
        path = DATA_DIR / f"mooncake_{name}.npz"
        if not path.exists():  # released, but not in the stored snapshot of kvcache-ai/Mooncake: not shipped
            ship = f"python -m pipeline.traces derive {name}_trace.jsonl {path.relative_to(ROOT)}"
            print(f"| {name} | not shipped (`{ship}` ships it) | | | {paper:.0%} | | |", flush=True)
            continue
        t = load_trace(path)
        full, local = replay_hits(t, None), replay_hits(t, LOCAL_CACHE_TOKENS)
        print(f"| {name} | {len(t):,} | {int(t.input_tokens.sum()):,} | {full:.1%} | {paper:.0%} | {local:.1%} | "
              f"{local / full:.0%} |", flush=True)  # fmt: skip


WORKLOADS = ("mooncake_conversation", "chat_sessions")


def exact(prefix_cache: bool, workload: str = "mooncake_conversation") -> tuple[object, float]:
    """hetero_a's exact plan of `workload` (slo=mooncake), priced with or without its prefix caches."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import context

    from pipeline.planning.build import build_plan
    from pipeline.search.reference import exact_layout, reference

    t0 = time.perf_counter()
    settings, ctx = context(["+inventory=hetero_a", f"workload={workload}", "slo=mooncake",
                             f"search.prefix_cache={str(prefix_cache).lower()}"])  # fmt: skip
    layout = exact_layout(reference(settings, ctx, ctx.planner))
    return build_plan(ctx.planner, layout, ctx.inner_time_limit_s, ctx.backend), time.perf_counter() - t0


def routing(seed: int, scale: float, workload: str, n: int) -> None:
    from pipeline.planning.simulation import island_caches, request_mix

    plan, took = exact(True, workload)
    mix = request_mix(plan.workload, plan.spec_of_workload)
    rate = plan.rates.rate_req_s * scale
    reqs = mix.requests(n, rate, "poisson", seed)
    routers = ("length", "cache", "plan") + (("session",) if reqs.session is not None else ())
    print(f"\n## B. Routing that keeps the cache: hetero_a's exact plan of {workload}\n\n"
          f"Planned with its prefix caches in {took:.0f} s: {plan.rate_req_s:.2f} req/s stated, serving islands "
          + ", ".join(f"{k}: {isl.size} x {isl.gpu} {isl.role}" + (f" (hit rate {isl.cache_hit_expected:.0%} "
                      "expected)" if isl.cache_hit_expected is not None else "")
                      for k, isl in enumerate(plan.serving))
          + f". {n:,} requests, Poisson arrivals at {rate:.2f} req/s ({scale:g} x stated), seed {seed}, caches empty "
          "at the start, hit rates past the first 10 % of arrivals.\n")  # fmt: skip
    print("| caches | router | hit rate | of `cache`'s | per island: simulated (expected) | within the SLOs | "
          "TTFT p50 / p99 (s) | TPOT p99 (ms) | throughput / offered | verdict | s |")  # fmt: skip
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---|---:|")
    rows = {}
    for on, router in ((False, "plan"), *((True, r) for r in routers)):
        t1 = time.perf_counter()
        runner = Runner(plan, plan.slo, SimSettings(seed=seed, prefix_cache=on))
        sim, m, _ = runner.simulate(reqs, router)
        rows[(on, router)] = m
        warm = float(reqs.arrival[int(len(reqs) * runner.s.warmup_fraction)])
        caches = sorted(island_caches(plan, sim, warm).items()) if on else []
        per = "; ".join(f"{k}: {st.hit_rate:.0%} ({plan.serving[k].cache_hit_expected or 0:.0%}, "
                        f"{st.prompt_tokens / max(sum(c.prompt_tokens for _, c in caches), 1):.0%} of tokens)"
                        for k, st in caches if st.prompt_tokens)  # fmt: skip
        hit = m.get("cache_hit_rate", 0.0)
        of = rows.get((True, "cache"), {}).get("cache_hit_rate")
        why = runner.verdict(m)
        print(f"| {'on' if on else 'off'} | {router} | {hit:.1%} | {f'{hit / of:.0%}' if on and of else '-'} | "
              f"{per} | {m['slo_attainment']:.1%} | {m['ttft_ms_p50'] / 1e3:.1f} / {m['ttft_ms_p99'] / 1e3:.1f} | "
              f"{m['tpot_ms_p99']:.1f} | {m['throughput_req_s'] / m['offered_req_s']:.3f} | {why or 'held'} | "
              f"{time.perf_counter() - t1:.0f} |", flush=True)  # fmt: skip


def planned(seed: int, workload: str) -> None:
    from pipeline.planning.check import check
    from pipeline.planning.simulation import request_mix

    print(f"\n## C. The plan with and without its prefix caches priced: {workload}\n")
    print("hetero_a's exact plan each way, checked as the search checks it (Poisson arrivals at the stated rate, "
          "caches on; where the SLOs break, the highest rate below that holds).\n")  # fmt: skip
    print("| priced | stated (req/s) | expected hit rate | simulated / stated | within the SLOs | TTFT p99 (s) | "
          "sustained (req/s) | s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for on in (False, True):
        plan, took = exact(on, workload)
        t0 = time.perf_counter()
        v = check(plan, request_mix(plan.workload, plan.spec_of_workload), SimSettings(seed=seed))
        pre = [isl for isl in plan.serving if isl.cache_hit_expected is not None]
        share = sum(isl.traffic_share * isl.cache_hit_expected for isl in pre)  # type: ignore[operator]
        hit = f"{share / max(sum(isl.traffic_share for isl in pre), 1e-9):.0%}" if pre else "-"
        print(f"| {'with caches' if on else 'without'} | {plan.rate_req_s:.2f} | {hit} | "
              f"{v.simulated_over_stated:.3f} | {v.slo_attainment:.1%} | {v.ttft_ms_p99 / 1e3:.1f} | "
              f"{v.sustained_req_s:.2f} | {took + time.perf_counter() - t0:.0f} |", flush=True)  # fmt: skip


def sessions_fit(seed: int) -> None:
    import yaml

    from pipeline.planning.workload import workload_from_cfg
    from simulator.sessions import next_turns

    cfg = yaml.safe_load((ROOT / "conf" / "workload" / "chat_sessions.yaml").read_text())
    w = workload_from_cfg("chat_sessions", cfg)
    t = load_trace(DATA_DIR / "mooncake_conversation.npz")
    assert w.sessions is not None and t.blocks is not None
    r = w.sessions.requests(len(t), cfg["rate_req_s"], seed)
    assert r.blocks is not None
    print("\n## D. The session model against the trace it was fitted to\n")
    print(f"conf/workload/chat_sessions.yaml's sessions, {len(t):,} requests at the trace's {cfg['rate_req_s']} req/s "
          f"(seed {seed}), beside the trace.\n")  # fmt: skip
    print("| | unbounded cache | 10 M tokens | 3 M tokens | prompt mean | median | p90 | next turns |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, blocks, ins in (("the trace", t.blocks, t.input_tokens), ("its sessions", r.blocks, r.input_len)):
        trace = Trace(name, name, ins, ins, None, blocks)
        hits = [replay_hits(trace, c) for c in (None, 1e7, LOCAL_CACHE_TOKENS)]
        nxt = float((next_turns(blocks)[0] >= 0).mean())
        print(f"| {name} | {hits[0]:.1%} | {hits[1]:.1%} | {hits[2]:.1%} | {ins.mean():,.0f} | "
              f"{np.median(ins):,.0f} | {np.percentile(ins, 90):,.0f} | {nxt:.1%} |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("A", "B", "C", "D"), default=None, help="one part only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=0.8, help="part B's rate, a multiple of the stated")
    ap.add_argument("--requests", type=int, default=20_000, help="part B's requests")
    ap.add_argument("--workload", choices=WORKLOADS, default=None, help="parts B and C on this workload only")
    args = ap.parse_args()
    workloads = [args.workload] if args.workload else list(WORKLOADS)
    if args.part in (None, "A"):
        published()
    if args.part in (None, "D"):
        sessions_fit(args.seed)
    for w in workloads if args.part in (None, "B") else ():
        routing(args.seed, args.scale, w, args.requests)
    for w in workloads if args.part in (None, "C") else ():
        planned(args.seed, w)


if __name__ == "__main__":
    main()

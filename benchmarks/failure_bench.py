"""One host lost: the rate the plan states for each host's loss, checked by simulating that loss.

    python benchmarks/failure_bench.py                          # the main job's inventory (hetero_a)
    python benchmarks/failure_bench.py +inventory=tiny_hetero ranges.width=1000
    python benchmarks/failure_bench.py --plan outputs/search/latest/plan.json   # a plan the search wrote

The plan is the exact planner's (`search.sampler=exact`, the main job's layout with every host up), or with
`--plan` a plan.json of the config the other arguments give (the main job's default plan, which plans for one
host lost). For every host that runs a
serving island, `pipeline.planning.failures.host_losses` gives the rate with that host gone (its islands stop,
the router re-solves its shares over the rest, every engine as launched); here each of those plans is simulated
request by request at that rate (`pipeline.planning.check`, the search's own check), and the table gives the
simulated / stated ratio, whether the SLOs held, and the rate the simulator sustains. A loss that leaves no
decode (or no prefill) capacity states 0 req/s: there is nothing to simulate. Nothing here is fitted.
"""

from __future__ import annotations

import sys
import time

from common import context, exact_plan

import plan as plans
from pipeline.planning.check import check
from pipeline.planning.failures import host_losses, without_host
from pipeline.planning.planner import Layout
from pipeline.planning.simulation import RequestMix


def main() -> None:
    args = sys.argv[1:]
    if args and args[-1] == "--plan":
        raise SystemExit("--plan takes a plan.json, e.g. --plan outputs/search/latest/plan.json")
    given = args[args.index("--plan") + 1] if "--plan" in args else None
    overrides = [a for a in args if a not in ("--plan", given)] or ["+inventory=hetero_a"]
    t0 = time.perf_counter()
    if given is None:
        _, ctx, plan = exact_plan(overrides)
    else:
        _, ctx = context(overrides)
        plan = plans.load(given)
    layout = Layout.of([(isl.gpu, isl.size) for isl in plan.islands])
    t1 = time.perf_counter()
    losses = host_losses(ctx.planner, layout, plan, ctx.inner_time_limit_s, ctx.backend)
    if losses is None:
        raise SystemExit(f"the plan of {overrides} serves nothing: no host to lose")
    print(f"# One host lost: {' '.join(overrides)}\n\nplan: {plan.rate_req_s:.2f} req/s on {len(losses.losses)} hosts "
          f"that run a serving island (planned in {t1 - t0:.1f} s; every host's loss solved in "
          f"{time.perf_counter() - t1:.1f} s)\n")  # fmt: skip
    print("| host | stops | stated (req/s) | of the plan's | simulated / stated | SLOs | sustained (req/s) | s |")
    print("|---|---|---:|---:|---:|---|---:|---:|")
    mix = RequestMix.of(ctx.planner.workload)
    ratios = []
    for h in losses.losses:
        stops = ", ".join(f"{plan.islands[i].size} x {plan.islands[i].gpu} {plan.islands[i].role}" for i in h.islands)
        share = h.rate_req_s / plan.rate_req_s
        if h.rate_req_s <= 0:
            print(f"| {h.gpu} {h.node} | {stops} | 0.00 | 0% | - | nothing serves | - | - |")
            continue
        t = time.perf_counter()
        v = check(without_host(ctx.planner, layout, plan, h.islands, ctx.inner_time_limit_s, ctx.backend), mix)
        ratios.append(v.simulated_over_stated)
        held = "held" if v.sustained else f"broke: {v.why_not}"
        print(f"| {h.gpu} {h.node} | {stops} | {h.rate_req_s:.2f} | {share:.0%} | {v.simulated_over_stated:.3f} | "
              f"{held} | {v.sustained_req_s:.2f} | {time.perf_counter() - t:.1f} |", flush=True)  # fmt: skip
    w = losses.worst
    print(f"\nworst: {w.gpu} node {w.node}, {w.rate_req_s:.2f} req/s ({w.rate_req_s / plan.rate_req_s:.0%} of the "
          f"plan's rate)")  # fmt: skip
    if ratios:
        off = max(abs(r - 1.0) for r in ratios)
        print(f"simulated / stated over the {len(ratios)} losses simulated: {min(ratios):.3f} - {max(ratios):.3f} "
              f"({'within' if off <= 0.05 else 'not within'} ±5 %)")  # fmt: skip


if __name__ == "__main__":
    main()

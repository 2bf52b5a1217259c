"""SLO-true plans: the rate a plan states against the rate the simulator sustains within the SLOs.

For each cell (inventory x workload; default: the Table 5.1 cells), side by side in one run:
- plan with the SLOs (the default `slo`) by an in-process search (TPE + polish, `--evals`
  evaluations, as `pipeline.search` runs it under Ray Tune) and state its rate;
- bisect the offered rate (Poisson arrivals, the plan's own routing, FCFS) for the highest rate
  at which throughput keeps up and TTFT and TPOT at their SLO percentiles meet their targets
  (`simulator.metrics.verdict`, the judge `pipeline.simulate` uses);
- print stated, simulated SLO-sustainable, their ratio (target 0.95-1.05), and what the SLOs cost:
  the stated rate against the same search with slo=null.

    python benchmarks/slo_bench.py                                  # the six Table 5.1 cells
    python benchmarks/slo_bench.py --cells hetero_a:azure_code --evals 96
    python benchmarks/slo_bench.py --plans outputs/search/<run>/plan.json   # a plan already made (the main job)
    python benchmarks/slo_bench.py --goodput 32 --cells hetero_a:azure_code   # objective=goodput vs max_rate

--goodput N: per cell, a search of N evaluations scored by simulated goodput (objective=goodput)
and one of N scored analytically (max_rate, same seed); both best plans are then bisected the same
way, and the table gives simulated goodput of the goodput plan / that of the analytic plan.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from common import context

import plan as plans
from pipeline.planning.build import build_plan
from pipeline.planning.planner import Layout
from pipeline.planning.simulation import RequestMix, Runner, request_mix, sustainable_rate
from pipeline.records.journal import write_json
from pipeline.search.samplers import make_sampler
from pipeline.search.trial import OK, ask_tell
from plan import Plan

CELLS = [f"{i}:{w}" for i in ("hetero_a", "hetero_b", "homo_c") for w in ("azure_code", "azure_conv")]


def plan_for(inv: str, wl: str, evals: int, extra: list[str]) -> tuple[Plan, RequestMix]:
    settings, ctx = context([f"+inventory={inv}", f"workload={wl}", *extra])
    sampler = make_sampler(settings.search.sampler, 0, ctx.space, settings.search.polish, evals)
    out = ask_tell(ctx, sampler, evals, settings.search.batch)
    best = max((r for r in out if r["status"] in OK), key=lambda r: r["score"])
    plan = build_plan(ctx.planner, Layout.of(ctx.space.layout(best["params"])), 30.0)
    return plan, RequestMix.of(ctx.planner.workload)


def sustained_rate(plan: Plan, mix: RequestMix, seconds: float, steps: int) -> tuple[float, str]:
    """Highest offered rate the simulator sustains within the plan's own SLOs: the stated rate first, then
    bisection in [0.2, 1.4] x stated (`sustainable_rate`, as objective=goodput probes a layout)."""
    runner = Runner(plan, plan.slo)

    def sustains(rate: float) -> str:
        _, m, _ = runner.simulate(mix.requests(int(max(rate * seconds, 2000)), rate))
        return runner.verdict(m)

    return sustainable_rate(sustains, plan.rate_req_s, steps, 0.2, 1.4)


def workload_mix(name: str) -> RequestMix:
    """The requests of the shipped workload `name` (conf/workload/<name>.yaml)."""
    from omegaconf import OmegaConf

    from costmodel.catalog import CONF_DIR

    data: Any = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "workload" / f"{name}.yaml"))
    return request_mix(name, data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--evals", type=int, default=96, help="search evaluations per plan")
    ap.add_argument("--seconds", type=float, default=120.0, help="seconds of arrivals per simulation")
    ap.add_argument("--steps", type=int, default=7, help="bisection steps")
    ap.add_argument("--goodput", type=int, default=0, help="evaluations per search for the goodput comparison")
    ap.add_argument("--plans", default="", help="comma-separated plan.json files to bisect instead of planning cells")
    ap.add_argument("--out", default="outputs/benchmarks/slo_bench")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.goodput:
        return compare_goodput(args, out)
    print("| cell | stated (SLO) req/s | simulated SLO-sustainable | ratio | fails above it | slo=null stated | "
          "SLO cost | time s |")  # fmt: skip
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for name in filter(None, args.plans.split(",")):
        t0 = time.perf_counter()
        path = Path(name)
        plan = plans.load(path)  # judged by its own SLOs, on the workload it was made for
        sustained, why = sustained_rate(plan, workload_mix(plan.workload), args.seconds, args.steps)
        stated = plan.rate_req_s
        print(f"| {path} | {stated:.1f} | {sustained:.1f} | {sustained / stated:.3f} | {why} | - | - | "
              f"{time.perf_counter() - t0:.0f} |", flush=True)  # fmt: skip
    for cell in filter(None, args.cells.split(",") if not args.plans else []):
        inv, wl = cell.split(":")
        t0 = time.perf_counter()
        plan, mix = plan_for(inv, wl, args.evals, [])
        write_json(out / f"{inv}-{wl}.json", plans.to_json(plan))
        sustained, why = sustained_rate(plan, mix, args.seconds, args.steps)
        free, _ = plan_for(inv, wl, args.evals, ["slo=null"])
        stated = plan.rate_req_s
        print(
            f"| {cell} | {stated:.1f} | {sustained:.1f} | {sustained / stated:.3f} | {why} | "
            f"{free.rate_req_s:.1f} | {1 - stated / free.rate_req_s:.1%} | {time.perf_counter() - t0:.0f} |",
            flush=True,
        )


def compare_goodput(args: argparse.Namespace, out: Path) -> None:
    print("| cell | evals | analytic plan: stated / simulated req/s | goodput plan: stated / simulated req/s | "
          "simulated goodput ÷ analytic | search s (analytic / goodput) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for cell in args.cells.split(","):
        inv, wl = cell.split(":")
        row = []
        for objective in ("max_rate", "goodput"):
            t0 = time.perf_counter()
            plan, mix = plan_for(inv, wl, args.goodput, [f"search.objective={objective}"])
            searched = time.perf_counter() - t0
            write_json(out / f"{inv}-{wl}-{objective}.json", plans.to_json(plan))
            sustained, _ = sustained_rate(plan, mix, args.seconds, args.steps)
            row.append((plan.rate_req_s, sustained, searched))
        (a_stated, a_sim, a_s), (g_stated, g_sim, g_s) = row
        print(f"| {cell} | {args.goodput} | {a_stated:.1f} / {a_sim:.1f} | {g_stated:.1f} / {g_sim:.1f} | "
              f"{g_sim / a_sim:.3f} | {a_s:.0f} / {g_s:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()

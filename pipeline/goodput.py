"""Simulated goodput of a layout: the highest offered rate its plan sustains within the SLOs.

`search.objective=goodput` scores each trial with this instead of the analytic rate: the layout
is planned as usual (inner solve with the queueing caps, routed mixes), then the request-level
simulator bisects the offered rate, starting at the plan's stated rate, for the highest rate at
which throughput keeps up and TTFT and TPOT hold at their SLO percentiles
(`simulator.metrics.verdict`, the judge of `pipeline.simulate` and the main job's check).

A noisy objective (a finite simulation of random arrivals) and an expensive one (a few seconds
a layout where the analytic score takes tens of milliseconds): the trade it measures is whether
what the simulator sees (batching, the routing's randomness, per-engine queues, decode memory)
changes which layout wins (benchmarks/slo_bench.py --goodput).

Pure of Ray, MLflow and files, like `pipeline.trial`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.planner import Layout, Planner
from simulator.arrivals import sampled
from simulator.core import Simulation
from simulator.metrics import summary, verdict
from simulator.plan import build, islands_from_plan
from simulator.schedulers import make_scheduler

TOLERANCE = 0.03  # throughput within 3 % of offered counts as keeping up (conf/simulate.yaml saturate.tolerance)
WARMUP = 0.1  # the first 10 % of arrivals warm the system up (conf/simulate.yaml warmup_fraction)


@dataclass(frozen=True)
class GoodputCheck:
    """How hard each layout is simulated (`search.goodput` in conf/search/*.yaml)."""

    seconds: float = 30.0  # of Poisson arrivals per simulation
    steps: int = 4  # simulations per layout: the stated rate, then bisection
    min_requests: int = 6000  # per simulation, however low the rate
    low: float = 0.5  # bisection bracket, as fractions of the stated rate
    high: float = 1.3
    seed: int = 0


def sustainable_rate(
    sustains: Callable[[float], str], stated: float, steps: int, low: float, high: float
) -> tuple[float, str]:
    """The highest rate `sustains` accepts ("" = sustained, else why not) in `steps` probes.

    The stated rate first; then bisection above it (up to high x stated) if it holds, below it
    (down to low x stated) if not. Returns (the highest sustained rate probed, 0 if none; why the
    lowest failing probe failed)."""
    best, why_fail = 0.0, ""
    lo, hi = low * stated, high * stated
    mid = stated
    for _ in range(steps):
        why = sustains(mid)
        if why:
            hi, why_fail = mid, why
        else:
            best = lo = mid
        mid = 0.5 * (lo + hi)
    return best, why_fail


def simulated_goodput(planner: Planner, plan: dict[str, Any], check: GoodputCheck) -> tuple[float, str]:
    """(the highest rate `plan` sustains within the planner's SLOs, why the next probe above failed)."""
    islands = islands_from_plan(plan)
    wl, cost = planner.workload, planner.cost
    inputs = np.flatnonzero(wl.pmf > 0)
    if wl.output_pmf is None:  # a workload that gives only the mean output: every answer that long
        out_hist = (np.array([max(round(wl.mean_decode), 1)]), np.ones(1))
    else:
        outputs = np.flatnonzero(wl.output_pmf > 0)
        out_hist = (outputs, wl.output_pmf[outputs])
    hist = ((inputs, wl.pmf[inputs]), out_hist)

    def sustains(rate: float) -> str:
        n = max(int(rate * check.seconds), check.min_requests)
        r = sampled(n, hist[0], hist[1], "poisson", rate, check.seed)
        stats = {"mean_input": float(r.input_len.mean()), "mean_output": float(r.output_len.mean()),
                 "std_output": float(r.output_len.std())}  # fmt: skip
        pre, dec, router = build(
            islands, planner.gpus, planner.model, cost, max_len=int(r.input_len.max()),
            max_context=int((r.input_len + r.output_len).max()), token_budget=cost.prefill_batch_tokens,
            seed=check.seed, stats=stats,
        )  # fmt: skip
        sim = Simulation(r, pre, dec, router, make_scheduler("fcfs", max_output=int(r.output_len.max())))
        sim.run()
        warm = float(r.arrival[int(len(r) * WARMUP)])
        m = summary(sim, warm, cost.ttft_ms, cost.tpot_ms, cost.ttft_percentile, cost.tpot_percentile)
        return verdict(m, cost.ttft_ms, cost.tpot_ms, TOLERANCE)

    return sustainable_rate(sustains, plan["rate_req_s"], check.steps, check.low, check.high)


def layout_goodput(
    planner: Planner, layout: Layout, check: GoodputCheck, time_limit_s: float, backend: str
) -> tuple[float, dict[str, Any]]:
    """Plan `layout` (as the search's final plan is made) and simulate its goodput; (goodput, plan)."""
    from pipeline.outputs import build_plan

    plan = build_plan(planner, layout, time_limit_s, backend)
    if plan["rate_req_s"] <= 0:
        return 0.0, plan
    rate, _ = simulated_goodput(planner, plan, check)
    return rate, plan

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

Pure of Ray, MLflow and files, like `pipeline.search.trial`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.planning.build import build_plan
from pipeline.planning.planner import Layout, Planner
from pipeline.planning.simulation import RequestMix, Runner, SimSettings, sustainable_rate, until_steady
from plan import Plan


@dataclass(frozen=True)
class GoodputCheck:
    """How hard each layout is simulated (`search.goodput` in conf/search/*.yaml)."""

    seconds: float = 30.0  # of Poisson arrivals per simulation, ...
    longest_s: float = 120.0  # ... or up to this many where that window is too short for a steady state
    steps: int = 4  # simulations per layout: the stated rate, then bisection
    min_requests: int = 6000  # per simulation, however low the rate
    low: float = 0.5  # bisection bracket, as fractions of the stated rate
    high: float = 1.3
    seed: int = 0


def simulated_goodput(planner: Planner, plan: Plan, check: GoodputCheck) -> tuple[float, str]:
    """(the highest rate `plan` sustains within its SLOs, why the next probe above failed)."""
    mix = RequestMix.of(planner.workload)
    runner = Runner(plan, plan.slo, SimSettings(seed=check.seed), planner.gpus)

    def sustains(rate: float) -> str:
        n = max(int(rate * check.seconds), check.min_requests)

        def simulate(k: int) -> tuple[object, dict[str, float]]:
            sim, m, _ = runner.simulate(mix.requests(k, rate, "poisson", check.seed))
            return sim, m

        m, _, _ = until_steady(simulate, n, rate, max(n, int(rate * check.longest_s)), runner.tolerance)
        return runner.verdict(m)

    return sustainable_rate(sustains, plan.rate_req_s, check.steps, check.low, check.high)


def layout_goodput(
    planner: Planner, layout: Layout, check: GoodputCheck, time_limit_s: float, backend: str
) -> tuple[float, Plan]:
    """Plan `layout` (as the search's final plan is made) and simulate its goodput; (goodput, plan)."""
    plan = build_plan(planner, layout, time_limit_s, backend)
    if not plan.serves:
        return 0.0, plan
    rate, _ = simulated_goodput(planner, plan, check)
    return rate, plan

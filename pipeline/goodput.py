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
from simulator.core import Requests, Simulation
from simulator.metrics import RAMP_DEFICIT_MAX, ramp_deficit, steady_state_note, summary, verdict
from simulator.plan import build, islands_from_plan
from simulator.schedulers import make_scheduler

TOLERANCE = 0.03  # throughput within 3 % of offered counts as keeping up (conf/simulate.yaml saturate.tolerance)
WARMUP = 0.1  # the first 10 % of arrivals warm the system up (conf/simulate.yaml warmup_fraction)


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


OVERLOADED = 0.75  # a longer window that leaves the throughput's shortfall above this share of itself: overloaded


def until_steady(
    simulate: Callable[[int], tuple[Simulation, dict[str, float]]], n: int, rate: float, most: int, tolerance: float
) -> tuple[dict[str, float], list[dict[str, float]], str]:
    """Simulate `n` requests at `rate` req/s; where the measuring window is too short for a steady state
    (`steady_state_note`: a large plan fills a request cap in a second, heavy-tailed answers outlast
    a short window), again on enough for a window past 1.5 x the p99 request whose ramp-up costs at
    most half of `RAMP_DEFICIT_MAX` (at least 1.5 x as many each time, at most `most`), until the
    window is long enough or a longer one leaves the throughput's shortfall above `OVERLOADED` of
    itself: then queues grow with time and the plan is overloaded at `rate`.

    Returns (the metrics of the last simulation, each simulation's window, requests, ramp deficit,
    offered and served rate, and why the last window fell short, "" if it did not)."""
    keys = ("window_s", "e2e_ms_p99", "ramp_deficit", "offered_req_s", "throughput_req_s")
    sim, m = simulate(n)
    windows, steady = [{"requests": n, **{k: m.get(k, float("nan")) for k in keys}}], steady_state_note(m)
    while steady and n < most:
        longer = min(most, max(int(1.5 * n), int(rate * 2 * _steady_window_s(sim.r, m, most / rate))))
        del sim  # (a million requests' arrays)
        sim, m_longer = simulate(longer)
        short, short_longer = (
            max(0.0, 1 - x["throughput_req_s"] / max(x["offered_req_s"], 1e-9)) for x in (m, m_longer)
        )
        n, m, steady = longer, m_longer, steady_state_note(m_longer)
        windows.append({"requests": n, **{k: m.get(k, float("nan")) for k in keys}})
        if steady and short > tolerance and short_longer > OVERLOADED * short:
            steady = (
                f"throughput falls {short_longer:.0%} short of the offered rate ({short:.0%} on fewer "
                "requests): a longer window does not close the gap; queues grow, the plan is overloaded"
            )
            break
    return m, windows, steady


def _steady_window_s(r: Requests, m: dict[str, float], longest_s: float) -> float:
    """The shortest window past 1.5 x the p99 request whose ramp-up costs at most half of `RAMP_DEFICIT_MAX`,
    had the requests taken as long as these did (in 5 % steps, at most `longest_s`)."""
    w = max(1.5 * m.get("e2e_ms_p99", 0.0), m["window_s"] * 1e3, 1.0)
    while ramp_deficit(r, w) > RAMP_DEFICIT_MAX / 2 and w < longest_s * 1e3:
        w *= 1.05
    return w / 1e3


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
        m, _, _ = until_steady(lambda k: simulate(rate, k), n, rate, max(n, int(rate * check.longest_s)), TOLERANCE)
        return verdict(m, cost.ttft_ms, cost.tpot_ms, TOLERANCE)

    def simulate(rate: float, n: int) -> tuple[Simulation, dict[str, float]]:
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
        return sim, summary(sim, warm, cost.ttft_ms, cost.tpot_ms, cost.ttft_percentile, cost.tpot_percentile)

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

"""The check after a search: the plan simulated request by request at its stated rate, judged by its own SLOs.

`check` simulates the plan on its workload's requests (`pipeline.planning.simulation`) and returns a
`Verification`: what it sustains, its latencies, a verdict, and where the SLOs break, the highest lower
rate the simulator sustains. The search records it in plan.json and report.md (`pipeline.search.run`).
"""

from __future__ import annotations

import numpy as np

from pipeline.planning.simulation import RequestMix, Runner, SimSettings, sustainable_rate, until_steady
from plan import Bursts, Plan, Verification, Window
from simulator.arrivals import PROFILE_BIN_S
from simulator.core import Simulation

SECONDS_OF_ARRIVALS = 90.0  # a plan is checked on this much simulated time at its stated rate ...
REQUESTS = (3000, 40000)  # ... within these bounds on the number of requests
LONGEST = (1_500_000, 600.0)  # where that window is too short for a steady state, again on more requests
# (`until_steady`), up to these many and these seconds of arrivals
MARGIN = 0.95  # a plan whose SLOs hold here but break at its stated rate is within 5 % of it
PROBES = 4  # where the SLOs break at the stated rate: rates below it simulated, 0.95 x stated first ...
LOW = 0.5  # ... then bisection between the stated rate and this fraction of it


def check(plan: Plan, mix: RequestMix, settings: SimSettings | None = None) -> Verification:
    """Simulate `plan` at its stated rate on `mix`'s requests, judged by the plan's own SLOs.

    The requests span `SECONDS_OF_ARRIVALS` within `REQUESTS` (a trace that names its prompts' blocks: at most
    one pass of it). Where the measuring window is then
    too short for a steady state (`simulator.metrics.steady_state_note`: a plan serving tens of
    thousands of requests a second fills its cap in a second, before decoding has filled up), the
    check runs again on more requests until the window is long enough, a longer window leaves the
    throughput as short as before (overloaded) or `LONGEST` is reached (`until_steady`). `windows`
    lists each of these simulations, `requests` is the count the verdict rests on and `steady_state`
    says why its window fell short ("" when it did not).

    When the SLOs break there, the highest rate below it that the simulator sustains (`sustained_req_s`):
    0.95 x stated first (`holds_at_0_95`: the stated rate is then within 5 % of the sustainable one; a
    finite simulation at the edge lands on either side), then bisection between the highest rate that
    held and the lowest that broke, `PROBES` simulations in all, the same arrivals' seed and request
    count as the check at the stated rate. 0 if none of them held."""
    settings = settings or SimSettings()
    rate = plan.rate_req_s
    n = int(np.clip(rate * SECONDS_OF_ARRIVALS, *REQUESTS))
    runner = Runner(plan, plan.slo, settings)
    walls: list[float] = []

    def simulate(k: int, at: float = rate) -> tuple[Simulation, dict[str, float]]:
        sim, m, wall = runner.simulate(mix.requests(k, at, "poisson", settings.seed))
        walls.append(wall)
        return sim, m

    most = min(LONGEST[0], int(rate * LONGEST[1]))
    if mix.prefix_trace is not None:
        # a trace naming its prompts' blocks is checked on one pass of it at most: past its end the replay starts
        # again with every prompt renamed (`simulator.arrivals.in_order`), its first turns' conversations begun
        # before it and found nowhere, a cold start in the middle of the measured window the model never prices
        most = min(most, len(mix.prefix_trace))
        n = min(n, most)
    m, windows, steady = until_steady(simulate, n, rate, most, runner.tolerance)
    n = int(windows[-1]["requests"])
    why = runner.verdict(m)
    best, holds = (rate, None) if not why else (0.0, False)
    if why:  # how far off? Rates below the stated one, 0.95 x first
        best, _ = sustainable_rate(lambda r: runner.verdict(simulate(n, r)[1]), MARGIN * rate, PROBES,
                                   LOW / MARGIN, 1 / MARGIN)  # fmt: skip
        holds = best >= MARGIN * rate  # the first probe held: bisection went up from it
    nan = float("nan")
    arrived = m["offered_req_s"] * m["window_s"]
    precision = float(np.hypot(m.get("throughput_noise", 0.0), 1 / np.sqrt(max(arrived, 1.0))))
    return Verification(
        offered_req_s=m["offered_req_s"],
        throughput_req_s=m["throughput_req_s"],
        simulated_over_stated=m["throughput_req_s"] / rate,
        ttft_ms_p50=m.get("ttft_ms_p50", nan),
        ttft_ms_p99=m.get("ttft_ms_p99", nan),
        tpot_ms_p99=m.get("tpot_ms_p99", nan),
        ttft_ms_at_slo=m["ttft_ms_at_slo"],
        tpot_ms_at_slo=m["tpot_ms_at_slo"],
        slo_attainment=m["slo_attainment"],
        sustained=not why,
        why_not=why,
        steady_state=steady,
        requests=n,
        sim_wall_s=sum(walls),
        slo=plan.slo.text(),
        sustained_req_s=best,
        sustained_over_stated=best / rate,
        holds_at_0_95=holds,
        windows=tuple(Window(**{k: float(w[k]) if k != "requests" else int(w[k]) for k in w}) for w in windows),
        precision=precision,
        cache_hit_rate=m.get("cache_hit_rate"),
        cache_hit_rates=None if "cache_hit_rate" not in m else tuple(
            float(m.get(f"cache_hit_rate_island_{k}", 0.0)) for k in range(len(plan.serving))),
    )


BURST_PROBES = 7  # whole-day simulations the rate under the workload's own arrivals is found with


def peak_to_mean(profile: np.ndarray, percentile: float) -> float:
    """The workload's bursts: the rate over the mean that `percentile` % of its requests arrive at or below (the
    profile weighted by the requests in each bin: a request-weighted quantile)."""
    r = np.sort(np.asarray(profile, dtype=float))
    cum = np.cumsum(r) / r.sum()
    return float(r[min(int(np.searchsorted(cum, percentile / 100.0)), len(r) - 1)])


def bursts(plan: Plan, mix: RequestMix, settings: SimSettings | None = None) -> Bursts:
    """The mean rate `plan` sustains within its SLOs under its workload's own arrivals (`arrivals=workload`: the
    Cox process over its trace's rate profile), each probe simulating one whole cycle of the profile, so the SLO
    percentiles are the day's. A model gives the first probe: the plan's `rates.bursty_req_s`, the queueing model
    under those arrivals (`costmodel.queueing.modulated_cap`), where it has one; else C / q: a plan that sustains its
    stated rate C under Poisson arrivals sustains about that under bursts whose rate, for the SLO's percentile of
    requests, is at most q times the mean (`peak_to_mean`). `BURST_PROBES` probes then bisect between half and
    twice the first."""
    if mix.profile is None:
        raise ValueError(f"workload {mix.name} has no arrival model (no trace)")
    settings = settings or SimSettings()
    runner = Runner(plan, plan.slo, settings)
    day_s = len(mix.profile) * PROFILE_BIN_S
    percentile = max(plan.slo.ttft_percentile, plan.slo.tpot_percentile) if plan.slo.any else 99.0
    q = peak_to_mean(mix.profile, percentile)
    estimate = plan.rate_req_s / q
    seen: dict[float, dict[str, float]] = {}
    walls: list[float] = []

    def sustains(rate: float) -> str:
        _, m, wall = runner.simulate(mix.requests(max(int(np.ceil(rate * day_s)), 100), rate, "workload",
                                                  settings.seed))  # fmt: skip
        walls.append(wall)
        seen[rate] = m
        return runner.verdict(m)

    best, why = sustainable_rate(sustains, plan.rates.bursty_req_s or estimate, BURST_PROBES, 0.5, 2.0)
    m = seen.get(best) or {}
    nan = float("nan")
    return Bursts(rate_req_s=best, estimate_req_s=estimate, peak_to_mean=q, percentile=percentile, day_s=day_s,
                  slo_attainment=m.get("slo_attainment", nan), ttft_ms_p99=m.get("ttft_ms_p99", nan),
                  tpot_ms_p99=m.get("tpot_ms_p99", nan), why_above=why, probes=len(walls), sim_wall_s=sum(walls),
                  seed=settings.seed)  # fmt: skip

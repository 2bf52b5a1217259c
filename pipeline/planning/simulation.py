"""A plan simulated request by request: its requests (`RequestMix`) and its engines (`Runner`), as
`pipeline.simulate`, the post-search check (`pipeline.planning.check`) and the goodput objective
(`pipeline.planning.goodput`) run it. The simulator itself (simulator/) knows nothing of configs."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.catalog import load_gpu
from costmodel.settings import Slo
from costmodel.specs import GPU
from pipeline.errors import ConfigError
from pipeline.planning.traces import Trace
from pipeline.planning.workload import Workload, from_trace, trace_from_cfg, workload_from_cfg
from plan import Plan
from simulator import mixed
from simulator.arrivals import ARRIVALS, PROFILE_BIN_S, in_order, replay_refusal, replayed, sampled
from simulator.arrivals import from_trace as trace_requests
from simulator.build import build
from simulator.cache import CacheStats
from simulator.core import Simulation
from simulator.metrics import P99_WINDOWS, RAMP_DEFICIT_MAX, ramp_deficit, steady_state_note, summary, verdict
from simulator.requests import Requests
from simulator.routers import AFFINITY_BOUND, CACHE_ROUTERS
from simulator.schedulers import make_scheduler
from simulator.sessions import SessionModel

MAX_REQUESTS = 5_000_000  # per simulation: ~120 bytes of arrays a request, minutes of simulation at this many
SIMULATED_REQ_S = 10_000  # a floor on the simulator's speed (benchmarks/sim_bench.py), for estimates of run time


@dataclass(frozen=True)
class RequestMix:
    """Where a simulation's requests come from: input and output lengths as a workload has them, drawn
    independently, and the trace itself where arrivals replay its timestamps."""

    name: str
    inputs: tuple[np.ndarray, np.ndarray]  # (lengths, weights)
    outputs: tuple[np.ndarray, np.ndarray]
    trace: Trace | None = None
    profile: np.ndarray | None = None  # the workload's arrival model (`workload` arrivals; simulator.arrivals)
    sessions: SessionModel | None = None  # a session workload's model, which gives the requests at any rate

    @staticmethod
    def of(workload: Workload, trace: Trace | None = None) -> RequestMix:
        inputs = np.flatnonzero(workload.pmf > 0)
        if workload.output_pmf is None:  # a workload that gives only the mean output: every answer that long
            outputs = (np.array([max(round(workload.mean_decode), 1)]), np.ones(1))
        else:
            out = np.flatnonzero(workload.output_pmf > 0)
            outputs = (out, workload.output_pmf[out])
        trace = trace or workload.prefix_trace  # a trace naming its prompts' blocks travels with its workload
        return RequestMix(workload.name, (inputs, workload.pmf[inputs]), outputs, trace, workload.arrival_profile,
                          workload.sessions)  # fmt: skip

    @property
    def prefix_trace(self) -> Trace | None:
        """The trace whose own requests this mix gives in order at poisson, constant and workload arrivals: one that
        names its prompts' prefix blocks (None: lengths drawn apart, or a session model's requests)."""
        t = self.trace
        return t if self.sessions is None and t is not None and t.blocks is not None else None

    def requests(self, n: int, rate: float, arrivals: str = "poisson", seed: int = 0) -> Requests:
        """`n` requests at `rate` req/s: `poisson` or `constant` arrivals, the workload's own arrival model
        (`workload`: its trace's rate over time, at a mean of `rate`), or the trace's own timestamps (`trace`)
        scaled to `rate`. A trace that names its prompts' prefix blocks gives its own requests in its order at
        every kind of arrivals (`simulator.arrivals.in_order`), not lengths drawn apart, so prefixes recur. A session
        workload's model generates them: sessions starting at `arrivals` at rate / its turns per session, each turn
        after its think time (`simulator.sessions`)."""
        if arrivals not in ARRIVALS:
            raise ConfigError(f"arrivals={arrivals!r}: choose from {list(ARRIVALS)}")
        if n > MAX_REQUESTS:
            raise ConfigError(
                f"requests={n:,} is over {MAX_REQUESTS:,} per simulation (about {n / SIMULATED_REQ_S / 60:,.0f} min "
                f"at {SIMULATED_REQ_S:,} simulated requests/s and {n * 120 / 1e9:,.0f} GB of arrays): lower requests"
            )
        if self.sessions is not None:  # sessions start at `arrivals`, their turns follow at their think times
            if arrivals.startswith("trace"):
                raise ConfigError(f"arrivals={arrivals} replays a trace's timestamps; workload {self.name} is a "
                                  "session model, whose sessions start at poisson or constant arrivals: use "
                                  "arrivals=poisson")  # fmt: skip
            return self.sessions.requests(n, rate, seed, arrivals, self.profile)
        if arrivals == "workload" and self.profile is None:
            raise ConfigError(f"arrivals=workload is the arrival model a workload fitted to its trace; workload "
                              f"{self.name} has no trace (a synthetic one): use arrivals=poisson")  # fmt: skip
        if not arrivals.startswith("trace"):
            t = self.prefix_trace
            if t is not None and t.blocks is not None:  # its prompts' prefixes: the trace's requests in its order
                return in_order(t.input_tokens, t.output_tokens, t.blocks, arrivals, n, rate, seed, self.profile)
            return sampled(n, self.inputs, self.outputs, arrivals, rate, seed, self.profile)
        t = self.timed(arrivals)
        scale = rate / (len(t) / t.span_s)
        if arrivals == "trace":
            if refusal := replay_refusal(scale, n, len(t)):
                raise ConfigError(f"arrivals=trace at {rate:.4g} req/s on {self.name} ({len(t):,} requests "
                                  f"over {t.span_s:.3g} s): {refusal}; use arrivals=trace_compressed or "
                                  "workload")  # fmt: skip
            return replayed(t.arrival_s, t.input_tokens, t.output_tokens, scale, n, seed, t.blocks)[0]
        return trace_requests(t.arrival_s, t.input_tokens, t.output_tokens, scale, n, t.blocks)

    def timed(self, arrivals: str) -> Trace:
        t = self.trace
        if t is None or t.arrival_s is None:
            raise ConfigError(f"arrivals={arrivals} needs timestamps; workload {self.name} has none: use "
                              "+workload=trace with a timestamped trace, or arrivals=poisson")  # fmt: skip
        if not len(t) > 1 or not t.arrival_s.max() > t.arrival_s.min():
            raise ConfigError(f"arrivals={arrivals} needs timestamps at two different times at least; workload "
                              f"{self.name} has {len(t)} request(s) over 0 s: use arrivals=poisson")  # fmt: skip
        return t

    def coverage(self, n: int, rate: float, arrivals: str) -> str:
        """What `n` requests at `rate` req/s cover of the trace's day, where that bears on the percentiles: a
        stretch of it (the percentiles are that stretch's), or more than it (`trace`: replayed again; a trace naming
        its prompts' blocks: passes after the first start cold); "" else."""
        span = n / rate
        t = self.prefix_trace
        if t is not None and not arrivals.startswith("trace"):
            if n <= len(t):  # a trace naming its prompts' blocks replays its own requests in order (`requests`)
                return ""
            return (f"{n:,} requests replay the trace's {len(t):,} in order {n / len(t):.1f} times over; each pass "
                    "after the first has its prompts renamed and starts cold (its first turns continue conversations "
                    f"found nowhere), so hit rates and throughput dip there; requests={len(t):,} keeps one pass, as "
                    "the check after a search does.")  # fmt: skip
        if arrivals == "workload" and self.profile is not None:
            day_s = len(self.profile) * PROFILE_BIN_S
            what = "the workload's arrival profile"
        elif arrivals == "trace" and self.trace is not None and self.trace.arrival_s is not None:
            day_s = self.timed(arrivals).span_s
            what = "the trace, on its own time scale"
        else:
            return ""
        if span < day_s:
            return (f"{n:,} requests at {rate:.1f} req/s span {span:,.0f} s of {what} ({day_s:,.0f} s; "
                    f"{span / day_s:.0%}): the percentiles are that stretch's, not the whole trace's; "
                    f"requests={math.ceil(rate * day_s):,} covers it.")  # fmt: skip
        if arrivals == "trace" and span > 1.01 * day_s:
            once = math.floor(rate * day_s)
            return (f"{n:,} requests at {rate:.1f} req/s span {span:,.0f} s: the trace is {_seconds(day_s)} s long, so "
                    f"it is replayed {span / day_s:,.1f} times over, its bursts again in the same places"
                    + (f"; requests={once:,} covers it once." if once else "."))  # fmt: skip
        return ""


def request_mix(name: str, cfg: Mapping[str, Any]) -> RequestMix:
    """The requests of workload `name` (its conf/workload mapping, plain)."""
    if cfg.get("kind") == "trace":
        trace = trace_from_cfg(name, cfg)
        return RequestMix.of(from_trace(trace), trace)
    return RequestMix.of(workload_from_cfg(name, cfg))


@dataclass(frozen=True)
class SimSettings:
    """How a plan is simulated besides its requests (conf/simulate.yaml's defaults)."""

    seed: int = 0
    token_budget: int | None = None  # prompt tokens per prefill batch (None: the plan's)
    expert_imbalance: float = 1.0
    warmup_fraction: float = 0.1  # the first arrivals warm the system up and are not measured
    tolerance: float = 0.03  # throughput within this share of offered counts as keeping up
    larry_alpha: float = 1.0
    sjf_theta_age_ms: float = 5000.0
    prefix_cache: bool = True  # engines keep prefix caches where the requests name their prompts' blocks


class Runner:
    """Engines for one plan, rebuilt per simulation (they carry state), judged against `slo`."""

    def __init__(
        self, plan: Plan, slo: Slo, settings: SimSettings | None = None, gpus: Mapping[str, GPU] | None = None
    ) -> None:
        """`gpus`: the GPU figures to simulate with (default: the catalogue's)."""
        self.plan, self.slo, self.s = plan, slo, settings or SimSettings()
        given = gpus or {}
        self.gpus = {g: given[g] if g in given else load_gpu(g) for g in {isl.gpu for isl in plan.serving}}

    @property
    def tolerance(self) -> float:
        return self.s.tolerance

    def verdict(self, m: Mapping[str, float]) -> str:
        """"" when the SLOs held and throughput kept up, else why not (`simulator.metrics.verdict`)."""
        return verdict(m, self.slo.ttft_ms, self.slo.tpot_ms, self.s.tolerance)

    def simulate(
        self, req: Requests, router: str = "plan", scheduler: str = "fcfs"
    ) -> tuple[Simulation, dict[str, float], float]:
        """(the finished simulation, its metrics, wall seconds)."""
        if router == "session" and req.session is None:
            raise ConfigError(f"router=session routes each request by its session (as deployment.router does by "
                              f"its session header or user); workload {self.plan.workload}'s requests name none "
                              "(Mooncake's traces name prompt blocks, not sessions): use router=plan, which "
                              "reads the engines' caches, or a session workload (workload=chat_sessions)")  # fmt: skip
        r = req.fresh()
        stats = {"mean_input": float(r.input_len.mean()), "mean_output": float(r.output_len.mean()),
                 "std_output": float(r.output_len.std())}  # fmt: skip
        max_len, max_context = int(r.input_len.max()), int((r.input_len + r.output_len).max())

        blocks = r.blocks.block_tokens if self.s.prefix_cache and r.blocks is not None else None

        def disaggregated(part: Requests) -> Simulation:
            pre, dec, rt = build(
                self.plan, self.gpus, router=router, max_len=max_len, max_context=max_context,
                token_budget=self.s.token_budget, seed=self.s.seed, stats=stats,
                expert_imbalance=self.s.expert_imbalance, cache_block_tokens=blocks,
            )  # fmt: skip
            sched = make_scheduler(scheduler, max_output=int(r.output_len.max()),
                                   theta_age_ms=self.s.sjf_theta_age_ms, alpha=self.s.larry_alpha)  # fmt: skip
            part_sim = Simulation(part, pre, dec, rt, sched)
            part_sim.run()
            return part_sim

        t0 = time.perf_counter()
        if any(isl.role == "aggregated" for isl in self.plan.serving):  # aggregated islands run apart
            affinity = AFFINITY_BOUND if router in CACHE_ROUTERS else None
            sim = mixed.run(self.plan, r, self.gpus, disaggregated, self.s.seed, self.s.expert_imbalance, blocks,
                            affinity)  # fmt: skip
        else:
            sim = disaggregated(r)
        wall = time.perf_counter() - t0
        # past the warm-up: the requests that only warm the engines (`Requests.warm`), then a share of the rest
        first = r.warm + int((len(r) - r.warm) * self.s.warmup_fraction)
        warm = float(r.arrival[min(first, len(r) - 1)]) if len(r) else 0.0
        slo = self.slo
        m = summary(sim, warm, slo.ttft_ms, slo.tpot_ms, slo.ttft_percentile, slo.tpot_percentile)
        if blocks is not None:  # past the warm-up, as the latencies (the caches start empty)
            done = (r.first_token >= 0) & (r.arrival >= warm)
            m["cache_hit_rate"] = float(r.cached[done].sum() / max(int(r.input_len[done].sum()), 1))
            caches = island_caches(self.plan, sim, warm)
            for k, st in caches.items():
                m[f"cache_hit_rate_island_{k}"] = st.hit_rate
            if self.plan.cost.engine.host_cache_gb:  # the share of the prompt tokens loaded from host tiers
                m["cache_host_rate"] = sum(st.host_tokens for st in caches.values()) / max(
                    sum(st.prompt_tokens for st in caches.values()), 1)
        m["sustained"] = float(not self.verdict(m))
        m["sim_wall_s"] = wall
        m["sim_req_per_s"] = len(r) / wall if wall > 0 else 0.0
        return sim, m, wall


def island_caches(plan: Plan, sim: Simulation | mixed.MixedRun, since_ms: float | None = None) -> dict[int, CacheStats]:
    """Each serving island's prefix caches, summed over its engines (by index in `plan.serving`): the prompt tokens
    its prefills were asked for and those they found cached (and loaded from a host tier). `since_ms`: of the
    requests that arrived since then only (the caches warm, as latencies are measured past a warm-up), each by the
    island that prefilled it; the host tier's tokens stay the whole run's."""
    apart = [k for k, isl in enumerate(plan.serving) if isl.role != "aggregated"]  # simulator.build's island order
    out: dict[int, CacheStats] = {}
    pools = [(apart[e.island], e.stats) for e in sim.prefill]
    pools += [(k, e.stats) for k, pool in getattr(sim, "aggregated", {}).items() for e in pool]
    for k, st in pools:
        mine = out.setdefault(k, CacheStats())
        mine.host_tokens += st.host_tokens
        if since_ms is None:
            mine.prompt_tokens += st.prompt_tokens
            mine.cached_tokens += st.cached_tokens
    if since_ms is not None:
        r = sim.r
        owner = {e.index: apart[e.island] for e in sim.prefill} | getattr(sim, "engine_island", {})
        island = np.array([owner.get(int(e), -1) for e in r.prefill_engine])
        done = (r.first_token >= 0) & (r.arrival >= since_ms) & (island >= 0)
        for k in out:
            mine = done & (island == k)
            out[k].prompt_tokens = int(r.input_len[mine].sum())
            out[k].cached_tokens = int(r.cached[mine].sum())
    return out


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
    a short window), again on enough for a window past `P99_WINDOWS` x the p99 request whose ramp-up costs at
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
    """The shortest window past `P99_WINDOWS` x the p99 request whose ramp-up costs at most half of `RAMP_DEFICIT_MAX`,
    had the requests taken as long as these did (in 5 % steps, at most `longest_s`)."""
    w = max(P99_WINDOWS * m.get("e2e_ms_p99", 0.0), m["window_s"] * 1e3, 1.0)
    while ramp_deficit(r, w) > RAMP_DEFICIT_MAX / 2 and w < longest_s * 1e3:
        w *= 1.05
    return w / 1e3


def _seconds(s: float) -> str:
    """A span in seconds as a reader takes it in: 3,436; 2.5; 1.5e-06."""
    return f"{s:,.0f}" if s >= 100 else f"{s:.3g}"

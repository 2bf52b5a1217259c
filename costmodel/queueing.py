"""Queueing at an island: how loaded it may run before a latency percentile breaks its target.

An island of c identical servers (prefill: its dp engines, each serving one prompt after
another; decode: its sequence slots, batch x attention ranks x dp) takes Poisson arrivals at
rate λ and serves a mix of service times S (one value per input-length range, with the
range's share of the requests). With μ = 1 / E[S], offered load a = λ / μ and utilisation
ρ = a / c:

    Erlang C        C(c, a) = P(wait > 0) in M/M/c, from Erlang B by the stable recursion
                    B(0) = 1, B(k) = a B(k-1) / (k + a B(k-1)),  C = B / (1 - ρ (1 - B))
    wait tail       P(W > t) ≈ C(c, a) exp(-(c μ - λ) t · 2 / (1 + Cs²))
    wait quantile   W_q = ln(C / (1 - q)) (1 + Cs²) / (2 (c μ - λ))   (0 when C <= 1 - q)

Cs² = Var[S] / E[S]² is the squared coefficient of variation of the mix. For M/M/c (Cs² = 1)
the tail is exact; its mean, C (1 + Cs²) / (2 (c μ - λ)), is the Allen-Cunneen approximation,
exact for M/G/1 (the Pollaczek-Khinchine formula) and so for M/D/1. A request's latency
percentile is bounded by W_q + S_q (the q-quantile of the mix): the quantile of a sum of
independent parts is at most the sum of their quantiles, so the bound errs on the safe side.

`max_utilisation` is the largest ρ whose bound meets a target (bisection; the bound grows with
ρ); `utilisation_caps` the same for many wait budgets at once, on a grid of ρ (1/2000 steps,
rounded down, so never above the exact cap). The island benchmark turns them into each
island's usable share of time (`costmodel.island_bench.utilisation_caps`). The assumptions (Poisson
arrivals, first-come first-served, no batching delay) are checked against the request-level
simulator, not taken on trust: docs/inner.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


def erlang_c(c: int, a: float) -> float:
    """P(an arrival waits) in M/M/c with offered load a = λ/μ (1 when a >= c)."""
    if c < 1:
        raise ValueError(f"`c >= 1` servers must hold, got {c=}")
    if a <= 0:
        return 0.0
    if a >= c:
        return 1.0
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    return b / (1.0 - rho * (1.0 - b))


def mix_moments(service_s: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """(E[S], Cs²) of a discrete service-time mix; weights need not sum to 1."""
    w = np.asarray(weights, dtype=float)
    s = np.asarray(service_s, dtype=float)
    w = w / w.sum()
    mean = float(w @ s)
    var = float(w @ (s - mean) ** 2)
    return mean, var / mean**2 if mean > 0 else 0.0


def mix_quantile(service_s: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-quantile of a discrete service-time mix."""
    order = np.argsort(service_s)
    s, w = np.asarray(service_s, dtype=float)[order], np.asarray(weights, dtype=float)[order]
    cum = np.cumsum(w) / w.sum()
    return float(s[min(int(np.searchsorted(cum, q - 1e-12)), len(s) - 1)])


def wait_tail(c: int, rate: float, mean_s: float, cs2: float) -> tuple[float, float]:
    """(P(W > 0), θ) of the M/G/c approximation above: P(W > t) = P(W > 0) e^(-θ t), θ in 1/s (0 at or beyond
    saturation, where every prompt waits without bound)."""
    if rate <= 0:
        return 0.0, math.inf
    if rate * mean_s >= c:
        return 1.0, 0.0
    return erlang_c(c, rate * mean_s), 2.0 * (c / mean_s - rate) / (1.0 + cs2)


def wait_quantile(c: int, rate: float, mean_s: float, cs2: float, q: float) -> float:
    """W_q of the M/G/c approximation above (inf at or beyond saturation)."""
    pw, theta = wait_tail(c, rate, mean_s, cs2)
    if pw <= 1.0 - q:
        return 0.0
    return math.inf if theta <= 0 else math.log(pw / (1.0 - q)) / theta


def max_utilisation(c: int, service_s: np.ndarray, weights: np.ndarray, target_s: float, q: float) -> float:
    """Largest ρ in [0, 1) with W_q(ρ) + S_q <= target_s; 0 when even an idle island misses it."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"`0 < q < 1` must hold for a percentile, got {q=}")
    mean, cs2 = mix_moments(service_s, weights)
    budget = target_s - mix_quantile(service_s, weights, q)
    if budget < 0 or mean <= 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(40):  # ρ to ~1e-12
        mid = 0.5 * (lo + hi)
        if wait_quantile(c, mid * c / mean, mean, cs2, q) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


RHO_GRID = np.arange(2000) / 2000.0  # 0 .. 0.9995


def erlang_c_grid(c: int, rho: np.ndarray) -> np.ndarray:
    """Erlang C at every utilisation of `rho` (< 1), vectorised: Erlang B is P(N = c) / P(N <= c)
    for N ~ Poisson(a), so thousands of servers (a decode island's slots) cost no more than one."""
    from scipy.special import gammaln, pdtr  # (not scipy.stats: its import alone takes half a second)

    a = rho * c
    with np.errstate(divide="ignore", invalid="ignore"):  # log P(N = c) - log P(N <= c)
        b = np.where(a > 0, np.exp(c * np.log(a) - a - gammaln(c + 1) - np.log(pdtr(c, a))), 0.0)
    return np.where(a > 0, b / (1.0 - rho * (1.0 - b)), 0.0)


def utilisation_caps(
    c: int, mean_s: float, cs2: float, wait_s: np.ndarray, q: float, batch_s: float = 0.0
) -> np.ndarray:
    """For each wait budget, the largest grid ρ with W_q(ρ) + X(ρ) <= budget (0 for a negative budget).

    X is the delay batching adds (`batch_s` = 0: none). A server that takes every queued job up to
    a size limit into one batch, all finishing together, makes a job also wait for the jobs
    batched behind it: those that joined its server's queue while it waited, about ρ·W of work
    (arrivals at λ/c for a time W, E[S] each), and at most one full batch, `batch_s`. So
    X = min(ρ W_q, batch_s): the job taken as the first of its batch, the safe side.
    """
    rho = RHO_GRID
    pw = erlang_c_grid(c, rho)
    with np.errstate(divide="ignore", invalid="ignore"):
        wq = np.where(pw > 1.0 - q, np.log(pw / (1.0 - q)) * (1.0 + cs2) / (2.0 * (c / mean_s) * (1.0 - rho)), 0.0)
    wq = wq + np.minimum(rho * wq, batch_s)
    wq = np.maximum.accumulate(wq)  # monotone by construction; guards rounding
    budget = np.asarray(wait_s, dtype=float)
    idx = np.searchsorted(wq, budget, side="right") - 1
    return np.where(budget >= 0, rho[np.clip(idx, 0, len(rho) - 1)], 0.0)


def tpot_step_cap_ms(tpot_ms: float, q: float, output_pmf: np.ndarray) -> float:
    """The largest decode step time (ms) at which requests meet a TPOT target at percentile q.

    A request of n output tokens gets its first token from prefill; its KV then joins a decode
    engine at the next step boundary, a wait A ~ Uniform(0, step), and n - 1 steps follow. Its
    TPOT = (finish - first token) / (n - 1) = step + A / (n - 1): a short answer carries the wait
    over few tokens. With step = st, P(TPOT > T) = Σ_{n>=2} p(n) clip(1 - (T - st)(n - 1) / st, 0, 1)
    over the requests with n >= 2 (the ones TPOT is measured on). It grows with st; the cap is
    the largest st with P <= 1 - q (bisection). KV transfer time is left out: for DeepSeek-V3 it
    is ~35 KB a token, a few ms for a 4k-token prompt, against a step of tens of ms.
    """
    p = np.asarray(output_pmf, dtype=float)
    n = np.arange(len(p))
    keep = n >= 2
    if not keep.any() or p[keep].sum() <= 0:
        return tpot_ms
    n, w = n[keep], p[keep] / p[keep].sum()

    def miss(st: float) -> float:
        return float(w @ np.clip(1.0 - (tpot_ms - st) * (n - 1) / st, 0.0, 1.0))

    return _largest_within(miss, 1.0 - q, tpot_ms, 50)


def _largest_within(miss: Callable[[float], float], allowed: float, hi: float, steps: int) -> float:
    """The largest x in [0, hi] with miss(x) <= allowed, miss growing with x (bisection, `steps` halvings)."""
    if miss(hi) <= allowed:
        return hi
    lo = 0.0
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if miss(mid) <= allowed else (lo, mid)
    return lo


@dataclass(frozen=True)
class RateProfile:
    """Arrivals whose rate varies in time: `relative[i]` x the mean over the i-th `bin_s`-second bin, the bins
    walked in turn and round again (a workload's arrival model, `simulator.arrivals.rate_profile`)."""

    relative: np.ndarray
    bin_s: float

    def __post_init__(self) -> None:
        r = np.asarray(self.relative, dtype=float)
        if r.ndim != 1 or not len(r) or (r < 0).any() or not r.sum() > 0 or not self.bin_s > 0:
            raise ValueError("a rate profile is a non-empty 1-d array of rates >= 0 (some > 0) over bins of > 0 s")


STEPS_PER_BIN = 10  # the fluid backlog is followed at this many steps a profile bin


def modulated_cap(
    c: int, mean_s: float, cs2: float, wait_s: float, q: float, arrivals: RateProfile, batch_s: float = 0.0
) -> float:
    """The largest mean utilisation ρ at which the waits of arrivals modulated by `arrivals` (ρ x relative[i] in
    bin i) meet `wait_s` at the percentile q over all of them: `utilisation_caps`' cap for bursty arrivals.

    A bin's load ρ_i = ρ relative[i] above 1 builds a backlog, a fluid queue (Lindley's recursion over
    `STEPS_PER_BIN` steps a bin, two cycles of the profile so the first bin starts with the last one's backlog),
    and an arrival first waits it out: B_j seconds of work per server. On top of it, the M/G/c wait of the
    Poisson model at the bin's load, that load capped at ρ̂, the Poisson cap for the same budget: the stationary
    queue at a load between ρ̂ and 1 builds over minutes (its relaxation time grows as (1 - √ρ)^-2), longer than a
    trace's bursts last, so within a burst it stays near what it is at ρ̂. An arrival in step j then misses
    the budget with probability 1 where B_j >= t, else C(c, c ρ'_j) exp(-θ_j (t - B_j)), t the budget less
    the batching delay (`utilisation_caps`); the cap is the largest ρ at which the arrivals' mean miss is at
    most 1 - q (bisection). With a flat profile it is ρ̂ itself."""
    hat = float(utilisation_caps(c, mean_s, cs2, np.array([wait_s]), q, batch_s)[0])
    if wait_s < 0 or hat <= 0:
        return 0.0
    rel = np.asarray(arrivals.relative, dtype=float)
    rel = rel / rel.mean()
    n, dt = len(rel), arrivals.bin_s / STEPS_PER_BIN
    share = rel / rel.sum()  # of the arrivals in each bin
    rate = c / mean_s
    steps = np.arange(STEPS_PER_BIN + 1)

    def missed(rho: float) -> float:
        load = rho * rel
        # Lindley at the bins' edges, over two cycles: within a bin the load is constant, so the running minimum
        # of the cumulated work is reached at an edge and the steps inside need not be walked
        s = np.concatenate([[0.0], np.cumsum(np.tile(load - 1.0, 2) * arrivals.bin_s)])
        start = (s - np.minimum.accumulate(np.minimum(s, 0.0)))[n : 2 * n]  # the second cycle's bins, at their start
        rise = (load - 1.0) * dt  # backlog added a step
        capped = np.minimum(load, hat)
        pw = erlang_c_grid(c, capped)
        theta = 2.0 * rate * (1.0 - capped) / (1.0 + cs2)
        t = np.maximum(wait_s / (1.0 + capped), wait_s - batch_s)
        tail = np.minimum(pw * np.exp(-theta * np.maximum(t, 0.0)), 1.0)  # a bin that never holds a backlog
        busy = (start > 0) | (rise > 0)
        if busy.any():  # each step's middle: B = max(start + j rise, 0) at its edges
            edge = np.maximum(start[busy, None] + steps * rise[busy, None], 0.0)
            mid = 0.5 * (edge[:, :-1] + edge[:, 1:])
            tb, pb, hb = t[busy, None], pw[busy, None], theta[busy, None]
            step = np.where((mid > 0) & (mid >= tb), 1.0, np.minimum(pb * np.exp(-hb * np.maximum(tb - mid, 0.0)), 1.0))
            tail[busy] = step.mean(axis=1)
        return float(share @ tail)

    return _largest_within(missed, 1.0 - q, hat, 30)

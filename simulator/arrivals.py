"""Requests for a simulation: lengths from a trace or from its length distributions, and arrivals.

- `trace`: the trace's own timestamps, compressed by `rate_scale` (2 = twice the request rate);
  lengths are the trace's own, request by request.
- `poisson`: exponential gaps at `rate` req/s; `constant`: gaps of exactly 1 / `rate`.
- `workload`: the workload's own arrival model, fitted to its trace: a Cox process (a Poisson process
  whose rate varies in time; Cox 1955) whose rate in each `PROFILE_BIN_S`-second bin is `rate` times
  the trace's requests in that bin over their mean (`rate_profile`). Bursts keep the trace's time scale
  (a 10-s burst lasts 10 s at any mean rate) and their height relative to the mean; the profile is
  walked from a random bin and wraps around past the trace's end. Bins the trace left empty stay empty.
Lengths are drawn independently from the input and output length distributions (a shipped histogram
has no joint lengths).
"""

from __future__ import annotations

import numpy as np

from simulator.requests import Requests

ARRIVALS = ("poisson", "constant", "trace", "workload")
PROFILE_BIN_S = 10.0  # the rate profile's bin (docs/simulator.md: the Azure traces' 10-s and 60-s window peaks kept)


def rate_profile(arrival_s: np.ndarray, bin_s: float = PROFILE_BIN_S) -> np.ndarray:
    """The trace's requests in each `bin_s`-second bin over their mean (mean 1): its rate over time, relative."""
    t = np.asarray(arrival_s, dtype=float)
    counts = np.bincount(((t - t.min()) // bin_s).astype(int)).astype(float)
    return counts / counts.mean()


def arrivals_ms(
    kind: str, n: int, rate_req_s: float, rng: np.random.Generator, profile: np.ndarray | None = None
) -> np.ndarray:
    if not rate_req_s > 0:
        raise ValueError(f"the request rate must be > 0 req/s, got {rate_req_s}")
    if kind == "poisson":
        return np.cumsum(rng.exponential(1000.0 / rate_req_s, n))
    if kind == "constant":
        return np.arange(1, n + 1) * (1000.0 / rate_req_s)
    if kind == "workload" and profile is not None:
        return modulated_ms(n, rate_req_s, profile, rng)
    raise ValueError(f"arrivals={kind!r}: choose poisson or constant (trace and workload arrivals need a trace's)")


def modulated_ms(n: int, rate_req_s: float, profile: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`n` arrival times (ms) of the Cox process at mean `rate_req_s` over `profile` (`PROFILE_BIN_S` bins)."""
    prof = np.asarray(profile, dtype=float)
    chunks: list[np.ndarray] = []
    got, start, t0 = 0, int(rng.integers(len(prof))), 0.0
    while got < n:
        bins = max(int(1.2 * (n - got) / (rate_req_s * PROFILE_BIN_S)) + 1, 16)
        counts = rng.poisson(rate_req_s * PROFILE_BIN_S * prof[(start + np.arange(bins)) % len(prof)])
        k = int(counts.sum())
        times = t0 + np.repeat(np.arange(bins), counts) * PROFILE_BIN_S + rng.uniform(0.0, PROFILE_BIN_S, k)
        chunks.append(np.sort(times))
        got, start, t0 = got + k, start + bins, t0 + bins * PROFILE_BIN_S
    return np.concatenate(chunks)[:n] * 1000.0


def sampled(
    n: int,
    inputs: tuple[np.ndarray, np.ndarray],
    outputs: tuple[np.ndarray, np.ndarray],
    kind: str,
    rate_req_s: float,
    seed: int,
    profile: np.ndarray | None = None,
) -> Requests:
    """`n` requests with lengths drawn from (values, counts) histograms and `kind` arrivals (`profile`: the
    workload's rate profile, for `workload` arrivals)."""
    rng = np.random.default_rng(seed)
    draw = [np.maximum(rng.choice(v, n, p=c / c.sum()), 1).astype(int) for v, c in (inputs, outputs)]
    return Requests(arrivals_ms(kind, n, rate_req_s, rng, profile), draw[0], draw[1])


def from_trace(
    arrival_s: np.ndarray, input_len: np.ndarray, output_len: np.ndarray, rate_scale: float, n: int | None = None
) -> Requests:
    """The trace's requests in order, its timestamps divided by `rate_scale`."""
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    k = len(arrival_s) if n is None else min(n, len(arrival_s))
    t = (arrival_s[:k] - arrival_s[0]) * 1000.0 / rate_scale
    order = np.argsort(t, kind="stable")
    return Requests(t[order], np.maximum(input_len[:k][order], 1), np.maximum(output_len[:k][order], 1))

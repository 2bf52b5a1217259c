"""Requests for a simulation: lengths from a trace or from its length distributions, and arrivals.

- `trace`: the trace's own timestamps, compressed by `rate_scale` (2 = twice the request rate);
  lengths are the trace's own, request by request.
- `poisson`: exponential gaps at `rate` req/s; `constant`: gaps of exactly 1 / `rate`.
  Lengths are drawn independently from the input and output length distributions (a shipped
  histogram has no joint lengths).
"""

from __future__ import annotations

import numpy as np

from simulator.requests import Requests

ARRIVALS = ("poisson", "constant", "trace")


def arrivals_ms(kind: str, n: int, rate_req_s: float, rng: np.random.Generator) -> np.ndarray:
    if not rate_req_s > 0:
        raise ValueError(f"the request rate must be > 0 req/s, got {rate_req_s}")
    if kind == "poisson":
        return np.cumsum(rng.exponential(1000.0 / rate_req_s, n))
    if kind == "constant":
        return np.arange(1, n + 1) * (1000.0 / rate_req_s)
    raise ValueError(f"arrivals={kind!r}: choose poisson or constant (trace arrivals come with a trace)")


def sampled(
    n: int,
    inputs: tuple[np.ndarray, np.ndarray],
    outputs: tuple[np.ndarray, np.ndarray],
    kind: str,
    rate_req_s: float,
    seed: int,
) -> Requests:
    """`n` requests with lengths drawn from (values, counts) histograms and `kind` arrivals."""
    rng = np.random.default_rng(seed)
    draw = [np.maximum(rng.choice(v, n, p=c / c.sum()), 1).astype(int) for v, c in (inputs, outputs)]
    return Requests(arrivals_ms(kind, n, rate_req_s, rng), draw[0], draw[1])


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

"""Latency and throughput of a finished simulation."""

from __future__ import annotations

import numpy as np

from simulator.core import Simulation


def summary(
    sim: Simulation, warmup_ms: float = 0.0, ttft_slo_ms: float | None = None, tpot_slo_ms: float | None = None
) -> dict[str, float]:
    """TTFT, normalised TTFT (per input token), TPOT, end-to-end latency (mean, p50, p95, p99; ms) of
    the requests that arrived after `warmup_ms`; throughput, and goodput (throughput x the share of
    those requests within both SLOs). Every request must have finished."""
    r = sim.r
    if (r.finish < 0).any():
        raise AssertionError(f"{int((r.finish < 0).sum())} requests never finished")
    keep = r.arrival >= warmup_ms
    ttft = (r.first_token - r.arrival)[keep]
    e2e = (r.finish - r.arrival)[keep]
    decoded = r.output_len[keep] - 1
    tpot = np.where(decoded > 0, (r.finish - r.first_token)[keep] / np.maximum(decoded, 1), 0.0)[decoded > 0]
    # throughput: departures in the second half of the arrival period (the system has filled up by then;
    # an unstable one falls behind its arrivals there), beside the arrivals in the same window
    t0 = float(r.arrival.min() + r.arrival.max()) / 2 if len(r) else 0.0
    t1 = float(r.arrival.max()) if len(r) else 0.0
    window_s = (t1 - t0) / 1e3
    done = (r.finish >= t0) & (r.finish <= t1)
    arrived = (r.arrival >= t0) & (r.arrival <= t1)
    out: dict[str, float] = {
        "requests": float(keep.sum()),
        "offered_req_s": float(arrived.sum()) / window_s if window_s > 0 else 0.0,
        "throughput_req_s": float(done.sum()) / window_s if window_s > 0 else 0.0,
        "output_tok_s": float(r.output_len[done].sum()) / window_s if window_s > 0 else 0.0,
        "preemptions": float(r.preemptions.sum()),
        "kv_peak_fraction": max((e.kv_peak / e.timing.kv_tokens for e in sim.decode), default=0.0),
    }
    tpot_all = np.where(decoded > 0, (r.finish - r.first_token)[keep] / np.maximum(decoded, 1), 0.0)
    good = np.ones(len(ttft), dtype=bool)
    if ttft_slo_ms is not None:
        good &= ttft <= ttft_slo_ms
    if tpot_slo_ms is not None:
        good &= tpot_all <= tpot_slo_ms
    out["slo_attainment"] = float(good.mean()) if len(good) else 0.0
    out["goodput_req_s"] = out["throughput_req_s"] * out["slo_attainment"]
    norm_ttft = ttft / r.input_len[keep]
    for name, xs in (("ttft_ms", ttft), ("norm_ttft_ms_per_tok", norm_ttft), ("tpot_ms", tpot), ("e2e_ms", e2e)):
        if xs.size:
            out[f"{name}_mean"] = float(xs.mean())
            for q in (50, 95, 99):
                out[f"{name}_p{q}"] = float(np.percentile(xs, q))
    return out

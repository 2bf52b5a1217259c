"""Latency and throughput of a finished simulation."""

from __future__ import annotations

import numpy as np

from simulator.core import Simulation


def summary(sim: Simulation, warmup_ms: float = 0.0) -> dict[str, float]:
    """TTFT, TPOT, end-to-end latency (mean, p50, p95, p99; ms) and throughput of the requests
    that arrived after `warmup_ms`; every request must have finished."""
    r = sim.r
    if (r.finish < 0).any():
        raise AssertionError(f"{int((r.finish < 0).sum())} requests never finished")
    keep = r.arrival >= warmup_ms
    ttft = (r.first_token - r.arrival)[keep]
    e2e = (r.finish - r.arrival)[keep]
    decoded = r.output_len[keep] - 1
    tpot = np.where(decoded > 0, (r.finish - r.first_token)[keep] / np.maximum(decoded, 1), 0.0)[decoded > 0]
    # throughput in the window from the warm-up to the last arrival: requests (tokens) finished there
    t1 = float(r.arrival.max()) if len(r) else 0.0
    window_s = (t1 - warmup_ms) / 1e3
    done = (r.finish >= warmup_ms) & (r.finish <= t1)
    out: dict[str, float] = {
        "requests": float(keep.sum()),
        "offered_req_s": float(((r.arrival >= warmup_ms) & (r.arrival <= t1)).sum()) / window_s
        if window_s > 0
        else 0.0,
        "throughput_req_s": float(done.sum()) / window_s if window_s > 0 else 0.0,
        "output_tok_s": float(r.output_len[done].sum()) / window_s if window_s > 0 else 0.0,
        "preemptions": float(r.preemptions.sum()),
        "kv_peak_fraction": max((e.kv_peak / e.timing.kv_tokens for e in sim.decode), default=0.0),
    }
    for name, xs in (("ttft_ms", ttft), ("tpot_ms", tpot), ("e2e_ms", e2e)):
        if xs.size:
            out[f"{name}_mean"] = float(xs.mean())
            for q in (50, 95, 99):
                out[f"{name}_p{q}"] = float(np.percentile(xs, q))
    return out

"""Latency and throughput of a finished simulation."""

from __future__ import annotations

import numpy as np

from simulator.core import Simulation
from simulator.requests import Requests


def summary(
    sim: Simulation,
    warmup_ms: float = 0.0,
    ttft_slo_ms: float | None = None,
    tpot_slo_ms: float | None = None,
    ttft_percentile: float = 99.0,
    tpot_percentile: float = 99.0,
) -> dict[str, float]:
    """TTFT, normalised TTFT (per input token), TPOT, end-to-end latency (mean, p50, p95, p99; ms) of
    the requests that arrived after `warmup_ms`; throughput, and goodput (throughput x the share of
    those requests within both SLOs); TTFT and TPOT at the SLOs' percentiles (`ttft_ms_at_slo`,
    `tpot_ms_at_slo`). Every request must have finished."""
    r = sim.r
    if (r.finish < 0).any():
        raise AssertionError(f"{int((r.finish < 0).sum())} requests never finished")
    keep = r.arrival >= warmup_ms
    ttft = (r.first_token - r.arrival)[keep]
    e2e = (r.finish - r.arrival)[keep]
    decoded = r.output_len[keep] - 1
    tpot = np.where(decoded > 0, (r.finish - r.first_token)[keep] / np.maximum(decoded, 1), 0.0)[decoded > 0]
    # Throughput over the second half of the arrival period, by tokens: a request's decoded tokens
    # are spread evenly between its first token and its finish, so requests still decoding when the
    # window closes count for what they generated in it. Departures alone would lag arrivals by the
    # sojourn time (a 1,000-token answer takes over a minute), which a window of one run cannot hide.
    t0 = float(r.arrival.min() + r.arrival.max()) / 2 if len(r) else 0.0
    t1 = float(r.arrival.max()) if len(r) else 0.0
    window_s = (t1 - t0) / 1e3
    arrived = (r.arrival >= t0) & (r.arrival <= t1)
    span = np.maximum(r.finish - r.first_token, 1e-9)
    inside = np.clip(np.minimum(r.finish, t1) - np.maximum(r.first_token, t0), 0.0, None)
    tokens = (r.output_len - 1) * inside / span + ((r.first_token >= t0) & (r.first_token <= t1))
    mean_out = float(r.output_len.mean()) if len(r) else 0.0
    offered = float(arrived.sum()) / window_s if window_s > 0 else 0.0
    # How far the window's tokens may stray from its requests' mean by chance: the relative standard error of
    # the summed answers of the requests it holds. Heavy-tailed answers make it several % over a few thousand
    # requests (Azure code: 2.6 % over 5,700), the same at every rate of a run with the same seed.
    out_w = r.output_len[arrived]
    noise = float(out_w.std() / out_w.mean() / np.sqrt(len(out_w))) if len(out_w) > 1 else 1.0
    served_tok = float(tokens.sum()) / window_s if window_s > 0 else 0.0
    out: dict[str, float] = {
        "requests": float(keep.sum()),
        "offered_req_s": offered,
        "offered_tok_s": offered * mean_out,
        "output_tok_s": served_tok,
        "throughput_req_s": served_tok / mean_out if mean_out > 0 else 0.0,  # requests' worth of tokens
        "throughput_noise": noise,
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
    out["ttft_ms_at_slo"] = float(np.percentile(ttft, ttft_percentile)) if ttft.size else 0.0
    out["tpot_ms_at_slo"] = float(np.percentile(tpot, tpot_percentile)) if tpot.size else 0.0
    out["window_s"] = window_s
    out["ramp_deficit"] = ramp_deficit(r, t0 - float(r.arrival.min())) if len(r) and t1 > t0 else 0.0
    return out


RAMP_DEFICIT_MAX = 0.01  # a window whose ramp-up may cost throughput more than this is too short
# a window shorter than this many p99 requests is too short: a run that has not filled up measures its requests
# shorter than they take once it has (a decode batch filling for a minute steps faster than a full one), so a window
# just past its own p99 request can still be ramping (16 B200 at 1k/1k: 8 % short over 44 s, 1 % over 175 s)
P99_WINDOWS = 1.5


def ramp_deficit(r: Requests, window_ms: float) -> float:
    """The share of a window's steady-state tokens that a simulation starting empty misses: those that
    requests arriving before its first one would have generated in it, had they taken as long as the
    simulated ones. Throughput is measured over [W, 2W] after the first arrival (W = `window_ms`).
    A request taking e ms from arrival to finish, decoding evenly from its first token, arriving at
    a < 0: its tokens in the window, integrated over a, are (decode rate) x ∫_W^2W max(0, e - x) dx.
    A heavy tail of long answers holds many of the tokens (Azure code: the 1 % longest answers hold
    17 % of them), so this needs a window well past the p99 request. The durations come from the run
    itself, so a run that has not filled up underestimates it, and an overloaded one overestimates it."""
    w = float(window_ms)
    if w <= 0:
        return 1.0
    e = r.finish - r.arrival
    rate = (r.output_len - 1) / np.maximum(r.finish - r.first_token, 1e-9)
    missed = np.where(e <= w, 0.0, np.where(e <= 2 * w, (e - w) ** 2 / 2, w * (e - 1.5 * w)))
    return float((rate * missed).sum() / (w * r.output_len.sum()))


def verdict(m: dict[str, float], ttft_slo_ms: float | None, tpot_slo_ms: float | None, tolerance: float) -> str:
    """ "" when the run sustained its offered rate within the SLOs, else why not. Sustained means:
    throughput keeps up with the offered rate (within `tolerance`, or twice the window's own sampling noise
    where that is larger: `throughput_noise`) and TTFT and TPOT at their SLO percentiles meet their targets.
    `run` and `saturate` of pipeline.simulate both judge by this."""
    why = []
    # short by more than the tolerance, and by more than twice what chance gives a window of these requests
    if m["throughput_req_s"] < (1 - max(tolerance, 2 * m.get("throughput_noise", 0.0))) * m["offered_req_s"]:
        why.append(f"throughput {m['throughput_req_s']:.1f} < offered {m['offered_req_s']:.1f} req/s")
    if ttft_slo_ms is not None and m.get("ttft_ms_at_slo", np.inf) > ttft_slo_ms:
        why.append(f"TTFT {m['ttft_ms_at_slo']:.0f} > {ttft_slo_ms:g} ms")
    if tpot_slo_ms is not None and m.get("tpot_ms_at_slo", np.inf) > tpot_slo_ms:
        why.append(f"TPOT {m['tpot_ms_at_slo']:.1f} > {tpot_slo_ms:g} ms")
    return "; ".join(why)


def steady_state_note(m: dict[str, float]) -> str:
    """A warning when the measuring window is too short for a steady state: shorter than `P99_WINDOWS` x the p99
    request, or short enough that ramping up costs the throughput more than `RAMP_DEFICIT_MAX`."""
    w, p99, ramp = m.get("window_s", 0.0), m.get("e2e_ms_p99", 0.0) / 1e3, m.get("ramp_deficit", 0.0)
    if P99_WINDOWS * p99 > w or ramp > RAMP_DEFICIT_MAX:
        return (
            f"the measuring window ({w:.3g} s of arrivals; the p99 request took {p99:.3g} s) is too short for a "
            f"steady state: starting empty costs its throughput about {ramp:.1%}; simulate more requests"
        )
    return ""


def benchmark_metrics(r: Requests, gpus: int, prefill_gpus: int = 0, decode_gpus: int = 0) -> dict[str, float]:
    """A finished run's metrics as serving benchmarks define them (InferenceX; vLLM's and SGLang's
    `bench_serving`), in their units: per request, TTFT = first token - sent, TPOT = (finish - first
    token) / (output tokens - 1) over requests of more than one token, E2EL = finish - sent, interactivity =
    1 / TPOT; medians, means and p99 over every request (seconds). Throughput over the run (first request sent
    to last finished), per GPU in tokens/s: `tput_per_gpu` all tokens over all `gpus`; input tokens over
    `prefill_gpus` and output tokens over `decode_gpus` where the phases have their own GPUs (else `gpus`).
    `r`: a finished simulation's requests (`Simulation.r`, `AggregatedSimulation.r`)."""
    if (r.finish < 0).any():
        raise AssertionError(f"{int((r.finish < 0).sum())} requests never finished")
    ttft = (r.first_token - r.arrival) / 1e3
    e2el = (r.finish - r.arrival) / 1e3
    many = r.output_len > 1
    tpot = (r.finish - r.first_token)[many] / (r.output_len[many] - 1) / 1e3
    duration_s = float(r.finish.max() - r.arrival.min()) / 1e3
    inputs, outputs = float(r.input_len.sum()), float(r.output_len.sum())
    out = {
        "median_ttft": float(np.median(ttft)),
        "mean_ttft": float(ttft.mean()),
        "p99_ttft": float(np.percentile(ttft, 99)),
        "median_e2el": float(np.median(e2el)),
        "duration_s": duration_s,
        "tput_per_gpu": (inputs + outputs) / duration_s / gpus,
        "input_tput_per_gpu": inputs / duration_s / (prefill_gpus or gpus),
        "output_tput_per_gpu": outputs / duration_s / (decode_gpus or gpus),
    }
    if len(tpot):
        out.update(median_tpot=float(np.median(tpot)), mean_tpot=float(tpot.mean()),
                   p99_tpot=float(np.percentile(tpot, 99)), median_intvty=float(np.median(1.0 / tpot)))  # fmt: skip
    return out

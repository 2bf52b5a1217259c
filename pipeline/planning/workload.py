"""Workloads: a pmf over input length plus decode-length statistics, and its ranges.

A `Workload` is what the planner needs of a request mix (thesis 4.3): p(s) over input length
s = 0..len(pmf)-1, the mean decode length d and the maximum decode length every decode island
must hold. `make_ranges` bins it into ranges of width W (thesis 4.6.3).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.reuse import Reuse
from pipeline.errors import WorkloadError
from pipeline.planning.traces import DATA_DIR, Columns, Trace, load_histogram, load_trace
from simulator.arrivals import rate_profile
from simulator.sessions import SessionModel


@dataclass(frozen=True)
class Workload:
    name: str
    pmf: np.ndarray  # p(s), s = 0 .. len(pmf) - 1 input tokens; sums to 1
    mean_decode: float
    max_decode: int
    arrival_s: np.ndarray | None = None  # request arrival times (s), kept for the simulator
    output_pmf: np.ndarray | None = None  # p(n) over output length n (None: only its mean and maximum are known)
    # its arrival model: the trace's requests per 1-s bin over their mean (simulator.arrivals; None: no trace)
    arrival_profile: np.ndarray | None = None
    spec: str = ""  # its conf/workload mapping as composed (canonical JSON): what plan.json records to rebuild it
    reuse: Reuse | None = None  # its trace's prefix reuse (a trace naming its prompts' blocks; costmodel.reuse) ...
    prefix_trace: Trace | None = None  # ... and that trace, whose requests in order the simulator replays
    sessions: SessionModel | None = None  # a session workload's model: the simulator's requests come from it

    def __post_init__(self) -> None:
        if self.pmf.ndim != 1 or len(self.pmf) == 0 or (self.pmf < 0).any() or not np.isclose(self.pmf.sum(), 1.0):
            raise WorkloadError(f"workload {self.name}: the input-length pmf must be non-negative and sum to 1")
        if not (self.mean_decode >= 1 and self.max_decode >= self.mean_decode):
            raise WorkloadError(
                f"workload {self.name}: `1 <= mean_decode <= max_decode` must hold, "
                f"got mean_decode={self.mean_decode}, max_decode={self.max_decode}"
            )

    @property
    def mean_input(self) -> float:
        return float(np.arange(len(self.pmf)) @ self.pmf)


@dataclass(frozen=True)
class Ranges:
    """Input-length ranges [start, end) with representative length `mid` (the thesis's), mass `p`
    and `mean`, the workload's mean length within each range (`mid` where the range is empty)."""

    start: np.ndarray
    end: np.ndarray
    mid: np.ndarray
    p: np.ndarray
    mean: np.ndarray

    def __len__(self) -> int:
        return len(self.mid)

    def benchmark_lengths(self, slo: bool) -> np.ndarray:
        """The length each range is benchmarked at: with SLOs its mean length (what its requests
        cost, which the queueing caps need), without them the thesis's midpoint (docs/inner.md)."""
        return self.mean if slo else self.mid


MIN_RANGES = 3  # fewer ranges than this leave nothing to route by length


def ranges_from_cfg(w: Workload, width: object, key: str = "ranges.width", most: object = None) -> Ranges:
    """`make_ranges` for a width from a config: a whole number that leaves at least MIN_RANGES ranges; `most`
    (`ranges.max`): at most that many, the width widened where the workload's prompts are long enough to need it."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise WorkloadError(f"`{key} >= 1` (whole number of tokens) must hold, got {key}={width!r}")
    n = len(w.pmf)
    if most is not None:
        if isinstance(most, bool) or not isinstance(most, int) or most < MIN_RANGES:
            raise WorkloadError(f"`ranges.max >= {MIN_RANGES}` (whole number of ranges) must hold, got {most!r}")
        width = max(width, n // (most + 1) + 1)  # then n // width <= most
    if n // width < MIN_RANGES:
        raise WorkloadError(
            f"{key}={width} cuts workload {w.name}'s input lengths 0..{n - 1} into {max(n // width, 1)} range(s); "
            f"routing by length needs at least {MIN_RANGES}: use {key} <= {n // MIN_RANGES}"
        )
    return make_ranges(w, width)


def make_ranges(w: Workload, width: int) -> Ranges:
    """Thesis 4.6.3: ranges k·W .. k·W + W with mid = start + floor(W/2).

    The thesis keeps floor(|S|/W) ranges and so may drop the last few lengths; here the last
    range is widened to the end of the support so every request belongs to a range.
    """
    if not isinstance(width, int) or width < 1:
        raise WorkloadError(f"`ranges.width >= 1` (whole number of tokens) must hold, got {width!r}")
    n = len(w.pmf)
    k = max(n // width, 1)
    start = np.arange(k) * width
    end = np.minimum(start + width, n)
    end[-1] = n
    cum = np.concatenate([[0.0], np.cumsum(w.pmf)])
    p = cum[end] - cum[start]
    mid = np.minimum(start + width // 2, end - 1)
    moment = np.concatenate([[0.0], np.cumsum(w.pmf * np.arange(n))])
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(p > 0, (moment[end] - moment[start]) / p, mid)
    return Ranges(start, end, mid, p, np.clip(np.round(mean), start, end - 1).astype(int))


def synthetic_normal(
    name: str, mu: float, sigma: float, min_len: int, max_len: int, mean_decode: float, max_decode: int
) -> Workload:
    """Normal(mu, sigma) over whole input lengths, truncated to [min_len, max_len], renormalised."""
    if not (sigma > 0 and 0 <= min_len < max_len):
        raise WorkloadError(
            f"workload {name}: `sigma > 0` and `0 <= min_len < max_len` must hold, "
            f"got sigma={sigma}, min_len={min_len}, max_len={max_len}"
        )
    s = np.arange(max_len + 1)
    dens = np.where(s >= min_len, np.exp(-0.5 * ((s - mu) / sigma) ** 2), 0.0)  # the normal pdf, up to a constant
    return Workload(name, dens / dens.sum(), float(mean_decode), int(max_decode))


def synthetic_lognormal(
    name: str, median: float, sigma: float, max_len: int, mean_decode: float, max_decode: int
) -> Workload:
    """Lognormal input length (median, sigma of log), whole lengths 1..max_len, renormalised."""
    if not (median > 0 and sigma > 0 and max_len >= 1):
        raise WorkloadError(f"workload {name}: `median > 0`, `sigma > 0` and `max_len >= 1` must hold")
    s = np.arange(max_len + 1, dtype=float)
    dens = np.zeros_like(s)
    dens[1:] = np.exp(-0.5 * (np.log(s[1:] / median) / sigma) ** 2) / s[1:]  # the lognormal pdf, up to a constant
    return Workload(name, dens / dens.sum(), float(mean_decode), int(max_decode))


def empirical(name: str, lengths: list[int], weights: list[float], mean_decode: float, max_decode: int) -> Workload:
    """Input lengths with given relative weights (any positive numbers)."""
    lv = np.asarray(lengths)
    wv = np.asarray(weights, dtype=float)
    if lv.ndim != 1 or len(lv) == 0 or lv.shape != wv.shape or (lv < 0).any() or (wv < 0).any() or wv.sum() <= 0:
        raise WorkloadError(
            f"workload {name}: `lengths` and `weights` must be equal-length lists of "
            "non-negative numbers with a positive total"
        )
    pmf = np.bincount(lv.astype(int), weights=wv)
    return Workload(name, pmf / pmf.sum(), float(mean_decode), int(max_decode))


def from_counts(
    name: str,
    input_values: np.ndarray,
    input_counts: np.ndarray,
    output_values: np.ndarray,
    output_counts: np.ndarray,
    arrival_s: np.ndarray | None = None,
    arrival_profile: np.ndarray | None = None,
) -> Workload:
    """A workload from per-length request counts (a trace or a shipped histogram); its arrival model from the
    trace's timestamps, or as shipped (`arrival_profile`)."""
    pmf = np.bincount(input_values.astype(int), weights=input_counts.astype(float))
    mean_decode = float(output_values @ output_counts / output_counts.sum())
    out = np.bincount(output_values.astype(int), weights=output_counts.astype(float))
    if arrival_profile is None and arrival_s is not None and len(arrival_s) > 1:
        arrival_profile = rate_profile(arrival_s)
    return Workload(name, pmf / pmf.sum(), mean_decode, int(output_values.max()), arrival_s, out / out.sum(),
                    arrival_profile)  # fmt: skip


def from_trace(trace: Trace, sessions: SessionModel | None = None) -> Workload:
    """A workload of a trace's requests (`sessions`: the model that generated them, which the simulator asks for
    its requests at any rate)."""
    iv, ic = np.unique(trace.input_tokens, return_counts=True)
    ov, oc = np.unique(trace.output_tokens, return_counts=True)
    w = from_counts(trace.name, iv, ic, ov, oc, trace.arrival_s)
    if trace.blocks is None:
        return w
    b = trace.blocks
    reuse = Reuse.of(b.ids, b.start, b.block_tokens, trace.input_tokens, trace.arrival_s, paced=sessions is not None,
                     warmup=WARMUP_SHARE)
    return dataclasses.replace(w, reuse=reuse, prefix_trace=trace, sessions=sessions)


SESSION_RUN = ("rate_req_s", "requests", "seed")  # a session workload's keys beside its model's
WARMUP_SHARE = 0.1  # a trace's first requests that fill the caches uncounted (as SimSettings.warmup_fraction)


def from_sessions(name: str, cfg: Mapping[str, Any], where: str) -> Workload:
    """A `kind: sessions` workload (`simulator.sessions`): its model's parameters, and `requests` generated at
    `rate_req_s` (seed `seed`) for the planner's length statistics and reuse; the simulator generates its own."""
    keys = SessionModel.keys()
    unknown = sorted(set(cfg) - set(keys) - set(SESSION_RUN) - {"kind"})
    if unknown:
        raise WorkloadError(f"{where}: unknown session key(s) {unknown}; a session workload takes "
                            f"{list(SESSION_RUN) + list(keys)}")  # fmt: skip
    rate, n, seed = cfg.get("rate_req_s"), cfg.get("requests", 12_000), cfg.get("seed", 0)
    whole = (int,)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not (math.isfinite(rate) and rate > 0):
        raise WorkloadError(f"{where}: `rate_req_s` must be a rate > 0 req/s (the requests' own), got {rate!r}")
    if isinstance(n, bool) or not isinstance(n, whole) or not 2 <= n <= 1_000_000:
        raise WorkloadError(f"{where}: `requests` must be a whole number 2..1,000,000, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, whole):
        raise WorkloadError(f"{where}: `seed` must be a whole number, got {seed!r}")
    given = {k: cfg[k] for k in keys if cfg.get(k) is not None}
    missing = [k for k in ("turns_mean", "think_s", "first_tokens", "growth_tokens", "output_tokens", "max_tokens")
               if k not in given]
    if missing:
        raise WorkloadError(f"{where}: missing field(s) {missing} of the session model")
    try:
        model = SessionModel(**{k: tuple(v) if isinstance(v, list | tuple) else v for k, v in given.items()})
        r = model.requests(int(n), float(rate), int(seed))  # type: ignore[arg-type]
    except (TypeError, ValueError) as err:
        raise WorkloadError(f"{where}: {err}") from None
    trace = Trace(name, where, r.input_len, r.output_len, r.arrival / 1000.0, r.blocks)
    w = from_trace(trace, model)
    assert w.reuse is not None  # (a session workload names its blocks) its warm-up turns are not counted
    return dataclasses.replace(w, reuse=dataclasses.replace(w.reuse, counted_from=r.warm + int((len(r) - r.warm)
                                                                                                * WARMUP_SHARE)))


def _need(cfg: Mapping[str, Any], keys: tuple[str, ...], where: str) -> list[Any]:
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise WorkloadError(f"{where}: missing field(s) {missing}")
    return [cfg[k] for k in keys]


def workload_from_cfg(name: str, cfg: Mapping[str, Any]) -> Workload:
    """Build a workload from its `conf/workload/<name>.yaml` mapping (already plain Python), carrying it."""
    w = _from_cfg(name, cfg)
    return dataclasses.replace(w, spec=json.dumps(cfg, sort_keys=True, default=str))


def _from_cfg(name: str, cfg: Mapping[str, Any]) -> Workload:
    where = f"conf/workload/{name}.yaml (or its overrides)"
    kind, dist = cfg.get("kind"), cfg.get("dist")
    if kind == "synthetic" and dist == "normal":
        return synthetic_normal(
            name, *_need(cfg, ("mu", "sigma", "min_len", "max_len", "mean_decode", "max_decode"), where)
        )
    if kind == "synthetic" and dist == "lognormal":
        return synthetic_lognormal(
            name, *_need(cfg, ("median", "sigma", "max_len", "mean_decode", "max_decode"), where)
        )
    if kind == "synthetic" and dist == "empirical":
        return empirical(name, *_need(cfg, ("lengths", "weights", "mean_decode", "max_decode"), where))
    if kind == "histogram":
        (hist,) = _need(cfg, ("histogram",), where)
        h = load_histogram(str(hist))
        return from_counts(name, h["input_values"], h["input_counts"], h["output_values"], h["output_counts"],
                           arrival_profile=h.get("arrival_profile"))  # fmt: skip
    if kind == "trace":
        return from_trace(trace_from_cfg(name, cfg))
    if kind == "sessions":
        return from_sessions(name, cfg, where)
    raise WorkloadError(
        f"{where}: unsupported workload kind={kind!r} dist={dist!r}; valid: kind=synthetic with "
        "dist normal|lognormal|empirical, kind=histogram, kind=trace, kind=sessions"
    )


def trace_from_cfg(name: str, cfg: Mapping[str, Any]) -> Trace:
    """The trace a `kind: trace` workload names (`path`, `format`, optional `columns`), loaded and checked."""
    where = f"conf/workload/{name}.yaml (or its overrides)"
    (path,) = _need(cfg, ("path",), where)
    cols = cfg.get("columns")
    columns = None
    if cols:
        if not isinstance(cols, Mapping) or not {"input", "output"} <= set(cols):
            raise WorkloadError(
                f"{where}: `columns` must map input and output (and optionally timestamp, "
                "timestamp_kind) to column names"
            )
        columns = Columns(**{k: cols[k] for k in ("input", "output", "timestamp", "timestamp_kind") if k in cols})
    path = Path(str(path))
    if not path.is_absolute() and not path.exists() and (DATA_DIR / path).is_file():
        path = DATA_DIR / path  # a trace this project ships (pipeline/data)
    return load_trace(path, str(cfg.get("format", "auto")), columns, name)

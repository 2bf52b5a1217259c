"""Workloads: a pmf over input length plus decode-length statistics, and its ranges.

A `Workload` is what the planner needs of a request mix (thesis 4.3): p(s) over input length
s = 0..len(pmf)-1, the mean decode length d and the maximum decode length every decode island
must hold. `make_ranges` bins it into ranges of width W (thesis 4.6.3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import norm


class WorkloadError(ValueError):
    """A workload description or trace that cannot be used; the message says what and where."""


@dataclass(frozen=True)
class Workload:
    name: str
    pmf: np.ndarray  # p(s), s = 0 .. len(pmf) - 1 input tokens; sums to 1
    mean_decode: float
    max_decode: int

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
    """Input-length ranges [start, end) with representative length `mid` and mass `p`."""

    start: np.ndarray
    end: np.ndarray
    mid: np.ndarray
    p: np.ndarray

    def __len__(self) -> int:
        return len(self.mid)


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
    return Ranges(start, end, mid, p)


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
    dens = np.where(s >= min_len, norm.pdf(s, loc=mu, scale=sigma), 0.0)
    return Workload(name, dens / dens.sum(), float(mean_decode), int(max_decode))


def workload_from_cfg(name: str, cfg: Mapping[str, Any]) -> Workload:
    """Build a workload from its `conf/workload/<name>.yaml` mapping."""
    kind = cfg.get("kind")
    if kind == "synthetic" and cfg.get("dist") == "normal":
        keys = ("mu", "sigma", "min_len", "max_len", "mean_decode", "max_decode")
        missing = [k for k in keys if k not in cfg]
        if missing:
            raise WorkloadError(f"conf/workload/{name}.yaml: missing field(s) {missing}")
        return synthetic_normal(name, *(cfg[k] for k in keys))
    raise WorkloadError(
        f"conf/workload/{name}.yaml: unsupported workload kind={kind!r} dist={cfg.get('dist')!r}; "
        "valid: kind=synthetic with dist=normal"
    )

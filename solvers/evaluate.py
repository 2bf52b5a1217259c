"""Evaluator (thesis 5.2.2): re-score an inner solution at full input-length resolution.

The plan routes range j's traffic to islands in proportion to the capacity it gave them,
share_ij = b_ij x_ij / Σ_k b_kj x_kj (b at the range's representative length). A request of
length s occupies island i for 1 / b_i(s) of its time, so at total rate Λ island i is busy

    load_i(Λ) = Λ · Σ_j share_ij · Σ_{s in j} p(s) / b_i(s)

and the plan sustains Λ_eval = 1 / max_i Σ_j share_ij Σ_{s in j} p(s) / b_i(s) (per phase; the
plan's rate is the smaller of the two). With b_i(s) = b_ij for every s in j this is exactly the
solver's Λ, so the gap between the two measures the range approximation alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Evaluation:
    rate_req_s: float  # min over phases of the sustainable rate at full resolution
    prefill_req_s: float
    decode_req_s: float
    island_load: np.ndarray  # (I,) busy fraction of each island at rate_req_s
    served_req_s: np.ndarray  # (L,) requests/s of each length at rate_req_s (= rate · p(s))


@dataclass(frozen=True)
class PhaseRouting:
    """One phase of a routing and its islands' throughput: at the ranges' lengths (the solver's) and at each."""

    x: np.ndarray  # (I, J) routing
    mid_req_s: np.ndarray  # (I, J) throughput the solver used
    by_length_req_s: np.ndarray  # (I, L) exact throughput of each island at each length


def evaluate(
    prefill: PhaseRouting, decode: PhaseRouting, range_of_length: np.ndarray, p_length: np.ndarray
) -> Evaluation:
    """Sustainable rate of a routing when every length is costed at its own throughput.

    range_of_length: (L,) range index of each length; p_length: (L,) mass of each length.
    """
    rates, loads = [], []
    for x, mid, exact in ((ph.x, ph.mid_req_s, ph.by_length_req_s) for ph in (prefill, decode)):
        cap = mid * x  # (I, J) planned capacity
        tot = cap.sum(axis=0)
        share = np.divide(cap, tot, out=np.zeros_like(cap), where=tot > 0)  # (I, J)
        share_l = share[:, range_of_length]  # (I, L)
        with np.errstate(divide="ignore"):
            inv = np.where(share_l > 0, p_length / np.where(exact > 0, exact, 0.0), 0.0)  # s/request per unit Λ
        work = (share_l * inv).sum(axis=1)  # (I,) busy time per unit of Λ
        unserved = ((share_l.sum(axis=0) == 0) & (p_length > 0)).any()
        worst = work.max() if work.size else np.inf
        rate = 0.0 if unserved or not np.isfinite(worst) or worst <= 0 else 1.0 / worst
        rates.append(rate)
        loads.append(work)
    rate = min(rates)
    return Evaluation(rate, rates[0], rates[1], np.maximum(loads[0], loads[1]) * rate, rate * p_length)

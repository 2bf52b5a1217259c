"""Role search: a better role split for max_rate when its MILP runs out of time.

With every island's role fixed, max_rate falls apart into one LP per phase: P(u) is the largest
Λ that u_c prefill islands of each class c serve (capacity rows Σ_j x_cj <= u_c, and with KV
transfer Σ_j b_cj k_j x_cj <= u_c L_c), D(u') the same for the decode islands, and the layout's
rate is min(P, D). The search moves one island of a class from one role to the other, or swaps
one of each, and takes the first move that improves the rate, until none does.

Which move to try first comes from the phases' LP duals, and they bound every move from above.
At range prices w (the demand rows' duals, Σ_j w_j p_j = 1) the dual objective is Σ_c u_c v_c,
with v_c the island value (its capacity and KV rows' duals, μ_c + κ_c L_c); it equals P. The
duals stay feasible when u changes, so:
- one island of class c more: P' <= P + max_j w_j b_cj (what the island could earn at w; KV
  rows only lower it);
- one island of class c fewer: P' <= P − v_c.
So min of the two phases' bounds bounds a move's rate. Moves are tried in the order of their
bounds (the prefill LP first, the decode LP only if the move survives it); once a bound is no
better than the current rate no move left can improve it, and the split is a local optimum.

Each phase is one GLOP model, re-solved from its last basis after a capacity row's bound changes
(a few ms on 64 islands × 32 ranges).
"""

from __future__ import annotations

import time

import numpy as np
from ortools.linear_solver import pywraplp
from ortools.linear_solver.python import model_builder as mb
from scipy.sparse import csr_matrix

_IMPROVES = 1 + 1e-9  # a move must beat the current rate by more than LP noise


def phase_model(b: np.ndarray, p: np.ndarray, u: np.ndarray, kv: np.ndarray | None,
                link: np.ndarray | None) -> mb.Model:  # fmt: skip
    """One phase's LP, max Λ: Σ_c b_cj x_cj >= Λ p_j ∀ j, Σ_j x_cj <= u_c ∀ c and, with `kv` and
    `link`, Σ_j b_cj kv_j x_cj <= u_c link_c ∀ c. Columns x[c, j] row-major, then Λ; rows the demands,
    the capacities, then the KV rows."""
    n_c, n_j = b.shape
    cj = n_c * n_j
    cc, jj = np.meshgrid(np.arange(n_c), np.arange(n_j), indexing="ij")
    rows = [jj.ravel(), np.arange(n_j), n_j + cc.ravel()]
    cols = [np.arange(cj), np.full(n_j, cj), np.arange(cj)]
    vals = [b.ravel(), -p, np.ones(cj)]
    row_ub = [np.full(n_j, np.inf), u.astype(float)]
    if kv is not None and link is not None:
        rows.append(n_j + n_c + cc.ravel())
        cols.append(np.arange(cj))
        vals.append((b * kv[None, :]).ravel())
        row_ub.append(u * link)
    n_row = n_j + n_c * (2 if kv is not None and link is not None else 1)
    matrix = csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n_row, cj + 1))
    lb, ub = np.zeros(cj + 1), np.where(np.append(b.ravel() > 0, True), np.inf, 0.0)
    row_lb = np.concatenate([np.zeros(n_j), np.full(n_row - n_j, -np.inf)])
    objective = np.zeros(cj + 1)
    objective[cj] = 1.0
    model = mb.Model()
    model.helper.fill_model_from_sparse_data(lb, ub, objective, row_lb, np.concatenate(row_ub), matrix)
    model.helper.set_maximize(True)
    return model


class Phase:
    """One phase's LP over all classes; u_c of class c's islands take part."""

    def __init__(self, b: np.ndarray, p: np.ndarray, u: np.ndarray, kv: np.ndarray | None, link: np.ndarray | None):
        n_c, n_j = b.shape
        self.b, self.link = b, link
        model = phase_model(b, p, u, kv, link)
        self.solver = pywraplp.Solver.CreateSolver("GLOP")
        error = self.solver.LoadModelFromProto(model.export_to_proto())
        if error:
            raise RuntimeError(f"role search could not load a phase LP: {error}")
        rows_ = self.solver.constraints()
        self.demand, self.cap = rows_[:n_j], rows_[n_j : n_j + n_c]
        self.kv = rows_[n_j + n_c :]  # empty without KV rows
        self.lam = self.solver.variables()[n_c * n_j]
        self.rate = self.solve()

    def set(self, c: int, u: float) -> None:
        self.solved = False
        self.cap[c].SetUb(u)
        if self.kv:
            self.kv[c].SetUb(u * float(self.link[c]))  # type: ignore[index]

    def solve(self) -> float:
        code = self.solver.Solve()
        if code != pywraplp.Solver.OPTIMAL:
            raise RuntimeError(f"role search: a phase LP ended with status {code}")
        self.solved = True
        return float(self.lam.solution_value())

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per class: the most one more island adds to the rate, and the least one fewer takes off.
        (From the duals of the last solve, so only of the roles it was solved with.)"""
        if not self.solved:
            raise RuntimeError("role search: a phase's duals were read after its roles changed; solve first")
        w = np.abs([c.dual_value() for c in self.demand])
        gain = (self.b * w[None, :]).max(axis=1)
        loss = np.abs([c.dual_value() for c in self.cap])
        if self.kv:
            loss = loss + np.abs([c.dual_value() for c in self.kv]) * self.link
        return gain, loss


def improve(
    bp: np.ndarray,
    bd: np.ndarray,
    p: np.ndarray,
    m: np.ndarray,
    decode: np.ndarray,
    *,
    kv_gb: np.ndarray | None = None,
    link_gb_s: np.ndarray | None = None,
    budget_s: float = 0.5,
) -> tuple[np.ndarray, float]:
    """The decode count per class the search reaches from `decode`, and its rate.

    `m` islands per class, `decode` of them decoding (the rest prefill); stops at a local optimum
    or after `budget_s` (the split it holds then is returned)."""
    t0 = time.perf_counter()
    d = np.asarray(decode, dtype=int).copy()
    m = np.asarray(m, dtype=int)
    pre = Phase(bp, p, m - d, kv_gb, link_gb_s)
    dec = Phase(bd, p, d, kv_gb, link_gb_s)
    while time.perf_counter() - t0 < budget_s:
        rate = min(pre.rate, dec.rate)
        move = _next_move(pre, dec, m, d, rate, t0 + budget_s)
        if move is None:
            break
        _apply(pre, dec, m, d, move)
        pre.rate, dec.rate = pre.solve(), dec.solve()
    return d, min(pre.rate, dec.rate)


def _next_move(pre: Phase, dec: Phase, m: np.ndarray, d: np.ndarray, rate: float, deadline: float) -> dict | None:
    """The first move (class → change in its decode count), in the order of the bounds, whose rate
    beats `rate`; None when no move's bound does (a local optimum) or at the deadline."""
    gain_p, loss_p = pre.bounds()
    gain_d, loss_d = dec.bounds()
    P, D = pre.rate, dec.rate
    to_p = np.flatnonzero(d > 0)  # classes with a decode island that could prefill
    to_d = np.flatnonzero(m - d > 0)
    # bounds: a moves decode -> prefill, b prefill -> decode, or both (a swap)
    cands = [(min(P + gain_p[a], D - loss_d[a]), {a: -1}) for a in to_p]
    cands += [(min(P - loss_p[b], D + gain_d[b]), {b: 1}) for b in to_d]
    swap = np.minimum(
        P + gain_p[to_p][:, None] - loss_p[to_d][None, :], D - loss_d[to_p][:, None] + gain_d[to_d][None, :]
    )
    ia, ib = np.nonzero(swap > rate * _IMPROVES)
    cands += [(swap[x, y], {to_p[x]: -1, to_d[y]: 1}) for x, y in zip(ia, ib, strict=True) if to_p[x] != to_d[y]]
    cands.sort(key=lambda c: -c[0])
    beat = rate * _IMPROVES
    for bound, move in cands:
        if bound <= beat or time.perf_counter() > deadline:
            break
        _apply(pre, dec, m, d, move)
        got = pre.solve()
        if got > beat:  # the decode LP only when the prefill side alone does not rule the move out
            got = min(got, dec.solve())
        _apply(pre, dec, m, d, {c: -k for c, k in move.items()})
        if got > beat:
            return move
    return None


def _apply(pre: Phase, dec: Phase, m: np.ndarray, d: np.ndarray, move: dict) -> None:
    for c, k in move.items():
        d[c] += k
        pre.set(c, float(m[c] - d[c]))
        dec.set(c, float(d[c]))

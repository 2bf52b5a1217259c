"""Roles that keep the most when islands are lost: the max_rate model over loss scenarios (search.spare_hosts).

An engine's role is fixed when it is launched; when a host fails, the router can only re-route over the
islands left. So the roles of a layout that must survive losses are chosen once for every scenario, and the
routing per scenario. Scenarios s are sets of islands D_s that stop together (the islands on K lost hosts).
Per island i a binary d_i (1: decode, 0: prefill); per scenario routing x^{P,s}_ij, x^{D,s}_ij of the islands
up in it (`inner.py`'s notation):

    max Λ
    (1) Σ_i b^P_ij x^{P,s}_ij >= Λ p_j      ∀ s, j   every scenario prefills Λ p_j of range j
    (2) Σ_i b^D_ij x^{D,s}_ij >= Λ p_j      ∀ s, j   and decodes it
    (3) Σ_j x^{P,s}_ij <= 1 − d_i,  Σ_j x^{D,s}_ij <= d_i   ∀ s, i
        x^{P,s}_ij = x^{D,s}_ij = 0 for i in D_s

Λ is then the lowest rate over the scenarios, for the roles that make it highest: what a layout is worth with
its worst K hosts gone. Islands are not merged into classes as `inner.py` merges them: the scenarios tell
identical islands apart. Prefill and decode roles only (no aggregated or idle islands, no budget or KV cap).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from solvers.inner import Rows, _solve_matrix, maximising


@dataclass(frozen=True)
class SpareRoles:
    status: str  # optimal | feasible | infeasible | time_limit
    rate_req_s: float  # the lowest rate over the scenarios (0 without a solution)
    roles: tuple[str, ...]  # "prefill" | "decode" per island
    solve_ms: float


def spare_roles(
    prefill_req_s: np.ndarray,
    decode_req_s: np.ndarray,
    p: np.ndarray,
    scenarios: Sequence[Collection[int]],
    time_limit_s: float = 10.0,
    backend: str = "AUTO",
    fixed: Sequence[str | None] | None = None,
) -> SpareRoles:
    """The roles maximising the lowest rate over `scenarios` (each: the islands that stop), and that rate.

    `prefill_req_s`, `decode_req_s`: (I, J) req/s of each island on each range in each role; `p`: range masses.
    No scenario: the plain max_rate of the layout (every island up). `fixed`: per island a role it keeps
    ("prefill" or "decode", as its running engine) or None (the solve chooses): a re-plan's kept islands."""
    t0 = time.perf_counter()
    bp, bd = np.asarray(prefill_req_s, dtype=float), np.asarray(decode_req_s, dtype=float)
    n_i, n_j = bp.shape
    scen = [frozenset(s) for s in scenarios] or [frozenset()]
    n_s, ij = len(scen), n_i * n_j
    col_lam = n_i + 2 * n_s * ij
    n_col = col_lam + 1
    lb, ub = np.zeros(n_col), np.zeros(n_col)
    ub[:n_i] = 1.0
    for i, role in enumerate(fixed or ()):
        if role is not None:
            lb[i] = ub[i] = 1.0 if role == "decode" else 0.0
    ub[col_lam] = np.inf
    ii, jj = np.meshgrid(np.arange(n_i), np.arange(n_j), indexing="ij")
    rows = Rows()
    for k, down in enumerate(scen):
        up = np.ones(n_i, dtype=bool)
        up[list(down)] = False
        base = n_i + 2 * k * ij
        xp, xd = base + ii * n_j + jj, base + ij + ii * n_j + jj
        ub[xp.ravel()] = np.where((bp > 0) & up[:, None], 1.0, 0.0).ravel()
        ub[xd.ravel()] = np.where((bd > 0) & up[:, None], 1.0, 0.0).ravel()
        for b, x in ((bp, xp), (bd, xd)):  # (1), (2): Σ_i b_ij x_ij − p_j Λ >= 0
            rows.add(jj, x, b)
            rows.add(np.arange(n_j), np.full(n_j, col_lam), -p)
            rows.close(n_j, 0.0, np.inf)
        # (3) prefill: Σ_j x^P_ij + d_i <= 1; decode: Σ_j x^D_ij − d_i <= 0
        for x, sign, hi in ((xp, 1.0, 1.0), (xd, -1.0, 0.0)):
            rows.add(ii, x, 1.0)
            rows.add(np.arange(n_i), np.arange(n_i), sign)
            rows.close(n_i, -np.inf, hi)
    model = maximising(col_lam, lb, ub, rows)
    for i in range(n_i):
        model.helper.set_var_integrality(i, True)
    status, x = _solve_matrix(model, backend, time_limit_s)
    ms = (time.perf_counter() - t0) * 1e3
    if status in ("infeasible", "time_limit"):
        return SpareRoles(status, 0.0, ("prefill",) * n_i, ms)
    roles = tuple("decode" if v > 0.5 else "prefill" for v in x[:n_i])
    return SpareRoles(status, max(float(x[col_lam]), 0.0) + 0.0, roles, ms)  # (+ 0.0: no -0.0)

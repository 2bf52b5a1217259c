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
its worst K hosts gone. Prefill and decode roles only (no aggregated or idle islands, no budget or KV cap).

Where every scenario stops one island (one host lost, no host shared by two islands: the default island shapes),
identical islands are interchangeable, and the model is solved over their classes c (m_c islands with the same
rates, the same kept role and a scenario each) instead. z_ck = [c runs k decode islands], k = 0..m_c, one per
class (Σ_k z_ck = 1: each class's choices as their own hull). By symmetry the only scenarios are "one prefill
island of c lost" and "one decode island of c lost"; a prefill island lost changes prefill's routing only, so
each scenario routes the role it loses from (the other role's routing is the one with every island up, which
the scenarios losing from it bound already), and (3) becomes, per scenario s and class c,

    prefill: Σ_j x^s_cj <= Σ_k (m_c − k − [s loses a prefill island of c and m_c − k >= 1]) z_ck
    decode:  Σ_j x^s_cj <= Σ_k (k − [s loses a decode island of c and k >= 1]) z_ck

(a scenario whose role the class does not run loses nothing). Identical islands' routing adds up to the class's
(and splits back evenly), so the optimum is the per-island model's, with 2 C routings of one role over C classes
in place of I scenarios of both roles over I islands (`by_class`; tests/test_failures.py checks the two agree,
and both against brute force). With no island lost (a re-plan scores its states so) every class is one no scenario
stops, and its two halves route each role with every island up: the plain max_rate of the roles, by classes too.

Its integer part is small (the main job's layouts: 720 combinations of decode counts at the median), and each half
given the counts is an LP whose dual solutions bound it at every count. So `by_cuts` solves it without a MILP: it
bounds every combination at once by the duals found so far, solves the halves' routing LPs (GLOP) at the best-bounded
one and adds their duals, until that combination's rate meets its bound (three to four rounds; 2.4 s against
SCIP's 18.6 s on the 167 distinct layouts of the main job's search, the same optima and roles). Beyond `CUT_COUNTS`
combinations the class MILP (SCIP) solves it.

A host may hold several alike islands (a small model's 4-GPU islands, two a host): where every scenario stops n
islands of one class (u_c = m_c / n units of c), a class running k decode islands spreads them evenly over its
units, floor(k / u_c) or ceil(k / u_c) a unit. A scenario changes each role's routing by the islands of that role it
stops, so the prefill half takes the most prefill islands any scenario of c stops, n - floor(k / u_c), and the
decode half the most decode ones, ceil(k / u_c); no other spread stops fewer of either, and with n = 1 these are the
indicators above.

A host may hold unlike islands too (a small model's islands of 1, 2 and 4 GPUs side by side). Where every scenario
stops the islands of one host and no island is in two scenarios, hosts of the same make-up (how many islands of each
class they hold: their type h, u_h hosts) are interchangeable, and so are those of one type running the same roles
(their configuration k: d_kc decode islands of each class c, the rest prefill). The model then counts the hosts of
each type in each configuration, y_hk (Σ_k y_hk = u_h), with z_hk = [y_hk >= 1] (y_hk <= u_h z_hk), and routes each
role once per configuration (`by_host`):

    prefill: Σ_j x^{hk}_cj <= P_c − (a_hc − d_kc) z_hk,   decode: Σ_j x^{hk}_cj <= D_c − d_kc z_hk
    D_c = w_c + Σ_hk y_hk d_kc,   P_c = m_c − D_c

(a_hc: the islands of c such a host holds; w_c: the decode islands among those of c no scenario stops). A
configuration no host runs (z_hk = 0) routes with every island up, which the others bound already, so the model
holds exactly the scenarios some host runs, as the per-island model does, with a routing per configuration in place
of one per host (alike islands stopping in unequal numbers are hosts of two types). Where a scenario stops islands
another one stops too (several hosts lost, an island across hosts), the first model solves it island by island
(`by_island`).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver.python import model_builder as mb

from solvers.inner import SCIP_PARAMETERS, Rows, _solve_matrix, maximising

# SCIP on the class model: the inner models' settings, and branching on pseudo-costs from the start, the primal
# simplex and no presolve, since its LP (a routing per loss scenario) is most of the time and strong branching
# solves it again per candidate: 20-30 % faster on the main job's layouts than the inner models' settings, and
# without presolve another 19 % (the 157 distinct layouts of the main job's search: 13.1 s against 16.1 s), the
# same optima
CLASS_SCIP = SCIP_PARAMETERS + "\nbranching/pscost/priority = 1000000\nlp/initalgorithm = p\npresolving/maxrounds = 0"


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
    scen = [frozenset(s) for s in scenarios] or [frozenset()]
    solve = by_class if _units(bp, bd, scen, fixed) is not None else by_host if _one_host_each(scen) else by_island
    return solve(bp, bd, np.asarray(p, dtype=float), scen, time_limit_s=time_limit_s, backend=backend, fixed=fixed,
                 t0=t0)  # fmt: skip


def by_island(
    bp: np.ndarray,
    bd: np.ndarray,
    p: np.ndarray,
    scen: Sequence[frozenset[int]],
    *,
    time_limit_s: float,
    backend: str,
    fixed: Sequence[str | None] | None,
    t0: float,
) -> SpareRoles:
    """The module's model over every island and scenario as given."""
    n_i, n_j = bp.shape
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
    return _answer(status, x, col_lam, n_i, t0, lambda: ["decode" if v > 0.5 else "prefill" for v in x[:n_i]])


def _answer(
    status: str, x: np.ndarray, col_lam: int, n_i: int, t0: float, roles: Callable[[], list[str]]
) -> SpareRoles:
    """The solve's result: its Λ and `roles()` of the solution, or none (every island prefill, 0 req/s)."""
    ms = (time.perf_counter() - t0) * 1e3
    if status in ("infeasible", "time_limit"):
        return SpareRoles(status, 0.0, ("prefill",) * n_i, ms)
    return SpareRoles(status, max(float(x[col_lam]), 0.0) + 0.0, tuple(roles()), ms)  # (+ 0.0: no -0.0)


def _class_keys(bp: np.ndarray, bd: np.ndarray,
                fixed: Sequence[str | None] | None) -> list[tuple[bytes, bytes, str | None]]:  # fmt: skip
    """Each island's class: its rates in both roles and the role it keeps (None: the solve chooses)."""
    kept = list(fixed) if fixed is not None else [None] * bp.shape[0]
    return [(bp[i].tobytes(), bd[i].tobytes(), kept[i]) for i in range(bp.shape[0])]


def _units(bp: np.ndarray, bd: np.ndarray, scen: Sequence[frozenset[int]],
           fixed: Sequence[str | None] | None) -> dict[int, int] | None:  # fmt: skip
    """Each island's scenario where the class model holds (every scenario stops islands of one class only, with the
    same rates and kept role, no island is in two scenarios, and every scenario of a class stops as many: one host
    lost, each host's islands alike), else None."""
    key_of = _class_keys(bp, bd, fixed)
    at: dict[int, int] = {}
    size: dict[tuple[bytes, bytes, str | None], int] = {}
    seen: set[frozenset[int]] = set()
    for k, down in enumerate(scen):
        if not down:  # nothing lost: every island up, which any scenario losing some bounds already (or, alone,
            continue  # the model's halves with every island up: the plain max_rate of the roles)
        if down in seen:  # the same islands again: the same scenario
            continue
        seen.add(down)
        keys = {key_of[i] for i in down}
        if len(keys) != 1 or any(i in at for i in down) or size.setdefault(keys.pop(), len(down)) != len(down):
            return None
        at.update((i, k) for i in down)
    return at


@dataclass(frozen=True)
class _Classes:
    """Identical islands merged: per class its islands (grouped by the scenario that stops them), rates and kept
    role, and the loss halves of the model."""

    islands: list[list[int]]
    units: list[list[list[int]]]  # per class its islands that stop together (one scenario's), [] if never lost
    cp: np.ndarray  # (C, J) prefill req/s of one island of each class
    cd: np.ndarray  # ... and decode
    m: np.ndarray  # islands per class
    n: np.ndarray  # islands one scenario stops, per class (0: never lost)
    kept: list[str | None]  # a role every island of the class keeps (None: the solve chooses)
    halves: list[tuple[int, str, str]]  # (class lost, its role, the role routed) per half; (-1, "", r): every island up
    p: np.ndarray

    @property
    def first(self) -> np.ndarray:  # z_ck's first column per class, and the end
        return _hull(self.m)[0]

    @staticmethod
    def of(bp: np.ndarray, bd: np.ndarray, p: np.ndarray, scen: Sequence[frozenset[int]],
           fixed: Sequence[str | None] | None) -> _Classes:  # fmt: skip
        at = _units(bp, bd, scen, fixed)
        assert at is not None, "by_class needs scenarios of alike islands, one scenario an island"
        key_of = _class_keys(bp, bd, fixed)
        members: dict[tuple[bytes, bytes, str | None, int], dict[int, list[int]]] = {}
        for i in range(bp.shape[0]):  # (islands never lost: a unit each, of size 0)
            n = len(scen[at[i]]) if i in at else 0
            members.setdefault((*key_of[i], n), {}).setdefault(at.get(i, -1 - i), []).append(i)
        units = [list(us.values()) if key[3] else [] for key, us in members.items()]
        islands = [[i for u in us.values() for i in u] for us in members.values()]
        # scenarios: (class, role lost) for every class whose islands can be lost; none: every island up. A scenario
        # changes prefill's routing by the prefill islands it stops and decode's by the decode ones, independently:
        # each half routes one role, with the most of it any scenario of the class stops (every island up: both)
        losses = [(c, r) for c, key in enumerate(members) if key[3] for r in ("prefill", "decode")] or [(-1, "")]
        halves = [(c, r, half) for c, r in losses for half in ("prefill", "decode") if r in ("", half)]
        first = [c[0] for c in islands]
        return _Classes(islands, units, bp[first], bd[first], np.array([len(c) for c in islands], dtype=float),
                        np.array([key[3] for key in members], dtype=float), [key[2] for key in members], halves,
                        p)  # fmt: skip


def _hull(m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The one-hot columns z_ck, k = 0..m_c, of classes of m_c islands each: every class's first column (and the
    end), and each column's class c and count k."""
    counts = np.asarray(m, dtype=int)
    first = np.concatenate([[0], np.cumsum(counts + 1)]).astype(int)
    zc = np.repeat(np.arange(len(counts)), counts + 1)
    zk = (np.arange(first[-1]) - first[zc]).astype(float)
    return first, zc, zk


def _class_model(k: _Classes) -> tuple[mb.Model, int]:
    """The class model over every loss half, and its Λ column."""
    n_c, n_j = k.cp.shape
    cj, first = n_c * n_j, k.first
    # z_ck = [class c runs k decode islands], k = 0..m_c, one per class: each class's choices as its own hull
    col_x = int(first[-1])
    col_lam = col_x + len(k.halves) * cj
    lb, ub = np.zeros(col_lam + 1), np.zeros(col_lam + 1)
    ub[:col_x] = 1.0
    for c, role in enumerate(k.kept):
        if role is not None:  # a kept role: every island of the class in it
            ub[first[c]:first[c + 1]] = 0.0
            ub[first[c] + (int(k.m[c]) if role == "decode" else 0)] = 1.0
    ub[col_lam] = np.inf
    cc, jj = np.meshgrid(np.arange(n_c), np.arange(n_j), indexing="ij")
    _, zc, zk = _hull(k.m)
    mz = k.m[zc]
    # a class of u units of n islands running k decode spreads them evenly (floor(k / u) or ceil(k / u) a unit):
    # the most decode islands one scenario stops is ceil(k / u), the most prefill n - floor(k / u), and no spread
    # stops fewer of either (with n = 1: one island, [k >= 1] decode, [k < m] prefill)
    nz = np.maximum(k.n[zc], 1.0)
    uz = mz / nz
    lose_d, lose_p = np.ceil(zk / uz - 1e-9), nz - np.floor(zk / uz + 1e-9)
    rows = Rows()
    rows.add(zc, np.arange(col_x), 1.0)  # Σ_k z_ck = 1
    rows.close(n_c, 1.0, 1.0)
    for n, (gone, role, half) in enumerate(k.halves):
        x = col_x + n * cj + cc * n_j + jj
        b = k.cp if half == "prefill" else k.cd
        ub[x.ravel()] = np.where(b > 0, k.m[:, None], 0.0).ravel()
        rows.add(jj, x, b)  # (1) or (2): Σ_c b_cj x_cj − p_j Λ >= 0
        rows.add(np.arange(n_j), np.full(n_j, col_lam), -k.p)
        rows.close(n_j, 0.0, np.inf)
        # (3): Σ_j x_cj <= the islands of c in the role up in this scenario, Σ_k (that count at k) z_ck
        if half == "prefill":
            up = mz - zk - ((zc == gone) & (role == "prefill")) * lose_p
        else:
            up = zk - ((zc == gone) & (role == "decode")) * lose_d
        rows.add(cc, x, 1.0)
        rows.add(zc, np.arange(col_x), -up)
        rows.close(n_c, -np.inf, 0.0)
    model = maximising(col_lam, lb, ub, rows)
    for col in range(col_x):
        model.helper.set_var_integrality(col, True)
    return model, col_lam


def by_class(
    bp: np.ndarray,
    bd: np.ndarray,
    p: np.ndarray,
    scen: Sequence[frozenset[int]],
    *,
    time_limit_s: float,
    backend: str,
    fixed: Sequence[str | None] | None,
    t0: float,
) -> SpareRoles:
    """The module's model over classes of identical islands, every scenario one island lost (the docstring's
    second model): by cuts over every count of decode islands where there are at most `CUT_COUNTS` of them (the
    main job's layouts: 6-7x faster than the MILP, the same optima), else the class MILP."""
    k = _Classes.of(bp, bd, p, scen, fixed)
    if np.prod(k.m + 1) <= CUT_COUNTS:
        try:
            return by_cuts(k, bp.shape[0], time_limit_s, t0)
        except _LPFailed:  # a routing LP GLOP did not solve: the MILP, which has its own solvers
            pass
    return class_milp(k, bp.shape[0], time_limit_s, backend, t0)


def class_milp(k: _Classes, n_i: int, time_limit_s: float, backend: str, t0: float) -> SpareRoles:
    """The class model as a MILP (`_class_model`, SCIP's settings `CLASS_SCIP`)."""
    model, col_lam = _class_model(k)
    status, x = _solve_matrix(model, backend, time_limit_s, CLASS_SCIP)
    first = k.first
    return _answer(status, x, col_lam, n_i, t0,
                   lambda: _class_roles(k, [int(np.argmax(x[first[c]:first[c + 1]])) for c in range(len(k.islands))],
                                        n_i))  # fmt: skip


def _class_roles(k: _Classes, n_dec: Sequence[int], n_i: int) -> list[str]:
    """Roles of every island: `n_dec[c]` of class c's islands decode, spread evenly over its units."""
    out = ["prefill"] * n_i
    for c, islands in enumerate(k.islands):
        units = k.units[c] or [islands]
        for t, unit in enumerate(units):
            for i in unit[: n_dec[c] // len(units) + (t < n_dec[c] % len(units))]:
                out[i] = "decode"
    return out


# The class model by cuts (`by_cuts`), where its classes' counts of decode islands are at most this many combinations
# (the main job's layouts: 720 at the median, 6,048 at most); beyond, the class MILP
CUT_COUNTS = 50_000
CUT_GAP = 1e-7  # the relative gap at which a count's rate, met by no bound above it, is the optimum (SCIP_GAP's)


class _LPFailed(RuntimeError):
    pass


class _Routing:
    """One role's routing LP over the classes (a half of the class model with its counts fixed): max Λ subject to
    Σ_c b_cj x_cj >= Λ p_j and Σ_j x_cj <= u_c; built once, solved again (GLOP) for each capacity u."""

    def __init__(self, b: np.ndarray, p: np.ndarray) -> None:
        from scipy.sparse import csr_matrix

        n_c, n_j = b.shape
        self.b, self.p, self.n_j = b, p, n_j
        cc, jj = np.meshgrid(np.arange(n_c), np.arange(n_j), indexing="ij")
        serves = (b > 0).ravel()
        x, col_lam = np.arange(n_c * n_j), n_c * n_j
        rows = np.concatenate([jj.ravel()[serves], np.arange(n_j), n_j + cc.ravel()])
        cols = np.concatenate([x[serves], np.full(n_j, col_lam), x])
        vals = np.concatenate([b.ravel()[serves], -p, np.ones(n_c * n_j)])
        matrix = csr_matrix((vals, (rows, cols)), shape=(n_j + n_c, col_lam + 1))
        objective = np.zeros(col_lam + 1)
        objective[col_lam] = 1.0
        self.model = mb.Model()
        self.model.helper.fill_model_from_sparse_data(
            np.zeros(col_lam + 1), np.append(np.where(serves, np.inf, 0.0), np.inf), objective,
            np.concatenate([np.zeros(n_j), np.full(n_c, -np.inf)]), np.concatenate([np.full(n_j, np.inf),
                                                                                   np.zeros(n_c)]), matrix)  # fmt: skip
        self.model.helper.set_maximize(True)
        self.demand = self.model.get_linear_constraints()[:n_j]
        self.solver = mb.Solver("glop")

    def __call__(self, u: np.ndarray) -> tuple[float, np.ndarray]:
        """Λ at capacities `u`, and a cut: per class the bound's slope μ_c."""
        for c, cap in enumerate(u):
            self.model.helper.set_constraint_upper_bound(self.n_j + c, float(cap))
        code = self.solver.solve(self.model)
        if code.name != "OPTIMAL":
            raise _LPFailed(code.name)
        # ν >= 0 of the demand rows, p·ν = 1, bounds Λ <= Σ_c u_c max_j b_cj ν_j at any u (weak duality), with
        # equality at this u (ν optimal): the cut holds whatever the solver's tolerance
        nu = np.abs(self.solver.dual_values(self.demand).to_numpy())
        weight = float(self.p @ nu)
        if weight <= 1e-12:  # (p·ν >= 1 at an optimum: a solver's answer without it is not one to cut by)
            raise _LPFailed("no dual bound")
        return max(float(self.solver.objective_value), 0.0), (self.b * nu).max(axis=1) / weight


def by_cuts(k: _Classes, n_i: int, time_limit_s: float, t0: float) -> SpareRoles:
    """The class model solved over its counts n ∈ Π_c {0..m_c} of decode islands by cuts (a Benders scheme whose
    master is every count at once).

    At counts n each half routes one role over the classes' islands up in it, u_h(n) (linear in n but for the
    lost class's own count), and keeps the LP's rate Λ_h(u) = min over its dual solutions of Σ_c u_c μ_c: every
    dual solution of one role's LP bounds every half of that role at every count. So: bound every count by the cuts
    found so far (at first one per role, μ_c = max_j b_cj), take the count with the highest bound, solve its halves'
    LPs (each capacity once) and add their duals as cuts; when its rate meets its bound, no count can do better.
    Three to four rounds on the main job's layouts."""
    m = k.m.astype(int)
    counts = np.array(list(itertools.product(*[
        [m[c] if role == "decode" else 0] if role else range(m[c] + 1) for c, role in enumerate(k.kept)
    ])), dtype=float)  # fmt: skip
    n_units = np.maximum(k.n, 1.0)
    unit = m / n_units  # islands per unit
    routing = {"prefill": _Routing(k.cp, k.p), "decode": _Routing(k.cd, k.p)}
    halves: list[tuple[str, np.ndarray, int, np.ndarray]] = []  # (role routed, capacities, class lost, its loss)
    for gone, role, half in k.halves:
        caps = counts if half == "decode" else m - counts
        loss = np.zeros(len(counts))
        if gone >= 0 and role == half:  # the most islands of the role any scenario of the class stops
            ran = counts[:, gone]
            if half == "decode":
                loss = np.ceil(ran / unit[gone] - 1e-9)
            else:
                loss = n_units[gone] - np.floor(ran / unit[gone] + 1e-9)
        halves.append((half, caps, gone, loss))
    bound = np.full((len(halves), len(counts)), np.inf)

    def cut(role: str, mu: np.ndarray) -> None:
        for h, (half, caps, gone, loss) in enumerate(halves):
            if half == role:
                bound[h] = np.minimum(bound[h], caps @ mu - (mu[gone] * loss if gone >= 0 else 0.0))

    for role, r in routing.items():
        cut(role, r.b.max(axis=1) / r.p.sum())
    solved: dict[tuple[str, bytes], float] = {}
    best, best_rate, status = 0, -1.0, "optimal"
    while True:
        top = bound.min(axis=0)
        at = int(np.argmax(top))
        rate, fresh = np.inf, False
        for half, caps, gone, loss in halves:
            u = caps[at].copy()
            if gone >= 0:
                u[gone] -= loss[at]
            key = (half, u.tobytes())
            if key not in solved:
                solved[key], mu = routing[half](u)
                fresh = True
                cut(half, mu)
            rate = min(rate, solved[key])
        if rate > best_rate:
            best, best_rate = at, rate
        # met its bound, or its every LP was solved before (its bound is their rates, to the LP's tolerance): optimal
        if best_rate >= top[at] - CUT_GAP * max(abs(top[at]), 1.0) or not fresh:
            break
        if time.perf_counter() - t0 > time_limit_s:  # the best counts so far, not proven
            status = "feasible"
            break
    n_dec = [int(v) for v in counts[best]]
    return SpareRoles(status, max(best_rate, 0.0) + 0.0, tuple(_class_roles(k, n_dec, n_i)),
                      (time.perf_counter() - t0) * 1e3)


def _one_host_each(scen: Sequence[frozenset[int]]) -> bool:
    """Whether `by_host` holds: every scenario stops some islands and none another scenario stops (a scenario given
    twice is one)."""
    seen: set[int] = set()
    for down in dict.fromkeys(scen):
        if not down or not seen.isdisjoint(down):
            return False
        seen |= down
    return True


@dataclass(frozen=True)
class _HostTypes:
    """Islands by class (`_Classes`' key: rates and kept role) and hosts by type (the islands of each class they
    hold), for `by_host`."""

    cp: np.ndarray  # (C, J) prefill req/s of one island of each class
    cd: np.ndarray  # ... and decode
    m: np.ndarray  # (C,) islands per class
    safe: list[list[int]]  # per class its islands no scenario stops
    kept: list[str | None]  # a role every island of the class keeps (None: the solve chooses)
    make_up: list[np.ndarray]  # per host type: (C,) islands of each class one host holds
    hosts: list[list[list[list[int]]]]  # per host type, per host, per class: its islands
    configs: list[np.ndarray]  # per host type: (K, C) decode islands of each class, every configuration

    @staticmethod
    def of(bp: np.ndarray, bd: np.ndarray, scen: Sequence[frozenset[int]],
           fixed: Sequence[str | None] | None) -> _HostTypes:  # fmt: skip
        n_i = bp.shape[0]
        index: dict[tuple[bytes, bytes, str | None], int] = {}
        cls = [index.setdefault(key, len(index)) for key in _class_keys(bp, bd, fixed)]
        n_c = len(index)
        first = [cls.index(c) for c in range(n_c)]
        kept = [key[2] for key in index]
        lost = set().union(*scen)
        safe = [[i for i in range(n_i) if cls[i] == c and i not in lost] for c in range(n_c)]
        types: dict[tuple[int, ...], list[list[list[int]]]] = {}
        for down in dict.fromkeys(scen):
            by_class = [sorted(i for i in down if cls[i] == c) for c in range(n_c)]
            types.setdefault(tuple(len(isl) for isl in by_class), []).append(by_class)
        configs = []
        for make_up in types:  # a class kept in a role: all its islands in it; else 0..a of them decode
            choices = [[a] if kept[c] == "decode" else [0] if kept[c] == "prefill" else list(range(a + 1))
                       for c, a in enumerate(make_up)]  # fmt: skip
            configs.append(np.array(list(itertools.product(*choices)), dtype=float).reshape(-1, n_c))
        return _HostTypes(bp[first], bd[first], np.bincount(cls, minlength=n_c).astype(float), safe, kept,
                          [np.array(t, dtype=float) for t in types], list(types.values()), configs)  # fmt: skip


def by_host(
    bp: np.ndarray,
    bd: np.ndarray,
    p: np.ndarray,
    scen: Sequence[frozenset[int]],
    *,
    time_limit_s: float,
    backend: str,
    fixed: Sequence[str | None] | None,
    t0: float,
) -> SpareRoles:
    """The module's model over host types and their role configurations, every scenario the islands of one host
    (the docstring's third model)."""
    k = _HostTypes.of(bp, bd, scen, fixed)
    n_i = bp.shape[0]
    n_c, n_j = k.cp.shape
    cj = n_c * n_j
    sizes = [len(c) for c in k.configs]
    u = np.array([len(h) for h in k.hosts], dtype=float)  # hosts of each type
    col_y = np.concatenate([[0], np.cumsum(sizes)]).astype(int)  # y_hk, then z_hk, w_c, D_c
    n_hk = int(col_y[-1])
    col_z, col_w = n_hk, 2 * n_hk
    col_d = col_w + n_c
    col_x = col_d + n_c  # then the halves' routings, their v, and Λ (`halves` below)
    htype = np.repeat(np.arange(len(sizes)), sizes)
    lb, ub = np.zeros(col_x), np.zeros(col_x)
    ub[:n_hk] = u[htype]
    ub[col_z:col_w] = 1.0
    for c, role in enumerate(k.kept):  # the decode islands among those no scenario stops
        n_safe = float(len(k.safe[c]))
        lb[col_w + c] = n_safe if role == "decode" else 0.0
        ub[col_w + c] = 0.0 if role == "prefill" else n_safe
    ub[col_d:col_x] = k.m
    rows = Rows()
    hk = np.arange(n_hk)
    rows.add(htype, hk, 1.0)  # Σ_k y_hk = u_h
    rows.close(len(sizes), u, u)
    rows.add(hk, hk, 1.0)  # y_hk − u_h z_hk <= 0
    rows.add(hk, col_z + hk, -u[htype])
    rows.close(n_hk, -np.inf, 0.0)
    d = np.concatenate(k.configs)  # (hk, C) decode islands of each class
    a = np.array([k.make_up[h] for h in htype]).reshape(n_hk, n_c)
    cc = np.arange(n_c)
    rows.add(cc, col_d + cc, 1.0)  # D_c − w_c − Σ_hk y_hk d_kc = 0
    rows.add(cc, col_w + cc, -1.0)
    rows.add(np.tile(cc, n_hk), np.repeat(hk, n_c), -d.ravel())
    rows.close(n_c, 0.0, 0.0)
    # a half per role and islands lost: the configurations losing the same islands of that role route alike, so
    # they share one routing, lost when any of them is run (v >= z_hk of each; a half losing nothing routes with
    # every island up, which any other half bounds)
    halves: dict[tuple[int, bytes], tuple[np.ndarray, list[int]]] = {}
    for n in range(n_hk):
        for role, loss in enumerate((a[n] - d[n], d[n])):
            halves.setdefault((role, loss.tobytes()), (loss, []))[1].append(n)
    routed = [(role, loss, runs) for (role, _), (loss, runs) in halves.items() if loss.any()]
    for role in (0, 1):
        if not any(r == role for r, _, _ in routed):
            routed.append((role, np.zeros(n_c), []))
    col_v = col_x + len(routed) * cj
    col_lam = col_v + len(routed)
    lb, ub = (np.concatenate([v, np.zeros(col_lam + 1 - col_x)]) for v in (lb, ub))
    ub[col_v:col_lam] = 1.0
    ub[col_lam] = np.inf
    ci, jj = np.meshgrid(cc, np.arange(n_j), indexing="ij")
    for n, (role, loss, runs) in enumerate(routed):
        b = k.cp if role == 0 else k.cd
        x = col_x + n * cj + ci * n_j + jj
        ub[x.ravel()] = np.where(b > 0, k.m[:, None], 0.0).ravel()
        rows.add(jj, x, b)  # Σ_c b_cj x_cj − p_j Λ >= 0
        rows.add(np.arange(n_j), np.full(n_j, col_lam), -p)
        rows.close(n_j, 0.0, np.inf)
        # prefill: Σ_j x_cj + D_c + (a_hc − d_kc) v <= m_c; decode: Σ_j x_cj − D_c + d_kc v <= 0
        rows.add(ci, x, 1.0)
        rows.add(cc, col_d + cc, 1.0 if role == 0 else -1.0)
        rows.add(cc, np.full(n_c, col_v + n), loss)
        rows.close(n_c, -np.inf, k.m if role == 0 else 0.0)
        if runs:  # v − z_hk >= 0 for each configuration losing these
            rows.add(np.arange(len(runs)), np.full(len(runs), col_v + n), 1.0)
            rows.add(np.arange(len(runs)), col_z + np.array(runs), -1.0)
            rows.close(len(runs), 0.0, np.inf)
    model = maximising(col_lam, lb, ub, rows)
    for col in range(col_d):
        model.helper.set_var_integrality(col, True)
    status, x = _solve_matrix(model, backend, time_limit_s, CLASS_SCIP)

    def roles() -> list[str]:  # y_hk hosts of type h in configuration k, the first d_kc islands of each class decode
        out = ["prefill"] * n_i
        for h, hosts in enumerate(k.hosts):
            chosen = np.repeat(np.arange(sizes[h]), np.round(x[col_y[h] : col_y[h + 1]]).astype(int))
            for host, config in zip(hosts, chosen, strict=True):
                for c, islands in enumerate(host):
                    for i in islands[: int(k.configs[h][config, c])]:
                        out[i] = "decode"
        for c, islands in enumerate(k.safe):
            for i in islands[: round(x[col_w + c])]:
                out[i] = "decode"
        return out

    return _answer(status, x, col_lam, n_i, t0, roles)


def cheapest_roles(
    prefill_req_s: np.ndarray,
    decode_req_s: np.ndarray,
    p: np.ndarray,
    scenarios: Sequence[Collection[int]],
    cost_per_hour: np.ndarray,
    demand_req_s: float,
    *,
    time_limit_s: float = 10.0,
    backend: str = "AUTO",
) -> SpareRoles:
    """The cheapest islands, and their roles, that serve `demand_req_s` in every one of `scenarios` (the sizing
    question with hosts lost: search.objective=min_cost with search.spare_hosts). Per class c of identical islands
    (the same rates and $/h) it runs n^P_c prefill and n^D_c decode islands (n^P_c + n^D_c <= m_c, the rest idle),
    each count one-hot (z^r_ck = [c runs k islands in role r]); a scenario stops q_c islands of each class, and per
    scenario and role a routing serves the demand over what is left:

        min Σ_c cost_c (n^P_c + n^D_c)
        Σ_c b_cj x^{s,r}_cj >= R p_j                                  ∀ s, r, j
        Σ_j x^{s,r}_cj <= Σ_k max(k − q^s_c, 0) z^r_ck                 ∀ s, r, c

    Each role's routing takes the scenario's q islands from its own count (whichever role they run, the worse
    for each): exact where a scenario stops one island (one host lost, islands of whole hosts: tests check it
    against brute force), on the safe side where a host holds several islands of one class. `rate_req_s` is the
    demand where it is met; `roles` "prefill", "decode" or "idle" per island."""
    t0 = time.perf_counter()
    bp, bd = np.asarray(prefill_req_s, dtype=float), np.asarray(decode_req_s, dtype=float)
    cost = np.asarray(cost_per_hour, dtype=float)
    n_i = bp.shape[0]
    groups: dict[tuple[bytes, bytes, float], list[int]] = {}
    for i in range(n_i):
        groups.setdefault((bp[i].tobytes(), bd[i].tobytes(), float(cost[i])), []).append(i)
    members = list(groups.values())
    of = {i: c for c, ms in enumerate(members) for i in ms}
    losses = sorted({frozenset(Counter(of[i] for i in s).items()) for s in scenarios}, key=sorted) or [frozenset()]
    # Lazily: the MILP over the losses of the classes its last answer runs (at first none: every island up), until
    # its answer runs no class whose losses are left out. A loss of classes an answer does not run stops nothing of
    # it, so that answer holds in every scenario; the MILP over fewer losses bounds the cost from below: optimal.
    used: set[int] = set()
    while True:
        now = [lost for lost in losses if any(c in used for c, _ in lost)] or [frozenset()]
        status, x = _cheapest_solve(bp, bd, p, cost, members, now, demand_req_s=demand_req_s, backend=backend,
                                    time_limit_s=max(time_limit_s - (time.perf_counter() - t0), 0.01))  # fmt: skip
        if status in ("infeasible", "time_limit"):
            return _answer(status, x, 0, n_i, t0, list)
        runs = {c for c in range(len(members)) if round(x[c]) + round(x[len(members) + c]) > 0}
        if runs <= used:
            break
        used |= runs
    n_c = len(members)

    def roles() -> list[str]:  # each class's first a_c islands prefill, the next y_c decode, the rest idle
        out = ["idle"] * n_i
        for c, ms in enumerate(members):
            n_p, n_d = round(x[c]), round(x[n_c + c])
            for k, i in enumerate(ms):
                out[i] = "prefill" if k < n_p else "decode" if k < n_p + n_d else "idle"
        return out

    return _answer(status, x, len(x) - 1, n_i, t0, roles)


def _cheapest_solve(
    bp: np.ndarray, bd: np.ndarray, p: np.ndarray, cost: np.ndarray, members: list[list[int]],
    losses: Sequence[frozenset[tuple[int, int]]], *, demand_req_s: float, time_limit_s: float, backend: str,
) -> tuple[str, np.ndarray]:  # fmt: skip
    """`cheapest_roles`' MILP over `losses` (each: the (class, islands stopped) pairs of a scenario): its status and
    columns (zP, zD, the routings, Λ last). Each class's count in each role is one-hot, z^r_ck = [c runs k islands
    in role r], k = 0..m_c (its choices as their own hull, as `by_class`): with q of its islands stopped, a role's
    routing has Σ_k max(k − q, 0) z^r_ck islands of c."""
    n_j = bp.shape[1]
    first = [ms[0] for ms in members]
    cb, c_cost = (bp[first], bd[first]), cost[first]
    m = np.array([len(ms) for ms in members], dtype=int)
    n_c, cj = len(members), len(members) * n_j
    start, zc, zk = _hull(m)  # per role
    n_z = int(start[-1])
    col_x = 2 * n_z
    col_lam = col_x + 2 * len(losses) * cj
    lb, ub = np.zeros(col_lam + 1), np.zeros(col_lam + 1)
    ub[:col_x] = 1.0
    lb[col_lam] = ub[col_lam] = demand_req_s
    rows = Rows()
    for role in (0, 1):  # Σ_k z^r_ck = 1
        rows.add(zc, role * n_z + np.arange(n_z), 1.0)
        rows.close(n_c, 1.0, 1.0)
    rows.add(np.tile(zc, 2), np.arange(col_x), np.tile(zk, 2))  # prefill and decode islands of c: at most m_c
    rows.close(n_c, -np.inf, m.astype(float))
    cc, jj = np.meshgrid(np.arange(n_c), np.arange(n_j), indexing="ij")
    for n, lost in enumerate(losses):
        q = np.zeros(n_c)
        for c, k in lost:
            q[c] = k
        for role in (0, 1):
            x = col_x + (2 * n + role) * cj + cc * n_j + jj
            ub[x.ravel()] = np.where(cb[role] > 0, m[:, None], 0.0).ravel()
            rows.add(jj, x, cb[role])  # Σ_c b_cj x_cj − p_j Λ >= 0
            rows.add(np.arange(n_j), np.full(n_j, col_lam), -np.asarray(p, dtype=float))
            rows.close(n_j, 0.0, np.inf)
            rows.add(cc, x, 1.0)  # Σ_j x_cj − Σ_k max(k − q_c, 0) z^r_ck <= 0
            rows.add(zc, role * n_z + np.arange(n_z), -np.maximum(zk - q[zc], 0.0))
            rows.close(n_c, -np.inf, 0.0)
    objective = np.zeros(col_lam + 1)
    objective[:col_x] = -np.tile(c_cost[zc] * zk, 2)
    model = maximising(objective, lb, ub, rows)
    for col in range(col_x):
        model.helper.set_var_integrality(col, True)
    status, x = _solve_matrix(model, backend, time_limit_s, CLASS_SCIP)
    if status in ("infeasible", "time_limit"):
        return status, x
    counts = np.zeros((2, n_c))  # the one-hot columns read as counts: prefill, decode per class
    for role in (0, 1):
        for c in range(n_c):
            counts[role, c] = np.argmax(x[role * n_z + start[c] : role * n_z + start[c + 1]])
    return status, np.concatenate([counts.ravel(), [demand_req_s]])

"""Inner loop: give islands prefill/decode roles and route input-length ranges to them.

Sets: islands i (GPU type, size), ranges j with mass p_j (Σ p_j = 1).
Data: b^P_ij, b^D_ij = requests/s island i sustains when all of it prefills / decodes range j.

Identical islands (same type, size and benchmark rows) form a class c of m_c islands; y_c of
them decode. Both objectives are solved over classes: a class's x^P_cj is capacity in island
units (1 = one whole island), spread evenly over its prefill islands afterwards. This is exact
(every constraint below is linear in the class totals), and it turns 64 binaries into a
handful of small integers. `aggregate=False` solves with one binary z_i per island instead.

**max_rate** (default, exact).

    max Λ
    (1) Σ_c b^P_cj x^P_cj >= Λ p_j                 ∀ j   prefill capacity of range j
    (2) Σ_c b^D_cj x^D_cj >= Λ p_j                 ∀ j   decode capacity of range j
    (3) Σ_j x^P_cj <= a_c,  Σ_j x^D_cj <= y_c       ∀ c   a_c prefill and y_c decode islands
    (4) a_c + y_c = m_c     (with a budget: <= m_c, islands may stay idle)
    (5) optional KV transfer: Σ_j b^P_cj x^P_cj k_j <= a_c L_c   (prefill islands' egress)
                              Σ_j b^D_cj x^D_cj k_j <= y_c L_c   (decode islands' ingress)
        k_j = KV GB of one request of range j, L_c = an island's scale-out GB/s
    (6) optional $ budget: Σ_c cost_c (a_c + y_c) <= B
        x >= 0,  a_c, y_c ∈ {0, ..., m_c}
    (7) optional aggregated islands (`aggregated_req_s` = b^A_cj, the rate an island serves range j at,
        prefill and decode both, as aggregated engines): g_c of a class's islands aggregate, with x^A_cj
        of their capacity on range j; b^A_cj x^A_cj joins the left of both (1) and (2),
        Σ_j x^A_cj <= g_c, and (4) becomes a_c + y_c + g_c = m_c (<= with a budget; g_c in its cost).
        Aggregated islands hand no KV over: (5) leaves them out.

**min_cost** (a demand R, `demand_req_s`: the sizing question). The islands are what may be bought or rented:

    min Σ_c cost_c (a_c + y_c + g_c)
    (1)-(3), (5), (7) as above, Λ >= R, and (4) a_c + y_c + g_c <= m_c (an island left idle costs nothing)
The solution's Λ is R (nothing pays for more); a layout that cannot serve R is `infeasible`.

After the solve every range's capacity is scaled down to exactly Λ p_j; what is left of an
island is headroom.

**thesis** (seeds/000 section 4.8.1, as written). z_i = 1: island i decodes,
R^P_j = Σ_i b^P_ij x^P_ij, R^D_j likewise, R^P = Σ_j R^P_j, R^D = Σ_j R^D_j,
λ_j = M / (1 + p_j).

    max R^D + R^P − Σ_j λ_j (δ^D_j + δ^P_j + δ^M_j)
    (1) Σ_j (x^P_ij + x^D_ij) = 1                   ∀ i
    (2) x^P_ij <= 1 − z_i,  x^D_ij <= z_i           ∀ i, j
    (3) R^P >= ε,  R^D >= ε                          (ε = 0.01)
    (4) |R^D_j − p_j R^D| <= δ^D_j <= τ p_j R^D      ∀ j
    (5) |R^P_j − p_j R^P| <= δ^P_j <= τ p_j R^P      ∀ j
    (6) |R^D_j − R^P_j| <= δ^M_j                     ∀ j
    (7) D_total = Σ_j (δ^D_j + δ^P_j + δ^M_j)
Aggregated, (1)-(2) become Σ_j x^P_cj = m_c − y_c and Σ_j x^D_cj = y_c. The thesis reports
min(R^P, R^D) as the system's throughput; so does `rate_req_s` here. The KV and budget
constraints are not part of the thesis model and are rejected for it.

Backends (OR-Tools' linear solver wrapper): a model with integers goes to a MILP solver
(SCIP by default; HiGHS and CBC by `backend=`), one without (every role fixed by `roles`) to
GLOP. Infeasible and time-limit are statuses, never exceptions; any other solver outcome
raises with the solver's status.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
from ortools.linear_solver import pywraplp
from ortools.linear_solver.python import model_builder as mb

from costmodel.roles import ROLES
from solvers import role_search

OBJECTIVES = ("max_rate", "thesis")
STATUSES = ("optimal", "feasible", "infeasible", "time_limit")
MILP_BACKENDS = ("SCIP", "HIGHS", "CBC")
BACKENDS = ("AUTO", *MILP_BACKENDS)  # AUTO: SCIP for AUTO_SCIP_S, then HiGHS (see `_solve_matrix`)
AUTO_SCIP_S = 1.0  # AUTO's SCIP stint before HiGHS takes over (docs/inner.md)
ROLE_SEARCH_S = 0.5  # out of time: the role search's own limit, after the MILP's (docs/inner.md)

# SCIP on both inner models: the LP relaxation is within a few % of the optimum and the trees are
# small, so cutting planes and primal heuristics cost more than they save. Without them the median
# max_rate solve was 2-20x and the slowest 25-70x faster on the layouts measured, the thesis
# model's about 2x, to the same optima (docs/inner.md).
_SCIP_HEURISTICS = (
    "actconsdiving adaptivediving alns bound clique coefdiving completesol conflictdiving crossover dins "
    "distributiondiving dks dps dualval farkasdiving feaspump fixandinfer fracdiving gins guideddiving indicator "
    "indicatordiving intdiving intshifting linesearchdiving localbranching locks lpface mpec multistart mutation "
    "nlpdiving objpscostdiving octane ofins oneopt padm proximity pscostdiving randrounding rens reoptsols repair "
    "rins rootsoldiving rounding scheduler shiftandpropagate shifting simplerounding subnlp trivial "
    "trivialnegation trustregion twoopt undercover vbounds veclendiving zeroobj zirounding"
).split()
MODEL_GAP = 1e-7  # the comparison model's relative MIP gap (`_Model`)
SCIP_GAP = "limits/gap = 1e-7"  # SCIP's default 1e-4 is visible in Λ
# SCIP leaves Ctrl-C to Python: by default it takes the signal itself and ends the solve early with an incumbent (or
# none), so a caller would carry on with a cut solution, or fail on the status, instead of stopping
SCIP_CTRL_C = "misc/catchctrlc = FALSE"
SCIP_PARAMETERS = "\n".join(
    [SCIP_GAP, SCIP_CTRL_C, "separating/maxrounds = 0", "separating/maxroundsroot = 0"]
    + [f"heuristics/{h}/freq = -1" for h in _SCIP_HEURISTICS]
)


@dataclass(frozen=True)
class InnerProblem:
    islands: tuple[tuple[str, int], ...]  # (gpu, size) per island
    p: np.ndarray  # (J,) range masses
    prefill_req_s: np.ndarray  # (I, J)
    decode_req_s: np.ndarray  # (I, J)
    objective: str = "max_rate"
    tau: float = 0.5  # thesis: maximum relative per-range deviation (value not given there)
    M: float = 1.0  # thesis: deviation weight scale ("a large constant"; no value given; see docs/inner.md)
    epsilon: float = 0.01  # thesis: minimum R^P and R^D
    range_start: np.ndarray | None = None
    range_end: np.ndarray | None = None
    kv_gb: np.ndarray | None = None  # (J,) KV cache GB one request of range j moves prefill -> decode
    link_gb_s: np.ndarray | None = None  # (I,) scale-out GB/s of each island (all its NICs)
    cost_per_hour: np.ndarray | None = None  # (I,) $/h of each island
    budget_per_hour: float | None = None  # max $/h of the islands in use
    roles: tuple[str, ...] | None = None  # fix every island's role: the model becomes an LP
    aggregated_req_s: np.ndarray | None = None  # (I, J) req/s as aggregated engines (None: no aggregated role)
    demand_req_s: float | None = None  # min_cost: the cheapest islands serving this rate (needs `cost_per_hour`)

    def __post_init__(self) -> None:
        n_i, n_j = len(self.islands), len(self.p)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose from {list(OBJECTIVES)}")
        if n_i == 0 or n_j == 0:
            raise ValueError(f"a problem needs at least one island and one range, got {n_i} islands, {n_j} ranges")
        for name in ("prefill_req_s", "decode_req_s", "aggregated_req_s"):
            a = getattr(self, name)
            if a is None:
                continue
            if a.shape != (n_i, n_j):
                raise ValueError(f"`{name}` must be islands x ranges = {n_i} x {n_j}, got shape {a.shape}")
            if not np.isfinite(a).all() or (a < 0).any():
                raise ValueError(f"`{name}` must be finite and non-negative")
        if (self.p < 0).any() or not np.isclose(self.p.sum(), 1.0, atol=1e-6):
            raise ValueError(f"range masses `p` must be non-negative and sum to 1, got sum {self.p.sum():.6g}")
        if not (self.tau > 0 and self.M > 0 and self.epsilon >= 0):
            raise ValueError("`tau > 0`, `M > 0` and `epsilon >= 0` must hold")
        for name, n in (("kv_gb", n_j), ("link_gb_s", n_i), ("cost_per_hour", n_i)):
            a = getattr(self, name)
            if a is not None and a.shape != (n,):
                raise ValueError(f"`{name}` must have {n} entries, got shape {a.shape}")
            if a is not None and (not np.isfinite(a).all() or (a < 0).any()):
                raise ValueError(f"`{name}` must be finite and non-negative")
        if (self.kv_gb is None) != (self.link_gb_s is None):
            raise ValueError("the KV-transfer constraint needs both `kv_gb` (per range) and `link_gb_s` (per island)")
        if self.budget_per_hour is not None and (self.cost_per_hour is None or self.budget_per_hour < 0):
            raise ValueError("a budget needs `cost_per_hour` per island and `budget_per_hour >= 0`")
        if self.demand_req_s is not None and (self.cost_per_hour is None or not self.demand_req_s > 0
                                              or not np.isfinite(self.demand_req_s)):  # fmt: skip
            raise ValueError("a demand needs `cost_per_hour` per island and a finite `demand_req_s > 0`")
        if self.objective == "thesis" and self.demand_req_s is not None:
            raise ValueError("a demand (min_cost) belongs to `max_rate`; the thesis model has none")
        if self.objective == "thesis" and (self.kv_gb is not None or self.budget_per_hour is not None):
            raise ValueError("KV-transfer and budget constraints belong to `max_rate`; the thesis model has neither")
        if self.roles is not None and (len(self.roles) != n_i or not set(self.roles) <= set(ROLES)):
            raise ValueError(f"`roles` must give one of {list(ROLES)} for each of the {n_i} islands")
        if self.objective == "thesis" and self.roles is not None and "idle" in self.roles:
            raise ValueError("the thesis model uses every island; `idle` roles belong to `max_rate`")
        if self.objective == "thesis" and self.aggregated_req_s is not None:
            raise ValueError("aggregated islands belong to `max_rate`; the thesis model has prefill and decode only")
        if self.roles is not None and "aggregated" in self.roles and self.aggregated_req_s is None:
            raise ValueError("an `aggregated` role needs `aggregated_req_s`, the islands' rates as aggregated engines")

    def resolved(self, roles: tuple[str, ...]) -> InnerProblem:
        """This problem with every island's role fixed to `roles` and an aggregated island's prefill and decode
        rows its aggregated rate (it serves both phases of what it takes, so each phase's capacity counts it):
        the problem a solution with those roles is read against (`InnerSolution` gives an aggregated island
        the same share in x_prefill and x_decode). Solved again, it gives the same solution.
        Without an aggregated island, this problem itself."""
        agg = np.array([r == "aggregated" for r in roles], dtype=bool)
        if not agg.any() or self.aggregated_req_s is None:
            return self  # (no island aggregates: the rows are already the solution's)
        bp, bd = self.prefill_req_s.copy(), self.decode_req_s.copy()
        bp[agg] = bd[agg] = self.aggregated_req_s[agg]
        return replace(self, prefill_req_s=bp, decode_req_s=bd, roles=tuple(roles))

    @property
    def aggregated_roles(self) -> bool:
        return self.aggregated_req_s is not None and bool(self.aggregated_req_s.any())


@dataclass(frozen=True)
class InnerSolution:
    status: str
    rate_req_s: float  # max_rate: Λ; thesis: min(R^P, R^D)
    roles: tuple[str, ...]  # "prefill" | "decode" | "aggregated" | "idle" (only with a budget) per island
    x_prefill: np.ndarray  # (I, J) fraction of island i's capacity prefilling range j (aggregated: serving it)
    x_decode: np.ndarray  # (an aggregated island has the same row in both)
    prefill_req_s: float  # R^P = Σ_ij b^P_ij x^P_ij
    decode_req_s: float
    deviation: float  # thesis D_total evaluated on this routing
    solve_ms: float
    extra: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "status": self.status,
            "rate_req_s": self.rate_req_s,
            "roles": list(self.roles),
            "x_prefill": self.x_prefill.tolist(),
            "x_decode": self.x_decode.tolist(),
            "prefill_req_s": self.prefill_req_s,
            "decode_req_s": self.decode_req_s,
            "deviation": self.deviation,
            "solve_ms": self.solve_ms,
        }


def thesis_deviation(prob: InnerProblem, x_p: np.ndarray, x_d: np.ndarray) -> float:
    """D_total of the thesis for a routing: Σ_j |R^P_j − p_j R^P| + |R^D_j − p_j R^D| + |R^D_j − R^P_j|."""
    rp_j = (prob.prefill_req_s * x_p).sum(axis=0)
    rd_j = (prob.decode_req_s * x_d).sum(axis=0)
    rp, rd = rp_j.sum(), rd_j.sum()
    return float(np.abs(rp_j - prob.p * rp).sum() + np.abs(rd_j - prob.p * rd).sum() + np.abs(rd_j - rp_j).sum())


def solve(
    prob: InnerProblem, *, time_limit_s: float = 10.0, backend: str = "AUTO", aggregate: bool = True
) -> InnerSolution:
    """Solve `prob` with its objective; see the module docstring for both models.

    `backend` is AUTO or one of MILP_BACKENDS (the thesis model takes SCIP for AUTO); LPs go to GLOP.
    `aggregate=False` gives every island its own class (one binary each; the thesis as written).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown MILP backend {backend!r}; choose from {list(BACKENDS)}")
    t0 = time.perf_counter()
    classes = island_classes(prob) if aggregate else [[i] for i in range(len(prob.islands))]
    if prob.objective == "max_rate":
        return _max_rate(prob, classes, backend, time_limit_s, t0)
    m = _Model(
        prob, classes, ("SCIP" if backend == "AUTO" else backend) if prob.roles is None else "GLOP", time_limit_s
    )
    return m.thesis(t0)


def status_of(solver: pywraplp.Solver, code: int, time_limit_s: float) -> str:
    if code == pywraplp.Solver.OPTIMAL:
        return "optimal"
    if code == pywraplp.Solver.INFEASIBLE:
        return "infeasible"
    if code == pywraplp.Solver.FEASIBLE:
        return "feasible"  # stopped at the time limit with a solution in hand
    known = (pywraplp.Solver.UNBOUNDED, pywraplp.Solver.ABNORMAL, pywraplp.Solver.MODEL_INVALID)
    if code not in known and solver.wall_time() >= 0.95 * time_limit_s * 1e3:  # wall_time: ms
        return "time_limit"  # NOT_SOLVED, or HiGHS's unlisted code when its time ran out before a solution
    names = {
        pywraplp.Solver.UNBOUNDED: "UNBOUNDED",
        pywraplp.Solver.ABNORMAL: "ABNORMAL",
        pywraplp.Solver.MODEL_INVALID: "MODEL_INVALID",
        pywraplp.Solver.NOT_SOLVED: "NOT_SOLVED",
    }
    raise RuntimeError(f"inner solver ended with status {names.get(code, code)}")


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """File descriptor 1 pointed at /dev/null within, Python's stdout flushed first: HiGHS's MIP solver prints some
    of its internal notes there, whatever its output settings."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def new_solver(backend: str, time_limit_s: float, mip_gap: float | None = None) -> pywraplp.Solver:
    """A quiet OR-Tools solver with a time limit; `mip_gap`: the relative gap HiGHS solves a MILP to (OR-Tools' HiGHS
    interface ignores RELATIVE_MIP_GAP, which the other backends take with the solve)."""
    solver = pywraplp.Solver.CreateSolver(backend)
    if solver is None:
        raise RuntimeError(f"OR-Tools was built without {backend}; reinstall ortools")
    solver.SetTimeLimit(max(int(time_limit_s * 1000), 1))
    solver.SuppressOutput()
    if backend == "HIGHS":  # HiGHS prints a banner otherwise
        solver.SetSolverSpecificParametersAsString("output_flag=false"
                                                   + (f"\nmip_rel_gap={mip_gap}" if mip_gap is not None else ""))
    return solver


def island_classes(prob: InnerProblem) -> list[list[int]]:
    """Islands grouped by (gpu, size, identical benchmark rows, fixed role, link, cost), first-seen order."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, isl in enumerate(prob.islands):
        key = (
            isl,
            prob.prefill_req_s[i].tobytes(),
            prob.decode_req_s[i].tobytes(),
            None if prob.roles is None else prob.roles[i],
            None if prob.link_gb_s is None else float(prob.link_gb_s[i]),
            None if prob.cost_per_hour is None else float(prob.cost_per_hour[i]),
            None if prob.aggregated_req_s is None else prob.aggregated_req_s[i].tobytes(),
        )
        groups.setdefault(key, []).append(i)
    return list(groups.values())


@dataclass(frozen=True)
class _Classes:
    """The max_rate model's data per class c of identical islands, and where its columns sit: x^P (C*J),
    x^D (C*J), y (C), a (C, only with a budget or fixed roles), Λ, and with aggregated islands x^A (C*J), g (C).
    Without a budget a_c = m_c − y_c − g_c is substituted, as in the module docstring's (4)."""

    members: list[list[int]]  # the islands of each class
    first: list[int]  # each class's first island, whose rows the class has
    m: np.ndarray  # (C,) islands per class
    bp: np.ndarray  # (C, J) b^P_cj
    bd: np.ndarray  # (C, J) b^D_cj
    ba: np.ndarray  # (C, J) b^A_cj (zeros without aggregated islands)
    explicit_a: bool  # a_c is a column (a budget, a demand, or fixed roles)
    with_agg: bool  # the columns x^A, g exist

    @staticmethod
    def of(prob: InnerProblem, classes: list[list[int]]) -> _Classes:
        first = [c[0] for c in classes]
        bp, bd = prob.prefill_req_s[first], prob.decode_req_s[first]
        with_agg = prob.aggregated_roles
        ba = prob.aggregated_req_s[first] if with_agg else np.zeros_like(bp)  # type: ignore[index]
        explicit_a = prob.budget_per_hour is not None or prob.demand_req_s is not None or prob.roles is not None
        m = np.array([len(c) for c in classes], dtype=float)
        return _Classes(classes, first, m, bp, bd, ba, explicit_a, with_agg)

    @property
    def n_c(self) -> int:
        return self.bp.shape[0]

    @property
    def n_j(self) -> int:
        return self.bp.shape[1]

    @property
    def cj(self) -> int:
        return self.n_c * self.n_j

    @property
    def col_y(self) -> int:
        return 2 * self.cj

    @property
    def col_a(self) -> int:
        return self.col_y + self.n_c if self.explicit_a else -1

    @property
    def col_lam(self) -> int:
        return self.col_y + (2 if self.explicit_a else 1) * self.n_c

    @property
    def col_xa(self) -> int:
        return self.col_lam + 1

    @property
    def col_g(self) -> int:
        return self.col_xa + self.cj

    @property
    def n_col(self) -> int:
        return self.col_g + self.n_c if self.with_agg else self.col_lam + 1

    @property
    def counts(self) -> list[int]:
        """The island-count columns: y, a (if a column) and g (with aggregated islands)."""
        return [*range(self.col_y, self.col_lam), *(range(self.col_g, self.n_col) if self.with_agg else ())]


class Rows:
    """The rows of a sparse constraint matrix, built one constraint family at a time: `add` pieces of (row,
    column, value) entries, rows numbered within the family, then `close` the family with its rows' bounds."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []
        self.n = 0  # rows of the closed families

    def add(self, r: np.ndarray, c: np.ndarray, v: object) -> None:
        self.rows.append(self.n + r.ravel())
        self.cols.append(c.ravel())
        self.vals.append(np.broadcast_to(v, r.shape).ravel().astype(float))

    def close(self, n: int, lo: object, hi: object) -> None:
        self.lo.append(np.broadcast_to(np.asarray(lo, dtype=float), (n,)))
        self.hi.append(np.broadcast_to(np.asarray(hi, dtype=float), (n,)))
        self.n += n


def _max_rate(
    prob: InnerProblem, classes: list[list[int]], backend: str, time_limit_s: float, t0: float
) -> InnerSolution:
    """max_rate built as sparse matrices in one go (NumPy), solved by OR-Tools' model builder; the columns are
    `_Classes`', the rows the module docstring's (1)-(7)."""
    k = _Classes.of(prob, classes)
    lb, ub = _bounds(prob, k)
    rows = Rows()
    _capacity_rows(rows, prob, k)
    _island_rows(rows, k)
    _budget_rows(rows, prob, k)
    _kv_rows(rows, prob, k)
    model = maximising(k.col_lam if prob.demand_req_s is None else _cheapest(prob, k), lb, ub, rows)
    if prob.roles is None:
        for col in k.counts:
            model.helper.set_var_integrality(col, True)

    status, x = _solve_matrix(model, backend if prob.roles is None else "GLOP", time_limit_s)
    extra: dict[str, float] = {}
    if status in ("time_limit", "feasible") and prob.roles is None and not k.explicit_a:
        # out of time (many distinct islands): role search from the incumbent, or from the LP relaxation
        found = _searched_incumbent(model, prob, k, x)
        if found is not None:
            status, x, extra = "feasible", found[0], {"bound_req_s": found[1]}
    if status in ("infeasible", "time_limit"):
        return _empty(prob, status, t0)
    return _read_out(prob, k, x, status=status, t0=t0, extra=extra)


def _bounds(prob: InnerProblem, k: _Classes) -> tuple[np.ndarray, np.ndarray]:
    """The columns' bounds: x within each class's islands (0 where the class serves no range), counts within
    m_c, Λ free above; fixed roles make the counts constants and the model an LP."""
    m, cj, n_c = k.m, k.cj, k.n_c
    lb, ub = np.zeros(k.n_col), np.zeros(k.n_col)
    ub[:cj] = np.where(k.bp > 0, m[:, None], 0.0).ravel()
    ub[cj : k.col_y] = np.where(k.bd > 0, m[:, None], 0.0).ravel()
    ub[k.col_y : k.col_y + n_c] = m
    if k.explicit_a:
        ub[k.col_a : k.col_a + n_c] = m
    ub[k.col_lam] = np.inf
    if prob.demand_req_s is not None:  # min_cost: Λ >= R
        lb[k.col_lam] = prob.demand_req_s
    if k.with_agg:
        ub[k.col_xa : k.col_g] = np.where(k.ba > 0, m[:, None], 0.0).ravel()
        ub[k.col_g :] = np.where(k.ba.any(axis=1), m, 0.0)
    if prob.roles is not None:  # fixed roles: the counts are constants, the model an LP
        role = [prob.roles[c[0]] for c in k.members]
        for col, name in ((k.col_y, "decode"), (k.col_a, "prefill"), (k.col_g, "aggregated")):
            if name == "aggregated" and not k.with_agg:
                continue
            lb[col : col + n_c] = ub[col : col + n_c] = [m[c] if r == name else 0.0 for c, r in enumerate(role)]
    return lb, ub


def _grid(k: _Classes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(class, range) index grids and the columns of x^P, x^D and x^A on them."""
    cc, jj = np.meshgrid(np.arange(k.n_c), np.arange(k.n_j), indexing="ij")
    return cc, jj, cc * k.n_j + jj, k.cj + cc * k.n_j + jj, k.col_xa + cc * k.n_j + jj


def _capacity_rows(rows: Rows, prob: InnerProblem, k: _Classes) -> None:
    _, jj, xp_col, xd_col, xa_col = _grid(k)
    all_j = np.arange(k.n_j)
    for b, x_col in ((k.bp, xp_col), (k.bd, xd_col)):  # (1), (2): capacity of range j >= Λ p_j
        rows.add(jj, x_col, b)
        if k.with_agg:  # (7) an aggregated island serves both phases of what it takes
            rows.add(jj, xa_col, k.ba)
        rows.add(all_j, np.full(k.n_j, k.col_lam), -prob.p)
        rows.close(k.n_j, 0.0, np.inf)


def _island_rows(rows: Rows, k: _Classes) -> None:
    cc, _, xp_col, xd_col, xa_col = _grid(k)
    all_c, n_c, m = np.arange(k.n_c), k.n_c, k.m
    y_col, g_col = k.col_y + all_c, k.col_g + all_c
    # (3) prefill islands' capacity: Σ_j x^P_cj <= a_c (= m_c − y_c − g_c without a budget)
    rows.add(cc, xp_col, 1.0)
    if k.explicit_a:
        rows.add(all_c, k.col_a + all_c, -1.0)
        rows.close(n_c, -np.inf, 0.0)
    else:
        rows.add(all_c, y_col, 1.0)
        if k.with_agg:
            rows.add(all_c, g_col, 1.0)
        rows.close(n_c, -np.inf, m)
    rows.add(cc, xd_col, 1.0)  # (3) decode: Σ_j x^D_cj <= y_c
    rows.add(all_c, y_col, -1.0)
    rows.close(n_c, -np.inf, 0.0)
    if k.with_agg:  # (7) aggregated: Σ_j x^A_cj <= g_c
        rows.add(cc, xa_col, 1.0)
        rows.add(all_c, g_col, -1.0)
        rows.close(n_c, -np.inf, 0.0)
        if k.explicit_a:  # (4) the islands of a class: a_c + y_c + g_c <= m_c
            rows.add(all_c, y_col, 1.0)
            rows.add(all_c, k.col_a + all_c, 1.0)
            rows.add(all_c, g_col, 1.0)
            rows.close(n_c, -np.inf, m)


def _cheapest(prob: InnerProblem, k: _Classes) -> np.ndarray:
    """min_cost's objective as a maximisation: −Σ_c cost_c (a_c + y_c + g_c)."""
    assert prob.cost_per_hour is not None
    cost, all_c = prob.cost_per_hour[k.first], np.arange(k.n_c)
    objective = np.zeros(k.n_col)
    objective[k.col_y + all_c] = objective[k.col_a + all_c] = -cost
    if k.with_agg:
        objective[k.col_g + all_c] = -cost
    return objective


def _budget_rows(rows: Rows, prob: InnerProblem, k: _Classes) -> None:
    if (prob.budget_per_hour is None and prob.demand_req_s is None) or prob.cost_per_hour is None:
        return
    all_c, n_c = np.arange(k.n_c), k.n_c
    y_col, a_col = k.col_y + all_c, k.col_a + all_c
    if not k.with_agg:
        rows.add(all_c, y_col, 1.0)  # (4) with a budget or a demand: a_c + y_c <= m_c
        rows.add(all_c, a_col, 1.0)
        rows.close(n_c, -np.inf, k.m)
    if prob.budget_per_hour is None:
        return
    cost = prob.cost_per_hour[k.first]
    row0 = np.zeros(n_c, dtype=int)  # one row
    rows.add(row0, y_col, cost)  # (6) Σ_c cost_c (a_c + y_c + g_c) <= B
    rows.add(row0, a_col, cost)
    if k.with_agg:
        rows.add(row0, k.col_g + all_c, cost)
    rows.close(1, -np.inf, prob.budget_per_hour)


def _kv_rows(rows: Rows, prob: InnerProblem, k: _Classes) -> None:
    if prob.kv_gb is None or prob.link_gb_s is None:
        return
    cc, _, xp_col, xd_col, _ = _grid(k)
    all_c, n_c = np.arange(k.n_c), k.n_c
    y_col = k.col_y + all_c
    # (5) KV GB/s through the islands' NICs: prefill islands' egress, decode islands' ingress
    link = prob.link_gb_s[k.first]
    rows.add(cc, xp_col, k.bp * prob.kv_gb[None, :])
    if k.explicit_a:
        rows.add(all_c, k.col_a + all_c, -link)
        rows.close(n_c, -np.inf, 0.0)
    else:
        rows.add(all_c, y_col, link)
        if k.with_agg:
            rows.add(all_c, k.col_g + all_c, link)
        rows.close(n_c, -np.inf, link * k.m)
    rows.add(cc, xd_col, k.bd * prob.kv_gb[None, :])
    rows.add(all_c, y_col, -link)
    rows.close(n_c, -np.inf, 0.0)


def _read_out(
    prob: InnerProblem, k: _Classes, x: np.ndarray, *, status: str, t0: float, extra: dict[str, float]
) -> InnerSolution:
    """The solution from the solver's columns: class totals to islands, at the rate the routing delivers."""
    n_c, n_j, cj = k.n_c, k.n_j, k.cj
    rate = float(x[k.col_lam])
    n_dec = np.round(x[k.col_y : k.col_y + n_c]).astype(int)
    n_agg = np.round(x[k.col_g : k.n_col]).astype(int) if k.with_agg else np.zeros(n_c, dtype=int)
    n_pre = np.round(x[k.col_a : k.col_a + n_c]).astype(int) if k.explicit_a else k.m.astype(int) - n_dec - n_agg
    # Solvers honour constraints to a tolerance (-1e-12 for zero, 4e-7 of prefill on a decode class):
    # clip, keep each class within its islands, and report the rate this routing actually delivers.
    xp = _within(np.maximum(x[:cj].reshape(n_c, n_j), 0.0), n_pre)
    xd = _within(np.maximum(x[cj : k.col_y].reshape(n_c, n_j), 0.0), n_dec)
    xa = _within(np.maximum(x[k.col_xa : k.col_g].reshape(n_c, n_j), 0.0), n_agg) if k.with_agg else np.zeros_like(xp)
    need = prob.p > 0
    both = (k.ba * xa).sum(axis=0)
    delivered = min(
        (((k.bp * xp).sum(axis=0) + both)[need] / prob.p[need]).min(),
        (((k.bd * xd).sum(axis=0) + both)[need] / prob.p[need]).min(),
    )
    rate = min(rate, float(delivered))
    xa = _trim_to_demand(xa, k.ba, prob.p * rate)
    rest = np.maximum(prob.p * rate - (k.ba * xa).sum(axis=0), 0.0)
    xp, xd = _trim_to_demand(xp, k.bp, rest), _trim_to_demand(xd, k.bd, rest)
    routing = _expand(prob, k.members, _ClassTotals(xp, xd, n_pre, n_dec, xa, n_agg))
    priced = prob.resolved(routing.roles)
    deviation = thesis_deviation(priced, routing.x_prefill, routing.x_decode)
    return _solution(priced, k.members, routing, status=status, rate=rate, deviation=deviation, t0=t0, extra=extra)


def maximising(col: int | np.ndarray, lb: np.ndarray, ub: np.ndarray, rows: Rows) -> mb.Model:
    """The model `max x[col]` (or, `col` a vector, `max col · x`) over columns within [lb, ub] and `rows` within
    their bounds; integrality is the caller's to set."""
    from scipy.sparse import csr_matrix

    shape = (rows.n, len(lb))
    entries = (np.concatenate(rows.vals), (np.concatenate(rows.rows), np.concatenate(rows.cols)))
    matrix = csr_matrix(entries, shape=shape)
    if isinstance(col, np.ndarray):
        objective = col
    else:
        objective = np.zeros(len(lb))
        objective[col] = 1.0
    model = mb.Model()
    model.helper.fill_model_from_sparse_data(lb, ub, objective, np.concatenate(rows.lo), np.concatenate(rows.hi),
                                             matrix)  # fmt: skip
    model.helper.set_maximize(True)
    return model


def _searched_incumbent(
    model: mb.Model, prob: InnerProblem, k: _Classes, incumbent: np.ndarray
) -> tuple[np.ndarray, float] | None:
    """A max_rate solution and an upper bound when the MILP ran out of time, with or without an incumbent.

    The LP relaxation (GLOP) bounds Λ from above. The role search (`solvers.role_search`, at most
    ROLE_SEARCH_S) starts from the incumbent's decode counts per class, or without one from the
    relaxation's, rounded, and improves them one move at a time; the LP left with those roles fixed
    routes the ranges. Its Λ is achievable (a solution of the MILP), the relaxation's is the bound
    the gap is taken to. The search moves islands between prefill and decode only: it starts, and ends,
    with no island aggregated (a solution all the same; the relaxation's bound counts aggregated islands).
    """
    col_y, col_lam, counts, first = k.col_y, k.col_lam, k.counts, k.first
    relaxed = model.clone()
    for col in counts:
        relaxed.helper.set_var_integrality(col, False)
    status, x = _solve_matrix(relaxed, "GLOP", 60.0)
    if status not in ("optimal", "feasible"):
        return None
    bound = float(x[col_lam])
    start = np.round((incumbent if len(incumbent) else x)[col_y:col_lam])
    try:  # `first`: each class's first island, whose rows the class has
        decode, _ = role_search.improve(
            prob.prefill_req_s[first],
            prob.decode_req_s[first],
            prob.p,
            k.m,
            start,
            kv_gb=prob.kv_gb,
            link_gb_s=None if prob.link_gb_s is None else prob.link_gb_s[first],
            budget_s=ROLE_SEARCH_S,
        )
    except RuntimeError:  # a phase LP GLOP could not solve: the start is still a solution
        decode = start
    fixed = relaxed.clone()
    for col, v in zip(range(col_y, col_lam), decode, strict=True):
        fixed.helper.set_var_lower_bound(col, float(v))
        fixed.helper.set_var_upper_bound(col, float(v))
    for col in counts[col_lam - col_y :]:  # no aggregated islands
        fixed.helper.set_var_upper_bound(col, 0.0)
    status, xf = _solve_matrix(fixed, "GLOP", 60.0)
    if status not in ("optimal", "feasible"):
        return None
    if len(incumbent) and xf[col_lam] < incumbent[col_lam]:
        return incumbent, bound  # (the search keeps or improves its start; this guards LP tolerances)
    return xf, bound


_MB_STATUS = {"OPTIMAL": "optimal", "FEASIBLE": "feasible", "INFEASIBLE": "infeasible"}


def _solve_matrix(
    model: mb.Model, backend: str, time_limit_s: float, scip: str = SCIP_PARAMETERS
) -> tuple[str, np.ndarray]:
    """Solve with one backend, or AUTO: SCIP for AUTO_SCIP_S, then HiGHS for the rest of the time; `scip`: SCIP's
    parameters."""
    if backend == "AUTO":
        t0 = time.perf_counter()
        status, x = _solve_matrix(model, "SCIP", min(AUTO_SCIP_S, time_limit_s), scip)
        if status in ("optimal", "infeasible"):
            return status, x
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0:
            return status, x
        status2, x2 = _solve_matrix(model, "HIGHS", left)
        if status2 == "time_limit" and status == "feasible":
            return status, x  # HiGHS found nothing in the time left; SCIP's incumbent stands
        return status2, x2
    if backend == "CBC":  # not in the model builder: through the classic wrapper
        solver = new_solver("CBC", time_limit_s)
        error = solver.LoadModelFromProto(model.export_to_proto())
        if error:
            raise RuntimeError(f"inner solver could not load the model: {error}")
        params = pywraplp.MPSolverParameters()
        params.SetDoubleParam(params.RELATIVE_MIP_GAP, 1e-7)
        status = status_of(solver, solver.Solve(params), time_limit_s)
        x = np.array([v.solution_value() for v in solver.variables()]) if status in ("optimal", "feasible") else None
        return status, x  # type: ignore[return-value]
    solver = mb.Solver(backend.lower())
    solver.set_time_limit_in_seconds(time_limit_s)
    if backend == "HIGHS":
        solver.set_solver_specific_parameters("mip_rel_gap=1e-7\noutput_flag=false")
    elif backend == "SCIP":
        solver.set_solver_specific_parameters(scip)
    code = solver.solve(model)
    status = _MB_STATUS.get(code.name)
    if status is None:
        # out of time without a solution: SCIP says NOT_SOLVED, HiGHS UNKNOWN_STATUS
        if code.name in ("NOT_SOLVED", "UNKNOWN_STATUS") and solver.wall_time >= 0.95 * time_limit_s:
            return "time_limit", np.zeros(0)
        raise RuntimeError(f"inner solver ({backend}) ended with status {code.name}")
    if status == "infeasible":
        return status, np.zeros(0)
    return status, solver.values(model.get_variables()).to_numpy()


class _Model:
    """The thesis model over classes, built term by term (the comparison model, not the hot path)."""

    def __init__(self, prob: InnerProblem, classes: list[list[int]], backend: str, time_limit_s: float) -> None:
        self.prob, self.classes = prob, classes
        self.first = [c[0] for c in classes]
        self.bp, self.bd = prob.prefill_req_s[self.first], prob.decode_req_s[self.first]
        self.m = [len(c) for c in classes]
        self.solver = solver = new_solver(backend, time_limit_s, MODEL_GAP)
        self.time_limit_s = time_limit_s
        if backend == "SCIP" and not solver.SetSolverSpecificParametersAsString(SCIP_PARAMETERS):
            raise RuntimeError("SCIP refused solvers.inner.SCIP_PARAMETERS (an OR-Tools upgrade renamed one?)")
        n_c, n_j = len(classes), len(prob.p)
        self.xp = [[solver.NumVar(0.0, self.m[c], f"xP[{c},{j}]") for j in range(n_j)] for c in range(n_c)]
        self.xd = [[solver.NumVar(0.0, self.m[c], f"xD[{c},{j}]") for j in range(n_j)] for c in range(n_c)]
        self.y, self.a = [], []  # decode and prefill island counts per class
        for c, members in enumerate(classes):
            if prob.roles is not None:
                role = prob.roles[members[0]]
                n_d, n_p = (self.m[c] if role == "decode" else 0), (self.m[c] if role == "prefill" else 0)
                self.y.append(solver.NumVar(n_d, n_d, f"y[{c}]"))
                self.a.append(solver.NumVar(n_p, n_p, f"a[{c}]"))
            else:
                self.y.append(solver.IntVar(0, self.m[c], f"y[{c}]"))
                self.a.append(None)  # the thesis model uses every island: a_c = m_c − y_c

    def _range_rates(self) -> tuple[list[object], list[object]]:
        n_c, n_j = len(self.classes), len(self.prob.p)
        bp, bd, s = self.bp, self.bd, self.solver
        rp_j = [s.Sum([bp[c, j] * self.xp[c][j] for c in range(n_c) if bp[c, j] > 0]) for j in range(n_j)]
        rd_j = [s.Sum([bd[c, j] * self.xd[c][j] for c in range(n_c) if bd[c, j] > 0]) for j in range(n_j)]
        return rp_j, rd_j

    def _run(self) -> str:
        params = pywraplp.MPSolverParameters()
        params.SetDoubleParam(params.RELATIVE_MIP_GAP, MODEL_GAP)  # SCIP's default 1e-4 is visible in Λ
        return status_of(self.solver, self.solver.Solve(params), self.time_limit_s)

    def thesis(self, t0: float) -> InnerSolution:
        prob, s = self.prob, self.solver
        n_j, p, inf = len(prob.p), prob.p, s.infinity()
        d_p = [s.NumVar(0.0, inf, f"dP[{j}]") for j in range(n_j)]
        d_d = [s.NumVar(0.0, inf, f"dD[{j}]") for j in range(n_j)]
        d_m = [s.NumVar(0.0, inf, f"dM[{j}]") for j in range(n_j)]
        rp_j, rd_j = self._range_rates()
        rp, rd = s.Sum(rp_j), s.Sum(rd_j)
        for c in range(len(self.classes)):
            if self.m[c] == 1 and prob.roles is None:
                # (1)-(2) as written: one island, one binary
                z = self.y[c]
                s.Add(s.Sum(self.xp[c]) + s.Sum(self.xd[c]) == 1)
                for j in range(n_j):
                    s.Add(self.xp[c][j] <= 1 - z)
                    s.Add(self.xd[c][j] <= z)
            else:
                # (1)-(2) aggregated over the class's m_c islands
                s.Add(s.Sum(self.xp[c]) == self.m[c] - self.y[c])
                s.Add(s.Sum(self.xd[c]) == self.y[c])
        # (3) minimum performance
        s.Add(rp >= prob.epsilon)
        s.Add(rd >= prob.epsilon)
        for j in range(n_j):
            # (4) decode deviation, (5) prefill deviation, (6) prefill/decode match
            s.Add(rd_j[j] - p[j] * rd <= d_d[j])
            s.Add(p[j] * rd - rd_j[j] <= d_d[j])
            s.Add(d_d[j] <= prob.tau * p[j] * rd)
            s.Add(rp_j[j] - p[j] * rp <= d_p[j])
            s.Add(p[j] * rp - rp_j[j] <= d_p[j])
            s.Add(d_p[j] <= prob.tau * p[j] * rp)
            s.Add(rd_j[j] - rp_j[j] <= d_m[j])
            s.Add(rp_j[j] - rd_j[j] <= d_m[j])
        lam = prob.M / (1.0 + p)
        s.Maximize(rd + rp - s.Sum([lam[j] * (d_d[j] + d_p[j] + d_m[j]) for j in range(n_j)]))
        status = self._run()
        if status in ("infeasible", "time_limit"):
            return self._empty(status, t0)
        routing = self._expand(*self._values())
        r_p = float((prob.prefill_req_s * routing.x_prefill).sum())
        r_d = float((prob.decode_req_s * routing.x_decode).sum())
        # (7) D_total, as the solver's deviation variables
        d_total = float(sum(v.solution_value() for v in (*d_p, *d_d, *d_m)))
        return _solution(prob, self.classes, routing, status=status, rate=min(r_p, r_d), deviation=d_total, t0=t0,
                         extra={"objective": s.Objective().Value()})  # fmt: skip

    def _values(self) -> tuple[np.ndarray, np.ndarray]:
        xp = np.array([[v.solution_value() for v in row] for row in self.xp])
        xd = np.array([[v.solution_value() for v in row] for row in self.xd])
        return xp, xd

    def _expand(self, xp: np.ndarray, xd: np.ndarray) -> _Routing:
        n_dec = np.array([round(v.solution_value()) for v in self.y])
        n_pre = np.array([round(self.a[c].solution_value()) if self.a[c] is not None else self.m[c] - n_dec[c]
                          for c in range(len(self.classes))])  # fmt: skip
        return _expand(self.prob, self.classes, _ClassTotals(xp, xd, n_pre, n_dec))

    def _empty(self, status: str, t0: float) -> InnerSolution:
        return _empty(self.prob, status, t0)


@dataclass(frozen=True)
class _ClassTotals:
    """A solve's totals per class: capacity per range in island units (C, J) and islands (C,) per role."""

    xp: np.ndarray
    xd: np.ndarray
    n_pre: np.ndarray
    n_dec: np.ndarray
    xa: np.ndarray | None = None  # with aggregated islands
    n_agg: np.ndarray | None = None


class _Routing(NamedTuple):
    """Per island: its share of each range in each phase (I, J), and its role."""

    x_prefill: np.ndarray
    x_decode: np.ndarray
    roles: tuple[str, ...]


def _expand(prob: InnerProblem, classes: list[list[int]], t: _ClassTotals) -> _Routing:
    """Class totals to islands: the first a_c prefill, the next y_c decode, the next g_c aggregated (its share in
    both x_prefill and x_decode), the rest idle."""
    n_i, n_j = len(prob.islands), len(prob.p)
    roles = ["idle"] * n_i
    x_pi, x_di = np.zeros((n_i, n_j)), np.zeros((n_i, n_j))
    n_pre, n_dec, xa, n_agg = t.n_pre, t.n_dec, t.xa, t.n_agg
    for c, members in enumerate(classes):
        for k, i in enumerate(members):
            if k < n_pre[c]:
                roles[i] = "prefill"
                x_pi[i] = t.xp[c] / n_pre[c]
            elif k < n_pre[c] + n_dec[c]:
                roles[i] = "decode"
                x_di[i] = t.xd[c] / n_dec[c]
            elif xa is not None and n_agg is not None and k < n_pre[c] + n_dec[c] + n_agg[c]:
                roles[i] = "aggregated"
                x_pi[i] = x_di[i] = xa[c] / n_agg[c]
    return _Routing(x_pi, x_di, tuple(roles))


def _solution(
    prob: InnerProblem,
    classes: list[list[int]],
    routing: _Routing,
    *,
    status: str,
    rate: float,
    deviation: float,
    t0: float,
    extra: dict[str, float],
) -> InnerSolution:
    x_pi, x_di, roles = routing
    return InnerSolution(
        status,
        rate,
        roles,
        x_pi,
        x_di,
        float((prob.prefill_req_s * x_pi).sum()),
        float((prob.decode_req_s * x_di).sum()),
        deviation,
        (time.perf_counter() - t0) * 1e3,
        {"classes": float(len(classes)), **extra},
    )


def _empty(prob: InnerProblem, status: str, t0: float) -> InnerSolution:
    n_i, n_j = prob.prefill_req_s.shape
    z = np.zeros((n_i, n_j))
    return InnerSolution(status, 0.0, ("prefill",) * n_i, z, z.copy(), 0.0, 0.0, 0.0, (time.perf_counter() - t0) * 1e3)


def _within(x: np.ndarray, islands: np.ndarray) -> np.ndarray:
    """Scale each class's row down to at most its number of islands (none: zero)."""
    total = x.sum(axis=1)
    scale = np.where(total > islands, np.divide(islands, total, out=np.zeros_like(total), where=total > 0), 1.0)
    return x * scale[:, None]


def _trim_to_demand(x: np.ndarray, b: np.ndarray, demand: np.ndarray) -> np.ndarray:
    """Scale each range's allocation down so its capacity equals the demand Λ p_j exactly."""
    cap = (b * x).sum(axis=0)
    scale = np.where(cap > demand, np.divide(demand, cap, out=np.ones_like(cap), where=cap > 0), 1.0)
    return np.where(b > 0, x * scale, 0.0)


# --- JSON contract: python -m solvers.inner PROBLEM.json ---------------------------------------


def problem_from_json(data: object) -> tuple[InnerProblem, float]:
    """Parse the contract's problem JSON; ValueError names the offending key."""
    if not isinstance(data, dict):
        raise ValueError("the problem must be a JSON object")
    for key in ("islands", "ranges", "prefill_req_s", "decode_req_s"):
        if key not in data:
            raise ValueError(f"missing key {key!r}")
    islands = data["islands"]
    if not isinstance(islands, list) or not all(
        isinstance(x, dict) and isinstance(x.get("gpu"), str) and isinstance(x.get("size"), int) for x in islands
    ):
        raise ValueError('`islands` must be a list of {"gpu": str, "size": int}')
    ranges = data["ranges"]
    if not isinstance(ranges, list) or not all(isinstance(r, dict) and {"start", "end", "p"} <= set(r) for r in ranges):
        raise ValueError('`ranges` must be a list of {"start": int, "end": int, "p": float}')
    try:
        bp = np.array(data["prefill_req_s"], dtype=float)
        bd = np.array(data["decode_req_s"], dtype=float)
        p = np.array([float(r["p"]) for r in ranges])
    except (TypeError, ValueError):
        raise ValueError("`prefill_req_s`, `decode_req_s` and range `p` must be numbers (rows = islands)") from None
    extra: dict[str, object] = {}
    for key in ("tau", "M", "budget_per_hour", "kv_gb", "link_gb_s", "cost_per_hour", "aggregated_req_s"):
        if key in data:
            try:
                extra[key] = (
                    float(data[key]) if key in ("tau", "M", "budget_per_hour") else np.array(data[key], dtype=float)
                )
            except (TypeError, ValueError):
                raise ValueError(
                    f"`{key}` must be a number (or, for per-range/per-island keys, a list of numbers)"
                ) from None
    if "roles" in data:
        roles = data["roles"]
        if (
            not isinstance(roles, list)
            or len(roles) != len(islands)
            or not all(r in ("prefill", "decode", "aggregated") for r in roles)
        ):
            raise ValueError(
                f'`roles` must list "prefill", "decode" or "aggregated" for each of the {len(islands)} islands, '
                f"got {roles!r}"
            )
        extra["roles"] = tuple(roles)
    limit = data.get("time_limit_s", 10.0)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0 or limit != limit:
        raise ValueError(f"`time_limit_s` must be a number of seconds > 0, got {limit!r}")
    prob = InnerProblem(
        islands=tuple((x["gpu"], x["size"]) for x in islands),
        p=p,
        prefill_req_s=bp,
        decode_req_s=bd,
        objective=str(data.get("objective", "max_rate")),
        range_start=np.array([r["start"] for r in ranges]),
        range_end=np.array([r["end"] for r in ranges]),
        **extra,
    )
    return prob, float(limit)


def problem_to_json(prob: InnerProblem, time_limit_s: float | None = None) -> dict[str, object]:
    starts = prob.range_start if prob.range_start is not None else np.arange(len(prob.p))
    ends = prob.range_end if prob.range_end is not None else starts + 1
    out: dict[str, object] = {
        "objective": prob.objective,
        "islands": [{"gpu": g, "size": int(n)} for g, n in prob.islands],
        "ranges": [
            {"start": int(s), "end": int(e), "p": float(q)} for s, e, q in zip(starts, ends, prob.p, strict=True)
        ],
        "prefill_req_s": prob.prefill_req_s.tolist(),
        "decode_req_s": prob.decode_req_s.tolist(),
        "tau": prob.tau,
        "M": prob.M,
    }
    for key in ("kv_gb", "link_gb_s", "cost_per_hour", "aggregated_req_s"):
        if getattr(prob, key) is not None:
            out[key] = getattr(prob, key).tolist()
    if prob.budget_per_hour is not None:
        out["budget_per_hour"] = prob.budget_per_hour
    if prob.roles is not None:
        out["roles"] = list(prob.roles)
    if time_limit_s is not None:
        out["time_limit_s"] = time_limit_s
    return out


def main(argv: list[str]) -> int:
    import json

    from costmodel.cli import UserError

    if len(argv) != 1:
        raise UserError("usage: python -m solvers.inner PROBLEM.json")
    try:
        data = json.loads(open(argv[0], "rb").read().decode("utf-8"))
        prob, limit = problem_from_json(data)
    except OSError as err:
        raise UserError(f"{argv[0]}: cannot read it ({err.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{argv[0]}: not valid JSON ({err})") from None
    except ValueError as err:
        raise UserError(f"{argv[0]}: {err}") from None
    print(json.dumps(solve(prob, time_limit_s=limit).to_json()))
    return 0


if __name__ == "__main__":
    import sys

    from costmodel.cli import run

    run(lambda: main(sys.argv[1:]))

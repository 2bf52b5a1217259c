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

import time
from dataclasses import dataclass, field

import numpy as np
from ortools.linear_solver import pywraplp

OBJECTIVES = ("max_rate", "thesis")
STATUSES = ("optimal", "feasible", "infeasible", "time_limit")
ROLES = ("prefill", "decode", "idle")
MILP_BACKENDS = ("SCIP", "HIGHS", "CBC")


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

    def __post_init__(self) -> None:
        n_i, n_j = len(self.islands), len(self.p)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose from {list(OBJECTIVES)}")
        if n_i == 0 or n_j == 0:
            raise ValueError(f"a problem needs at least one island and one range, got {n_i} islands, {n_j} ranges")
        for name in ("prefill_req_s", "decode_req_s"):
            a = getattr(self, name)
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
        if self.objective == "thesis" and (self.kv_gb is not None or self.budget_per_hour is not None):
            raise ValueError("KV-transfer and budget constraints belong to `max_rate`; the thesis model has neither")
        if self.roles is not None and (len(self.roles) != n_i or not set(self.roles) <= set(ROLES)):
            raise ValueError(f"`roles` must give one of {list(ROLES)} for each of the {n_i} islands")
        if self.objective == "thesis" and self.roles is not None and "idle" in self.roles:
            raise ValueError("the thesis model uses every island; `idle` roles belong to `max_rate`")


@dataclass(frozen=True)
class InnerSolution:
    status: str
    rate_req_s: float  # max_rate: Λ; thesis: min(R^P, R^D)
    roles: tuple[str, ...]  # "prefill" | "decode" | "idle" (only with a budget) per island
    x_prefill: np.ndarray  # (I, J) fraction of island i's capacity prefilling range j
    x_decode: np.ndarray
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
    prob: InnerProblem, *, time_limit_s: float = 10.0, backend: str = "SCIP", aggregate: bool = True
) -> InnerSolution:
    """Solve `prob` with its objective; see the module docstring for both models.

    `backend` is the MILP solver (one of MILP_BACKENDS); LPs always go to GLOP.
    `aggregate=False` gives every island its own class (one binary each; the thesis as written).
    """
    if backend not in MILP_BACKENDS:
        raise ValueError(f"unknown MILP backend {backend!r}; choose from {list(MILP_BACKENDS)}")
    t0 = time.perf_counter()
    classes = island_classes(prob) if aggregate else [[i] for i in range(len(prob.islands))]
    m = _Model(prob, classes, backend if prob.roles is None else "GLOP", time_limit_s)
    if prob.objective == "max_rate":
        return m.max_rate(t0)
    return m.thesis(t0)


def _status(solver: pywraplp.Solver, code: int) -> str:
    if code == pywraplp.Solver.OPTIMAL:
        return "optimal"
    if code == pywraplp.Solver.INFEASIBLE:
        return "infeasible"
    if code == pywraplp.Solver.FEASIBLE:
        return "feasible"  # stopped at the time limit with a solution in hand
    if code == pywraplp.Solver.NOT_SOLVED and solver.wall_time() >= 0.95 * solver.time_limit():
        return "time_limit"
    names = {
        pywraplp.Solver.UNBOUNDED: "UNBOUNDED",
        pywraplp.Solver.ABNORMAL: "ABNORMAL",
        pywraplp.Solver.MODEL_INVALID: "MODEL_INVALID",
        pywraplp.Solver.NOT_SOLVED: "NOT_SOLVED",
    }
    raise RuntimeError(f"inner solver ended with status {names.get(code, code)}")


def new_solver(backend: str, time_limit_s: float) -> pywraplp.Solver:
    """A quiet OR-Tools solver with a time limit."""
    solver = pywraplp.Solver.CreateSolver(backend)
    if solver is None:
        raise RuntimeError(f"OR-Tools was built without {backend}; reinstall ortools")
    solver.SetTimeLimit(max(int(time_limit_s * 1000), 1))
    solver.SuppressOutput()
    if backend == "HIGHS":
        solver.SetSolverSpecificParametersAsString("output_flag=false")  # HiGHS prints a banner otherwise
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
        )
        groups.setdefault(key, []).append(i)
    return list(groups.values())


class _Model:
    """The class-aggregated variables shared by both objectives."""

    def __init__(self, prob: InnerProblem, classes: list[list[int]], backend: str, time_limit_s: float) -> None:
        self.prob, self.classes = prob, classes
        self.first = [c[0] for c in classes]
        self.bp, self.bd = prob.prefill_req_s[self.first], prob.decode_req_s[self.first]
        self.m = [len(c) for c in classes]
        self.solver = solver = new_solver(backend, time_limit_s)
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
                self.a.append(solver.IntVar(0, self.m[c], f"a[{c}]") if prob.budget_per_hour is not None else None)

    def _prefill_count(self, c: int) -> object:
        return self.a[c] if self.a[c] is not None else self.m[c] - self.y[c]

    def _range_rates(self) -> tuple[list[object], list[object]]:
        n_c, n_j = len(self.classes), len(self.prob.p)
        bp, bd, s = self.bp, self.bd, self.solver
        rp_j = [s.Sum([bp[c, j] * self.xp[c][j] for c in range(n_c) if bp[c, j] > 0]) for j in range(n_j)]
        rd_j = [s.Sum([bd[c, j] * self.xd[c][j] for c in range(n_c) if bd[c, j] > 0]) for j in range(n_j)]
        return rp_j, rd_j

    def _run(self) -> str:
        params = pywraplp.MPSolverParameters()
        params.SetDoubleParam(params.RELATIVE_MIP_GAP, 1e-7)  # SCIP's default 1e-4 is visible in Λ
        return _status(self.solver, self.solver.Solve(params))

    def max_rate(self, t0: float) -> InnerSolution:
        prob, s = self.prob, self.solver
        lam = s.NumVar(0.0, s.infinity(), "Lambda")
        rp_j, rd_j = self._range_rates()
        for j in range(len(prob.p)):
            s.Add(rp_j[j] >= prob.p[j] * lam)  # (1)
            s.Add(rd_j[j] >= prob.p[j] * lam)  # (2)
        for c in range(len(self.classes)):
            s.Add(s.Sum(self.xp[c]) <= self._prefill_count(c))  # (3)
            s.Add(s.Sum(self.xd[c]) <= self.y[c])
            if self.a[c] is not None:
                s.Add(self.a[c] + self.y[c] <= self.m[c])  # (4) with a budget
        if prob.kv_gb is not None and prob.link_gb_s is not None:  # (5)
            k = prob.kv_gb
            for c, i in enumerate(self.first):
                link = float(prob.link_gb_s[i])
                s.Add(
                    s.Sum([self.bp[c, j] * k[j] * v for j, v in enumerate(self.xp[c])]) <= link * self._prefill_count(c)
                )
                s.Add(s.Sum([self.bd[c, j] * k[j] * v for j, v in enumerate(self.xd[c])]) <= link * self.y[c])
        if prob.budget_per_hour is not None and prob.cost_per_hour is not None:  # (6)
            cost = prob.cost_per_hour[self.first]
            s.Add(
                s.Sum([float(cost[c]) * (self.a[c] + self.y[c]) for c in range(len(self.classes))])
                <= prob.budget_per_hour
            )
        s.Maximize(lam)
        status = self._run()
        if status in ("infeasible", "time_limit"):
            return self._empty(status, t0)
        rate = lam.solution_value()
        xp, xd = self._values()
        xp, xd = _trim_to_demand(xp, self.bp, prob.p * rate), _trim_to_demand(xd, self.bd, prob.p * rate)
        x_pi, x_di, roles = self._expand(xp, xd)
        return self._solution(status, float(rate), roles, x_pi, x_di, thesis_deviation(prob, x_pi, x_di), t0, {})

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
        x_pi, x_di, roles = self._expand(*self._values())
        r_p = float((prob.prefill_req_s * x_pi).sum())
        r_d = float((prob.decode_req_s * x_di).sum())
        # (7) D_total, as the solver's deviation variables
        d_total = float(sum(v.solution_value() for v in (*d_p, *d_d, *d_m)))
        return self._solution(
            status, min(r_p, r_d), roles, x_pi, x_di, d_total, t0, {"objective": s.Objective().Value()}
        )

    def _values(self) -> tuple[np.ndarray, np.ndarray]:
        xp = np.array([[v.solution_value() for v in row] for row in self.xp])
        xd = np.array([[v.solution_value() for v in row] for row in self.xd])
        return xp, xd

    def _expand(self, xp: np.ndarray, xd: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
        """Class totals to islands: the first a_c prefill, the next y_c decode, the rest idle."""
        n_i, n_j = len(self.prob.islands), len(self.prob.p)
        roles = ["idle"] * n_i
        x_pi, x_di = np.zeros((n_i, n_j)), np.zeros((n_i, n_j))
        for c, members in enumerate(self.classes):
            n_dec = round(self.y[c].solution_value())
            n_pre = round(self.a[c].solution_value()) if self.a[c] is not None else self.m[c] - n_dec
            for k, i in enumerate(members):
                if k < n_pre:
                    roles[i] = "prefill"
                    x_pi[i] = xp[c] / n_pre
                elif k < n_pre + n_dec:
                    roles[i] = "decode"
                    x_di[i] = xd[c] / n_dec
        return x_pi, x_di, tuple(roles)

    def _solution(
        self,
        status: str,
        rate: float,
        roles: tuple[str, ...],
        x_pi: np.ndarray,
        x_di: np.ndarray,
        deviation: float,
        t0: float,
        extra: dict[str, float],
    ) -> InnerSolution:
        return InnerSolution(
            status,
            rate,
            roles,
            x_pi,
            x_di,
            float((self.prob.prefill_req_s * x_pi).sum()),
            float((self.prob.decode_req_s * x_di).sum()),
            deviation,
            (time.perf_counter() - t0) * 1e3,
            {"classes": float(len(self.classes)), **extra},
        )

    def _empty(self, status: str, t0: float) -> InnerSolution:
        n_i, n_j = self.prob.prefill_req_s.shape
        z = np.zeros((n_i, n_j))
        return InnerSolution(
            status, 0.0, ("prefill",) * n_i, z, z.copy(), 0.0, 0.0, 0.0, (time.perf_counter() - t0) * 1e3
        )


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
    for key in ("tau", "M", "budget_per_hour", "kv_gb", "link_gb_s", "cost_per_hour"):
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
        extra["roles"] = tuple(str(r) for r in data["roles"])
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
    return prob, float(data.get("time_limit_s", 10.0))


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
    for key in ("kv_gb", "link_gb_s", "cost_per_hour"):
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
    import sys

    if len(argv) != 1:
        print("usage: python -m solvers.inner PROBLEM.json", file=sys.stderr)
        return 2
    try:
        with open(argv[0]) as f:
            data = json.load(f)
        prob, limit = problem_from_json(data)
    except FileNotFoundError:
        print(f"error: {argv[0]}: no such file", file=sys.stderr)
        return 2
    except json.JSONDecodeError as err:
        print(f"error: {argv[0]}: not valid JSON ({err})", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"error: {argv[0]}: {err}", file=sys.stderr)
        return 2
    print(json.dumps(solve(prob, time_limit_s=limit).to_json()))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))

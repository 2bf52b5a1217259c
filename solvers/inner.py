"""Inner loop: give islands prefill/decode roles and route input-length ranges to them.

Sets: islands i (GPU type, size), ranges j with mass p_j (Σ p_j = 1).
Data: b^P_ij, b^D_ij = requests/s island i sustains when all of it prefills / decodes range j.

**max_rate** (default, exact). Identical islands (same type, size and benchmark rows) form a
class c of m_c islands; y_c = how many of them decode.

    max Λ
    (1) Σ_c b^P_cj x^P_cj >= Λ p_j                 ∀ j   prefill capacity of range j
    (2) Σ_c b^D_cj x^D_cj >= Λ p_j                 ∀ j   decode capacity of range j
    (3) Σ_j x^P_cj <= m_c − y_c                     ∀ c   prefill islands' capacity
    (4) Σ_j x^D_cj <= y_c                           ∀ c   decode islands' capacity
        x >= 0,  y_c ∈ {0, ..., m_c}

x^P_cj is capacity in island units (1 = one whole island). After the solve every range's
capacity is scaled down to exactly Λ p_j; what is left of an island is headroom.

**thesis** (seeds/000 section 4.8.1, as written). One binary z_i per island (1 = decode),
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
The thesis reports min(R^P, R^D) as the system's throughput; so does `rate_req_s` here.

Both are MILPs (SCIP through OR-Tools' linear solver wrapper). Infeasible and time-limit are
statuses, never exceptions; any other solver outcome raises with the solver's status.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from ortools.linear_solver import pywraplp

OBJECTIVES = ("max_rate", "thesis")
STATUSES = ("optimal", "feasible", "infeasible", "time_limit")


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


@dataclass(frozen=True)
class InnerSolution:
    status: str
    rate_req_s: float  # max_rate: Λ; thesis: min(R^P, R^D)
    roles: tuple[str, ...]  # "prefill" | "decode" per island
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


def solve(prob: InnerProblem, *, time_limit_s: float = 10.0) -> InnerSolution:
    """Solve `prob` with its objective; see the module docstring for both models."""
    if prob.objective == "max_rate":
        return _solve_max_rate(prob, time_limit_s)
    return _solve_thesis(prob, time_limit_s)


def _new_solver(time_limit_s: float) -> pywraplp.Solver:
    solver = pywraplp.Solver.CreateSolver("SCIP")  # MILP: GLOP would reject the integers
    if solver is None:
        raise RuntimeError("OR-Tools was built without SCIP; reinstall ortools")
    solver.SetTimeLimit(max(int(time_limit_s * 1000), 1))
    return solver


def _run(solver: pywraplp.Solver) -> int:
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(params.RELATIVE_MIP_GAP, 1e-7)  # SCIP's default 1e-4 is visible in Λ
    return solver.Solve(params)


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


def _empty(prob: InnerProblem, status: str, t0: float) -> InnerSolution:
    n_i, n_j = prob.prefill_req_s.shape
    z = np.zeros((n_i, n_j))
    return InnerSolution(status, 0.0, ("prefill",) * n_i, z, z.copy(), 0.0, 0.0, 0.0, (time.perf_counter() - t0) * 1e3)


def island_classes(prob: InnerProblem) -> list[list[int]]:
    """Islands grouped by (gpu, size, identical benchmark rows), in first-seen order."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, isl in enumerate(prob.islands):
        key = (isl, prob.prefill_req_s[i].tobytes(), prob.decode_req_s[i].tobytes())
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _solve_max_rate(prob: InnerProblem, time_limit_s: float) -> InnerSolution:
    t0 = time.perf_counter()
    classes = island_classes(prob)
    n_c, n_j = len(classes), len(prob.p)
    b_p = np.array([prob.prefill_req_s[c[0]] for c in classes])
    b_d = np.array([prob.decode_req_s[c[0]] for c in classes])
    m = [len(c) for c in classes]
    solver = _new_solver(time_limit_s)
    lam = solver.NumVar(0.0, solver.infinity(), "Lambda")
    x_p = [[solver.NumVar(0.0, m[c], f"xP[{c},{j}]") for j in range(n_j)] for c in range(n_c)]
    x_d = [[solver.NumVar(0.0, m[c], f"xD[{c},{j}]") for j in range(n_j)] for c in range(n_c)]
    y = [solver.IntVar(0, m[c], f"y[{c}]") for c in range(n_c)]
    for j in range(n_j):
        # (1) prefill capacity of range j; (2) decode capacity of range j
        solver.Add(sum(b_p[c, j] * x_p[c][j] for c in range(n_c) if b_p[c, j] > 0) >= prob.p[j] * lam)
        solver.Add(sum(b_d[c, j] * x_d[c][j] for c in range(n_c) if b_d[c, j] > 0) >= prob.p[j] * lam)
    for c in range(n_c):
        # (3) prefill islands of class c; (4) decode islands of class c
        solver.Add(sum(x_p[c]) <= m[c] - y[c])
        solver.Add(sum(x_d[c]) <= y[c])
    solver.Maximize(lam)
    status = _status(solver, _run(solver))
    if status in ("infeasible", "time_limit"):
        return _empty(prob, status, t0)
    rate = lam.solution_value()
    xp = np.array([[v.solution_value() for v in row] for row in x_p])
    xd = np.array([[v.solution_value() for v in row] for row in x_d])
    ys = [round(v.solution_value()) for v in y]
    xp, xd = _trim_to_demand(xp, b_p, prob.p * rate), _trim_to_demand(xd, b_d, prob.p * rate)
    # expand classes to islands: the first m_c − y_c prefill, the rest decode; capacity shared evenly
    n_i = len(prob.islands)
    roles = ["prefill"] * n_i
    x_pi, x_di = np.zeros((n_i, n_j)), np.zeros((n_i, n_j))
    for c, members in enumerate(classes):
        n_pre = m[c] - ys[c]
        for k, i in enumerate(members):
            if k < n_pre:
                x_pi[i] = xp[c] / n_pre
            else:
                roles[i] = "decode"
                x_di[i] = xd[c] / ys[c]
    return InnerSolution(
        status,
        float(rate),
        tuple(roles),
        x_pi,
        x_di,
        float((prob.prefill_req_s * x_pi).sum()),
        float((prob.decode_req_s * x_di).sum()),
        thesis_deviation(prob, x_pi, x_di),
        (time.perf_counter() - t0) * 1e3,
        {"classes": float(n_c)},
    )


def _trim_to_demand(x: np.ndarray, b: np.ndarray, demand: np.ndarray) -> np.ndarray:
    """Scale each range's allocation down so its capacity equals the demand Λ p_j exactly."""
    cap = (b * x).sum(axis=0)
    scale = np.where(cap > demand, np.divide(demand, cap, out=np.ones_like(cap), where=cap > 0), 1.0)
    return np.where(b > 0, x * scale, 0.0)


def _solve_thesis(prob: InnerProblem, time_limit_s: float) -> InnerSolution:
    t0 = time.perf_counter()
    n_i, n_j = prob.prefill_req_s.shape
    bp, bd, p = prob.prefill_req_s, prob.decode_req_s, prob.p
    solver = _new_solver(time_limit_s)
    inf = solver.infinity()
    x_p = [[solver.NumVar(0.0, 1.0, f"xP[{i},{j}]") for j in range(n_j)] for i in range(n_i)]
    x_d = [[solver.NumVar(0.0, 1.0, f"xD[{i},{j}]") for j in range(n_j)] for i in range(n_i)]
    z = [solver.BoolVar(f"z[{i}]") for i in range(n_i)]
    d_p = [solver.NumVar(0.0, inf, f"dP[{j}]") for j in range(n_j)]
    d_d = [solver.NumVar(0.0, inf, f"dD[{j}]") for j in range(n_j)]
    d_m = [solver.NumVar(0.0, inf, f"dM[{j}]") for j in range(n_j)]
    rp_j = [sum(bp[i, j] * x_p[i][j] for i in range(n_i) if bp[i, j] > 0) for j in range(n_j)]
    rd_j = [sum(bd[i, j] * x_d[i][j] for i in range(n_i) if bd[i, j] > 0) for j in range(n_j)]
    rp, rd = solver.Sum(rp_j), solver.Sum(rd_j)
    for i in range(n_i):
        # (1) each island allocates exactly one unit of capacity
        solver.Add(sum(x_p[i]) + sum(x_d[i]) == 1)
        for j in range(n_j):
            # (2) exclusive prefill/decode role
            solver.Add(x_p[i][j] <= 1 - z[i])
            solver.Add(x_d[i][j] <= z[i])
    # (3) minimum performance
    solver.Add(rp >= prob.epsilon)
    solver.Add(rd >= prob.epsilon)
    for j in range(n_j):
        # (4) decode deviation, (5) prefill deviation, (6) prefill/decode match
        solver.Add(rd_j[j] - p[j] * rd <= d_d[j])
        solver.Add(p[j] * rd - rd_j[j] <= d_d[j])
        solver.Add(d_d[j] <= prob.tau * p[j] * rd)
        solver.Add(rp_j[j] - p[j] * rp <= d_p[j])
        solver.Add(p[j] * rp - rp_j[j] <= d_p[j])
        solver.Add(d_p[j] <= prob.tau * p[j] * rp)
        solver.Add(rd_j[j] - rp_j[j] <= d_m[j])
        solver.Add(rp_j[j] - rd_j[j] <= d_m[j])
    lam = prob.M / (1.0 + p)
    solver.Maximize(rd + rp - sum(lam[j] * (d_d[j] + d_p[j] + d_m[j]) for j in range(n_j)))
    status = _status(solver, _run(solver))
    if status in ("infeasible", "time_limit"):
        return _empty(prob, status, t0)
    xp = np.array([[v.solution_value() for v in row] for row in x_p])
    xd = np.array([[v.solution_value() for v in row] for row in x_d])
    roles = tuple("decode" if v.solution_value() > 0.5 else "prefill" for v in z)
    r_p, r_d = float((bp * xp).sum()), float((bd * xd).sum())
    # (7) D_total, as the solver's deviation variables
    d_total = float(sum(v.solution_value() for v in (*d_p, *d_d, *d_m)))
    return InnerSolution(
        status,
        min(r_p, r_d),
        roles,
        xp,
        xd,
        r_p,
        r_d,
        d_total,
        (time.perf_counter() - t0) * 1e3,
        {"objective": solver.Objective().Value()},
    )


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
    extra = {k: float(data[k]) for k in ("tau", "M") if k in data}
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

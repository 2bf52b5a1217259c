"""The exact reference: the best layout *and* routing of an inventory in one MILP.

Classes c = (GPU type t, island size s) for every size s >= the type's minimum island that
holds the model. n^P_c, n^D_c = how many islands of class c prefill / decode (integers);
x^P_cj, x^D_cj = capacity (island units) they give range j.

    max Λ
    (1) Σ_c b^P_cj x^P_cj >= Λ p_j,   Σ_c b^D_cj x^D_cj >= Λ p_j       ∀ j
    (2) Σ_j x^P_cj <= n^P_c,          Σ_j x^D_cj <= n^D_c             ∀ c
    (3) Σ_{c of type t} s_c (n^P_c + n^D_c) <= I_t                    ∀ t   the inventory
    (4) optional: Σ_c cost_c (n^P_c + n^D_c) <= B                           $/h budget
    (5) optional: KV egress/ingress as in solvers/inner.py
    (7) optional aggregated islands (a type's `aggregated_req_s`): n^A_c of them, x^A_cj capacity on range j,
        b^A_cj x^A_cj on the left of both halves of (1), Σ_j x^A_cj <= n^A_c, and n^A_c beside
        n^P_c + n^D_c in (3), (4) and (6), as in solvers/inner.py
    (6) optional, per type t with given island multisets M_t (e.g. every layout a generator can
        propose), instead of (3): Σ_m z_tm = 1 (z binary) and
        n^P_c + n^D_c <= Σ_m z_tm · (islands of size s_c in m)             ∀ c of type t
        The optimum is then the best layout among those multisets: a generator's ceiling.

This is the inner `max_rate` model with the layout made a decision too, so its Λ bounds
every layout a generator can propose (each is a feasible point): a search's gap to it is
>= 0 and measures the search alone.

When the MILP stops at its time limit (`max_rate`, no multisets), the LP relaxation gives a proven
upper bound, and a layout comes from the MILP's incumbent and the relaxation's counts made whole,
each improved by a local search over island counts (`solvers/count_search.py`), then from the
MILP over only the classes near the layouts that search ends at (`unproven`; the last
`COUNT_SEARCH_S` of the time limit are kept for both): the result is `feasible` with the
optimum between `rate_req_s` and `bound`, and a search's gap against `bound` is an upper bound on
its true gap.

`min_cost` (a demand R): min C subject to Λ >= R and (1)-(7): the cheapest islands within the inventory (its
counts upper bounds) that serve R; one MILP. Its `bound` is the proven lower bound on C (C itself when optimal).

`rate_per_dollar` maximises Λ / C (C = Σ_c cost_c (n^P_c + n^D_c)) by Dinkelbach's method:
solve max Λ − θ C, set θ = Λ / C, repeat until the optimum is 0 (a few MILPs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ortools.linear_solver import pywraplp

from solvers import count_search
from solvers.inner import MILP_BACKENDS, new_solver, quiet_stdout, status_of
from solvers.type_options import TypeOptions

GAP = 1e-6  # relative MIP gap: the reference is exact to this
# max_rate: the end of the time limit kept, if the MILP stops there, for the count search (the first half)
# and a MILP over the classes near its layouts (the rest); at most a quarter of the limit
COUNT_SEARCH_S = 20.0
NEAR_SIZES = 10  # that MILP's classes: each one the count search's layouts hold and this many sizes either side
LOSSES_PER_ROUND = 3  # spare_optimum, spare_cheapest: the losses that join the MILP per round, lowest first
EXACT_OBJECTIVES = ("max_rate", "rate_per_dollar", "min_cost")
MIX_PAIRS_UPTO = 4  # sizing_optima: the cheapest fleet of every pair of GPU types too, for inventories this small


@dataclass(frozen=True)
class ExactResult:
    status: str
    rate_req_s: float
    cost_per_hour: float
    islands: tuple[tuple[str, int, str], ...]  # (gpu, size, role) per island
    solve_ms: float
    iterations: int  # MILPs solved (Dinkelbach steps for rate_per_dollar)
    bound: float = float("nan")  # max_rate: the solver's proven upper bound on Λ (= Λ when optimal); min_cost: its
    # proven lower bound on C (= C when optimal)
    lost_hosts: int = 0  # the optimum with this many hosts lost (spare_optimum; 0: every host up)

    @property
    def rate_per_dollar(self) -> float:
        return self.rate_req_s / self.cost_per_hour if self.cost_per_hour > 0 else 0.0


def exact_optimum(
    types: list[TypeOptions],
    p: np.ndarray,
    *,
    objective: str = "max_rate",
    budget_per_hour: float | None = None,
    kv_gb: np.ndarray | None = None,
    time_limit_s: float = 120.0,
    backend: str = "HIGHS",
    demand_req_s: float | None = None,
) -> ExactResult:
    """The optimum of `objective` over every layout of `types` (min_cost: of the islands serving `demand_req_s`)."""
    if objective not in EXACT_OBJECTIVES:
        raise ValueError(f"exact reference: unknown objective {objective!r}; choose from {list(EXACT_OBJECTIVES)}")
    if backend not in MILP_BACKENDS:
        raise ValueError(f"unknown MILP backend {backend!r}; choose from {list(MILP_BACKENDS)}")
    if (objective == "min_cost") != (demand_req_s is not None):
        raise ValueError("exact reference: a demand goes with objective min_cost, and min_cost needs one")
    if demand_req_s is not None:
        res, _ = solve_counts(types, p, demand=demand_req_s, budget=budget_per_hour, kv_gb=kv_gb,
                              time_limit_s=time_limit_s, backend=backend)  # fmt: skip
        return res
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    fallback = objective == "max_rate" and all(t.layouts is None for t in types)  # `unproven` if cut short
    search_s = min(COUNT_SEARCH_S, time_limit_s / 4) if fallback else 0.0
    theta, iters, best = 0.0, 0, None
    while True:
        iters += 1
        milp_s = max(deadline - search_s - time.perf_counter(), 1.0)
        res, counts = solve_counts(types, p, theta=theta, budget=budget_per_hour, kv_gb=kv_gb, time_limit_s=milp_s,
                                   backend=backend)  # fmt: skip
        if fallback and res.status in ("feasible", "time_limit"):
            res = unproven(types, p, res, counts, t0, budget=budget_per_hour, kv_gb=kv_gb, search_s=search_s,
                           backend=backend)  # fmt: skip
        if res.status not in ("optimal", "feasible") or (best is not None and res.cost_per_hour <= 0):
            break  # at the optimal ratio the empty layout ties at 0: the previous layout is the answer
        if best is None or res.rate_per_dollar > best.rate_per_dollar:
            best = res
        if objective == "max_rate" or res.cost_per_hour <= 0 or time.perf_counter() > deadline or iters >= 50:
            break
        if res.rate_per_dollar <= theta * (1 + 1e-9):
            break
        theta = res.rate_per_dollar
    out = res if objective == "max_rate" or best is None else best
    return ExactResult(
        out.status, out.rate_req_s, out.cost_per_hour, out.islands, (time.perf_counter() - t0) * 1e3, iters, out.bound
    )


def island_classes(types: list[TypeOptions]) -> list[tuple[int, int]]:
    """(type index, size index) of every island that fits the inventory and serves in some role."""
    return [(ti, si) for ti, t in enumerate(types) for si in range(len(t.sizes))
            if t.sizes[si] <= t.count and (t.prefill_req_s[si].any() or t.decode_req_s[si].any()
                                           or _agg(t)[si].any())]  # fmt: skip


def _agg(t: TypeOptions) -> np.ndarray:
    return t.aggregated_req_s if t.aggregated_req_s is not None else np.zeros_like(t.prefill_req_s)


def solve_counts(
    types: list[TypeOptions],
    p: np.ndarray,
    *,
    theta: float = 0.0,
    budget: float | None = None,
    kv_gb: np.ndarray | None = None,
    time_limit_s: float,
    backend: str = "HIGHS",
    relax: bool = False,
    fix: list[tuple[int, int]] | None = None,
    halves: Sequence[tuple[int, str]] = (),
    demand: float | None = None,
) -> tuple[ExactResult, list[tuple[float, float]]]:
    """One solve of the model (`theta` > 0: of max Λ − θ C, a Dinkelbach step; `demand`: of min C with Λ >= it;
    `budget`: (4); `kv_gb`: (5);
    `relax`: integers continuous, an LP; `fix`: every class's (n^P, n^D) given and no island aggregated, an LP
    over the routing; `halves`: (8) for each (class, role), `spare_optimum`'s). Returns the result and each
    class's (n^P, n^D) as solved (aggregated islands, in the result's islands, are not among them: the count
    search moves prefill and decode islands only)."""
    t0 = time.perf_counter()
    milp = not (relax or fix is not None)
    s = new_solver(backend if milp else "HIGHS", time_limit_s, GAP if milp else None)  # GLOP: ABNORMAL at 10k GPUs
    lam = s.NumVar(0.0 if demand is None else demand, s.infinity(), "Lambda")
    block = add_model(s, types, p, lam, kv_gb=kv_gb, relax=relax, fix=fix)
    classes, n_p, n_d, n_a = block.classes, block.n_p, block.n_d, block.n_a
    for ti, t in enumerate(types):
        if t.layouts is not None:  # (6) one of the given multisets (islands that cannot run stay idle)
            z = [(s.NumVar(0.0, 1.0, "") if relax else s.BoolVar(f"z[{t.gpu},{k}]")) for k in range(len(t.layouts))]
            s.Add(s.Sum(z) == 1)
            for c, (tj, si) in enumerate(classes):
                if tj == ti:
                    size = int(t.sizes[si])
                    held = [z[k] * m.count(size) for k, m in enumerate(t.layouts) if size in m]
                    s.Add(n_p[c] + n_d[c] + n_a[c] <= s.Sum(held))
            continue
        used = block.used(ti)
        if used:
            s.Add(s.Sum(used) <= t.count)  # (3)
    for c, role in halves:  # (8) one island of class c in `role` lost (spare_optimum)
        _loss_half(s, types, classes, p, lam, n_p if role == "prefill" else n_d, lost=c, role=role)
    total_cost = block.cost()
    if budget is not None:
        s.Add(total_cost <= budget)
    if demand is not None:
        s.Minimize(total_cost)
    else:
        s.Maximize(lam - theta * total_cost if theta > 0 else lam)
    params = pywraplp.MPSolverParameters()
    if milp:
        params.SetDoubleParam(params.RELATIVE_MIP_GAP, GAP)
    with quiet_stdout() if milp and backend == "HIGHS" else contextlib.nullcontext():
        code = s.Solve(params)
    status = status_of(s, code, time_limit_s)
    if status in ("infeasible", "time_limit"):
        return ExactResult(status, 0.0, 0.0, (), (time.perf_counter() - t0) * 1e3, 1, float("nan")), []
    counts, islands = block.solution()
    spent = sum(size * next(t.price_per_gpu_hour for t in types if t.gpu == g) for g, size, _ in islands)
    # the proven bound (Λ's; min_cost: C's): the value itself when optimal (or an LP's), beyond the incumbent when
    # the time limit stopped it
    bound = (
        (s.Objective().Value() if demand is not None else lam.solution_value()) if relax or fix is not None
        else s.Objective().BestBound() if theta == 0 else float("nan")
    )  # fmt: skip
    ms = (time.perf_counter() - t0) * 1e3
    return ExactResult(status, lam.solution_value(), spent, islands, ms, 1, bound), counts


@dataclass
class ModelBlock:
    """One model's islands in a MILP: per class c (`island_classes`), the counts n^P_c, n^D_c, n^A_c and the
    capacity x_cj each gives range j, with (1), (2) and (5) added; the inventory (3) is the caller's, since several
    models' blocks share one inventory (`solvers/fleet.py`)."""

    solver: Any
    types: list[TypeOptions]
    classes: list[tuple[int, int]]
    n_p: list[Any]
    n_d: list[Any]
    n_a: list[Any]  # 0 where the class has no aggregated role
    aggregated: list[bool]

    def used(self, ti: int) -> list[Any]:
        """The GPUs of type `ti` this block's islands take (terms to sum)."""
        return [int(self.types[ti].sizes[si]) * (self.n_p[c] + self.n_d[c] + self.n_a[c])
                for c, (tj, si) in enumerate(self.classes) if tj == ti]  # fmt: skip

    def cost(self) -> Any:
        """$/h of the block's islands (an expression)."""
        return self.solver.Sum([int(self.types[ti].sizes[si]) * self.types[ti].price_per_gpu_hour
                                * (self.n_p[c] + self.n_d[c] + self.n_a[c])
                                for c, (ti, si) in enumerate(self.classes)])  # fmt: skip

    def solution(self, values: np.ndarray | None = None) -> tuple[list[tuple[float, float]],
                                                                tuple[tuple[str, int, str], ...]]:  # fmt: skip
        """Each class's (n^P, n^D) as solved, and every island (gpu, size, role), aggregated ones included
        (`values`: every variable's value by its index, where the model was solved outside its solver)."""
        def value(v: Any) -> float:
            return float(values[v.index()]) if values is not None else v.solution_value()

        counts = [(value(self.n_p[c]), value(self.n_d[c])) for c in range(len(self.classes))]
        aggregated = [round(value(self.n_a[c])) if a else 0 for c, a in enumerate(self.aggregated)]
        return counts, _islands_of(self.types, self.classes, counts, aggregated)


def add_model(
    s: Any,
    types: list[TypeOptions],
    p: np.ndarray,
    rate: Any,
    *,
    kv_gb: np.ndarray | None = None,
    relax: bool = False,
    fix: list[tuple[int, int]] | None = None,
    tag: str = "",
) -> ModelBlock:
    """Add one model's island classes to solver `s`: counts, routing, (1) Σ_c b_cj x_cj >= p_j · `rate` for each
    role, (2) and, with `kv_gb`, (5). `relax`: counts continuous; `fix`: every class's (n^P, n^D) given, no
    aggregated islands; `tag`: a prefix of its variables' names (several models in one solver)."""
    n_j = len(p)
    classes = island_classes(types)
    n_p, n_d, x_p, x_d = [], [], [], []
    n_a: list[Any] = []
    x_a: list[list[Any]] = []
    for c, (ti, si) in enumerate(classes):
        t, size = types[ti], int(types[ti].sizes[si])
        most = t.count // size
        if fix is not None:
            n_p.append(s.NumVar(fix[c][0], fix[c][0], ""))
            n_d.append(s.NumVar(fix[c][1], fix[c][1], ""))
        else:
            var = s.NumVar if relax else s.IntVar
            n_p.append(var(0, most, f"{tag}nP[{t.gpu},{size}]"))
            n_d.append(var(0, most, f"{tag}nD[{t.gpu},{size}]"))
        x_p.append([s.NumVar(0.0, most, "") for _ in range(n_j)])
        x_d.append([s.NumVar(0.0, most, "") for _ in range(n_j)])
        agg = fix is None and _agg(t)[si].any()
        n_a.append((s.NumVar if relax else s.IntVar)(0, most, f"{tag}nA[{t.gpu},{size}]") if agg else 0)
        x_a.append([s.NumVar(0.0, most, "") for _ in range(n_j)] if agg else [])
    for j in range(n_j):
        both = [_agg(types[ti])[si, j] * x_a[c][j] for c, (ti, si) in enumerate(classes) if x_a[c]]
        s.Add(s.Sum([types[ti].prefill_req_s[si, j] * x_p[c][j] for c, (ti, si) in enumerate(classes)] + both)
              >= p[j] * rate)  # fmt: skip
        s.Add(s.Sum([types[ti].decode_req_s[si, j] * x_d[c][j] for c, (ti, si) in enumerate(classes)] + both)
              >= p[j] * rate)  # fmt: skip
    for c, (ti, si) in enumerate(classes):
        s.Add(s.Sum(x_p[c]) <= n_p[c])
        s.Add(s.Sum(x_d[c]) <= n_d[c])
        if x_a[c]:
            s.Add(s.Sum(x_a[c]) <= n_a[c])
        if kv_gb is not None:
            t = types[ti]
            link = float(t.sizes[si]) * t.link_gb_s_per_gpu
            s.Add(s.Sum([t.prefill_req_s[si, j] * kv_gb[j] * x_p[c][j] for j in range(n_j)]) <= link * n_p[c])
            s.Add(s.Sum([t.decode_req_s[si, j] * kv_gb[j] * x_d[c][j] for j in range(n_j)]) <= link * n_d[c])
    return ModelBlock(s, types, classes, n_p, n_d, n_a, [bool(x) for x in x_a])


def _islands_of(types: list[TypeOptions], classes: list[tuple[int, int]], counts: list[tuple[float, float]],
                aggregated: list[int]) -> tuple[tuple[str, int, str], ...]:  # fmt: skip
    """(gpu, size, role) of every island of a solution: each class's (n^P, n^D) and aggregated islands."""
    islands: list[tuple[str, int, str]] = []
    for c, (ti, si) in enumerate(classes):
        size = int(types[ti].sizes[si])
        islands += [(types[ti].gpu, size, "prefill")] * round(counts[c][0])
        islands += [(types[ti].gpu, size, "decode")] * round(counts[c][1])
        islands += [(types[ti].gpu, size, "aggregated")] * aggregated[c]
    return tuple(islands)


def _loss_half(s: Any, types: list[TypeOptions], classes: list[tuple[int, int]], p: np.ndarray, lam: Any,
               n: list[Any], *, lost: int, role: str) -> None:  # fmt: skip
    """(8) for one island of class `lost` in `role` lost: a routing of that role of its own over the islands left,
    which must serve Λ p_j of every range (the other role's routing is the one with every island up). With
    w = [n_lost >= 1] (w <= n_lost <= most w), the class gives n_lost − w islands: a class without an island in
    the role loses none."""
    rows = [types[ti].prefill_req_s[si] if role == "prefill" else types[ti].decode_req_s[si] for ti, si in classes]
    most = [types[ti].count // int(types[ti].sizes[si]) for ti, si in classes]
    w = s.BoolVar("")
    s.Add(w <= n[lost])
    s.Add(n[lost] <= most[lost] * w)
    x = [[s.NumVar(0.0, most[c], "") if rows[c][j] > 0 else None for j in range(len(p))] for c in range(len(classes))]
    for j in range(len(p)):
        s.Add(s.Sum([rows[c][j] * x[c][j] for c in range(len(classes)) if x[c][j] is not None]) >= p[j] * lam)
    for c in range(len(classes)):
        s.Add(s.Sum([v for v in x[c] if v is not None]) <= n[c] - (w if c == lost else 0))


def spare_optimum(
    types: list[TypeOptions], p: np.ndarray, *, time_limit_s: float = 120.0, backend: str = "HIGHS"
) -> ExactResult:
    """The best layout and roles with one host lost: max Λ over layouts, Λ the lowest rate over losing any one
    island (its roles fixed, the routing re-solved: `solvers/spare.py`'s objective), for islands of whole hosts
    (every island size a multiple of its type's host, so that a host lost stops one island), no aggregated
    island, no budget or KV cap.

    The model is (1)-(3) with (8) for every class and role: a MILP with a routing per loss. Most losses do not
    bind, so they join as they do: the MILP over the losses found so far bounds Λ from above (fewer losses, a
    relaxation), the layout it returns is scored exactly (every loss of one of its islands, an LP each with its
    counts fixed, `solve_counts(fix=...)`), and the losses that score below the bound join, until the layout's
    own lowest rate meets the bound: the optimum. Stopped by the time limit it is `feasible`, with the best layout
    scored and the last bound."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    halves: list[tuple[int, str]] = []
    best, bound, status, milps = None, float("inf"), "infeasible", 0
    while True:
        milps += 1
        res, counts = solve_counts(types, p, time_limit_s=max(deadline - time.perf_counter(), 1.0), backend=backend,
                                   halves=halves)  # fmt: skip
        if res.status not in ("optimal", "feasible"):
            status = res.status if best is None else "feasible"
            break
        bound = min(bound, res.bound if res.bound == res.bound else res.rate_req_s)
        whole = [(float(round(a)), float(round(b))) for a, b in counts]
        losses = _loss_rates(types, p, whole)
        low = min(losses.values(), default=res.rate_req_s)
        if best is None or low > best.rate_req_s:
            best = dataclasses.replace(res, rate_req_s=low)
        if res.status == "optimal" and best.rate_req_s >= bound * (1 - 1e-6) - 1e-9:
            status = "optimal"
            break
        new = [h for h, rate in sorted(losses.items(), key=lambda kv: kv[1]) if rate < bound * (1 - 1e-6)
               and h not in halves][:LOSSES_PER_ROUND]  # fmt: skip
        if not new or time.perf_counter() > deadline:
            status = "feasible"
            break
        halves += new
    ms = (time.perf_counter() - t0) * 1e3
    if best is None:
        return ExactResult(status, 0.0, 0.0, (), ms, 1, float("nan"))
    return dataclasses.replace(best, status=status, solve_ms=ms, iterations=milps,
                               bound=best.rate_req_s if status == "optimal" else bound, lost_hosts=1)  # fmt: skip


def spare_cheapest(
    types: list[TypeOptions], p: np.ndarray, demand_req_s: float, *, time_limit_s: float = 120.0,
    backend: str = "HIGHS",
) -> ExactResult:  # fmt: skip
    """The cheapest layout and roles that serve `demand_req_s` with any one island lost (its roles fixed, the routing
    re-solved), for islands of whole hosts, as `spare_optimum` but min C with Λ >= R: the MILP over the losses found
    so far bounds C from below (fewer losses, a relaxation); the layout it returns is scored with each of its
    islands lost in turn, and the losses that leave less than R join, until none does: the optimum. Stopped by the
    time limit first it is `time_limit` (no layout yet known to hold), with the last bound."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    halves: list[tuple[int, str]] = []
    bound, milps = 0.0, 0
    while True:
        milps += 1
        res, counts = solve_counts(types, p, demand=demand_req_s, time_limit_s=max(deadline - time.perf_counter(), 1.0),
                                   backend=backend, halves=halves)  # fmt: skip
        ms = (time.perf_counter() - t0) * 1e3
        if res.status not in ("optimal", "feasible"):
            return dataclasses.replace(res, solve_ms=ms, iterations=milps, bound=bound, lost_hosts=1)
        bound = max(bound, res.bound if res.bound == res.bound else res.cost_per_hour)
        whole = [(float(round(a)), float(round(b))) for a, b in counts]
        short = sorted((rate, h) for h, rate in _loss_rates(types, p, whole).items()
                       if rate < demand_req_s * (1 - 1e-6) and h not in halves)  # fmt: skip
        if not short:  # every loss keeps the demand: a layout of the spare problem at the MILP's cost
            status = "optimal" if res.status == "optimal" else "feasible"
            return dataclasses.replace(res, status=status, solve_ms=ms, iterations=milps, lost_hosts=1,
                                       bound=res.cost_per_hour if status == "optimal" else bound)  # fmt: skip
        if time.perf_counter() > deadline:
            return ExactResult("time_limit", 0.0, 0.0, (), ms, milps, bound, lost_hosts=1)
        halves += [h for _, h in short[:LOSSES_PER_ROUND]]


def _loss_rates(
    types: list[TypeOptions], p: np.ndarray, counts: list[tuple[float, float]]
) -> dict[tuple[int, str], float]:
    """Per (class, role) of the layout `counts` with an island there, its rate with one of those islands lost."""
    out = {}
    for c, pair in enumerate(counts):
        for r, role in enumerate(("prefill", "decode")):
            if pair[r] >= 1:
                less = [((a - 1, b) if r == 0 else (a, b - 1)) if k == c else (a, b) for k, (a, b) in enumerate(counts)]
                out[(c, role)] = solve_counts(types, p, time_limit_s=600.0, fix=less)[0].rate_req_s
    return out


def round_counts(
    types: list[TypeOptions], counts: list[tuple[float, float]], budget: float | None, fill: bool = False
) -> list[tuple[float, float]]:
    """Fractional island counts made whole: each rounded down, then the largest fractional parts
    rounded up while the type's GPUs (and the budget) allow.

    `fill`: the fractional parts, most GPUs first, each made one island of its size or of the
    largest size the type's GPUs and the budget still allow, in the same role. This keeps a
    type's split between prefill and decode where the relaxation used a fraction of an island
    larger than what is left (10,000 GPUs of 8 types: 0.68 of the optimum, against 0.25 without).
    """
    classes = island_classes(types)
    index = {cls: c for c, cls in enumerate(classes)}
    whole = [[float(np.floor(v + 1e-9)) for v in pair] for pair in counts]
    left = {ti: t.count for ti, t in enumerate(types)}
    spent = 0.0
    for (ti, si), pair in zip(classes, whole, strict=True):
        size = int(types[ti].sizes[si])
        left[ti] -= size * int(sum(pair))
        spent += size * types[ti].price_per_gpu_hour * sum(pair)
    weight = [int(types[ti].sizes[si]) if fill else 1 for ti, si in classes]
    parts = sorted(((counts[c][r] - whole[c][r]) * weight[c], c, r) for c in range(len(classes)) for r in (0, 1))
    for frac, c, r in reversed(parts):
        ti, si = classes[c]
        t = types[ti]
        rows = t.prefill_req_s if r == 0 else t.decode_req_s
        room = left[ti] if budget is None else min(left[ti], (budget - spent) / max(t.price_per_gpu_hour, 1e-12))
        candidates = [k for k in range(len(t.sizes)) if t.sizes[k] <= t.sizes[si]] if fill else [si]
        fits = [k for k in candidates if (ti, k) in index and rows[k].any() and t.sizes[k] <= room + 1e-9]
        if frac > 1e-9 and fits:
            k = max(fits, key=lambda k: t.sizes[k])  # the largest that fits
            size = int(t.sizes[k])
            whole[index[(ti, k)]][r] += 1.0
            left[ti] -= size
            spent += size * t.price_per_gpu_hour
    return [(a, b) for a, b in whole]


def round_pooled(
    types: list[TypeOptions], counts: list[tuple[float, float]], budget: float | None
) -> list[tuple[float, float]]:
    """Fractional island counts made whole by GPUs: each class keeps its whole islands, and each
    type's fractional islands in one role, pooled as GPUs, become one island of the smallest size
    that holds them (or the largest the type's free GPUs allow), the role with more GPUs first.

    A relaxation that takes slivers of several giant islands (their rate per GPU, a few dozen
    GPUs' worth) so gets one island of that many GPUs, where `round_counts` drops the slivers or
    makes one of them whole. The budget is kept: an island it cannot pay for is left out.
    """
    classes = island_classes(types)
    whole = [[float(np.floor(v + 1e-9)) for v in pair] for pair in counts]
    spent = sum(int(types[ti].sizes[si]) * types[ti].price_per_gpu_hour * sum(whole[c])
                for c, (ti, si) in enumerate(classes))  # fmt: skip
    for ti, t in enumerate(types):
        mine = [c for c, (tj, _) in enumerate(classes) if tj == ti]
        size = {c: int(t.sizes[classes[c][1]]) for c in mine}
        free = t.count - sum(size[c] * sum(whole[c]) for c in mine)
        pooled = {r: sum((counts[c][r] - whole[c][r]) * size[c] for c in mine) for r in (0, 1)}
        for r in sorted(pooled, key=lambda r: -pooled[r]):
            rows = t.prefill_req_s if r == 0 else t.decode_req_s
            room = free if budget is None else min(free, (budget - spent) / max(t.price_per_gpu_hour, 1e-12))
            fit = [c for c in mine if rows[classes[c][1]].any() and size[c] <= room + 1e-9]
            if pooled[r] <= 1e-6 or not fit:
                continue
            holds = [c for c in fit if size[c] >= pooled[r] - 1e-6]
            c = min(holds, key=size.__getitem__) if holds else max(fit, key=size.__getitem__)
            whole[c][r] += 1.0
            free -= size[c]
            spent += size[c] * t.price_per_gpu_hour
    return [(a, b) for a, b in whole]


def near_sizes(types: list[TypeOptions], layouts: list[list[tuple[float, float]]], sizes: int) -> list[TypeOptions]:
    """`types` with only the island sizes near `layouts` (each class's (n^P, n^D), `island_classes` order):
    every size one of them holds islands of, and `sizes` sizes either side of it in the type's list.

    Cut short at 10,008 GPUs, the optimum's islands are a few sizes from the count search's (a 128-GPU
    decode island where it ended at 80): over 162 of the 1,249 classes the MILP finds it in seconds."""
    classes = island_classes(types)
    out = []
    for ti, t in enumerate(types):
        held = {si for layout in layouts for c, (tj, si) in enumerate(classes) if tj == ti and sum(layout[c]) > 0}
        keep = sorted({k for si in held for k in range(max(si - sizes, 0), min(si + sizes + 1, len(t.sizes)))})
        out.append(dataclasses.replace(t, sizes=t.sizes[keep], prefill_req_s=t.prefill_req_s[keep],
                                       decode_req_s=t.decode_req_s[keep]))  # fmt: skip
    return out


def unproven(
    types: list[TypeOptions],
    p: np.ndarray,
    milp: ExactResult,
    milp_counts: list[tuple[float, float]],
    t0: float,
    *,
    budget: float | None = None,
    kv_gb: np.ndarray | None = None,
    search_s: float = COUNT_SEARCH_S,
    backend: str = "HIGHS",
) -> ExactResult:
    """max_rate when the MILP stopped at its time limit: a layout and a proven bound all the same.

    The LP relaxation bounds the optimum from above. The layout: the MILP's incumbent (if it has
    one) and the relaxation's counts made whole within the inventory and the budget
    (`round_pooled`, and `round_counts` both ways), each improved by the count search
    (`solvers/count_search.py`) for an equal share of half of `search_s` (a start that ends early
    leaves its time to the next); then the MILP over only the classes near the layouts it ended at
    (`near_sizes`) for the rest. The best of these layouts is kept.
    The result is `feasible`, with the lower of the two bounds: the optimum lies between
    `rate_req_s` and `bound`.
    """
    relaxed, counts = solve_counts(types, p, budget=budget, kv_gb=kv_gb, time_limit_s=600.0, relax=True)
    if relaxed.status != "optimal":
        return milp
    starts = [round_pooled(types, counts, budget)] + [
        round_counts(types, counts, budget, fill) for fill in (False, True)
    ]
    if milp.status == "feasible" and milp_counts:
        starts.insert(1, [(float(round(a)), float(round(b))) for a, b in milp_counts])
    classes = island_classes(types)
    rates = count_search.PhaseRates(types, classes, p, kv_gb)
    end = time.perf_counter() + search_s
    half = end - search_s / 2
    found = []
    for k, start in enumerate(starts):
        share = max(half - time.perf_counter(), 0.0) / (len(starts) - k)
        found.append(count_search.improve(types, classes, p, start, kv_gb=kv_gb, budget=budget,
                                          time_limit_s=share, rates=rates))  # fmt: skip
    _, whole = max(found, key=lambda f: f[0])
    layouts = [solve_counts(types, p, budget=budget, kv_gb=kv_gb, time_limit_s=600.0, fix=whole)[0]]
    near = near_sizes(types, [end_counts for _, end_counts in found], NEAR_SIZES)
    left_s = max(end - time.perf_counter(), 1.0)
    layouts.append(solve_counts(near, p, budget=budget, kv_gb=kv_gb, time_limit_s=left_s, backend=backend)[0])
    if milp.status == "feasible":
        layouts.append(milp)
    solved = [r for r in layouts if r.status in ("optimal", "feasible")]
    best = max(solved, key=lambda r: r.rate_req_s) if solved else milp
    bound = min(relaxed.rate_req_s, milp.bound if milp.bound == milp.bound else float("inf"))
    return ExactResult("feasible", best.rate_req_s, best.cost_per_hour, best.islands,
                       (time.perf_counter() - t0) * 1e3, 1, bound)  # fmt: skip


@dataclass(frozen=True)
class SizingOptima:
    """The exact answers of the sizing question for a demand R: the most the inventory serves (`most`, max_rate),
    the cheapest fleet of it serving R (`cheapest`, min_cost; None where R is above `most`), and the cheapest
    fleet of each GPU mix alone (`mixes`: the mix's name -> its result, `infeasible` where the mix cannot serve R)."""

    demand_req_s: float
    most: ExactResult
    cheapest: ExactResult | None
    mixes: dict[str, ExactResult]
    spare: bool = False  # `cheapest` and `mixes` serve the demand with any one host lost (`spare_cheapest`)

    @property
    def most_req_s(self) -> float:
        """The most the inventory serves: the optimum, or its proven upper bound where the MILP stopped short."""
        m = self.most
        return m.bound if m.status == "feasible" and m.bound == m.bound else m.rate_req_s


def sizing_optima(
    types: list[TypeOptions],
    p: np.ndarray,
    demand_req_s: float,
    *,
    kv_gb: np.ndarray | None = None,
    time_limit_s: float = 120.0,
    backend: str = "HIGHS",
    spare: bool = False,
) -> SizingOptima:
    """`SizingOptima` of the inventory `types` for `demand_req_s`: one max_rate MILP, one min_cost MILP, and one per
    GPU type alone (where the inventory has several), within `time_limit_s` shared between them. `spare`: the
    cheapest fleets serve the demand with any one host lost (`spare_cheapest`; islands of whole hosts, no KV cap);
    the most the inventory serves is still with every host up."""
    t_end = time.perf_counter() + time_limit_s
    most = exact_optimum(types, p, kv_gb=kv_gb, time_limit_s=time_limit_s / 3, backend=backend)
    if most.status not in ("optimal", "feasible"):
        return SizingOptima(demand_req_s, most, None, {})
    done = SizingOptima(demand_req_s, most, None, {})
    if demand_req_s > done.most_req_s * (1 + 1e-9):
        return done
    def solve(some: list[TypeOptions], limit_s: float) -> ExactResult:
        if spare:
            return spare_cheapest(some, p, demand_req_s, time_limit_s=limit_s, backend=backend)
        return exact_optimum(some, p, objective="min_cost", demand_req_s=demand_req_s, kv_gb=kv_gb,
                             time_limit_s=limit_s, backend=backend)  # fmt: skip

    cheapest = solve(types, max(t_end - time.perf_counter(), 1.0) / 2)
    mixes: dict[str, ExactResult] = {}
    if len(types) > 1:
        mixes[" + ".join(sorted(t.gpu for t in types))] = cheapest
        subsets = [[t] for t in types]  # each type alone and, of up to MIX_PAIRS_UPTO types, each pair
        if len(types) <= MIX_PAIRS_UPTO:
            subsets += [[a, b] for i, a in enumerate(types) for b in types[i + 1:] if len(types) > 2]
        for n, some in enumerate(subsets):
            limit_s = max((t_end - time.perf_counter()) / (len(subsets) - n + 1), 1.0)
            mixes[" + ".join(sorted(t.gpu for t in some))] = solve(some, limit_s)
    return SizingOptima(demand_req_s, most, cheapest, mixes, spare)

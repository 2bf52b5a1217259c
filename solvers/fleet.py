"""Several models on one inventory: the exact optimum of which islands serve which model, and the best split of the
inventory between the models planned one at a time, to compare it with.

Member m has its own island classes and benchmarks (`types_m`: its model, workload, SLOs and cost model), its
workload's range shares p_m and a demand d_m (req/s, or a weight). Every island serves one model (its weights
resident), so the models share nothing but the inventory:

    max α
    (1), (2), (5) of solvers/exact.py for each model, with its rate Λ_m = α d_m
    (3) Σ_m Σ_{c of type t} s_c (n^P_mc + n^D_mc + n^A_mc) <= I_t       ∀ t    one inventory
    (4) optional: Σ_m C_m <= B                                                  $/h budget

α is the largest common fraction of every demand the inventory serves (α >= 1: every demand held, with 1/α of the
inventory's capacity to spare; with weights, model m's rate is α w_m). The optimum bounds every joint plan of the
same model, so a plan's gap to it is >= 0.

`spare` plans for one host lost (the default fleet): every layout it gives keeps α d_m of every model with any one
host gone, its islands in their roles and the router re-sending their share, by a reserve per model m, role r and
island class c:

    (8) Σ_c' β^r_c' n^r_c' − h_c β^r_c w^r_c >= α d_m,   w^r_c ∈ {0, 1},  n^r_c <= most_c w^r_c

β^r_c = 1 / Σ_j p_j / b^r_cj is the req/s one island of c serves of the model's whole mix in role r (0 where it cannot
serve a range the mix holds), h_c = max(1, host / s_c) the islands of c one host holds. The left side is what the
islands left serve with each one given the mix in proportion, one host's worth of c's islands gone: a routing the
router can take, so the rate the routing re-solved keeps is at least that. A host holds islands of several classes
of one model (sizes below a host: Σ s_c <= host) or one island of whole hosts; either way what it carries of role r is
at most max_c h_c β^r_c, so (8) holds for every host. A host shared by two models costs each only its own islands:
(8) per model is the fleet's (as one constraint per model and role: a variable at least every h_c β^r_c w^r_c, the
most one host carries, taken from the left side). The reserve is conservative (the router does better than mix in
proportion), and its α a rate the plan keeps, not an optimum: the gap is stated against the optimum with every host
up, which bounds every plan's rate with a host lost. Models with aggregated islands are not planned this way.

`cheapest` (the sizing question for a fleet): min Σ_m C_m with α = 1, every model's demand served, the inventory's
counts upper bounds: the cheapest islands of the inventory that serve every demand (`FleetResult.bound` is then the
proven lower bound on that $/h).

`split_optimum` is what planning the models one at a time gives at best: each model takes the same fraction f_m
of every GPU type (f on a grid of 1/`steps`, Σ f_m <= 1) and its own optimum on that share; the best such split
maximises the same min_m Λ_m / d_m. The joint optimum is never below it (every split is a joint layout); the gain
is what choosing GPU types per model buys. `split_cheapest` is its sizing counterpart: each model's cheapest islands
serving its demand within its share, the split of least total $/h.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ortools.linear_solver import pywraplp

from solvers.exact import GAP, LOSSES_PER_ROUND, ModelBlock, _loss_half, _loss_rates, add_model, exact_optimum
from solvers.inner import MILP_BACKENDS, new_solver, quiet_stdout, status_of
from solvers.type_options import TypeOptions

SPLIT_STEPS = 12  # split_optimum's grid: shares of k/12 (halves, thirds, quarters and sixths among them)


@dataclass(frozen=True)
class Member:
    """One model of a fleet, as the MILP sees it."""

    name: str
    types: list[TypeOptions]  # every GPU type of the inventory, in one order for every member
    p: np.ndarray  # its workload's range shares
    demand: float  # req/s, or a weight
    kv_gb: np.ndarray | None = None  # (5): KV GB of one request per range, where KV transfer is priced


@dataclass(frozen=True)
class FleetResult:
    status: str  # optimal, feasible (time limit, an incumbent), infeasible, time_limit (none)
    fraction: float  # α: the common fraction of every demand served (cheapest: 1, every demand)
    bound: float  # the solver's proven bound: on α from above (= α when optimal); cheapest, on the $/h from below
    islands: tuple[tuple[tuple[str, int, str], ...], ...]  # per member: (gpu, size, role) per island
    cost_per_hour: float
    solve_ms: float
    lost_hosts: int = 0  # 1: α is kept with any one host lost (`spare`); 0: with every host up

    def rates(self, members: Sequence[Member]) -> list[float]:
        """Each member's rate at the common fraction (req/s)."""
        return [self.fraction * m.demand for m in members]


def _check(members: Sequence[Member], backend: str) -> None:
    if backend not in MILP_BACKENDS:
        raise ValueError(f"unknown MILP backend {backend!r}; choose from {list(MILP_BACKENDS)}")
    if not members:
        raise ValueError("a fleet needs at least one model")
    gpus = [t.gpu for t in members[0].types]
    for m in members:
        if [t.gpu for t in m.types] != gpus or [t.count for t in m.types] != [t.count for t in members[0].types]:
            raise ValueError(f"fleet: {m.name}'s GPU types are not the inventory's {gpus}")
        if not m.demand > 0:
            raise ValueError(f"fleet: {m.name}'s demand must be > 0, got {m.demand}")


def fleet_optimum(
    members: Sequence[Member],
    *,
    budget_per_hour: float | None = None,
    time_limit_s: float = 120.0,
    backend: str = "HIGHS",
    relax: bool = False,
    cheapest: bool = False,
    spare: bool = False,
    floor: float | None = None,
    phased: bool = True,
) -> FleetResult:
    """The largest common fraction α of every member's demand one inventory serves, and each member's islands
    (`relax`: island counts continuous, an LP: its α bounds the MILP's; `cheapest`: the least $/h of islands that
    serve every demand instead, α = 1; `spare`: α kept with any one host lost, (8), and `bound` the solver's on that
    model, solved in two phases unless not `phased`: `_coarse_first`; `floor`: only layouts with α above it, or
    cheapest, costing less: infeasible where none is)."""
    _check(members, backend)
    if spare and any(t.aggregated_req_s is not None and t.aggregated_req_s.any() for m in members for t in m.types):
        raise ValueError("fleet: a fleet planned for a host lost has no aggregated islands (not in its reserve (8))")
    if spare and phased and not relax and backend == "HIGHS":
        coarse = [dataclasses.replace(m, types=[coarse_sizes(t) for t in m.types]) for m in members]
        if any(len(a.sizes) < len(b.sizes) for m, c in zip(members, coarse, strict=True)
               for a, b in zip(c.types, m.types, strict=True)):  # fmt: skip
            return _coarse_first(members, coarse, budget_per_hour, time_limit_s, cheapest)
    t0 = time.perf_counter()
    s = new_solver("HIGHS" if relax else backend, time_limit_s)
    alpha = s.NumVar(1.0, 1.0, "alpha") if cheapest else s.NumVar(0.0, s.infinity(), "alpha")
    blocks = [add_model(s, m.types, m.p, alpha * m.demand, kv_gb=m.kv_gb, relax=relax, tag=f"{k}:")
              for k, m in enumerate(members)]  # fmt: skip
    if spare:
        for m, b in zip(members, blocks, strict=True):
            host_reserve(s, m, b, alpha * m.demand, relax)
    one_inventory(s, members, blocks)
    cost = s.Sum([b.cost() for b in blocks])
    if budget_per_hour is not None:
        s.Add(cost <= budget_per_hour)
    if floor is not None:
        s.Add(cost <= floor * (1 - 1e-6)) if cheapest else s.Add(alpha >= floor * (1 + 1e-6))
    if cheapest:
        s.Minimize(cost)
    else:
        s.Maximize(alpha)
    if backend == "HIGHS" and not relax:
        status, values, bound = solve_highs(s, time_limit_s)
        fraction = float(values[alpha.index()]) if values is not None else 0.0
    else:
        params = pywraplp.MPSolverParameters()
        params.SetDoubleParam(params.RELATIVE_MIP_GAP, GAP)
        status = status_of(s, s.Solve(params), time_limit_s)
        values = None
        if status not in ("infeasible", "time_limit"):
            fraction = alpha.solution_value()
            bound = s.Objective().BestBound() if not relax else s.Objective().Value()
    ms = (time.perf_counter() - t0) * 1e3
    if status in ("infeasible", "time_limit"):
        return FleetResult(status, 0.0, float("nan"), (), 0.0, ms, int(spare))
    islands = tuple(b.solution(values)[1] for b in blocks)
    price = {t.gpu: t.price_per_gpu_hour for t in members[0].types}
    spent = sum(size * price[g] for isl in islands for g, size, _ in isl)
    return FleetResult(status, fraction, bound, islands, spent, ms, int(spare))


def one_inventory(s: pywraplp.Solver, members: Sequence[Member], blocks: Sequence[ModelBlock]) -> None:
    """(3): every member's islands (`blocks`) within one inventory's GPUs of each type."""
    for ti, t in enumerate(members[0].types):
        used = [term for b in blocks for term in b.used(ti)]
        if used:
            s.Add(s.Sum(used) <= t.count)


COARSE_SHARE = 0.4  # a fleet planned for a host lost: the share of the time limit its MILP over coarse sizes has


def coarse_sizes(t: TypeOptions) -> TypeOptions:
    """The type with its island sizes of 2^k GPUs only (1, 2, 4, ... : the divisors of a host of 2^k GPUs and 2^k
    hosts), where it has any."""
    keep = [k for k, size in enumerate(t.sizes) if int(size) & (int(size) - 1) == 0]
    if not keep or len(keep) == len(t.sizes):
        return t
    agg = None if t.aggregated_req_s is None else t.aggregated_req_s[keep]
    return dataclasses.replace(t, sizes=t.sizes[keep], prefill_req_s=t.prefill_req_s[keep],
                               decode_req_s=t.decode_req_s[keep], aggregated_req_s=agg)  # fmt: skip


def _coarse_first(members: Sequence[Member], coarse: Sequence[Member], budget: float | None, time_limit_s: float,
                  cheapest: bool) -> FleetResult:  # fmt: skip
    """`spare` in two phases: the MILP over coarse island sizes first (`COARSE_SHARE` of the time: fewer, less alike
    classes, whose reserve HiGHS solves far sooner), then over every size for the rest, held to layouts better than
    the first's (`floor`). Every coarse layout is a layout of every size, so the better of the two is planned; where
    the second proves none better, the first is the optimum over every size."""
    t0 = time.perf_counter()
    first = fleet_optimum(coarse, budget_per_hour=budget, time_limit_s=COARSE_SHARE * time_limit_s,
                          cheapest=cheapest, spare=True, phased=False)  # fmt: skip
    left = max(time_limit_s - (time.perf_counter() - t0), 1e-3)
    if first.status in ("infeasible", "time_limit"):  # no coarse layout (in its time): every size, for the rest
        return fleet_optimum(members, budget_per_hour=budget, time_limit_s=left, cheapest=cheapest, spare=True,
                             phased=False)  # fmt: skip
    floor = first.cost_per_hour if cheapest else first.fraction
    rest = fleet_optimum(members, budget_per_hour=budget, time_limit_s=left, cheapest=cheapest, spare=True,
                         floor=floor, phased=False)  # fmt: skip
    ms = (time.perf_counter() - t0) * 1e3
    if rest.status in ("optimal", "feasible"):  # a better layout over every size (optimal: the optimum)
        return dataclasses.replace(rest, solve_ms=ms)
    if rest.status == "infeasible":  # none better over every size: the coarse layout is the optimum
        return dataclasses.replace(first, status="optimal", bound=floor, solve_ms=ms)
    # none better found in the time: the optimum is the coarse layout's or within the second's bound
    bound = rest.bound if rest.bound == rest.bound else float("nan")
    if bound == bound:
        bound = min(floor, bound) if cheapest else max(floor, bound)
    return dataclasses.replace(first, status="feasible", bound=bound, solve_ms=ms)


def mix_rate(rows: np.ndarray, p: np.ndarray) -> float:
    """β: the req/s one island serves of a mix with range shares `p`, its rates per range `rows` (0 where it cannot
    serve a range of the mix)."""
    held = p > 0
    return 0.0 if not held.any() or (rows[held] <= 0).any() else 1.0 / float(np.sum(p[held] / rows[held]))


def host_reserve(s: pywraplp.Solver, m: Member, block: ModelBlock, rate: Any, relax: bool = False) -> None:
    """(8) for member `m`'s islands (`block`): with any one host's worth of one class's islands in a role gone, the
    islands left, each serving the mix in proportion, still serve `rate`."""
    for n, role in ((block.n_p, "prefill"), (block.n_d, "decode")):
        beta = [mix_rate((m.types[ti].prefill_req_s if role == "prefill" else m.types[ti].decode_req_s)[si], m.p)
                for ti, si in block.classes]  # fmt: skip
        lost = s.NumVar(0.0, s.infinity(), "")  # the most one host carries of the role: max_c h_c β^r_c w^r_c
        for c, (ti, si) in enumerate(block.classes):
            if beta[c] <= 0:
                continue  # (serves nothing of the mix in proportion: its loss takes nothing from the left side)
            t, size = m.types[ti], int(m.types[ti].sizes[si])
            most = t.count // size
            held = min(max(1, t.node_gpus // size), most)
            w = s.NumVar(0.0, 1.0, "") if relax else s.BoolVar("")  # (w = 1 where n = 0 only takes more)
            s.Add(n[c] <= most * w)
            s.Add(lost >= held * beta[c] * w)
        s.Add(s.Sum([b * n[c] for c, b in enumerate(beta) if b > 0]) - lost >= rate)


def spare_fleet_optimum(members: Sequence[Member], *, time_limit_s: float = 600.0) -> FleetResult:
    """The best joint layout with any one island lost, its roles fixed and its model's routing re-solved: the exact
    model (8) approximates, for islands of whole hosts (one island a host). The joint MILP with a routing per loss of
    one island of a class in a role, per model (`solvers.exact._loss_half`), the losses joining as they bind, as
    `solvers.exact.spare_optimum` does for one model: the MILP over the losses so far bounds α from above, its layout
    scored exactly (each island lost in turn, an LP) from below, until they meet. Minutes on two models: a check of
    the reserve (tests, `benchmarks/fleet_reserve_bench.py`), not a planner. No budget, KV cap or aggregated island."""
    _check(members, "HIGHS")
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    halves: list[list[tuple[int, str]]] = [[] for _ in members]
    best: FleetResult | None = None
    bound, status = float("inf"), "infeasible"
    while True:
        s = new_solver("HIGHS", 1.0)
        alpha = s.NumVar(0.0, s.infinity(), "alpha")
        blocks = [add_model(s, m.types, m.p, alpha * m.demand, tag=f"{k}:") for k, m in enumerate(members)]
        one_inventory(s, members, blocks)
        for m, b, lost in zip(members, blocks, halves, strict=True):
            for c, role in lost:
                _loss_half(s, m.types, b.classes, m.p, alpha * m.demand, b.n_p if role == "prefill" else b.n_d,
                           lost=c, role=role)  # fmt: skip
        s.Maximize(alpha)
        got, values, milp_bound = solve_highs(s, max(deadline - time.perf_counter(), 1.0))
        if values is None:
            status = got if best is None else "feasible"
            break
        bound = min(bound, milp_bound if milp_bound == milp_bound else float(values[alpha.index()]))
        losses, islands = [], []
        for k, (m, b) in enumerate(zip(members, blocks, strict=True)):
            counts, isl = b.solution(values)
            islands.append(isl)
            whole = [(float(round(a)), float(round(d))) for a, d in counts]
            losses += [(rate / m.demand, k, h) for h, rate in _loss_rates(m.types, m.p, whole).items()]
        low = min((x[0] for x in losses), default=0.0)
        if best is None or low > best.fraction:
            price = {t.gpu: t.price_per_gpu_hour for t in members[0].types}
            best = FleetResult("feasible", low, bound, tuple(islands),
                               sum(size * price[g] for isl in islands for g, size, _ in isl), 0.0, 1)  # fmt: skip
        if got == "optimal" and best.fraction >= bound * (1 - 1e-6) - 1e-9:
            status = "optimal"
            break
        new = 0
        for k in range(len(members)):
            join = [h for f, kk, h in sorted(losses) if kk == k and f < bound * (1 - 1e-6) and h not in halves[k]]
            halves[k] += join[:LOSSES_PER_ROUND]
            new += len(join[:LOSSES_PER_ROUND])
        if not new or time.perf_counter() > deadline:
            status = "feasible"
            break
    ms = (time.perf_counter() - t0) * 1e3
    if best is None:
        return FleetResult(status, 0.0, float("nan"), (), 0.0, ms, 1)
    return dataclasses.replace(best, status=status, bound=best.fraction if status == "optimal" else bound,
                               solve_ms=ms)  # fmt: skip


def solve_highs(s: pywraplp.Solver, time_limit_s: float) -> tuple[str, np.ndarray | None, float]:
    """The MILP built in `s`, solved by HiGHS through SciPy: (status, every variable's value by index or None,
    the proven bound on the objective). OR-Tools' own HiGHS interface returns no solution where the time limit
    stops HiGHS with one in hand (status UNKNOWN); SciPy's returns that incumbent and HiGHS's dual bound, so a joint
    MILP cut short still plans its best layout with a proven gap."""
    from ortools.linear_solver import linear_solver_pb2
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_matrix

    proto = linear_solver_pb2.MPModelProto()
    s.ExportModelToProto(proto)
    sign = -1.0 if proto.maximize else 1.0  # SciPy minimises
    var = proto.variable
    c = np.array([v.objective_coefficient for v in var]) * sign
    rows = [(i, j, a) for i, con in enumerate(proto.constraint) for j, a in zip(con.var_index, con.coefficient,
                                                                                 strict=True)]  # fmt: skip
    i, j, a = (np.array(x) for x in zip(*rows, strict=True))
    matrix = csr_matrix((a.astype(float), (i.astype(int), j.astype(int))), shape=(len(proto.constraint), len(var)))
    with quiet_stdout():  # HiGHS's MIP solver prints some of its internal notes to the process's stdout
        res = milp(c, integrality=np.array([1 if v.is_integer else 0 for v in var]),
                   bounds=Bounds([v.lower_bound for v in var], [v.upper_bound for v in var]),
                   constraints=LinearConstraint(matrix, [k.lower_bound for k in proto.constraint],
                                                [k.upper_bound for k in proto.constraint]),
                   options={"time_limit": max(time_limit_s, 1e-3), "mip_rel_gap": GAP, "disp": False})  # fmt: skip
    bound = sign * float(res.mip_dual_bound) if getattr(res, "mip_dual_bound", None) is not None else float("nan")
    if res.status == 0:
        return "optimal", res.x, bound
    if res.status == 2:
        return "infeasible", None, float("nan")
    if res.x is not None:
        return "feasible", res.x, bound  # the time limit, a layout in hand
    if res.status == 1:
        return "time_limit", None, float("nan")
    raise RuntimeError(f"fleet MILP: HiGHS ended with {res.message}")


@dataclass(frozen=True)
class Split:
    """The best split of the inventory between the members planned one at a time."""

    shares: tuple[float, ...]  # each member's fraction of every GPU type
    fraction: float  # min_m Λ_m / d_m on those shares
    rates: tuple[float, ...]  # each member's optimum on its share (req/s)
    islands: tuple[tuple[tuple[str, int, str], ...], ...]
    proven: bool  # every one-model optimum it rests on solved to optimality
    cost_per_hour: float = float("nan")  # the $/h of every member's islands on its share (split_cheapest: cheapest)


def share_of(types: list[TypeOptions], share: float) -> list[TypeOptions]:
    """The member's types with `share` of every GPU type's count (rounded down to whole GPUs)."""
    return [dataclasses.replace(t, count=int(np.floor(t.count * share + 1e-9))) for t in types]


Islands = tuple[tuple[str, int, str], ...]


@dataclass(frozen=True)
class _Share:
    """One member alone on one share of the inventory: what its own exact optimum there gives."""

    rate: float  # req/s
    cost_per_hour: float
    proven: bool
    islands: Islands


def split_optimum(
    members: Sequence[Member],
    *,
    steps: int = SPLIT_STEPS,
    time_limit_s: float = 60.0,
    backend: str = "HIGHS",
    spare: bool = False,
) -> Split:
    """The best split of every GPU type between the members in shares of k/`steps`, each member's rate its own
    exact optimum on its share: what planning the models one at a time, each on a slice of the fleet, gives
    (`spare`: each member's rate with any one host lost, (8), on its share)."""
    _check(members, backend)

    def alone(m: Member, types: list[TypeOptions]) -> _Share:
        if spare:
            one = _alone_with_reserve(m, types, time_limit_s, backend)
            found = one.status in ("optimal", "feasible")
            return _Share(one.fraction * m.demand if found else 0.0, one.cost_per_hour, one.status == "optimal",
                          one.islands[0] if found else ())  # fmt: skip
        res = exact_optimum(types, m.p, kv_gb=m.kv_gb, time_limit_s=time_limit_s, backend=backend)
        rate = res.rate_req_s if res.status in ("optimal", "feasible") else 0.0
        return _Share(rate, res.cost_per_hour, res.status == "optimal", res.islands)

    def fraction(picked: list[_Share | None]) -> float | None:
        return min(x.rate / m.demand for x, m in zip(picked, members, strict=True) if x is not None)

    # a larger share never serves less: where the solver found less (a time limit), the smaller share's islands stand
    split = _best_split(members, steps, alone, _Share(0.0, 0.0, True, ()),
                        lambda new, old: new.rate < old.rate, fraction)  # fmt: skip
    assert split is not None  # (every member's empty share scores 0)
    return split


def split_cheapest(
    members: Sequence[Member],
    *,
    steps: int = SPLIT_STEPS,
    time_limit_s: float = 60.0,
    backend: str = "HIGHS",
    spare: bool = False,
) -> Split | None:
    """The split of every GPU type between the members in shares of k/`steps` whose members' cheapest islands serving
    their demands (each its own exact `min_cost` on its share; `spare`: with any one host lost, (8)) cost least in all:
    what sizing the models one at a time, each on a slice of the inventory, gives at best. None where no split serves
    every demand."""
    _check(members, backend)

    def alone(m: Member, types: list[TypeOptions]) -> _Share | None:
        if spare:
            one = _alone_with_reserve(m, types, time_limit_s, backend, cheapest=True)
            found = one.status in ("optimal", "feasible") and bool(one.islands[0])
            return _Share(m.demand, one.cost_per_hour, one.status == "optimal", one.islands[0]) if found else None
        res = exact_optimum(types, m.p, objective="min_cost", demand_req_s=m.demand, kv_gb=m.kv_gb,
                            time_limit_s=time_limit_s, backend=backend)  # fmt: skip
        found = res.status in ("optimal", "feasible") and bool(res.islands)
        return _Share(res.rate_req_s, res.cost_per_hour, res.status == "optimal", res.islands) if found else None

    def saving(picked: list[_Share | None]) -> float | None:  # less $/h scores more; a member unserved, none
        return None if any(x is None for x in picked) else -sum(x.cost_per_hour for x in picked if x is not None)

    # a larger share never costs more: where the solver found more (a time limit), the smaller share's islands stand
    split = _best_split(members, steps, alone, None, lambda new, old: new is None or new.cost_per_hour >
                        old.cost_per_hour, saving, tie=1e-9)  # fmt: skip
    return split


def _alone_with_reserve(m: Member, types: list[TypeOptions], time_limit_s: float, backend: str,
                        cheapest: bool = False) -> FleetResult:  # fmt: skip
    """Member `m` alone on `types` (its share), planned for a host lost: (8) for one model, solved whole (one model's
    MILP is proven sooner so than in two phases)."""
    return fleet_optimum([dataclasses.replace(m, types=types)], time_limit_s=time_limit_s, backend=backend,
                         cheapest=cheapest, spare=True, phased=False)  # fmt: skip


def _best_split(members: Sequence[Member], steps: int, alone: Callable[[Member, list[TypeOptions]], _Share | None],
                empty: _Share | None, worse: Callable[[_Share | None, _Share], bool],
                score: Callable[[list[_Share | None]], float | None], tie: float = 0.0) -> Split | None:  # fmt: skip
    """The split of every GPU type in shares of k/`steps` (Σ k <= steps) whose members' entries (`alone` on each
    share, `empty` on none; a member's smaller share's entry kept where the larger's is `worse`) `score` highest
    (None: not a split that serves); the first of equal scores within `tie`. None where none scores."""
    table: list[list[_Share | None]] = []
    for m in members:
        row = [empty]
        for k in range(1, steps + 1):
            mine = alone(m, share_of(m.types, k / steps))
            row.append(row[-1] if row[-1] is not None and worse(mine, row[-1]) else mine)
        table.append(row)
    best: tuple[float, tuple[int, ...]] | None = None
    for ks in itertools.product(range(steps + 1), repeat=len(members)):
        if sum(ks) <= steps:
            got = score([table[i][k] for i, k in enumerate(ks)])
            if got is not None and (best is None or got > best[0] + tie):
                best = (got, ks)
    if best is None:
        return None
    picked = [table[i][k] for i, k in enumerate(best[1])]
    served = [x for x in picked if x is not None]
    return Split(
        shares=tuple(k / steps for k in best[1]),
        fraction=min(x.rate / m.demand for x, m in zip(served, members, strict=True)),
        rates=tuple(x.rate for x in served),
        islands=tuple(x.islands for x in served),
        proven=all(x.proven for x in served),
        cost_per_hour=sum(x.cost_per_hour for x in served),
    )

"""Sizing: the cheapest islands of a layout that serve a demand (search.objective=min_cost).

The inventory is what may be rented or bought (its counts upper bounds, each GPU type at its $/h). A layout
proposed by the search is a set of islands to choose from; the inner MILP's min_cost form (solvers/inner.py)
keeps the cheapest of them that serve the demand within the SLOs, leaving the others idle, and those islands are
the fleet; with search.spare_hosts, the cheapest that serve it with any one host lost (`solvers.spare`). A
layout that cannot serve the demand is scored below every one that can, by how close it comes: `short_score`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline.planning.build import place
from pipeline.planning.failures import loss_scenarios, spare_solve
from pipeline.planning.planner import Layout, Planner
from solvers.spare import cheapest_roles


@dataclass(frozen=True)
class Fleet:
    """The cheapest islands of a layout serving a demand: the layout's islands in use, their $/h and roles."""

    layout: Layout | None  # None: the layout cannot serve the demand (`status` infeasible) or ran out of time
    cost_per_hour: float
    status: str  # the MILP's: optimal | feasible | infeasible | time_limit
    roles: tuple[str, ...]  # per island of `layout` (the fleet's): prefill, decode or aggregated
    solve_ms: float


def cheapest(
    planner: Planner,
    layout: Layout,
    demand_req_s: float,
    time_limit_s: float = 10.0,
    backend: str = "AUTO",
    spare_hosts: int = 0,
) -> Fleet:
    """The cheapest islands of `layout` serving `demand_req_s` in the search's model: the inner MILP's min_cost, or,
    with `spare_hosts` (one host lost), `solvers.spare.cheapest_roles` over the layout's loss scenarios, so that the
    demand is served with any of its hosts lost."""
    cost = planner.cost_per_hour(layout)
    if spare_hosts:
        prob = planner.problem(layout, "max_rate")
        hosts_of = place(layout.islands, {g: planner.gpus[g].node_gpus for g, _ in layout.islands})
        scenarios = [down for _, down in loss_scenarios(layout.islands, hosts_of, spare_hosts)]
        found = cheapest_roles(prob.prefill_req_s, prob.decode_req_s, prob.p, scenarios, cost, demand_req_s,
                               time_limit_s=time_limit_s, backend=backend)  # fmt: skip
        status, roles, ms = found.status, found.roles, found.solve_ms
    else:
        _, sol = planner.solve(layout, "max_rate", time_limit_s, backend=backend, demand_req_s=demand_req_s,
                               cost_per_hour=cost)  # fmt: skip
        status, roles, ms = sol.status, sol.roles, sol.solve_ms
    if status not in ("optimal", "feasible"):
        return Fleet(None, 0.0, status, (), ms)
    used = [i for i, role in enumerate(roles) if role != "idle"]
    return Fleet(Layout.of([layout.islands[i] for i in used]), float(cost[used].sum()), status,
                 tuple(roles[i] for i in used), ms)  # fmt: skip


def trimmed(
    planner: Planner,
    layout: Layout,
    sizes: Mapping[str, Sequence[int]],
    demand_req_s: float,
    time_limit_s: float = 10.0,
    backend: str = "AUTO",
    spare_hosts: int = 0,
) -> Fleet:
    """The cheapest fleet of `layout` (`cheapest`), then trimmed an island at a time: each island of the fleet made
    the next smaller size its type allows (`sizes`, ascending; below the smallest, dropped), the cheapest fleet of
    that layout kept where it costs less, until no such step costs less. A local search over island sizes, as the
    search's polish steps to neighbouring layouts: the layouts a search proposes split the inventory whole, and the
    fleet a demand needs may leave part of an island's GPUs idle."""
    best = cheapest(planner, layout, demand_req_s, time_limit_s, backend, spare_hosts)
    while best.layout is not None:
        isl = list(best.layout.islands)
        steps = []
        for g, n in dict.fromkeys(isl):  # each distinct island once
            smaller = [m for m in sizes.get(g, ()) if m < n]
            at = isl.index((g, n))
            steps.append(Layout.of(isl[:at] + ([(g, max(smaller))] if smaller else []) + isl[at + 1 :]))
        found = [f for f in (cheapest(planner, s, demand_req_s, time_limit_s, backend, spare_hosts) for s in steps
                             if s.islands) if f.layout is not None]  # fmt: skip
        cheaper = min(found, key=lambda f: f.cost_per_hour, default=None)
        if cheaper is None or cheaper.cost_per_hour >= best.cost_per_hour - 1e-9:
            break
        best = cheaper
    return best


TOP_UPS = 3  # `held_fleet`: sizing rounds at most, each for a demand raised by what the last fleet fell short


def held_fleet(
    planner: Planner,
    layout: Layout,
    demand_req_s: float,
    time_limit_s: float = 10.0,
    backend: str = "AUTO",
    spare_hosts: int = 0,
) -> tuple[Fleet, float]:
    """The cheapest fleet of `layout` that holds `demand_req_s` as its plan states rates (each island's load cap
    for the mix its routing gives it, `Planner.solve_routed`; with `spare_hosts`, with its worst hosts lost, each
    island kept in its role: `Planner.solve_without`), and that rate. `cheapest` sizes in the search's model
    (each island's cap for the whole workload's mix); where its fleet falls short in the plan's, the demand is
    raised by the shortfall and the fleet sized again, at most `TOP_UPS` times."""
    want, fleet, held = demand_req_s, None, 0.0
    for _ in range(TOP_UPS + 1):
        found = cheapest(planner, layout, want, time_limit_s, backend, spare_hosts)
        if found.layout is None:  # (the raised demand is more than the layout serves: the last fleet stands)
            break
        fleet, held = found, plan_rate(planner, found.layout, time_limit_s, backend, spare_hosts)
        if held >= demand_req_s * (1 - 1e-6):
            break
        want *= demand_req_s / max(held, 1e-9) * (1 + 1e-3)
    return fleet or cheapest(planner, layout, demand_req_s, time_limit_s, backend, spare_hosts), held


def plan_rate(planner: Planner, layout: Layout, time_limit_s: float, backend: str, spare_hosts: int) -> float:
    """The rate `layout` holds as its plan states rates: every host up, or with its worst `spare_hosts` lost (the
    roles that keep the most with them lost, `spare_solve`, as the plan's)."""
    if not spare_hosts:
        return planner.solve_routed(layout, time_limit_s, backend=backend)[1].rate_req_s
    roles = spare_solve(planner, layout, spare_hosts, time_limit_s, backend).roles
    hosts_of = place(layout.islands, {g: planner.gpus[g].node_gpus for g, _ in layout.islands})
    return min(planner.solve_without(layout, roles, down, time_limit_s, backend)[1].rate_req_s
               for _, down in loss_scenarios(layout.islands, hosts_of, spare_hosts))  # fmt: skip


def demand_score(demand_req_s: float, cost_per_hour: float) -> float:
    """A fleet's score: the demand per $/h it costs (higher is cheaper; the exact reference's is the best)."""
    return demand_req_s / cost_per_hour if cost_per_hour > 0 else 0.0


def short_score(most_req_s: float, inventory_cost_per_hour: float) -> float:
    """The score of a layout that serves only `most_req_s`, below the demand: what it serves per $/h of the whole
    inventory. Every fleet that serves the demand costs at most the inventory's $/h, so scores at least
    demand / inventory $/h > this; among short layouts the one closer to the demand scores more."""
    return most_req_s / inventory_cost_per_hour if inventory_cost_per_hour > 0 else 0.0


def inventory_cost(planner: Planner, inventory: tuple[tuple[str, int], ...]) -> float:
    """$/h of every GPU of an inventory ((GPU, count) pairs) at the planner's prices."""
    return float(sum(n * planner.gpus[g].price_per_hour for g, n in inventory))


def mix_name(gpus: list[str] | tuple[str, ...]) -> str:
    """A GPU mix as the cost curve names it: 'H20', 'H20 + H800', ..."""
    return " + ".join(sorted(gpus))


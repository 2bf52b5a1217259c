"""Sizing: the cheapest islands of a layout that serve a demand (search.objective=min_cost).

The inventory is what may be rented or bought (its counts upper bounds, each GPU type at its $/h). A layout
proposed by the search is a set of islands to choose from; the inner MILP's min_cost form (solvers/inner.py)
keeps the cheapest of them that serve the demand within the SLOs, leaving the others idle, and those islands are
the fleet; with search.spare_hosts, the cheapest that serve it with any one host lost (`solvers.spare`). `Sizer`
holds what that takes. A layout that cannot serve the demand is scored below every one that can, by how close it
comes: `short_score`.
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
    """The cheapest islands of a layout serving a demand: the layout's islands in use and their $/h."""

    layout: Layout | None  # None: the layout cannot serve the demand (`status` infeasible) or ran out of time
    cost_per_hour: float
    status: str  # the MILP's: optimal | feasible | infeasible | time_limit
    solve_ms: float


TOP_UPS = 3  # `Sizer.held`: sizing rounds at most, each for a demand raised by what the last fleet fell short


@dataclass(frozen=True)
class Sizer:
    """Sizing layouts for a demand: the planner, the demand, the inner solve's limits, and the hosts a fleet must
    lose and still serve it (`spare_hosts`; 0: every host up)."""

    planner: Planner
    demand_req_s: float
    time_limit_s: float = 10.0
    backend: str = "AUTO"
    spare_hosts: int = 0

    def cheapest(self, layout: Layout, demand_req_s: float | None = None) -> Fleet:
        """The cheapest islands of `layout` serving the demand (or `demand_req_s`) in the search's model: the inner
        MILP's min_cost, or, with `spare_hosts`, `solvers.spare.cheapest_roles` over the layout's loss scenarios,
        so that the demand is served with any of its hosts lost."""
        p, demand = self.planner, self.demand_req_s if demand_req_s is None else demand_req_s
        cost = p.cost_per_hour(layout)
        if self.spare_hosts:
            prob = p.problem(layout, "max_rate")
            found = cheapest_roles(prob.prefill_req_s, prob.decode_req_s, prob.p, self._scenarios(layout), cost, demand,
                                   time_limit_s=self.time_limit_s, backend=self.backend)  # fmt: skip
            status, roles, ms = found.status, found.roles, found.solve_ms
        else:
            _, sol = p.solve(layout, "max_rate", self.time_limit_s, backend=self.backend, demand_req_s=demand,
                             cost_per_hour=cost)  # fmt: skip
            status, roles, ms = sol.status, sol.roles, sol.solve_ms
        if status not in ("optimal", "feasible"):
            return Fleet(None, 0.0, status, ms)
        used = [i for i, role in enumerate(roles) if role != "idle"]
        return Fleet(Layout.of([layout.islands[i] for i in used]), float(cost[used].sum()), status, ms)

    def trimmed(self, layout: Layout, sizes: Mapping[str, Sequence[int]]) -> Fleet:
        """The cheapest fleet of `layout`, then trimmed an island at a time: each island of the fleet made the next
        smaller size its type allows (`sizes`; below the smallest, dropped), the cheapest fleet of that layout kept
        where it costs less, until no such step costs less. A local search over island sizes, as the search's
        polish steps to neighbouring layouts: the layouts a search proposes split the inventory whole, and the fleet
        a demand needs may leave part of an island's GPUs idle."""
        best = self.cheapest(layout)
        while best.layout is not None:
            isl = list(best.layout.islands)
            steps = []
            for g, n in dict.fromkeys(isl):  # each distinct island once
                smaller = [m for m in sizes.get(g, ()) if m < n]
                at = isl.index((g, n))
                steps.append(Layout.of(isl[:at] + ([(g, max(smaller))] if smaller else []) + isl[at + 1 :]))
            found = [f for f in (self.cheapest(s) for s in steps if s.islands) if f.layout is not None]
            cheaper = min(found, key=lambda f: f.cost_per_hour, default=None)
            if cheaper is None or cheaper.cost_per_hour >= best.cost_per_hour - 1e-9:
                break
            best = cheaper
        return best

    def held(self, layout: Layout) -> tuple[Fleet, float]:
        """The cheapest fleet of `layout` that holds the demand as its plan states rates (`plan_rate`), and that
        rate. `cheapest` sizes in the search's model (each island's cap for the whole workload's mix); where its
        fleet falls short in the plan's, the demand is raised by the shortfall and the fleet sized again, at most
        `TOP_UPS` times."""
        want, fleet, held = self.demand_req_s, None, 0.0
        for _ in range(TOP_UPS + 1):
            found = self.cheapest(layout, want)
            if found.layout is None:  # (the raised demand is more than the layout serves: the last fleet stands)
                break
            fleet, held = found, self.plan_rate(found.layout)
            if self.holds(held):
                break
            want *= self.demand_req_s / max(held, 1e-9) * (1 + 1e-3)
        return fleet or self.cheapest(layout), held

    def holds(self, rate_req_s: float) -> bool:
        return rate_req_s >= self.demand_req_s * (1 - 1e-6)

    def plan_rate(self, layout: Layout) -> float:
        """The rate `layout` holds as its plan states rates (each island's load cap for the mix its routing gives it,
        `Planner.solve_routed`): every host up, or with its worst `spare_hosts` lost, each island in the role that
        keeps the most with them lost (`spare_solve`, as the plan's), the rest re-routed (`Planner.solve_without`)."""
        p, limit, backend = self.planner, self.time_limit_s, self.backend
        if not self.spare_hosts:
            return p.solve_routed(layout, limit, backend=backend)[1].rate_req_s
        roles = spare_solve(p, layout, self.spare_hosts, limit, backend).roles
        return min(p.solve_without(layout, roles, down, limit, backend)[1].rate_req_s
                   for down in self._scenarios(layout))  # fmt: skip

    def _scenarios(self, layout: Layout) -> list[frozenset[int]]:
        """The islands each set of `spare_hosts` hosts stops, the islands placed as the plan places them."""
        hosts_of = place(layout.islands, {g: self.planner.gpus[g].node_gpus for g, _ in layout.islands})
        return [down for _, down in loss_scenarios(layout.islands, hosts_of, self.spare_hosts)]


def demand_score(demand_req_s: float, cost_per_hour: float) -> float:
    """A fleet's score: the demand per $/h it costs (higher is cheaper; the exact reference's is the best)."""
    return demand_req_s / cost_per_hour if cost_per_hour > 0 else 0.0


def short_score(most_req_s: float, inventory_cost_per_hour: float) -> float:
    """The score of a layout that serves only `most_req_s`, below the demand: what it serves per $/h of the whole
    inventory. Every fleet that serves the demand costs at most the inventory's $/h, so scores at least
    demand / inventory $/h > this; among short layouts the one closer to the demand scores more."""
    return most_req_s / inventory_cost_per_hour if inventory_cost_per_hour > 0 else 0.0


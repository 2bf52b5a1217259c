"""What a plan sustains when one of its hosts is gone (N-1), and the plan the simulator checks it on.

A host is one machine of a GPU type (`Island.hosts`: report.md's node map numbers them per type). When it
fails, every island with a GPU on it stops: an engine that spans several hosts stops whole, and the islands
that share the host with it stop too. The router then ejects those engines and spreads the traffic over the
islands left. The engines themselves keep running as launched (their role, parallelism and batch): nothing is
re-launched. `host_losses` gives the rate for each host that runs a serving island
(`Planner.solve_without`: the routing re-solved with every other island's role fixed, an LP), and
`without_host` the plan as it then runs, for the simulator (`pipeline.planning.check`).

`search.spare_hosts=K` plans for K hosts lost at once: `spare_solve` scores a layout (in a trial) by the
lowest rate over every set of K hosts lost, with the roles that make it highest (`solvers/spare.py`: roles are
fixed when engines launch, routing adapts to each loss), and the plan keeps those roles; `worst_loss` gives the
plan's own rate in that worst case, each island's load cap set for the mix it is then given."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Sequence

from pipeline.planning.build import describe, place
from pipeline.planning.planner import Layout, Planner
from plan import HostLoss, HostLosses, Hosts, Plan
from solvers.spare import SpareRoles, spare_roles


def islands_on(gpus: Sequence[str], hosts_of: Sequence[Hosts | None]) -> dict[tuple[str, int], tuple[int, ...]]:
    """Per host (GPU type, host number), in the node map's order, the islands that stop when it fails: every
    island with a GPU on it (`gpus`, `hosts_of`: each island's GPU type and hosts; an island without hosts is on
    none)."""
    on: dict[tuple[str, int], list[int]] = {}
    for i, (gpu, hosts) in enumerate(zip(gpus, hosts_of, strict=True)):
        for node in hosts.nodes if hosts is not None else ():
            on.setdefault((gpu, node), []).append(i)
    return {h: tuple(on[h]) for h in sorted(on)}


def host_losses(
    planner: Planner, layout: Layout, plan: Plan, time_limit_s: float, backend: str = "AUTO",
    roles: Sequence[str] | None = None,
) -> HostLosses | None:
    """The plan's rate with each of its hosts gone in turn (None for a plan that serves nothing). `roles`: those the
    plan was solved in, where it was planned for hosts lost (`spare_solve`): an island kept in a role as a standby
    carries nothing with every host up, so the plan lists it idle, and takes over when a host goes (an island the plan
    runs keeps the plan's role)."""
    if not plan.serves:
        return None
    given = list(roles) if roles is not None else [isl.role for isl in plan.islands]
    roles = [given[i] if isl.role == "idle" else isl.role for i, isl in enumerate(plan.islands)]
    losses, rates = [], {}
    for (gpu, node), down in islands_on([isl.gpu for isl in plan.islands], [isl.hosts for isl in plan.islands]).items():
        if not any(plan.islands[i].serving for i in down):
            continue  # nothing it runs serves: its loss costs nothing
        key = alike(plan, down)
        if key not in rates:  # hosts whose loss stops alike islands lose the same rate: the same LP up to the order
            # a solver's zero may come back as -0.0 or a rounding below it: nothing served is 0
            rates[key] = max(planner.solve_without(layout, roles, down, time_limit_s, backend)[1].rate_req_s, 0.0)
        losses.append(HostLoss(gpu, node, down, rates[key]))
    return HostLosses(tuple(losses), plan.rate_req_s)


def alike(plan: Plan, down: Collection[int]) -> tuple[tuple[str, int, str, int, int, int], ...]:
    """What the islands `down` are, whichever of several identical islands they are: GPU, size, role, parallelism
    and the ranges they serve. Two hosts with alike islands stopped leave problems that differ only in the
    order of their islands, so the same rate."""
    return tuple(sorted((plan.islands[i].gpu, plan.islands[i].size, plan.islands[i].role, plan.islands[i].tp,
                         plan.islands[i].dp, hash(plan.islands[i].ranges)) for i in down))  # fmt: skip


def without_host(
    planner: Planner, layout: Layout, plan: Plan, down: Collection[int], time_limit_s: float, backend: str = "AUTO"
) -> Plan:
    """`plan` as it runs with islands `down` stopped: their share routed to the islands left at the rate
    `host_losses` gives, each of those with the engine it was launched with (its batch and micro-batch overlap,
    not the ones a new plan for that load would pick). No band, check or losses of its own."""
    prob, sol = planner.solve_without(layout, [isl.role for isl in plan.islands], down, time_limit_s, backend)
    islands = []
    hosts = [isl.hosts for isl in plan.islands]
    given = None if None in hosts else hosts  # (a plan of an old version may lack its hosts: placed anew)
    for i, (now, was) in enumerate(zip(describe(planner, layout, prob, sol, given), plan.islands, strict=True)):
        if i in down or not now.serving:
            islands.append(dataclasses.replace(now, role="idle", tp=0, dp=0, ep=0, batch=0, ranges=()))
            continue
        islands.append(dataclasses.replace(now, batch=was.batch, overlap=was.overlap, chunk_tokens=was.chunk_tokens))
    rates = dataclasses.replace(plan.rates, rate_req_s=sol.rate_req_s,
                                output_tok_s=sol.rate_req_s * planner.workload.mean_decode)  # fmt: skip
    return dataclasses.replace(plan, islands=tuple(islands), rates=rates, band=None, verification=None,
                               host_losses=None, status=sol.status)  # fmt: skip


COMBINATIONS = 5000  # search.spare_hosts: at most this many sets of hosts a layout may lose (C(hosts, K))


def loss_scenarios(
    islands: Sequence[tuple[str, int]], hosts_of: Sequence[Hosts | None], spare: int
) -> list[tuple[tuple[tuple[str, int], ...], frozenset[int]]]:
    """(the hosts lost, the islands that stop) for each set of `spare` hosts of the islands (`hosts_of`: each
    island's hosts, the plan's node map), keeping only the sets whose stopped islands no other set's include:
    with more islands stopped, the rate can only be lower. No more hosts than `spare`: one scenario, every
    island."""
    on = islands_on([g for g, _ in islands], hosts_of)
    hosts = list(on)
    if len(hosts) <= spare:
        return [(tuple(hosts), frozenset(range(len(islands))))]
    found: dict[frozenset[int], tuple[tuple[str, int], ...]] = {}
    for lost in itertools.combinations(hosts, spare):
        found.setdefault(frozenset().union(*(on[h] for h in lost)), lost)
    return [(lost, down) for down, lost in found.items() if not any(down < other for other in found)]


def worst_loss(
    planner: Planner, layout: Layout, plan: Plan, spare: int, time_limit_s: float, backend: str = "AUTO"
) -> tuple[float, tuple[tuple[str, int], ...]]:
    """(the lowest rate, the hosts lost) over every set of `spare` hosts of `plan` lost at once, every island kept
    in its role and the routing re-solved for each (`Planner.solve_without`, caps from the mix it gives)."""
    roles = [isl.role for isl in plan.islands]
    worst: tuple[float, tuple[tuple[str, int], ...]] = (math.inf, ())
    for lost, down in loss_scenarios(layout.islands, [isl.hosts for isl in plan.islands], spare):
        rate = planner.solve_without(layout, roles, down, time_limit_s, backend)[1].rate_req_s
        if rate < worst[0]:
            worst = (rate, lost)
    return worst


def spare_solve(planner: Planner, layout: Layout, spare: int, time_limit_s: float, backend: str = "AUTO",
                hosts: Sequence[Hosts] | None = None) -> SpareRoles:  # fmt: skip
    """The roles of `layout` that keep the most with its worst `spare` hosts lost, and that rate, in the search's
    model (each island's whole-mix load cap): `solvers/spare.py` over `loss_scenarios`; cached by the planner.
    `hosts`: every island's hosts, given (a fleet's islands share the inventory's hosts with other models'), not
    placed here."""
    key = (layout, spare, backend, None if hosts is None else tuple(hosts))
    if key in planner.spare_cache:
        return planner.spare_cache[key]
    prob = planner.problem(layout, "max_rate")
    hosts_of = list(hosts) if hosts is not None else \
        place(layout.islands, {g: planner.gpus[g].node_gpus for g, _ in layout.islands})  # fmt: skip
    scenarios = [down for _, down in loss_scenarios(layout.islands, hosts_of, spare)]
    found = spare_roles(prob.prefill_req_s, prob.decode_req_s, prob.p, scenarios, time_limit_s, backend)
    if found.status == "optimal":  # (a solve cut short by its time limit may do better with another try)
        planner.spare_cache[key] = found
    return found

"""Re-plan a running fleet with few moves: `python -m pipeline.search +fleet=NAME search.from_plan=<run>/fleet.json
search.lost_hosts=[H20:11]`.

A host lost stops every island on it, of whichever model. Each model with an island on a host that is gone (lost, or
dropped from a smaller inventory) is re-planned as one model's plan is (`pipeline.planning.replan`: at most
search.max_moves changed islands, kept islands where they run and in their roles), on the inventory's hosts that no
other model's island runs on: the others run on as they are. The models re-planned go lowest served fraction first,
each seeing the hosts the ones before it took. Each re-planned model's plan is checked as a fleet's are (simulated at
its stated rate, its host losses and range), and its plan.json says how it was reached (`replan`: the moves, the
islands kept, the hosts re-launched), so `pipeline.deploy` writes launch files for its changed islands only.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plan as plans
from pipeline.checks import positive_int, whole_number
from pipeline.cli import plain
from pipeline.errors import ConfigError
from pipeline.fleet.config import FleetSpec, is_fleet, read_fleet
from pipeline.fleet.run import Composed, _band, fleet_record, write_fleet
from pipeline.planning.build import build_plan
from pipeline.planning.check import check
from pipeline.planning.failures import host_losses
from pipeline.planning.replan import as_running, hosts_now, replan
from pipeline.planning.simulation import RequestMix
from pipeline.search.settings import running_hosts
from plan import InventoryInfo, Plan, Replan, node_spans
from solvers.fleet import FleetResult


@dataclass(frozen=True)
class RunningFleet:
    """search.from_plan for a fleet: the running fleet's record and plans, the hosts of it that are gone, the bounds."""

    path: Path
    record: dict[str, Any]
    plans: dict[str, Plan]  # by model
    lost: tuple[tuple[str, int], ...]
    max_moves: int
    max_hosts: int | None


def running_fleet(cfg: Any, spec: FleetSpec) -> RunningFleet:
    """The running fleet search.from_plan names, checked against the fleet planned (the same models) and
    search.lost_hosts against its hosts; ConfigError naming the setting and the fix."""
    path = Path(str(cfg.search.from_plan))
    if not is_fleet(path):
        raise ConfigError(f"search.from_plan={path}: a fleet is re-planned from its fleet.json: give <run>/fleet.json "
                          "of a fleet plan")  # fmt: skip
    record = read_fleet(path)
    running = [str(m.get("model")) for m in record["models"]]
    if sorted(running) != sorted(m.model for m in spec.members):
        raise ConfigError(f"search.from_plan={path} runs {', '.join(running)}; fleet {spec.name} plans "
                          f"{', '.join(m.model for m in spec.members)}: re-plan it with the fleet it runs")  # fmt: skip
    if str(cfg.search.objective) != "max_rate":
        raise ConfigError(f"search.objective={cfg.search.objective}: a fleet re-plan keeps the most of every demand "
                          "(max_rate): drop search.objective")  # fmt: skip
    loaded = {str(m["model"]): plans.load(path.parent / str(m["plan"]), "search.from_plan") for m in record["models"]}
    lost = []
    for item in plain(cfg.search.get("lost_hosts")) or []:
        gpu, _, node = str(item).partition(":")
        had = sorted({h for p in loaded.values() for h in running_hosts(p, gpu)})
        if not node.strip().isdigit() or int(node) not in had:
            raise ConfigError(f"search.lost_hosts: {item!r} is not a host of the running fleet, GPU:host (its {gpu} "
                              f"hosts are {node_spans(tuple(had)) or 'none'}; e.g. H20:11)")  # fmt: skip
        lost.append((gpu, int(node)))
    max_hosts = None if cfg.search.get("max_hosts") is None else whole_number(cfg.search.max_hosts, "search.max_hosts")
    return RunningFleet(path, record, loaded, tuple(lost), positive_int(cfg.search.get("max_moves", 3),
                                                                        "search.max_moves"), max_hosts)  # fmt: skip


def _on(p: Plan) -> set[tuple[str, int]]:
    return {(isl.gpu, h) for isl in p.islands if isl.serving and isl.hosts is not None for h in isl.hosts.nodes}


def replan_fleet(spec: FleetSpec, members: list[Composed], again: RunningFleet, inventory_name: str, tracker: Any,
                 cfg: Any, t0: float) -> int:  # fmt: skip
    """Re-plan the models of the running fleet that lost a host; returns the exit code (0: a plan written)."""
    inv = members[0].settings.inventory
    bench_s = time.perf_counter() - t0  # (each model's settings and smallest islands, composed before)
    node = {g.name: g.node_gpus for g in inv.gpus}
    hosts = hosts_now(next(iter(again.plans.values())), inv.by_name, node, again.lost)
    there = {(g, h) for g, hs in hosts.items() for h in hs}
    current = dict(again.plans)
    demand = {c.spec.model: c.spec.demand for c in members}
    hit = [c for c in members if _on(current[c.spec.model]) - there]
    lost = ", ".join(f"{g}:{h}" for g, h in again.lost) or "none"
    if not hit:
        print(f"[fleet] re-plan: no model runs on a host that is gone (lost: {lost}): every model is re-planned for "
              "the hosts free", flush=True)  # fmt: skip
        hit = list(members)
    before = {c.spec.model: _kept_rate(current[c.spec.model], again.lost) for c in hit}
    info = InventoryInfo(inv.name, inv.named, inv.cost_per_hour)
    # a fleet planned for a host lost is re-planned for one too: each state scored with its worst host lost
    spare = int(again.record.get("reference", {}).get("lost_hosts", 0) or 0)
    moved: dict[str, dict[str, Any]] = {}
    for c in sorted(hit, key=lambda c: before[c.spec.model] / demand[c.spec.model]):
        model = c.spec.model
        busy = set().union(*(_on(p) for m, p in current.items() if m != model))
        tic = time.perf_counter()
        found = replan(c.ctx.planner, current[model], hosts, dict(c.ctx.space.min_island), again.max_moves,
                       time_limit_s=c.ctx.inner_time_limit_s, backend=c.ctx.backend, max_hosts=again.max_hosts,
                       busy=busy, spare=spare)  # fmt: skip
        plan = build_plan(c.ctx.planner, found.layout, c.ctx.inner_time_limit_s, c.ctx.backend, info, found.roles,
                          [p.hosts for p in found.pieces])  # fmt: skip
        islands, kept, moves, relaunched = as_running(plan, current[model], found)
        plan = dataclasses.replace(plan, islands=islands)
        verification = check(plan, RequestMix.of(c.ctx.planner.workload)) if plan.serves else None
        losses = host_losses(c.ctx.planner, found.layout, plan, c.ctx.inner_time_limit_s, c.ctx.backend)
        plan = dataclasses.replace(
            plan, verification=verification, host_losses=losses, band=_band(c, found.layout, plan),
            replan=Replan(str(again.path.parent / model / "plan.json"), moves, kept, relaunched, again.max_moves,
                          found.searched_req_s),
            notes=(*plan.notes, f"one of the models of a fleet, re-planned after hosts lost ({lost})"))  # fmt: skip
        current[model] = plan
        moved[model] = {"moves": list(moves), "hosts_relaunched": relaunched, "kept_islands": len(kept),
                        "was_req_s": again.plans[model].rate_req_s, "with_the_loss_req_s": before[model],
                        "seconds": time.perf_counter() - tic}  # fmt: skip
        print(f"[fleet] re-plan {model}: {len(moves)} moves ({'; '.join(moves) or 'none'}), {relaunched} hosts "
              f"re-launched: {plan.rate_req_s:.2f} req/s (ran {again.plans[model].rate_req_s:.2f}, "
              f"{before[model]:.2f} with the hosts lost)", flush=True)  # fmt: skip
    out = [current[c.spec.model] for c in members]
    served = min(p.rate_req_s / demand[c.spec.model] for p, c in zip(out, members, strict=True))
    was = min(p.rate_req_s / demand[m] for m, p in again.plans.items())
    joint = FleetResult("replan", served, float("nan"), tuple(_triples(p) for p in out),
                        sum(p.cost_per_hour for p in out), 0.0)  # fmt: skip
    record = fleet_record(spec, inventory_name, members, out, joint, None, served, None, time.perf_counter() - t0,
                          bench_s)  # fmt: skip
    record["replan"] = {"from": str(again.path), "lost_hosts": [f"{g}:{h}" for g, h in again.lost],
                        "max_moves": again.max_moves, "served_before": was,
                        "served_with_the_loss": min(_kept_rate(p, again.lost) / demand[m]
                                                    for m, p in again.plans.items()),
                        "models": moved}  # fmt: skip
    write_fleet(spec, members, out, record, cfg, inventory_name, tracker)
    return 0


def _kept_rate(p: Plan, lost: tuple[tuple[str, int], ...]) -> float:
    """A running plan's rate with the hosts `lost` gone, from its own host losses (each host lost on its own: with
    several, the lowest of theirs), its rate where none of its islands runs on them."""
    if not lost or p.host_losses is None:
        return p.rate_req_s if not (_on(p) & set(lost)) else 0.0
    rates = [x.rate_req_s for x in p.host_losses.losses if (x.gpu, x.node) in set(lost)]
    return min(rates, default=p.rate_req_s)


def _triples(p: Plan) -> tuple[tuple[str, int, str], ...]:
    return tuple((isl.gpu, isl.size, str(isl.role)) for isl in p.islands if isl.serving)


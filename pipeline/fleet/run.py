"""Several models on one inventory: `python -m pipeline.search +fleet=NAME [+inventory=NAME]`.

    each model's settings     its own composed config: model, workload, SLOs, cost model (pipeline.fleet.config)
    its islands benchmarked   every island size of every GPU type, as the exact reference of its own search
    the joint optimum         one MILP: which islands serve which model (solvers/fleet.py)
    each model's plan         its islands planned as its own search plans a layout (routing, roles, batches, hosts
                              placed on the shared inventory), simulated request by request on its own stream
    the best split            the models planned one at a time on shares of the inventory, to compare with
    records                   outputs/fleet/<fleet>-<inventory>-<hash>/<time>/: fleet.json, report.md, and per
                              model <model>/plan.json and report.md; MLflow: a parent run, a child per model

Every island serves one model and the router sends a request by its model first, so the fleet's mixed stream is
the models' own streams side by side: each model's plan is simulated on its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costmodel.catalog import CONF_DIR
from pipeline.cli import choice, plain
from pipeline.errors import ConfigError
from pipeline.fleet.config import FLEET_FILE, FleetSpec, MemberSpec, fleet_from_cfg
from pipeline.forking import Forked, forkable
from pipeline.planning.band import rate_band
from pipeline.planning.build import build_plan, place
from pipeline.planning.check import check
from pipeline.planning.config import fallback_note
from pipeline.planning.failures import host_losses, spare_solve
from pipeline.planning.planner import Layout
from pipeline.planning.simulation import RequestMix
from pipeline.records.journal import link_latest, write_json, write_text
from pipeline.records.tracking import open_tracker
from pipeline.search.reference import type_options
from pipeline.search.settings import Settings, context, inventory_of, read_settings
from pipeline.search.steps import read_steps
from pipeline.search.steps.band import band_calibration
from pipeline.search.trial import Context
from plan import Band, InventoryInfo, Plan, to_json
from solvers.fleet import FleetResult, Member, Split, fleet_optimum, split_cheapest, split_optimum

NO_PLAN = 1
# the command's settings that are the fleet's, not passed to each model's config
FLEET_SETTINGS = ("search.objective", "search.demand_req_s", "search.from_plan", "search.lost_hosts",
                  "search.max_moves", "search.max_hosts")
# the groups a member sets itself (a command's own choice of them is the member's default, or not used)
MEMBER_GROUPS = ("model", "workload", "slo", "costmodel")
FLEET_NOTE = ("Archipelago fleets: several models planned on one inventory (`python -m pipeline.search +fleet=NAME`). "
              "A parent run per fleet plan (the common fraction of every demand served, its gap to the exact "
              "optimum, the best split planned one model at a time); a child run per model.")  # fmt: skip


@dataclass(frozen=True)
class Composed:
    """One member's composed config and what it planned with."""

    spec: MemberSpec
    settings: Settings
    ctx: Context
    costmodel: str
    note: str  # "" or why the cost model is not the command's


@contextlib.contextmanager
def composed_as(cfg: Any) -> Iterator[None]:
    """Hydra's runtime choices (`pipeline.cli.choice`) are those of `cfg`, a member's composed config, within."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.instance()
    before = hc.cfg
    hc.set_config(cfg)
    try:
        yield
    finally:
        hc.cfg = before


def _group(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0].split(".", 1)[0]


def member_config(m: MemberSpec, costmodel: str | None) -> Any:
    """The command's config with the member's model, workload, SLOs and cost model: the command's own overrides
    (`+inventory=`, `search.*`, `costmodel.cache_hit=` ...) kept, its group choices the member sets replaced."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    own = {"model": m.model, "workload": m.workload, "slo": m.slo, "costmodel": costmodel}

    def kept(override: str) -> bool:  # not the fleet, nor a group choice the member makes itself
        key = override.lstrip("+~").split("=", 1)[0]
        fleets = key in FLEET_SETTINGS  # the fleet's objective and re-plan, not each model's
        return _group(override) != "fleet" and own.get(key) is None and not fleets

    hc = HydraConfig.get()
    # the command's own search path (hydra.searchpath=[...]: its own inventories, models, workloads) too
    paths = [o for o in hc.overrides.hydra if o.lstrip("+").startswith("hydra.searchpath=")]
    task = paths + [o for o in hc.overrides.task if kept(o)]
    extra = [f"{k}={v}" for k, v in own.items() if v is not None]
    # within the command Hydra's search path is the command's; a caller that composed its config and left
    # Hydra (a test, `helpers.in_process`) gets conf/
    with contextlib.nullcontext() if GlobalHydra.instance().is_initialized() else \
            initialize_config_dir(str(CONF_DIR), version_base="1.3"):  # fmt: skip
        return compose(config_name="search", overrides=task + extra, return_hydra_config=True)


def compose_member(m: MemberSpec, inventory_name: str, inv_cfg: Any, command_costmodel: str) -> Composed:
    """A member's settings and benchmarked context; ConfigError names the member."""
    costmodel = m.costmodel or command_costmodel
    try:
        cfg = member_config(m, m.costmodel)
        note = fallback_note(cfg.costmodel, m.model)  # (another model's fit: its `costmodel.fallback` prices it)
        with composed_as(cfg):
            settings = read_settings(cfg, inventory_name, inv_cfg)
            settings = dataclasses.replace(settings, steps=read_steps(cfg.search))  # (the range's draws among them)
            check_fits(settings)
            ctx = context(settings)
    except ConfigError as err:
        raise ConfigError(f"fleet member {m.model} (workload {m.workload}): {err}") from None
    return Composed(m, settings, ctx, costmodel, note)


def check_fits(settings: Settings) -> None:
    """ConfigError, naming the memory it needs, where the model's weights are more than all the GPUs of every type
    of the inventory hold (no island of any type can hold it)."""
    import numpy as np

    from costmodel.formulas import weight_bytes_per_gpu

    planner, inv = settings.planning, settings.inventory
    model = planner.model
    need = {g.name: float(weight_bytes_per_gpu(g, model, np.array(1.0), np.array(float(model.n_routed_experts)),
                                               planner.profile)) / 1e9 for g in inv.gpus}  # fmt: skip
    if all(need[g.name] > n * g.mem_gb for g, n in inv):
        held = ", ".join(f"{n} {g.name} hold {n * g.mem_gb:,.0f} GB" for g, n in inv)
        raise ConfigError(f"{model.name}'s weights alone take {min(need.values()):,.0f} GB, more than all the GPUs of "
                          f"any type of the inventory hold ({held}): add GPUs with more memory, or plan a smaller "
                          "model")  # fmt: skip


def execute(cfg: Any) -> int:
    """Plan the fleet `cfg` names on its inventory; returns the exit code (0 planned, 1 no plan)."""
    spec = fleet_from_cfg(choice("fleet"), plain(cfg.fleet))
    objective = fleet_objective(cfg, spec)  # (checked before anything is benchmarked)
    inventory_name, inv_cfg = inventory_of(cfg)
    again = None
    if cfg.search.get("from_plan") is not None:  # a running fleet re-planned with few moves
        from pipeline.fleet.replan import running_fleet

        again = running_fleet(cfg, spec)
    command_costmodel = choice("costmodel")
    t0 = time.perf_counter()
    members = [compose_member(m, inventory_name, inv_cfg, command_costmodel) for m in spec.members]
    inv = members[0].settings.inventory
    what = "demand" if spec.demands else "weight"
    print(f"[fleet] {spec.name}: {len(members)} models on {inv.describe()}: "
          + "; ".join(f"{c.spec.model} on {c.spec.workload} ({what} {c.spec.demand:g}"
                      + (" req/s" if spec.demands else "") + f", costmodel={c.costmodel})" for c in members),
          flush=True)  # fmt: skip
    for c in members:
        if c.note:
            print(f"[fleet] note: {c.note}", flush=True)
    tracker = open_tracker(cfg.mlflow.tracking_uri, str(cfg.mlflow.experiment), FLEET_NOTE, ())
    try:
        if again is not None:
            from pipeline.fleet.replan import replan_fleet

            return replan_fleet(spec, members, again, inventory_name, tracker, cfg, t0)
        return _plan_fleet(spec, members, inventory_name, tracker, cfg, t0, objective)
    finally:
        tracker.close()


def _plan_fleet(spec: FleetSpec, members: list[Composed], inventory_name: str, tracker: Any, cfg: Any,
                t0: float, objective: str) -> int:  # fmt: skip
    inv = members[0].settings.inventory
    fm = []
    for c in members:
        types, kv = type_options(c.settings, c.ctx, c.ctx.planner)
        fm.append(Member(c.spec.model, types, c.ctx.planner.ranges.p, c.spec.demand, kv))
    bench_s = time.perf_counter() - t0
    limit = members[0].settings.search.reference_time_limit_s  # each one-model optimum of the best split's
    budget = members[0].settings.planning.budget_per_hour
    spare = spare_of(members[0].settings)
    if objective == "min_cost":
        got = _cheapest_layout(fm, spec, inv, limit, spare)
        if got is None:
            return NO_PLAN
        joint, split = got
        return _planned(spec, members, inventory_name, tracker, cfg, t0, bench_s, objective, joint,
                        lambda: (split, None))  # fmt: skip
    # the best split, one model at a time, on the other core while the joint MILP runs
    aside = Forked(beside, fm, limit, spare, budget) if forkable() else None
    joint = fleet_optimum(fm, budget_per_hour=budget, time_limit_s=spec.time_limit_s, spare=spare)
    what = "demand" if spec.demands else "weight"
    lost = " with any one host lost" if spare else ""
    if joint.status == "optimal":
        print(f"[fleet] the joint {'layout' if spare else 'optimum'} (optimal, {joint.solve_ms / 1e3:.1f} s): "
              f"{joint.fraction:.3f} of every {what} served{lost}", flush=True)  # fmt: skip
    elif joint.fraction > 0:
        most = f"; its model's best is at most {joint.bound:.3f}" if joint.bound == joint.bound else ""
        print(f"[fleet] the joint MILP stopped at fleet.time_limit_s={spec.time_limit_s:g} with a layout serving "
              f"{joint.fraction:.3f} of every {what}{lost}{most}", flush=True)  # fmt: skip

    def best_split() -> tuple[Split | None, float | None]:
        return aside.result(what="the best split's process") if aside else beside(fm, limit, spare, budget)

    # (else: collected after the models' plans)
    split, up = best_split() if joint.status != "optimal" else (None, None)
    if split is not None and budget is None:  # (the best split knows no budget)
        planned = planned_layout(joint, split, lambda: fleet_optimum(fm, relax=True).fraction)
        if planned is not joint:
            found, by = ("none as good as the best split", "MILP") if joint.islands else ("no layout", "LP relaxation")
            print(f"[fleet] the joint MILP found {found} within fleet.time_limit_s={spec.time_limit_s:g}: planned "
                  f"with the best split ({split.fraction:.3f}); the {by} bounds the optimum at {planned.bound:.3f}",
                  flush=True)  # fmt: skip
        joint = planned
    if joint.fraction <= 0 or not any(joint.islands):
        if aside is not None and split is None:
            aside.kill()
        print(f"[fleet] error: no layout of {inv.describe()} serves every model of fleet {spec.name} "
              f"({joint.status}); see each model's islands above", flush=True)  # fmt: skip
        return NO_PLAN
    return _planned(spec, members, inventory_name, tracker, cfg, t0, bench_s, objective, joint,
                    lambda: (split, up) if split else best_split())  # fmt: skip


def _planned(spec: FleetSpec, members: list[Composed], inventory_name: str, tracker: Any, cfg: Any, t0: float,
             bench_s: float, objective: str, joint: FleetResult,
             best_split: Callable[[], tuple[Split | None, float | None]]) -> int:  # fmt: skip
    """The models' plans on the joint layout, checked, and the fleet's records (`best_split()`: the best split and,
    for a fleet planned for a host lost, the bound on its fraction from every host up)."""
    from pipeline.checks import boolean

    inv = members[0].settings.inventory
    plans = _member_plans(members, joint, inv, boolean(cfg.search.verify, "search.verify"),
                          boolean(cfg.search.get("host_losses", True), "search.host_losses") or
                          bool(joint.lost_hosts))  # fmt: skip
    split, up = best_split()
    if up is not None and up == up:
        joint = dataclasses.replace(joint, bound=up)
    wall_s = time.perf_counter() - t0
    served = min(p.rate_req_s / c.spec.demand for p, c in zip(plans, members, strict=True))
    searched = min(p.rates.searched_req_s / c.spec.demand for p, c in zip(plans, members, strict=True))
    if objective == "min_cost":  # the bound is the least $/h
        spent = sum(p.cost_per_hour for p in plans)
        gap = max(0.0, spent / joint.bound - 1.0) if joint.bound == joint.bound and joint.bound > 0 else None
    else:  # (planned for a host lost: what the layout keeps with any one host gone, by the MILP's reserve (8))
        kept = joint.fraction if joint.lost_hosts else searched
        gap = max(0.0, 1.0 - kept / joint.bound) if joint.bound == joint.bound and joint.bound > 0 else None
    record = fleet_record(spec, inventory_name, members, plans, joint, split, served, gap, wall_s, bench_s,
                          objective)  # fmt: skip
    write_fleet(spec, members, plans, record, cfg, inventory_name, tracker)
    return 0


def write_fleet(spec: FleetSpec, members: list[Composed], plans: list[Plan], record: dict[str, Any], cfg: Any,
                inventory_name: str, tracker: Any) -> Path:  # fmt: skip
    """The fleet's records (`record` with its worst host added): fleet.json, report.md and a plan.json per model in a
    new run folder, MLflow's runs, the console's summary. Returns the folder."""
    record["worst_host"] = worst_host(members, plans)
    ident = json.dumps({"fleet": plain(cfg.fleet), "inventory": inventory_name, "objective": record["objective"],
                        "members": [c.settings.key for c in members]}, sort_keys=True)  # fmt: skip
    root = Path(str(cfg.out_root)).parent / "fleet" / f"{spec.name}-{inventory_name}-{_digest(ident)}"
    run_dir = root / time.strftime("%Y-%m-%d_%H-%M-%S")
    for c, p in zip(members, plans, strict=True):
        (run_dir / c.spec.model).mkdir(parents=True, exist_ok=True)
        write_json(run_dir / c.spec.model / "plan.json", to_json(p))
    write_json(run_dir / FLEET_FILE, record)
    write_text(run_dir / "report.md", fleet_report(record))
    link_latest(root.parent, run_dir)
    _track(tracker, record, run_dir)
    for line in summary(record):
        print(f"[fleet] {line}", flush=True)
    print(f"[fleet] wrote {run_dir}/ (fleet.json, report.md, a plan.json per model) in {record['wall_s']:.1f} s",
          flush=True)  # fmt: skip
    return run_dir


FLEET_OBJECTIVES = ("max_rate", "min_cost")


def spare_of(settings: Settings) -> bool:
    """search.spare_hosts for a fleet: True plans it for one host lost (the default, `auto`, where the settings allow
    it: said on the console where they do not), False with every host up; ConfigError for more than one."""
    k = settings.search.spare_hosts
    if k > 1:
        raise ConfigError(f"search.spare_hosts={k}: a fleet is planned for one host lost at most (each model keeps "
                          "its rate with any one host gone): set search.spare_hosts=1 (the default) or 0")  # fmt: skip
    if settings.spare_off:
        print(f"[fleet] not planned for a host lost (search.spare_hosts=auto): {settings.spare_off}", flush=True)
    return k == 1


def fleet_objective(cfg: Any, spec: FleetSpec) -> str:
    """search.objective for a fleet: max_rate (the largest common fraction of every demand or weight) or min_cost
    (the cheapest islands of the inventory serving every demand); ConfigError for any other, or min_cost on weights."""
    objective = str(cfg.search.objective)
    if objective not in FLEET_OBJECTIVES:
        raise ConfigError(f"search.objective={objective}: a fleet maximises the common fraction of its models' demands "
                          "(max_rate) or finds the cheapest islands serving them (min_cost); choose one of "
                          f"{list(FLEET_OBJECTIVES)}")  # fmt: skip
    if objective == "min_cost" and not spec.demands:
        raise ConfigError(f"search.objective=min_cost: fleet {spec.name} gives weights, and the cheapest fleet is "
                          "the one serving demands: give every model a demand_req_s")  # fmt: skip
    return objective


def _cheapest_layout(fm: list[Member], spec: FleetSpec, inv: Any, limit: float,
                     spare: bool = False) -> tuple[FleetResult, Split | None] | None:  # fmt: skip
    """The cheapest islands of the inventory serving every demand (`spare`: with any one host lost), and the best
    split's sizing beside it (run on the other core); None (said) where none serves every demand."""
    aside = Forked(beside, fm, limit, spare, None, True) if forkable() else None
    joint = fleet_optimum(fm, time_limit_s=spec.time_limit_s, cheapest=True, spare=spare)
    split, up = aside.result(what="the best split's process") if aside else beside(fm, limit, spare, None, True)
    lost = " with any one host lost" if spare else ""
    if joint.status == "infeasible":
        most = fleet_optimum(fm, time_limit_s=spec.time_limit_s, spare=spare)
        print(f"[fleet] error: no layout of {inv.describe()} serves every model's demand{lost}: it serves at most "
              f"{most.fraction:.3f} of each ({most.status}); lower the demands or add GPUs"
              + (" (or search.spare_hosts=0: with every host up)" if spare else ""), flush=True)  # fmt: skip
        return None
    if up is not None:
        joint = dataclasses.replace(joint, bound=up)
    if joint.status == "optimal":
        print(f"[fleet] the cheapest islands serving every demand{lost} ({'its model ' if spare else ''}optimal, "
              f"{joint.solve_ms / 1e3:.1f} s): ${joint.cost_per_hour:,.2f}/h of the inventory's "
              f"${inv.cost_per_hour:,.2f}/h", flush=True)  # fmt: skip
        return joint, split
    planned = joint if split is None else \
        planned_layout(joint, split, lambda: fleet_optimum(fm, relax=True, cheapest=True).bound, cheapest=True)
    if planned is not joint:
        print(f"[fleet] the joint MILP found {'none as cheap as the best split' if joint.islands else 'no layout'} "
              f"within fleet.time_limit_s={spec.time_limit_s:g}: sized with the best split "
              f"(${planned.cost_per_hour:,.2f}/h); the least is at least ${planned.bound:,.2f}/h",
              flush=True)  # fmt: skip
        return planned, split
    if not joint.islands:
        print(f"[fleet] error: the joint MILP found no layout serving every demand within fleet.time_limit_s="
              f"{spec.time_limit_s:g}, nor does any split of the inventory: raise fleet.time_limit_s", flush=True)
        return None
    print(f"[fleet] the joint MILP stopped at fleet.time_limit_s={spec.time_limit_s:g} with islands serving every "
          f"demand at ${joint.cost_per_hour:,.2f}/h; the least is at least ${joint.bound:,.2f}/h", flush=True)
    return joint, split


UP_BOUND_S = 10.0  # a fleet planned for a host lost: the time the MILP with every host up has to bound it


def beside(fm: list[Member], limit: float, spare: bool, budget: float | None,
           cheapest: bool = False) -> tuple[Split | None, float | None]:  # fmt: skip
    """What the fleet's plan is compared with, worked out on the other core: the best split (`cheapest`: its sizing),
    and, for a fleet planned for a host lost, the bound with every host up (the MILP's proven bound in `UP_BOUND_S`,
    its LP's if it has none), which bounds every layout's fraction with a host lost from above (`cheapest`: its $/h
    from below); None where not planned for one."""
    split = split_cheapest(fm, time_limit_s=limit, spare=spare) if cheapest else \
        split_optimum(fm, time_limit_s=limit, spare=spare)  # fmt: skip
    if not spare:
        return split, None
    up = fleet_optimum(fm, budget_per_hour=budget, time_limit_s=UP_BOUND_S, cheapest=cheapest)
    if up.bound == up.bound:
        return split, up.bound
    return split, fleet_optimum(fm, budget_per_hour=budget, relax=True, cheapest=cheapest).bound


def planned_layout(joint: FleetResult, split: Split, lp_bound: Callable[[], float],
                   cheapest: bool = False) -> FleetResult:  # fmt: skip
    """The layout a fleet is planned on where the joint MILP was cut short: its best layout where that serves at
    least the best split's fraction (`cheapest`: costs no more than the best split's sizing); else the best split's
    (a joint layout too), with the MILP's proven bound where it has one and `lp_bound()` (the LP relaxation's) where
    it found no layout."""
    if cheapest:
        keep = bool(joint.islands) and joint.cost_per_hour <= split.cost_per_hour
    else:
        keep = split.fraction <= 0 or split.fraction <= joint.fraction
    if keep:
        return joint
    bound = joint.bound if joint.islands and joint.bound == joint.bound else lp_bound()
    return FleetResult("split", 1.0 if cheapest else split.fraction, bound, split.islands,
                       split.cost_per_hour if cheapest else 0.0, joint.solve_ms, joint.lost_hosts)  # fmt: skip


def _member_plans(members: list[Composed], joint: FleetResult, inv: Any, verify: bool = True,
                  losses_too: bool = True) -> list[Plan]:  # fmt: skip
    """Each member's islands planned as its own search plans a layout, on hosts placed over the one inventory,
    simulated on its own stream at its stated rate (`verify`: search.verify) and its host losses found
    (`losses_too`: search.host_losses) and its range drawn (search.band_draws); the models spread over this
    machine's cores where this process may fork (each is seconds: a simulation, the range's draws, a re-plan per
    host)."""
    layouts = [Layout.of([(g, n) for g, n, _ in isl]) for isl in joint.islands]
    node = {g.name: g.node_gpus for g in inv.gpus}
    hosts = place([i for lay in layouts for i in lay.islands], node)
    info = InventoryInfo(inv.name, inv.named, inv.cost_per_hour)
    jobs, at = [], 0
    for c, lay in zip(members, layouts, strict=True):
        if not lay.islands:
            raise ConfigError(f"fleet member {c.spec.model}: the joint optimum gives it no island")
        jobs.append((c, lay, info, hosts[at : at + len(lay.islands)], verify, losses_too, bool(joint.lost_hosts)))
        at += len(lay.islands)
    # the models over this machine's cores, the most requests to simulate first (a model's rate is its demand times
    # the common fraction), each core's share planned one after another
    groups = spread([c.spec.demand for c in members], min(len(jobs), os.cpu_count() or 1) if forkable() else 1)
    aside = [(g, Forked(_member_group, [jobs[k] for k in g])) for g in groups[1:]]
    done = dict(zip(groups[0], _member_group([jobs[k] for k in groups[0]]), strict=True))
    for g, forked in aside:
        done |= dict(zip(g, forked.result(what=f"the plans of {', '.join(jobs[k][0].spec.model for k in g)}"),
                         strict=True))  # fmt: skip
    return [done[k] for k in range(len(jobs))]


def spread(weights: list[float], n: int) -> list[list[int]]:
    """Indices of `weights` in `n` groups of near-equal sums (the heaviest first, each to the lightest group)."""
    groups: list[list[int]] = [[] for _ in range(max(1, n))]
    sums = [0.0] * len(groups)
    for k in sorted(range(len(weights)), key=lambda k: -weights[k]):
        g = sums.index(min(sums))
        groups[g].append(k)
        sums[g] += weights[k]
    return [g for g in groups if g]


def _member_group(jobs: list[tuple[Any, ...]]) -> list[Plan]:
    return [_member_plan(*job) for job in jobs]


def _member_plan(c: Composed, lay: Layout, info: InventoryInfo, mine: list[Any], verify: bool,
                 losses_too: bool, spare: bool = False) -> Plan:  # fmt: skip
    """One member's plan on its islands and hosts (`_member_plans`); `spare`: in the roles that keep the most with
    the worst of its hosts lost (on the hosts the fleet placed it on, some shared with other models' islands), as a
    search planned for a host lost keeps them."""
    roles = None
    if spare:
        found = spare_solve(c.ctx.planner, lay, 1, c.ctx.inner_time_limit_s, c.ctx.backend, hosts=mine)
        roles = found.roles if found.status in ("optimal", "feasible") else None
    plan = build_plan(c.ctx.planner, lay, c.ctx.inner_time_limit_s, c.ctx.backend, info, roles, mine)
    print(f"[fleet] {c.spec.model}: {lay.describe()}: {plan.rate_req_s:.2f} req/s within "
          f"{plan.slo.text()}" + ("; simulating it ..." if verify else ""), flush=True)  # fmt: skip
    verification = check(plan, RequestMix.of(c.ctx.planner.workload)) if plan.serves and verify else None
    losses = host_losses(c.ctx.planner, lay, plan, c.ctx.inner_time_limit_s, c.ctx.backend, roles) if losses_too \
        else None  # fmt: skip
    notes = (f"one of the models of a fleet: its islands are those the joint optimum gave {c.spec.model}",
             *((c.note,) if c.note else ()))  # fmt: skip
    return dataclasses.replace(plan, verification=verification, host_losses=losses, notes=(*plan.notes, *notes),
                               band=_band(c, lay, plan))  # fmt: skip


def _band(c: Composed, lay: Layout, plan: Plan) -> Band | None:
    """The member plan's range as its own search draws it (search.band_draws draws of its calibration, the model's
    error spread once more where it extrapolates or for a model no measurement is of); None where it has none."""
    cal, draws = c.settings.calibration, int(c.settings.steps.get("band", 0) or 0)
    if cal is None or not cal.uncertain or draws < 1 or not plan.serves:
        return None
    return rate_band(c.ctx.planner, lay, plan.rate_req_s, plan.rates.searched_req_s, band_calibration(cal, plan),
                     draws, time_limit_s=c.ctx.inner_time_limit_s, backend=c.ctx.backend,
                     seed=c.settings.search.seed)  # fmt: skip


def worst_host(members: list[Composed], plans: list[Plan]) -> dict[str, Any] | None:
    """The one host whose loss costs the fleet most: for every host a model's plan runs on, each model's rate with
    it gone (a model with no island there keeps its own) over its demand, the smallest of those; the host where that
    is lowest. None where no plan reports its host losses."""
    per = [{(x.gpu, x.node): x.rate_req_s for x in p.host_losses.losses} if p.host_losses else None for p in plans]
    if any(x is None for x in per):
        return None
    hosts = sorted({h for losses in per for h in losses if losses is not None})
    worst: dict[str, Any] | None = None
    for h in hosts:
        rates = [losses.get(h, p.rate_req_s) for losses, p in zip(per, plans, strict=True) if losses is not None]
        served = min(r / c.spec.demand for r, c in zip(rates, members, strict=True))
        if worst is None or served < worst["served"]:
            hit = [c.spec.model for c, losses in zip(members, per, strict=True) if losses is not None and h in losses]
            worst = {"gpu": h[0], "node": h[1], "served": served, "models": hit,
                     "rates_req_s": dict(zip([c.spec.model for c in members], rates, strict=True))}  # fmt: skip
    return worst


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def fleet_record(spec: FleetSpec, inventory_name: str, members: list[Composed], plans: list[Plan],
                 joint: FleetResult, split: Split | None, served: float, gap: float | None, wall_s: float,
                 bench_s: float, objective: str = "max_rate") -> dict[str, Any]:  # fmt: skip
    """fleet.json: what the fleet plan states, per model and in all."""
    per = []
    for k, (c, p) in enumerate(zip(members, plans, strict=True)):
        v = p.verification
        per.append({
            "model": c.spec.model, "workload": c.spec.workload, "costmodel": c.costmodel, "note": c.note,
            "slo": p.slo.text(), ("demand_req_s" if spec.demands else "weight"): c.spec.demand,
            "rate_req_s": p.rate_req_s, "served": p.rate_req_s / c.spec.demand,
            "searched_req_s": p.rates.searched_req_s, "output_tok_s": p.rates.output_tok_s,
            "cost_per_hour": p.cost_per_hour, "gpus": _gpus(p), "islands": _islands(p),
            "simulated_req_s": None if v is None else v.throughput_req_s,
            "simulated_over_stated": None if v is None else v.simulated_over_stated,
            "slo_attainment": None if v is None else v.slo_attainment,
            "range_req_s": None if p.band is None else [p.band.p10_req_s, p.band.p90_req_s],
            "range_calibration": None if p.band is None else p.band.calibration,
            "split_share": None if split is None else split.shares[k],
            "split_rate_req_s": None if split is None else split.rates[k],
            "plan": f"{c.spec.model}/plan.json",
        })  # fmt: skip
    inv = members[0].settings.inventory
    cheap = objective == "min_cost"
    return {
        "fleet": spec.name, "inventory": inventory_name, "inventory_gpus": dict(inv.named), "objective": objective,
        "demands": spec.demands, "served": served, "models": per,
        "cost_per_hour": sum(p.cost_per_hour for p in plans), "inventory_cost_per_hour": inv.cost_per_hour,
        # bound: on the common fraction from above (max_rate), on the $/h from below (min_cost)
        # lost_hosts 1: planned for one host lost (fraction, cost: what the reserve keeps with any one host gone;
        # bound: the optimum with every host up, which bounds it)
        "reference": {"status": joint.status, "lost_hosts": joint.lost_hosts, "fraction": joint.fraction,
                      "bound": joint.bound,
                      "cost_per_hour": joint.cost_per_hour, "gap": gap, "solve_s": joint.solve_ms / 1e3,
                      "time_limit_s": spec.time_limit_s},
        "split": None if split is None else {
            "shares": list(split.shares), "fraction": split.fraction, "rates_req_s": list(split.rates),
            "proven": split.proven, "cost_per_hour": split.cost_per_hour if cheap else None,
            "pooling_gain": joint.fraction / split.fraction - 1 if split.fraction > 0 and not cheap else None,
            "saving": 1 - joint.cost_per_hour / split.cost_per_hour if cheap and split.cost_per_hour > 0 else None},
        "wall_s": wall_s, "benchmark_s": bench_s,
    }  # fmt: skip


def _islands(p: Plan) -> str:
    counts: dict[tuple[str, int, str], int] = {}
    for isl in p.islands:
        if isl.serving:
            counts[(isl.gpu, isl.size, isl.role)] = counts.get((isl.gpu, isl.size, isl.role), 0) + 1
    return ", ".join(f"{n} x {g} {size} {role}" for (g, size, role), n in counts.items())


def _gpus(p: Plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for isl in p.islands:
        if isl.serving:
            out[isl.gpu] = out.get(isl.gpu, 0) + isl.size
    return out


def summary(r: dict[str, Any]) -> list[str]:
    unit = " req/s" if r["demands"] else ""
    key = "demand_req_s" if r["demands"] else "weight"
    out = [f"{m['model']}: {m['rate_req_s']:.2f} req/s = {m['served']:.3f} x its {key.split('_')[0]} "
           f"{m[key]:g}{unit}" + ("" if m.get("range_req_s") is None else
                                  f" (range {m['range_req_s'][0]:,.1f}-{m['range_req_s'][1]:,.1f})")
           + f"; simulated {_x(m['simulated_over_stated'])}; {m['islands']}" for m in r["models"]]
    ref, split = r["reference"], r["split"]
    if r["demands"] and r["served"] < 1:
        out.append(f"warning: the inventory serves {r['served']:.1%} of every model's demand, not all of it: add "
                   "GPUs or lower the demands")  # fmt: skip
    gap = "n/a" if ref["gap"] is None else f"{ref['gap']:.1%}"
    if r.get("worst_host"):
        w = r["worst_host"]
        out.append(f"one host lost: at worst {w['gpu']} host {w['node']} ({', '.join(w['models'])}): "
                   f"{w['served']:.3f} of every {key.split('_')[0]} served")  # fmt: skip
        if w["served"] < 0.5 * r["served"] and ref["status"] == "replan":
            out.append("warning: within its moves the re-plan left a model whose only island of a role runs on that "
                       "host: it stops if the host is lost; give more moves (search.max_moves) or plan the fleet again "
                       "from scratch")  # fmt: skip
        elif w["served"] < 0.5 * r["served"] and not ref.get("lost_hosts"):
            out.append("warning: this fleet is planned with every host up (search.spare_hosts=0, or a setting that "
                       "excludes it): a model whose only island of a role runs on that host stops")  # fmt: skip
    if r.get("objective") == "min_cost":
        return out + _cheapest_summary(r, gap)
    if ref["status"] == "replan":
        return out + _replan_summary(r, key.split("_")[0])
    if ref.get("lost_hosts") and ref["status"] != "split":
        state = "optimal in its model" if ref["status"] == "optimal" else "its best at fleet.time_limit_s"
        out.append(f"fleet: planned for one host lost: {r['served']:.3f} of every {key.split('_')[0]} served with "
                   f"every host up, ${r['cost_per_hour']:,.2f}/h; the joint layout keeps {ref['fraction']:.3f} with "
                   f"any one host lost by its reserve ({state}); the optimum with every host up bounds that at "
                   f"{ref['bound']:.3f}: gap at most {gap}")  # fmt: skip
    elif ref["status"] == "split":
        out.append(f"fleet: {r['served']:.3f} of every {key.split('_')[0]} served, ${r['cost_per_hour']:,.2f}/h: the "
                   f"best split's layout (the joint MILP found none as good within its time limit); the optimum is at "
                   f"most {ref['bound']:.3f}, gap at most {gap}")  # fmt: skip
        return out
    elif ref["status"] == "optimal":
        out.append(f"fleet: {r['served']:.3f} of every {key.split('_')[0]} served, ${r['cost_per_hour']:,.2f}/h; the "
                   f"exact optimum {ref['fraction']:.3f} (optimal), gap {gap}")  # fmt: skip
    else:
        out.append(f"fleet: {r['served']:.3f} of every {key.split('_')[0]} served, ${r['cost_per_hour']:,.2f}/h; the "
                   f"joint MILP's best layout {ref['fraction']:.3f} at its time limit (fleet.time_limit_s), the "
                   f"optimum at most {ref['bound']:.3f}: gap at most {gap}")  # fmt: skip
    if split is not None and split["pooling_gain"] is not None:
        shares = ", ".join(f"{m['model']} {s:.0%}" for m, s in zip(r["models"], split["shares"], strict=True))
        lost = " with any one host lost" if ref.get("lost_hosts") else ""
        out.append(f"planned one model at a time on the best split of the inventory ({shares} of every GPU type): "
                   f"{split['fraction']:.3f}{lost}; the joint plan gains {split['pooling_gain']:+.1%}")  # fmt: skip
    return out


def _replan_summary(r: dict[str, Any], word: str) -> list[str]:
    """The console's lines on a fleet re-planned from a running one (pipeline.fleet.replan)."""
    again = r["replan"]
    out = [f"re-planned {m}: {len(x['moves'])} moves ({'; '.join(x['moves']) or 'none'}), {x['hosts_relaunched']} "
           f"hosts re-launched, {x['kept_islands']} islands run on unchanged" for m, x in again["models"].items()]
    out.append(f"fleet: {r['served']:.3f} of every {word} served after the re-plan, ${r['cost_per_hour']:,.2f}/h; it "
               f"ran {again['served_before']:.3f}, and {again['served_with_the_loss']:.3f} with "
               f"{', '.join(again['lost_hosts']) or 'no host'} lost (from {again['from']})")  # fmt: skip
    return out


def _cheapest_summary(r: dict[str, Any], gap: str) -> list[str]:
    ref, split = r["reference"], r["split"]
    how = {"optimal": "the cheapest (optimal)", "split": "the best split's sizing (the joint MILP found none as cheap "
           "within its time limit)"}.get(ref["status"], "the joint MILP's cheapest at its time limit "
                                                        "(fleet.time_limit_s)")  # fmt: skip
    if ref.get("lost_hosts") and ref["status"] != "split":
        how = "the cheapest in the reserve's model" + (" (optimal)" if ref["status"] == "optimal" else
                                                       " at its time limit (fleet.time_limit_s)")  # fmt: skip
        out = [f"fleet: every demand served with any one host lost ({r['served']:.3f} x at least with every host "
               f"up), ${r['cost_per_hour']:,.2f}/h of the inventory's ${r['inventory_cost_per_hour']:,.2f}/h: {how}; "
               f"the cheapest with every host up is at least ${ref['bound']:,.2f}/h, gap at most {gap}"]
    else:
        out = [f"fleet: every demand served ({r['served']:.3f} x at least), ${r['cost_per_hour']:,.2f}/h of the "
               f"inventory's ${r['inventory_cost_per_hour']:,.2f}/h: {how}; the least is at least "
               f"${ref['bound']:,.2f}/h, gap {'' if ref['status'] == 'optimal' else 'at most '}{gap}"]
    if split is None:
        out.append("sized one model at a time, no split of the inventory in shares of k/12 serves every demand")
    elif split["saving"] is not None:
        shares = ", ".join(f"{m['model']} {s:.0%}" for m, s in zip(r["models"], split["shares"], strict=True))
        out.append(f"sized one model at a time on the best split of the inventory ({shares} of every GPU type): "
                   f"${split['cost_per_hour']:,.2f}/h; the joint plan saves {split['saving']:.1%}")  # fmt: skip
    return out


def _range(m: dict[str, Any]) -> str:
    r = m.get("range_req_s")
    return "n/a" if r is None else f"{r[0]:,.1f}-{r[1]:,.1f} ({m['range_calibration']})"


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}x"


def _reference_cell(ref: dict[str, Any], cheap: bool = False) -> str:
    """report.md's line on the joint MILP: the optimum it proved, or the best layout of its time and its bound."""
    gap = "n/a" if ref["gap"] is None else format(ref["gap"], ".2%")
    if ref["status"] == "replan":
        return "none: re-planned from a running fleet with few moves (below), not from scratch"
    if cheap and ref.get("lost_hosts") and ref["status"] != "split":
        state = ("optimal in the reserve's model" if ref["status"] == "optimal"
                 else "the joint MILP's cheapest in its time limit")
        return (f"${ref['cost_per_hour']:,.2f}/h serves every demand with any one host lost ({state}, "
                f"{ref['solve_s']:.1f} s); the cheapest with every host up is at least ${ref['bound']:,.2f}/h: "
                f"gap at most {gap}")  # fmt: skip
    if cheap:
        state = {"optimal": "optimal", "split": "the best split's sizing: the joint MILP found none as cheap"}.get(
            ref["status"], "not proven: the joint MILP's cheapest in its time limit")
        return (f"${ref['cost_per_hour']:,.2f}/h serves every demand ({state}, {ref['solve_s']:.1f} s); the least "
                f"is at least ${ref['bound']:,.2f}/h: gap {'' if ref['status'] == 'optimal' else 'at most '}{gap}")
    if ref.get("lost_hosts") and ref["status"] != "split":
        state = (f"optimal in the reserve's model, solved in {ref['solve_s']:.1f} s" if ref["status"] == "optimal"
                 else f"the joint MILP's best in its time limit, {ref['solve_s']:.1f} s")
        return (f"planned for one host lost: the joint layout keeps {ref['fraction']:.3f} with any one host gone by "
                f"its reserve ({state}); the optimum with every host up, at most {ref['bound']:.3f}, bounds every "
                f"plan's rate with a host lost: gap at most {gap}")  # fmt: skip
    if ref["status"] == "optimal":
        return f"{ref['fraction']:.3f} (optimal, solved in {ref['solve_s']:.1f} s); gap {gap}"
    if ref["status"] == "split":
        return (f"not found: the joint MILP found no layout as good as the best split's in {ref['solve_s']:.1f} s, "
                f"so the plan is the best split's; the optimum is at most {ref['bound']:.3f}: gap at most {gap}")
    return (f"not proven: the joint MILP's best layout in its time limit ({ref['solve_s']:.1f} s) serves "
            f"{ref['fraction']:.3f}, and the optimum is at most {ref['bound']:.3f} (its proven bound): gap at most "
            f"{gap}")


def _replan_section(r: dict[str, Any], word: str) -> list[str]:
    """report.md: how a re-planned fleet was reached from the running one."""
    again = r["replan"]
    lines = ["## Re-planned from a running fleet", "",
             f"From `{again['from']}`, with {', '.join(again['lost_hosts']) or 'no host'} lost: it served "
             f"{again['served_before']:.3f} of every {word}, {again['served_with_the_loss']:.3f} with the loss, and "
             f"{r['served']:.3f} re-planned. The models with an island on a host that is gone are re-planned within "
             f"{again['max_moves']} changed islands each, on hosts no other model runs on; the others run on as they "
             "are.", "",
             "| model | ran (req/s) | with the loss | re-planned | moves | hosts re-launched | islands kept |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    rates = {m["model"]: m["rate_req_s"] for m in r["models"]}
    for model, x in again["models"].items():
        lines.append(f"| {model} | {x['was_req_s']:.2f} | {x['with_the_loss_req_s']:.2f} | {rates[model]:.2f} | "
                     f"{'; '.join(x['moves']) or 'none'} | {x['hosts_relaunched']} | {x['kept_islands']} |")
    return [*lines, ""]


def _split_section(r: dict[str, Any], word: str) -> list[str]:
    """report.md: what planning (or sizing) the models one at a time on a split of the inventory gives."""
    ref, split = r["reference"], r["split"]
    if split is None:
        return ["No split of every GPU type between the models in shares of k/12 serves every demand with each "
                "model's cheapest islands on its share: only the joint plan does."]  # fmt: skip
    proven = "" if split["proven"] else " (some of its one-model optima stopped at their time limit)"
    if r.get("objective") == "min_cost":
        head = ("What separate runs can do: split every GPU type between the models in the same shares (k/12 of "
                "each), and size each model alone on its share (its cheapest islands there serving its demand). The "
                f"cheapest such split costs **${split['cost_per_hour']:,.2f}/h**{proven}; the joint plan's islands "
                f"cost **${ref['cost_per_hour']:,.2f}/h**"
                + (f": pooling the inventory saves **{split['saving']:.1%}**." if split["saving"] is not None
                   else "."))  # fmt: skip
    else:
        head = ("What separate runs can do: split every GPU type between the models in the same shares (k/12 of "
                "each), and plan each model alone on its share (its exact optimum there"
                + ("; both planned for one host lost, by the same reserve" if ref.get("lost_hosts") else "")
                + f"). The best such split serves **{split['fraction']:.3f}** of every {word}{proven}; the joint plan "
                f"serves **{ref['fraction']:.3f}** (the same cost model, the "
                + ("same reserve" if ref.get("lost_hosts") else "exact optimum of both") + ")"
                + (f": pooling the inventory gains **{split['pooling_gain']:+.1%}**, by giving each model the GPU "
                   "types it serves best rather than a slice of each." if split["pooling_gain"] is not None
                   else "."))  # fmt: skip
    return [head, "", "| model | share of every type | alone on it (req/s) | in the joint plan (req/s) |",
            "|---|---|---|---|",
            *(f"| {m['model']} | {m['split_share']:.0%} | {m['split_rate_req_s']:.2f} | {m['rate_req_s']:.2f} |"
              for m in r["models"])]  # fmt: skip


def fleet_report(r: dict[str, Any]) -> str:
    """report.md of a fleet: the fleet's totals, the joint plan against the best split, a section per model."""
    key = "demand_req_s" if r["demands"] else "weight"
    word = key.split("_")[0]
    ref, cheap = r["reference"], r.get("objective") == "min_cost"
    lines = [
        f"# Fleet {r['fleet']} on {r['inventory']}",
        "",
        f"{len(r['models'])} models on one inventory ({', '.join(f'{n} {g}' for g, n in r['inventory_gpus'].items())}"
        f", ${r['inventory_cost_per_hour']:,.2f}/h). Every island serves one model; a request goes to its model's "
        f"islands, then by its length as that model's plan routes it.",
        "",
        "| | |",
        "|---|---|",
        f"| **served** | **{r['served']:.3f} of every model's {word}** (the smallest of the models' rates over "
        f"their {word}s) |",
        f"| cost | ${r['cost_per_hour']:,.2f}/h of islands in use |",
        f"| {'cheapest islands' if cheap else 'a host lost' if ref.get('lost_hosts') else 'exact optimum'} | "
        f"{_reference_cell(ref, cheap)} |",
        *([f"| one host lost | at worst {r['worst_host']['gpu']} host {r['worst_host']['node']} (it runs "
           f"{', '.join(r['worst_host']['models'])}): {r['worst_host']['served']:.3f} of every {word} served; each "
           "model's plan.json lists its own host losses |"] if r.get("worst_host") else []),
        f"| planned in | {r['wall_s']:.1f} s (islands benchmarked in {r['benchmark_s']:.1f} s) |",
        "",
        "| model | workload | " + word + " | rate (req/s) | range (10th-90th percentile) | served | "
        "simulated / stated | within SLOs | GPUs | $/h |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(f"| {m['model']} | {m['workload']} | {m[key]:g} | {m['rate_req_s']:.2f} | {_range(m)} | {m['served']:.3f} | "
          f"{_x(m['simulated_over_stated'])} | "
          f"{'n/a' if m['slo_attainment'] is None else format(m['slo_attainment'], '.1%')} | "
          f"{', '.join(f'{n} {g}' for g, n in m['gpus'].items())} | {m['cost_per_hour']:,.2f} |"
          for m in r["models"]),
        "",
        *(_replan_section(r, word) if r.get("replan") else
          ["## The joint plan against the best split", "", *_split_section(r, word), ""]),
    ]  # fmt: skip
    for m in r["models"]:
        lines += [
            f"## {m['model']}",
            "",
            f"Workload {m['workload']}, {m['slo']}, costmodel={m['costmodel']}"
            + (f" ({m['note']})" if m["note"] else "") + f". Islands: {m['islands']}. Its plan: `{m['plan']}` "
            f"(`python -m pipeline.simulate plan={m['plan']}`, `python -m pipeline.deploy plan={m['plan']}`).",
            "",
        ]  # fmt: skip
    return "\n".join(lines)


def _track(tracker: Any, r: dict[str, Any], run_dir: Path) -> None:
    """MLflow: the fleet's parent run, a child per model."""
    params = {"fleet": r["fleet"], "inventory": r["inventory"], "models": ",".join(m["model"] for m in r["models"]),
              "objective": r.get("objective", "max_rate")}
    tracker.start_parent(f"fleet-{r['fleet']}-{r['inventory']}", params, None, FLEET_NOTE)
    key = "demand_req_s" if r["demands"] else "weight"
    for m in r["models"]:
        metrics = {k: float(m[k]) for k in ("rate_req_s", "served", "output_tok_s", "cost_per_hour", key,
                                             "simulated_req_s", "simulated_over_stated", "slo_attainment",
                                             "split_rate_req_s") if m.get(k) is not None}  # fmt: skip
        tracker.child(m["model"], {"model": m["model"], "workload": m["workload"], "costmodel": m["costmodel"]},
                      metrics, False)  # fmt: skip
    ref = r["reference"]
    metrics = {"served": r["served"], "cost_per_hour": r["cost_per_hour"], "wall_s": r["wall_s"],
               **({"split_served": r["split"]["fraction"]} if r["split"] else {})}  # fmt: skip
    if ref["status"] != "replan":  # (the joint MILP's layout's fraction: with a host lost where planned for one)
        metrics["optimum"] = ref["fraction"]
    else:  # a re-plan: the moves and hosts re-launched, what the fleet served before and with the loss
        again = r["replan"]
        metrics |= {"replan_moves": float(sum(len(x["moves"]) for x in again["models"].values())),
                    "replan_hosts_relaunched": float(sum(x["hosts_relaunched"] for x in again["models"].values())),
                    "served_before": again["served_before"], "served_with_the_loss": again["served_with_the_loss"]}
    if ref["gap"] is not None:
        metrics["gap"] = ref["gap"]
    if r.get("objective") == "min_cost":  # the sizing question: the $/h found, the least proven, the split's
        metrics |= {"cheapest_cost_per_hour": ref["cost_per_hour"], "cost_bound_per_hour": ref["bound"]}
        if r["split"] and r["split"]["cost_per_hour"] is not None:
            metrics["split_cost_per_hour"] = r["split"]["cost_per_hour"]
    if r.get("worst_host"):
        metrics["one_host_lost_served"] = r["worst_host"]["served"]
    tracker.finish_parent(metrics, [run_dir / "fleet.json", run_dir / "report.md"])

"""One search, from its composed config to its plan: `execute` (the command is `python -m pipeline.search`).

    settings and trial context   (pipeline.search.settings)
    the exact reference          (pipeline.search.reference; reference.json)
    the trials                   (pipeline.search.tune.driver under Ray Tune, or the reference's layout)
    the plan                     (pipeline.planning.build, then the rate band and the simulated check)
    its records                  (plan.json, report.md, plots, trials.parquet; MLflow's parent run)

Each run writes `outputs/search/<inventory>-<workload>-<generator>-<sampler>-<objective>-<hash>/<time>/`.
"""

from __future__ import annotations

import dataclasses
import errno
import sys
import time
from pathlib import Path
from typing import Any

from pipeline import cli
from pipeline.errors import RecordsError
from pipeline.planning.build import build_plan
from pipeline.planning.check import LOW
from pipeline.planning.config import fallback_note
from pipeline.planning.failures import spare_solve
from pipeline.planning.planner import Layout
from pipeline.planning.replan import Replanned, hosts_now, replan
from pipeline.planning.sizing import Sizer, demand_score
from pipeline.records import cost_curve
from pipeline.records.journal import link_latest, read_json, write_json, write_text
from pipeline.records.report import (
    Headline,
    best_so_far,
    convergence_plot,
    report,
    routing_plot,
    sizing_sentence,
    write_trials,
)
from pipeline.records.tracking import Served, Tracker, open_tracker
from pipeline.search.reference import exact_layout, run_reference
from pipeline.search.samplers import require_extras
from pipeline.search.settings import Settings, context, idle_types, inventory_of, read_settings, recorded
from pipeline.search.steps import STEPS, StepContext, read_steps
from pipeline.search.steps.runner import Stopped, run_steps, say, step_metrics
from pipeline.search.trial import OK, Context, TrialFn, run_trial, score_layout
from pipeline.search.trials import SearchRun
from pipeline.search.tune.driver import check_ray_address, run_tune, with_ray
from plan import InventoryInfo, Plan, Reference, SearchInfo, Sizing, to_json

NO_PLAN = 1  # exit code of a search that finished without a usable layout

EXPERIMENT_NOTE = (
    "Archipelago searches. Each parent run is one search (`python -m pipeline.search`): its parameters are the "
    "inventory, workload and search settings; its metrics the plan's rate (best_rate_req_s, within the SLOs), "
    "output_tok_s, cost_per_hour, usd_per_m_output_tokens, the gap to the exact optimum and best_so_far per trial "
    "(a chart of it is the convergence); its artifacts plan.json, report.md, convergence.png and trials.parquet. "
    "Its child runs are the trials: layout_id (the islands in full are the `islands` tag), status and rates."
)

# the runs table's columns (pipeline/records/tracking.py VIEW_KEY): the parent's plan and each trial's result
COLUMNS = ("metrics.best_rate_req_s", "metrics.gap", "metrics.output_tok_s", "metrics.usd_per_m_output_tokens",
           "metrics.score", "metrics.rate_req_s", "params.inventory", "params.workload", "params.sampler",
           "params.layout_id", "params.status")  # fmt: skip
FILES = ("plan.json", "report.md", "convergence.png", "routing.png", "trials.parquet", "reference.json", "sizing.json",
         "cost_curve.png")


def execute(cfg: Any, trial_fn: TrialFn = run_trial) -> int:
    """Run the search `cfg` describes; returns the exit code (0 done, 1 no plan, 130 interrupted). With
    `+fleet=NAME`, several models on one inventory (pipeline/fleet/run.py)."""
    if "fleet" in cfg:
        from pipeline.fleet.run import execute as plan_fleet

        return plan_fleet(cfg)
    settings = read_settings(cfg, *inventory_of(cfg))  # every value checked; nothing benchmarked yet
    settings = dataclasses.replace(settings, steps=read_steps(cfg.search))  # the post-search steps' own
    if settings.mode == "search":
        require_extras(settings.search.sampler)  # an optional extra missing: say so now
    check_ray_address(settings.ray.address)
    # a bad store: now; MLflow itself opens it beside the work below
    tracker = open_tracker(settings.mlflow.tracking_uri, settings.mlflow.experiment, EXPERIMENT_NOTE, COLUMNS)
    try:
        return _search(settings, trial_fn, tracker)
    finally:
        tracker.close()


def _search(settings: Settings, trial_fn: TrialFn, tracker: Tracker | Served) -> int:
    """The search once its settings are read and its tracking store is open."""
    ctx = context(settings)  # the islands benchmarked: minimum sizes, whether a plan exists at all
    run = SearchRun(settings, ctx, tracker)
    what = _what(settings)
    print(
        f"[search] {settings.inventory.describe()}; workload {settings.workload_name}; {what}, objective "
        f"{settings.search.objective}; minimum island " + ", ".join(f"{g} {n}" for g, n in ctx.space.min_island)
        + f"\n[search] run folder {run.dir}"
        + (f"\n[search] resuming: {run.resumed} trials already done" if run.resumed else ""),
        flush=True,
    )  # fmt: skip
    notes = [
        f"no island of {g} (not even all {settings.inventory.count(g)} of them) can hold {ctx.planner.model.name}: "
        f"those GPUs stay idle in every plan"
        for g in idle_types(ctx.planner, settings.inventory)
    ]
    for note in notes:
        print(f"[search] warning: {note}", flush=True)
    if priced := fallback_note(settings.config["costmodel"], ctx.planner.model.name):
        print(f"[search] note: {priced}", flush=True)
        notes.append(priced)
    if settings.spare_off:
        print(f"[search] not planned for a host lost (search.spare_hosts=auto): {settings.spare_off}",
              flush=True)  # fmt: skip
    try:
        write_json(run.dir / "config.json", recorded(settings, ctx))
        run.ref = run_reference(run, settings, ctx)
        state_path = run.dir / "state.json"
        state = read_json(state_path, "a new MLflow parent run records the search") or {}
        resumed_parent = state.get("parent_run_id")
        note = (f"Search: {settings.inventory.describe()}, workload {settings.workload_name}, {what}, objective "
                f"{settings.search.objective}. Children: one run per trial (layout_id, status, rates). "
                f"Run folder: {run.dir}")  # fmt: skip
        tracker.start_parent(run.dir.parent.name, _params(settings, ctx, run), resumed_parent, note, state_path)
        return _finish(run, settings, ctx, trial_fn, tracker, resumed_parent is not None, notes)
    except KeyboardInterrupt:
        tracker.end_parent("KILLED")
        raise
    except BaseException as err:
        tracker.end_parent("FAILED")
        line = records_error(err, run.dir)
        if line is None:
            raise
        raise RecordsError(line) from None


CANNOT_WRITE = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded",
                errno.EROFS: "the file system is read-only"}  # fmt: skip


def records_error(err: BaseException, run_dir: Path) -> str | None:
    """One line for a failure to write the run's records (a full disk, the run folder deleted), found anywhere in
    `err`'s chain (Ray Tune wraps what its callbacks raise); None for any other failure."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError):
            if not (run_dir / "config.json").exists():  # written first: gone, the folder was deleted (Ray Tune
                # may have made it again for its own files since)
                return (f"the run folder {run_dir} was deleted while the search ran, and its trials with it: run "
                        "the search again")  # fmt: skip
            if e.errno in CANNOT_WRITE:
                return (f"{CANNOT_WRITE[e.errno]} writing {e.filename or run_dir}: free space, then continue with "
                        f"the same command plus search.resume=true (the trials journalled so far are kept in "
                        f"{run_dir}/trials.jsonl)")  # fmt: skip
        e = e.__cause__ or e.__context__
    return None


def _what(settings: Settings) -> str:
    """How the layout is found, in the banner's words."""
    if settings.mode == "exact":
        return "the exact MILP plans the layout (no trials)"
    again, o = settings.replan, settings.search
    if again is not None:
        lost = f", hosts lost {', '.join(f'{g}:{n}' for g, n in again.lost_hosts)}" if again.lost_hosts else ""
        hosts = f" and {again.max_hosts} hosts" if again.max_hosts is not None else ""
        return f"re-plan of {again.path} within {again.max_moves} changed islands{hosts}{lost} (no trials)"
    polish = f" (the last {round(o.polish * o.trials)} polish the best)" if o.polish else ""
    return f"{o.generator} layouts, sampler {o.sampler}, {o.iterations} x {o.batch} trials{polish}"


def _params(settings: Settings, ctx: Context, run: SearchRun) -> dict[str, Any]:
    """The parent run's parameters: each setting once, the ones the runs table shows by their short name."""
    cal = settings.calibration
    shown = ("resume", "generator", "sampler", "objective", "iterations", "batch", "seed")
    return {
        "inventory": settings.inventory.describe(),
        "workload": settings.workload_name,
        "model": ctx.planner.model.name,
        "cost_profile": ctx.planner.profile.name,
        "calibration": "none" if cal is None else f"{cal.name} ({cal.source or 'fitted'})"
        + (", robust: 10th percentile" if settings.search.robust else ""),
        "generator": settings.search.generator,
        "sampler": settings.search.sampler,
        "objective": settings.search.objective,
        "iterations": settings.search.iterations,
        "batch": settings.search.batch,
        "seed": settings.search.seed,
        "run_dir": str(run.dir),
        **{f"search.{k}": v for k, v in settings.config["search"].items() if k not in shown},
    }


def _finish(
    run: SearchRun,
    settings: Settings,
    ctx: Context,
    trial_fn: TrialFn,
    tracker: Tracker | Served,
    resumed: bool,
    notes: list[str],
) -> int:
    """The trials, the plan and its records, once the parent MLflow run is open."""
    if resumed:
        run.reconcile(tracker.child_names())
        run.log_trials()
    t_start = time.perf_counter()
    best_layout, complete = _layout(run, settings, ctx, trial_fn, tracker)
    wall_s = time.perf_counter() - t_start
    run.log_trials()
    df = write_trials(run.dir / "trials.parquet", run.records)
    _convergence(run, settings)
    if best_layout is None:
        return _no_plan(run, settings, tracker, complete, wall_s)
    if _nothing_survives(run, settings):  # no layout keeps anything with its worst hosts lost: nothing to plan with
        return _no_plan(run, settings, tracker, complete, wall_s, serves_nothing=True)
    if out_of_time := _out_of_time(run):  # layouts the search could not score
        note = (f"{out_of_time} of {len(run.records)} trials ran out of search.inner_time_limit_s="
                f"{ctx.inner_time_limit_s:g} s without a solution and were not scored (trials.jsonl says which); a "
                "larger limit scores them")  # fmt: skip
        print(f"[search] note: {note}", flush=True)
        notes = [*notes, note]
    plan, best_layout = _best_plan(run, settings, ctx, best_layout, complete, wall_s, notes)
    if not plan.serves:  # the best layout serves nothing: no plan to write, deploy or link as the newest
        return _no_plan(run, settings, tracker, complete, wall_s, serves_nothing=True)
    poisson = dataclasses.replace(ctx, planner=ctx.planner.poisson(), key=f"{ctx.key}:poisson")  # the plan's rates
    sc = StepContext(settings, ctx, poisson, best_layout, run)
    try:
        plan, stopped = run_steps(STEPS, plan, sc), False
    except Stopped as stop:  # Ctrl-C in a post-search step: the plan with what finished, and exit 130
        plan, stopped = stop.plan, True
    _records(run, settings, plan, df)
    _log_parent(run, settings, tracker, plan, complete, wall_s)
    link_latest(settings.run_root.parent, run.dir)  # outputs/search/latest: the newest finished plan
    _summary(run, plan, sc)
    _unlogged_warning(run)
    if not complete:
        print(f"[search] interrupted after {len(run.records)}/{settings.search.trials} trials; finished trials are "
              "kept. Continue with the same command plus search.resume=true", file=sys.stderr, flush=True)  # fmt: skip
    return cli.INTERRUPTED if stopped or not complete else 0


def _layout(
    run: SearchRun, settings: Settings, ctx: Context, trial_fn: TrialFn, tracker: Tracker | Served
) -> tuple[Layout | None, bool]:
    """(the best layout, whether the search finished): the exact MILP's, a re-plan's, or the trials' best."""
    if settings.mode == "exact":
        assert run.ref is not None
        return exact_layout(run.ref), True
    if settings.mode == "replan":
        run.replanned = _replanned(settings, ctx)
        return (run.replanned.layout if run.replanned.pieces else None), True
    tracker.ready()  # a store MLflow cannot open: said before the trials, not after them
    complete = with_ray(settings.ray.address, settings.ray.num_cpus, lambda: run_tune(run, trial_fn),
                        keep=cli.sweep_dir() is not None)  # a multirun's next job searches on the same Ray
    run.progress(force=True)
    best = Layout.of(ctx.space.layout(run.best["params"])) if run.best else None
    if best is not None and ctx.demand_req_s is not None:  # objective min_cost: the islands of it in use, the fleet
        best = _fleet(run, ctx, best)
    return best, complete


def _fleet(run: SearchRun, ctx: Context, layout: Layout) -> Layout | None:
    """objective min_cost: the best layout's cheapest fleet, trimmed island by island (`Sizer.trimmed`), that holds
    the demand as the plan states rates (sized again from the whole layout, and said so, where it falls short)."""
    assert ctx.demand_req_s is not None
    sizer = Sizer(ctx.planner, ctx.demand_req_s, ctx.inner_time_limit_s, ctx.backend, ctx.spare_hosts)
    first = sizer.trimmed(layout, {g: ctx.space.sizes(g) for g, _ in ctx.space.inventory})
    if first.layout is None:
        return None
    run.searched_fleet = first.cost_per_hour
    if sizer.holds(sizer.plan_rate(first.layout)):
        return first.layout
    fleet, held = sizer.held(layout)
    lost = " with its worst host lost" if ctx.spare_hosts else ""
    print(f"[search] sizing: the fleet the trials found (${first.cost_per_hour:,.2f}/h) holds less than "
          f"{ctx.demand_req_s:g} req/s{lost} once each island's load cap is set for its own routed mix (the plan's "
          f"rates): sized again, ${fleet.cost_per_hour:,.2f}/h holds {held:.2f}", flush=True)  # fmt: skip
    return fleet.layout


def _records(run: SearchRun, settings: Settings, plan: Plan, df: Any) -> None:
    """plan.json, routing.png and report.md (the post-search steps' rows and sections in it)."""
    write_json(run.dir / "plan.json", to_json(plan))
    routing_plot(run.dir / "routing.png", plan, f"{settings.inventory.name}, {settings.workload_name}: routing")
    o = settings.search
    header = (f"# Search: {run.dir.parent.name}\n\n{settings.inventory.describe()}; workload {settings.workload_name}; "
              f"model {plan.model.name}, cost profile {plan.profile_name}; {o.generator} + {o.sampler}, "
              f"objective {o.objective}")  # fmt: skip
    png = "routing.png" if (run.dir / "routing.png").exists() else None
    write_text(run.dir / "report.md", report(plan, df, header, png, STEPS))
    if plan.sizing is not None:  # the cost curve: this run's point, and the multirun's curve so far
        sweep = cli.sweep_dir()
        cost_curve.record(plan, settings.inventory.name, [run.dir, *([Path(sweep)] if sweep else [])])


def _convergence(run: SearchRun, settings: Settings) -> None:
    o = settings.search
    per_dollar = o.objective == "rate_per_dollar"
    line = None
    if run.ref is not None and o.objective != "thesis":
        line = run.reference_score()
    convergence_plot(run.dir / "convergence.png", run.records, batch=o.batch, reference=line,
                     unit="req/s per $/h" if per_dollar else "req/s demanded per $/h of the fleet"
                     if o.objective == "min_cost" else "req/s",
                     title=f"{settings.inventory.name}, {settings.workload_name}: {o.sampler} ({o.generator})",
                     polish_from=run.polish_from, reference_is_bound=run.gap_is_bound)  # fmt: skip


# the search scores a layout with each island's load cap set for the whole workload's mix; its plan sets each cap for
# the island's own routed mix. Where the best-scored layout's plan holds less than this share of its score, the next
# `RUNNER_UPS` layouts by score are planned too and the plan that states the most is kept
SHORT_OF_SCORE = 0.9
RUNNER_UPS = 3


def _best_plan(
    run: SearchRun,
    settings: Settings,
    ctx: Context,
    layout: Layout,
    complete: bool,
    wall_s: float,
    notes: list[str],
) -> tuple[Plan, Layout]:
    """The plan of the best-scored layout, or of one of the next scored where that one's own routed mixes cap its
    islands well below its score (the objectives max_rate and rate_per_dollar; a re-plan or a sizing keeps its
    layout)."""
    plan = _plan(run, settings, ctx, layout, complete, wall_s, notes)
    o = settings.search
    fixed = settings.mode != "search" or run.replanned is not None or ctx.demand_req_s is not None
    if fixed or o.objective not in ("max_rate", "rate_per_dollar") or \
            plan.rate_req_s >= SHORT_OF_SCORE * plan.rates.searched_req_s:  # fmt: skip
        return plan, layout

    def worth(p: Plan) -> float:
        return p.rate_per_dollar if o.objective == "rate_per_dollar" else p.rate_req_s

    others: list[Layout] = []
    for rec in sorted((r for r in run.records if r["status"] in OK), key=lambda r: -r["score"]):
        other = Layout.of(ctx.space.layout(rec["params"]))
        if other != layout and other not in others:
            others.append(other)
        if len(others) == RUNNER_UPS:
            break
    best, first = (plan, layout), plan
    for other in others:
        candidate = _plan(run, settings, ctx, other, complete, wall_s, notes)
        if worth(candidate) > worth(best[0]):
            best = (candidate, other)
    if best[0] is first:
        return best
    said = (f"the best-scored layout's plan holds {first.rate_req_s:.2f} req/s once each island's load cap is set for "
            f"its own routed mix ({first.rate_req_s / first.rates.searched_req_s:.0%} of the "
            f"{first.rates.searched_req_s:.2f} the search's model gives it); of the next {len(others)} by score, one "
            f"holds {best[0].rate_req_s:.2f}: planned with it")  # fmt: skip
    print(f"[search] {said}", flush=True)
    return dataclasses.replace(best[0], notes=(*best[0].notes, said)), best[1]


def _plan(
    run: SearchRun,
    settings: Settings,
    ctx: Context,
    layout: Layout,
    complete: bool,
    wall_s: float,
    notes: list[str],
) -> Plan:
    """The plan of the best layout, with how the search found it and its gap to the exact reference."""
    inv = settings.inventory
    inventory = InventoryInfo(inv.name, inv.named, inv.cost_per_hour)
    roles, hosts, again = None, None, run.replanned
    if settings.search.spare_hosts:  # the roles that keep the most with the worst hosts lost, as the trials scored them
        roles = spare_solve(ctx.planner, layout, settings.search.spare_hosts, ctx.inner_time_limit_s, ctx.backend).roles
    if again is not None:  # a re-plan: kept islands where and as they run, the others as moved
        roles, hosts = again.roles, [p.hosts for p in again.pieces]
    plan = build_plan(ctx.planner, layout, ctx.inner_time_limit_s, ctx.backend, inventory, roles, hosts)
    score = plan.rates.searched_req_s  # the gap compares the search's model with the reference's: the same one
    if ctx.planner.arrivals is not None and plan.rates.bursty_req_s is not None:  # trials scored under the bursts
        score = plan.rates.bursty_req_s
    if settings.search.objective == "rate_per_dollar":
        score = score / plan.cost_per_hour if plan.cost_per_hour > 0 else 0.0
    if settings.search.demand_req_s is not None:  # what the trials scored: the demand per $/h of their fleet
        score = demand_score(settings.search.demand_req_s, run.searched_fleet or plan.cost_per_hour)
    elif settings.search.spare_hosts:  # what the trials scored: the rate with the worst hosts lost, the search's model
        score = float(score_layout(ctx, layout)["score"])
    if again is not None:
        score = again.searched_req_s
    ref = run.ref
    reference_info = None
    if ref is not None:
        gap = run.gap(score) if settings.search.objective != "thesis" else _thesis_gap(run, plan)
        reference_info = Reference(
            optimum_req_s=ref.rate_req_s,
            rate_per_dollar=ref.rate_per_dollar,
            bound_req_s=None if ref.bound != ref.bound else ref.bound,
            gap=None if gap is None or gap != gap else gap,
            gap_is_bound=run.gap_is_bound,
            layout_ahead=_reference_ahead(run, settings, score),
            lost_hosts=ref.lost_hosts,
        )
    search = SearchInfo(
        objective=settings.search.objective,
        sampler=settings.search.sampler,
        generator=settings.search.generator,
        trials=len(run.records),
        failed=sum(r["status"] == "error" for r in run.records),
        rejected=sum(r["status"] == "rejected" for r in run.records),
        complete=complete,
        wall_s=wall_s,
        robust=settings.search.robust,
    )
    simulated = run.best.get("simulated_req_s") if settings.search.objective == "goodput" and run.best else None
    rates = dataclasses.replace(plan.rates, simulated_req_s=simulated)  # the goodput the search scored it with
    return dataclasses.replace(plan, rates=rates, search=search, reference=reference_info, notes=tuple(notes),
                               sizing=_sizing(run, settings))  # fmt: skip


def _sizing(run: SearchRun, settings: Settings) -> Sizing | None:
    """objective min_cost: the demand, and what the exact MILPs say of it (`run.sizing`)."""
    demand, found = settings.search.demand_req_s, run.sizing
    if demand is None:
        return None
    ok = ("optimal", "feasible")
    ref = found.cheapest if found is not None else None
    return Sizing(
        demand_req_s=demand,
        inventory_cost_per_hour=settings.inventory.cost_per_hour,
        most_req_s=found.most_req_s if found is not None and found.most.status in ok else None,
        cheapest_per_hour=None if ref is None or ref.status not in ok else
        ref.bound if ref.status == "feasible" else ref.cost_per_hour,
        cheapest_is_bound=ref is not None and ref.status == "feasible",
        mixes=tuple((k, r.cost_per_hour) for k, r in (found.mixes if found else {}).items() if r.status in ok),
        short_mixes=tuple(k for k, r in (found.mixes if found else {}).items() if r.status not in ok),
        searched_per_hour=run.searched_fleet,
        hosts_lost=settings.search.spare_hosts,
        reference_hosts_lost=int(found is not None and found.spare),
    )  # fmt: skip


def _replanned(settings: Settings, ctx: Context) -> Replanned:
    """The best plan within search.max_moves changed islands of the running plan (`pipeline.planning.replan`)."""
    inv, again = settings.inventory, settings.replan
    assert again is not None
    hosts = hosts_now(again.plan, inv.by_name, {g.name: g.node_gpus for g in inv.gpus}, again.lost_hosts)
    t0 = time.perf_counter()
    print(f"[search] re-plan: from {again.path}, at most {again.max_moves} islands changed ...", flush=True)
    found = replan(ctx.planner, again.plan, hosts, dict(ctx.space.min_island), again.max_moves,
                   time_limit_s=ctx.inner_time_limit_s, backend=ctx.backend, max_hosts=again.max_hosts)  # fmt: skip
    moves = "; ".join(found.moves) or "none (the running islands as they are)"
    print(f"[search] re-plan: {len(found.moves)} moves ({moves}), {found.hosts_relaunched} hosts re-launched: "
          f"{found.searched_req_s:.2f} req/s in the search's model ({time.perf_counter() - t0:.1f} s)", flush=True)
    return found


def _log_parent(
    run: SearchRun, settings: Settings, tracker: Tracker | Served, plan: Plan, complete: bool, wall_s: float
) -> None:
    ref = plan.reference
    metrics = {
        "best_rate_req_s": plan.rate_req_s,
        "best_rate_per_dollar": plan.rate_per_dollar,
        "output_tok_s": plan.rates.output_tok_s,
        "cost_per_hour": plan.cost_per_hour,
        "usd_per_m_output_tokens": plan.usd_per_m_output_tokens,
        "gap": ref.gap if ref is not None and ref.gap is not None else float("nan"),
        "reference_optimum_req_s": ref.optimum_req_s if ref is not None and ref.optimum_req_s else float("nan"),
        "wall_s": wall_s,
        "trials": float(len(run.records)),
        "fluid_req_s": plan.rates.fluid_req_s,
        "searched_req_s": plan.rates.searched_req_s,
    }
    if plan.rates.simulated_req_s is not None:
        metrics["goodput_req_s"] = plan.rates.simulated_req_s
    if plan.sizing is not None:  # objective min_cost: the demand and the exact cheapest fleet for it
        metrics["demand_req_s"] = plan.sizing.demand_req_s
        if plan.sizing.cheapest_per_hour is not None:
            metrics["cheapest_per_hour"] = plan.sizing.cheapest_per_hour
    if plan.extrapolated is not None:  # islands outside the measured serving the cost model was fitted on
        metrics["extrapolated_islands"] = float(len(plan.extrapolated))
    metrics.update(step_metrics(STEPS, plan))  # the post-search steps': the check's, the band's, ...
    metrics = {**Headline.of(plan).metrics, **metrics}  # the four numbers to plan with first
    tracker.finish_parent(metrics, [run.dir / f for f in FILES], status="FINISHED" if complete else "KILLED",
                          series={"best_so_far": best_so_far(run.records)})  # fmt: skip
    gap = ref.gap_text() if ref is not None else ""
    tracker.describe_parent(
        f"{plan.rate_req_s:.2f} req/s ({plan.rates.output_tok_s:.0f} output tok/s) at ${plan.cost_per_hour:,.0f}/h "
        f"on {settings.inventory.describe()}, workload {settings.workload_name}"
        + (f", {gap} to the exact optimum in the search's model" if gap else "")
        + f". {len(run.records)} trials ({_what(settings)}). Plan, report and trials are this run's artifacts; "
        f"run folder {run.dir}"
    )


def _summary(run: SearchRun, plan: Plan, sc: StepContext) -> None:
    """The plan in its closing console lines: its rate, what the post-search steps add, and how it relates to the
    search's model and the reference (a step that changed what the trials scored says so in its own words)."""
    v, sim = plan.verification, ""
    if v is not None and not v.sustained:  # the SLOs broke at the plan's rate
        sim = f" (the simulator sustains {v.sustained_req_s:.2f})" if v.sustained_req_s else \
            f" (none of the rates the simulator tried, down to {LOW:g} x stated, held)"  # fmt: skip
    if plan.sizing is not None:
        say(sizing_sentence(plan))
    print(f"[search] plan: {plan.rate_req_s:.2f} req/s" + (f" within {plan.slo.text()}" if plan.slo.any else "")
          + sim + f" (${plan.cost_per_hour:,.0f}/h); wrote {run.dir}/ (plan.json, report.md, routing.png, "
          "convergence.png, trials.parquet)", flush=True)  # fmt: skip
    for line in (line for s in STEPS for line in s.summary(plan, sc)):
        say(line)
    out = plan.extrapolated
    if out:
        gpus = ", ".join(sorted({isl.gpu for isl in out}))
        say(f"{len(out)} of {len(plan.serving)} serving islands ({gpus}) extrapolate beyond the measured serving the "
            "cost model was fitted on; the range spreads its error once more there (report.md: where the plan "
            "extrapolates)")
    ref = plan.reference
    gap = f", {ref.gap_text()} to the exact optimum there" if ref is not None and ref.gap is not None else ""
    scored = next((line for s in sorted(STEPS, key=lambda s: s.stage) if (line := s.scored(plan, sc))), None)
    if scored:
        say(scored)
    elif plan.rates.refined:
        say(f"the search's model scores this layout {plan.rates.searched_req_s:.2f} req/s{gap}; the plan's rate "
            "re-sets each island's load cap for the mix its routing gives it (report.md: two rates of one layout)")
    elif gap:
        say(gap.removeprefix(", "))
    if ref is not None and ref.points_ahead:
        say(f"the exact reference's own layout scores {ref.layout_ahead:.2%} more than the plan's in the same model: "
            "search.sampler=exact plans it (its islands are in reference.json)")
    say(" ".join(Headline.of(plan).sentences))  # the last line: the four numbers to plan with


def _no_plan(
    run: SearchRun, settings: Settings, tracker: Tracker | Served, complete: bool, wall_s: float,
    serves_nothing: bool = False,
) -> int:  # fmt: skip
    """No trial gave a usable layout, or the best one serves no requests (`serves_nothing`): say why and what to
    change; no plan.json is written and outputs/search/latest is left as it was."""
    counts: dict[str, int] = {}
    for r in run.records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    seen = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials"
    if serves_nothing:
        why, fix = _serves_nothing(settings, run)
    elif not complete:
        why, fix = "the search was interrupted before any trial finished", "run it again with search.resume=true"
    elif settings.mode == "exact":
        why = f"the exact MILP found no layout ({run.ref.status if run.ref else 'not solved'})"
        fix = "raise search.reference_time_limit_s"
    elif counts.get("short") and not any(counts.get(k) for k in ("optimal", "feasible")):
        most = max(r["rate_req_s"] for r in run.records if r["status"] == "short")
        lost = " with its worst host lost" if settings.search.spare_hosts else ""
        why = (f"no layout the search tried serves the demand of {settings.search.demand_req_s:g} req/s{lost} (the "
               f"most one served: {most:.2f})")  # fmt: skip
        fix = "raise search.iterations, or lower search.demand_req_s" + (
            " (or search.spare_hosts=0: with every host up)" if settings.search.spare_hosts else "")
    elif counts.get("time_limit"):
        why = "inner solves ran out of time"
        fix = f"raise search.inner_time_limit_s (now {run.ctx.inner_time_limit_s:g})"
    elif counts.get("rejected"):
        why, fix = "every proposal broke the inventory", "set search.on_violation=repair or lower search.k_slots"
    else:
        why, fix = "no trial produced a layout that serves requests", "check the failed trials' notes in trials.jsonl"
    tracker.finish_parent({"trials": float(len(run.records)), "wall_s": wall_s},
                          [run.dir / "trials.parquet", run.dir / "convergence.png"], status="FAILED")  # fmt: skip
    print(f"error: no plan: {why} ({seen}); {fix}. Trials are kept in {run.dir}/trials.jsonl", file=sys.stderr,
          flush=True)  # fmt: skip
    _unlogged_warning(run)
    return cli.INTERRUPTED if not complete else NO_PLAN


def _out_of_time(run: SearchRun) -> int:
    """The trials that ran out of search.inner_time_limit_s without a solution: layouts the search could not score."""
    return sum(r["status"] == "time_limit" for r in run.records)


def _nothing_survives(run: SearchRun, settings: Settings) -> bool:
    """Whether a search that scored each layout by its rate with its worst `search.spare_hosts` hosts lost scored
    every one 0 req/s: its best layout's roles are then any (none keeps anything), and no plan is made of them."""
    o = settings.search
    if not o.spare_hosts or settings.mode != "search" or run.replanned is not None or \
            run.ctx.demand_req_s is not None or o.objective not in ("max_rate", "rate_per_dollar"):  # fmt: skip
        return False
    scores = [r["score"] for r in run.records if r["status"] in OK]
    return bool(scores) and max(scores) <= 0.0


def _serves_nothing(settings: Settings, run: SearchRun) -> tuple[str, str]:
    """(why, what to change) where the best layout the search found serves no requests."""
    o, budget, ref = settings.search, run.ctx.planner.budget_per_hour, run.ref
    # the exact reference proved that nothing serves with every host up either: not the hosts lost
    up = ref is not None and not ref.lost_hosts and ref.status == "optimal" and ref.rate_req_s <= 0
    if o.spare_hosts and not up:
        out_of_time = _out_of_time(run)
        return (f"every layout scored 0 req/s with its worst {o.spare_hosts} hosts lost", "lower search.spare_hosts"
                + (f", or raise search.inner_time_limit_s ({out_of_time} trials ran out of it)" if out_of_time else ""))
    if settings.replan is not None:
        return ("the re-plan's best islands serve nothing", "raise search.max_moves, or re-plan from scratch (drop "
                "search.from_plan)" + (" or raise search.budget_per_hour" if budget is not None else ""))
    if budget is not None:
        return (f"no layout within ${budget:,.0f}/h serves requests", "raise search.budget_per_hour")
    return ("the best layout serves no requests" + (" even with every host up (the exact optimum is 0 req/s)" if up
            else "") + " (no island runs the model in a role within the SLOs)",
            "relax the SLOs (slo.ttft_ms, slo.tpot_ms), add GPUs, or see what one island can do: python -m "
            "pipeline.island gpu=<GPU> size=<N>")


def _unlogged_warning(run: SearchRun) -> None:
    if run.unlogged and not run.log_trials():
        trials = ", ".join(str(r["trial"]) for r in run.unlogged[:10]) + (" ..." if len(run.unlogged) > 10 else "")
        print(f"[search] warning: MLflow did not take {len(run.unlogged)} trial(s) (trials {trials}); they are in "
              "trials.jsonl, and search.resume=true logs them", file=sys.stderr, flush=True)  # fmt: skip


def _reference_ahead(run: SearchRun, settings: Settings, score: float) -> float | None:
    """How much more the exact reference's own layout scores than the plan's (0.0035: 0.35 % more), where a
    search planned and the reference solves the search's model (max_rate, rate_per_dollar); else None.

    Cut short by its time limit the reference still has a layout (solvers/exact.py), at thousands of GPUs
    often a better one than the search's."""
    if run.ref is None or settings.mode == "exact" or score <= 0 or settings.search.spare_hosts:
        return None  # (with hosts lost the reference's layout is not scored: its rate with all up is a bound)
    if settings.search.objective not in ("max_rate", "rate_per_dollar"):
        return None
    ref = run.ref.rate_per_dollar if settings.search.objective == "rate_per_dollar" else run.ref.rate_req_s
    return ref / score - 1.0


def _thesis_gap(run: SearchRun, plan: Plan) -> float | None:
    """For the thesis objective: the best layout's max_rate Λ against the exact optimum of that model."""
    if run.ref is None or run.ref.rate_req_s <= 0:
        return None
    return 1.0 - plan.rates.searched_req_s / run.ref.rate_req_s


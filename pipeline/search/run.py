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
import os
import sys
import time
from pathlib import Path
from typing import Any

from pipeline import cli
from pipeline.errors import ConfigError, RecordsError
from pipeline.planning.build import build_plan
from pipeline.planning.check import LOW
from pipeline.planning.failures import spare_solve
from pipeline.planning.planner import Layout
from pipeline.planning.replan import Replanned, hosts_now, replan
from pipeline.records.journal import link_latest, read_json, write_json, write_text
from pipeline.records.progress import Progress
from pipeline.records.report import best_so_far, convergence_plot, report, routing_plot, write_trials
from pipeline.records.tracking import Served, Tracker, open_tracker
from pipeline.search.reference import ESTIMATE_ABOVE, exact_layout, reference, reference_cost
from pipeline.search.samplers import require_extras
from pipeline.search.settings import Settings, context, idle_types, inventory_of, read_settings, recorded
from pipeline.search.steps import STEPS, StepContext
from pipeline.search.steps.runner import run_steps, say, step_metrics
from pipeline.search.trial import Context, TrialFn, run_trial, score_layout
from pipeline.search.trials import SearchRun
from pipeline.search.tune.driver import check_ray_address, run_tune, with_ray
from plan import InventoryInfo, Plan, Reference, SearchInfo, to_json
from solvers.exact import ExactResult

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
FILES = ("plan.json", "report.md", "convergence.png", "routing.png", "trials.parquet", "reference.json")


def execute(cfg: Any, trial_fn: TrialFn = run_trial) -> int:
    """Run the search `cfg` describes; returns the exit code (0 done, 1 no plan, 130 interrupted)."""
    settings = read_settings(cfg, *inventory_of(cfg))  # every value checked; nothing benchmarked yet
    if settings.planner == "search":
        require_extras(settings.sampler)  # an optional extra missing: say so now
    check_ray_address(settings.ray_address)
    # a bad store: now; MLflow itself opens it beside the work below
    tracker = open_tracker(settings.mlflow_uri, settings.mlflow_experiment, EXPERIMENT_NOTE, COLUMNS)
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
        f"{settings.objective}; minimum island " + ", ".join(f"{g} {n}" for g, n in ctx.space.min_island)
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
    try:
        write_json(run.dir / "config.json", recorded(settings, ctx))
        run.ref = _reference(run, settings, ctx)
        state_path = run.dir / "state.json"
        state = read_json(state_path, "a new MLflow parent run records the search") or {}
        resumed_parent = state.get("parent_run_id")
        note = (f"Search: {settings.inventory.describe()}, workload {settings.workload_name}, {what}, objective "
                f"{settings.objective}. Children: one run per trial (layout_id, status, rates). "
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


def available_memory() -> float:
    """Bytes of memory this machine has free for new work (MemAvailable; the total where that is not known)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


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
    if settings.planner == "exact":
        return "the exact MILP plans the layout (no trials)"
    if settings.planner == "replan":
        lost = f", hosts lost {', '.join(f'{g}:{n}' for g, n in settings.lost_hosts)}" if settings.lost_hosts else ""
        hosts = f" and {settings.max_hosts} hosts" if settings.max_hosts is not None else ""
        return (f"re-plan of {settings.from_plan_path} within {settings.max_moves} changed islands{hosts}{lost} "
                "(no trials)")  # fmt: skip
    polish = f" (the last {round(settings.polish * settings.trials)} polish the best)" if settings.polish else ""
    return (f"{settings.generator} layouts, sampler {settings.sampler}, {settings.iterations} x {settings.batch} "
            f"trials{polish}")  # fmt: skip


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
        + (", robust: 10th percentile" if settings.robust else ""),
        "generator": settings.generator,
        "sampler": settings.sampler,
        "objective": settings.objective,
        "iterations": settings.iterations,
        "batch": settings.batch,
        "seed": settings.seed,
        "run_dir": str(run.dir),
        **{f"search.{k}": v for k, v in settings.config["search"].items() if k not in shown},
    }


BURSTY = " under the workload's own arrivals (search.arrivals=workload; its Poisson rate is stated beside it)"


def _reference(run: SearchRun, settings: Settings, ctx: Context) -> ExactResult | None:
    """The exact reference: reference.json of a resumed run, else solved now (when the search has one)."""
    path = run.dir / "reference.json"
    saved = read_json(path, "the exact reference (it is solved again)")
    if saved is not None:
        try:
            return ExactResult(**{**saved, "islands": tuple(tuple(t) for t in saved["islands"])})
        except (TypeError, KeyError) as err:
            print(f"[search] warning: {path} is not a reference this version wrote ({err}): solving it again",
                  file=sys.stderr, flush=True)  # fmt: skip
    if not (settings.reference or settings.planner in ("exact", "replan")):  # a re-plan is judged against it
        return None
    if sum(len(ctx.space.sizes(g.name)) for g in settings.inventory.gpus) > ESTIMATE_ABOVE:
        cost = reference_cost(settings, ctx, ctx.planner)
        free = available_memory()
        print(f"[search] {settings.inventory.total_gpus:,} GPUs: {cost.describe()} ({free / 1e9:,.1f} GB free)",
              flush=True)  # fmt: skip
        if cost.bytes > 0.8 * free:
            raise ConfigError(f"{cost.describe()}, more than the {free / 1e9:,.1f} GB this machine has free: set "
                              "search.reference=false (the search alone, without a gap), raise search.min_island, "
                              "or plan on a machine with more memory")  # fmt: skip
    limit = settings.reference_time_limit_s
    print(f"[search] solving the exact reference MILP (at most {limit:g} s; Ctrl-C stops the search) ...", flush=True)
    bar = Progress("search", "exact reference MILP", limit, "s", every_s=15.0)
    ref = reference(settings, ctx, ctx.planner, tick=lambda: bar.update(
        bar.elapsed, f"exact reference: {bar.elapsed:.0f} s of at most {limit:g} s"))  # fmt: skip
    bar.close()
    run.ref = ref
    if settings.spare_hosts:
        bound = ref.bound if ref.status == "feasible" else ref.rate_req_s
        print(f"[search] exact optimum {bound:.2f} req/s with every host up ({ref.status}, "
              f"{ref.solve_ms / 1e3:.1f} s): no layout keeps more with {settings.spare_hosts} host"
              f"{'s' if settings.spare_hosts > 1 else ''} lost, so gaps below are against this bound", flush=True)
    elif ref.status == "feasible" and settings.objective == "max_rate":  # stopped by its time limit with a layout
        print(f"[search] exact reference stopped at its time limit ({ref.solve_ms / 1e3:.1f} s): the optimum is "
              f"between {ref.rate_req_s:.2f} and {ref.bound:.2f} req/s in the search's model; gaps below are against "
              "the upper end (raise search.reference_time_limit_s to close it)", flush=True)  # fmt: skip
    else:
        print(f"[search] exact optimum {ref.rate_req_s:.2f} req/s at ${ref.cost_per_hour:,.0f}/h ({ref.status}, "
              f"{ref.solve_ms / 1e3:.1f} s) in the search's model: each island kept at the load whose queue meets the "
              f"SLOs for the whole workload's mix{BURSTY if ctx.planner.arrivals is not None else ''}",
              flush=True)  # fmt: skip
    write_json(path, {**ref.__dict__, "islands": [list(t) for t in ref.islands]})
    return ref


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
    plan = _plan(run, settings, ctx, best_layout, complete, wall_s, notes)
    poisson = dataclasses.replace(ctx, planner=ctx.planner.poisson(), key=f"{ctx.key}:poisson")  # the plan's rates
    sc = StepContext(settings, ctx, poisson, best_layout, run)
    plan = run_steps(STEPS, plan, sc)
    _records(run, settings, plan, df)
    _log_parent(run, settings, tracker, plan, complete, wall_s)
    link_latest(settings.run_root.parent, run.dir)  # outputs/search/latest: the newest finished plan
    _summary(run, plan, sc)
    _unlogged_warning(run)
    if not complete:
        print(f"[search] interrupted after {len(run.records)}/{settings.trials} trials; finished trials are kept. "
              "Continue with the same command plus search.resume=true", file=sys.stderr, flush=True)  # fmt: skip
        return cli.INTERRUPTED
    return 0


def _layout(
    run: SearchRun, settings: Settings, ctx: Context, trial_fn: TrialFn, tracker: Tracker | Served
) -> tuple[Layout | None, bool]:
    """(the best layout, whether the search finished): the exact MILP's, a re-plan's, or the trials' best."""
    if settings.planner == "exact":
        assert run.ref is not None
        return exact_layout(run.ref), True
    if settings.planner == "replan":
        run.replanned = _replanned(settings, ctx)
        return (run.replanned.layout if run.replanned.pieces else None), True
    tracker.ready()  # a store MLflow cannot open: said before the trials, not after them
    complete = with_ray(settings.ray_address, settings.ray_num_cpus, lambda: run_tune(run, trial_fn))
    run.progress(force=True)
    return (Layout.of(ctx.space.layout(run.best["params"])) if run.best else None), complete


def _records(run: SearchRun, settings: Settings, plan: Plan, df: Any) -> None:
    """plan.json, routing.png and report.md (the post-search steps' rows and sections in it)."""
    write_json(run.dir / "plan.json", to_json(plan))
    routing_plot(run.dir / "routing.png", plan, f"{settings.inventory.name}, {settings.workload_name}: routing")
    header = (f"# Search: {run.dir.parent.name}\n\n{settings.inventory.describe()}; workload {settings.workload_name}; "
              f"model {plan.model.name}, cost profile {plan.profile_name}; {settings.generator} + {settings.sampler}, "
              f"objective {settings.objective}")  # fmt: skip
    png = "routing.png" if (run.dir / "routing.png").exists() else None
    write_text(run.dir / "report.md", report(plan, df, header, png, STEPS))


def _convergence(run: SearchRun, settings: Settings) -> None:
    unit = "req/s per $/h" if settings.objective == "rate_per_dollar" else "req/s"
    line = None
    if run.ref is not None and settings.objective != "thesis":
        line = run.ref.bound if run.gap_is_bound else (
            run.ref.rate_per_dollar if settings.objective == "rate_per_dollar" else run.ref.rate_req_s)  # fmt: skip
    convergence_plot(run.dir / "convergence.png", run.records, settings.batch, line, unit,
                     f"{settings.inventory.name}, {settings.workload_name}: {settings.sampler} ({settings.generator})",
                     run.polish_from, run.gap_is_bound)  # fmt: skip


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
    if settings.spare_hosts:  # the roles that keep the most with the worst hosts lost, as the trials scored them
        roles = spare_solve(ctx.planner, layout, settings.spare_hosts, ctx.inner_time_limit_s, ctx.backend).roles
    if again is not None:  # a re-plan: kept islands where and as they run, the others as moved
        roles, hosts = again.roles, [p.hosts for p in again.pieces]
    plan = build_plan(ctx.planner, layout, ctx.inner_time_limit_s, ctx.backend, inventory, roles, hosts)
    score = plan.rates.searched_req_s  # the gap compares the search's model with the reference's: the same one
    if ctx.planner.arrivals is not None and plan.rates.bursty_req_s is not None:  # trials scored under the bursts
        score = plan.rates.bursty_req_s
    if settings.objective == "rate_per_dollar":
        score = score / plan.cost_per_hour if plan.cost_per_hour > 0 else 0.0
    if settings.spare_hosts:  # what the trials scored: the rate with the worst hosts lost, in the search's model
        score = float(score_layout(ctx, layout)["score"])
    if again is not None:
        score = again.searched_req_s
    ref = run.ref
    reference_info = None
    if ref is not None:
        gap = run.gap(score) if settings.objective != "thesis" else _thesis_gap(run, plan)
        reference_info = Reference(
            optimum_req_s=ref.rate_req_s,
            rate_per_dollar=ref.rate_per_dollar,
            bound_req_s=None if ref.bound != ref.bound else ref.bound,
            gap=None if gap is None or gap != gap else gap,
            gap_is_bound=run.gap_is_bound,
            layout_ahead=_reference_ahead(run, settings, score),
        )
    search = SearchInfo(
        objective=settings.objective,
        sampler=settings.sampler,
        generator=settings.generator,
        trials=len(run.records),
        failed=sum(r["status"] == "error" for r in run.records),
        rejected=sum(r["status"] == "rejected" for r in run.records),
        complete=complete,
        wall_s=wall_s,
        robust=settings.robust,
    )
    simulated = run.best.get("simulated_req_s") if settings.objective == "goodput" and run.best else None
    rates = dataclasses.replace(plan.rates, simulated_req_s=simulated)  # the goodput the search scored it with
    return dataclasses.replace(plan, rates=rates, search=search, reference=reference_info, notes=tuple(notes))


def _replanned(settings: Settings, ctx: Context) -> Replanned:
    """The best plan within search.max_moves changed islands of the running plan (`pipeline.planning.replan`)."""
    inv = settings.inventory
    counts = inv.by_name
    node_gpus = {g.name: g.node_gpus for g in inv.gpus}
    hosts = hosts_now(settings.from_plan, counts, node_gpus, settings.lost_hosts)
    t0 = time.perf_counter()
    print(f"[search] re-plan: from {settings.from_plan_path}, at most {settings.max_moves} islands changed ...",
          flush=True)  # fmt: skip
    found = replan(ctx.planner, settings.from_plan, hosts, dict(ctx.space.min_island), settings.max_moves,
                   ctx.inner_time_limit_s, ctx.backend, settings.max_hosts)  # fmt: skip
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
    metrics.update(step_metrics(STEPS, plan))  # the post-search steps': the check's, the band's, ...
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
    print(f"[search] plan: {plan.rate_req_s:.2f} req/s" + (f" within {plan.slo.text()}" if plan.slo.any else "")
          + sim + f" (${plan.cost_per_hour:,.0f}/h); wrote {run.dir}/ (plan.json, report.md, routing.png, "
          "convergence.png, trials.parquet)", flush=True)  # fmt: skip
    for line in (line for s in STEPS for line in s.summary(plan, sc)):
        say(line)
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


def _no_plan(run: SearchRun, settings: Settings, tracker: Tracker | Served, complete: bool, wall_s: float) -> int:
    """No trial gave a usable layout: say why and what to change; no plan.json is written."""
    counts: dict[str, int] = {}
    for r in run.records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    seen = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials"
    if not complete:
        why, fix = "the search was interrupted before any trial finished", "run it again with search.resume=true"
    elif settings.planner == "exact":
        why = f"the exact MILP found no layout ({run.ref.status if run.ref else 'not solved'})"
        fix = "raise search.reference_time_limit_s"
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
    if run.ref is None or settings.planner == "exact" or score <= 0 or settings.spare_hosts:
        return None  # (with hosts lost the reference's layout is not scored: its rate with all up is a bound)
    if settings.objective not in ("max_rate", "rate_per_dollar"):
        return None
    ref = run.ref.rate_per_dollar if settings.objective == "rate_per_dollar" else run.ref.rate_req_s
    return ref / score - 1.0


def _thesis_gap(run: SearchRun, plan: Plan) -> float | None:
    """For the thesis objective: the best layout's max_rate Λ against the exact optimum of that model."""
    if run.ref is None or run.ref.rate_req_s <= 0:
        return None
    return 1.0 - plan.rates.searched_req_s / run.ref.rate_req_s


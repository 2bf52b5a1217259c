"""The search: island layouts proposed by an Optuna sampler, run as Ray Tune trials, solved exactly inside.

    python -m pipeline.search                                   # hetero_a, Azure code, divider + TPE
    python -m pipeline.search +inventory=hetero_b search.sampler=gp workload=azure_conv
    python -m pipeline.search search=direct search.k_slots=8
    python -m pipeline.search search.sampler=exact              # the exact MILP as the planner
    python -m pipeline.search search.resume=true                # continue the last interrupted run
    python -m pipeline.search -m +inventory=divider_bench search.skew_range=1,3,5 search.min_island=1,2,4

Each run writes `outputs/search/<inventory>-<workload>-<generator>-<sampler>-<objective>-<hash>/<time>/`:
plan.json, trials.parquet, trials.jsonl (the journal a resume reads), convergence.png,
report.md, reference.json; and one MLflow parent run with a child per trial.

This module is the entry point only: settings (`pipeline.settings`), trial scoring
(`pipeline.trial`), samplers (`pipeline.samplers`), the exact reference (`pipeline.reference`),
the Ray Tune driver and journal (`pipeline.tune_driver`, `pipeline.journal`), outputs
(`pipeline.outputs`), MLflow (`pipeline.tracking`) and the CLI contract (`pipeline.cli`).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from pipeline import cli
from pipeline.journal import link_latest, write_json, write_text
from pipeline.outputs import (
    REFERENCE_AHEAD,
    best_so_far,
    build_plan,
    convergence_plot,
    report,
    routing_plot,
    usd_per_m_tokens,
    write_trials,
)
from pipeline.planner import Layout
from pipeline.progress import Progress
from pipeline.reference import exact_layout, reference
from pipeline.samplers import make_sampler
from pipeline.settings import idle_types, inventory_of, settings_from_cfg
from pipeline.tracking import Tracker
from pipeline.trial import Context, run_trial
from pipeline.tune_driver import SearchRun, TrialFn, check_ray_address, with_ray
from solvers.exact import ExactResult

NO_PLAN = 1  # exit code of a search that finished without a usable layout


EXPERIMENT_NOTE = (
    "Archipelago searches. Each parent run is one search (`python -m pipeline.search`): its parameters are the "
    "inventory, workload and search settings; its metrics the plan's rate (best_rate_req_s, within the SLOs), "
    "output_tok_s, cost_per_hour, usd_per_m_output_tokens, the gap to the exact optimum and best_so_far per trial "
    "(a chart of it is the convergence); its artifacts plan.json, report.md, convergence.png and trials.parquet. "
    "Its child runs are the trials: layout_id (the islands in full are the `islands` tag), status and rates."
)


# the runs table's columns (pipeline/tracking.py VIEW_KEY): the parent's plan and each trial's result
COLUMNS = ("metrics.best_rate_req_s", "metrics.gap", "metrics.output_tok_s", "metrics.usd_per_m_output_tokens",
           "metrics.score", "metrics.rate_req_s", "params.inventory", "params.workload", "params.sampler",
           "params.layout_id", "params.status")  # fmt: skip


def execute(cfg: Any, trial_fn: TrialFn = run_trial) -> int:
    """Run the search `cfg` describes; returns the exit code (0 done, 1 no plan, 130 interrupted)."""
    settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    if settings.planner == "search":
        make_sampler(settings.sampler, settings.seed, ctx.space)  # an optional extra missing: say so now
    check_ray_address(settings.ray_address)
    tracker = Tracker(settings.mlflow_uri, settings.mlflow_experiment, EXPERIMENT_NOTE, COLUMNS)  # bad store: now
    run = SearchRun(settings, ctx, tracker)
    planner = ctx.planner
    what = _what(settings)
    print(
        f"[search] {settings.inventory.describe()}; workload {settings.workload_name}; {what}, objective "
        f"{settings.objective}; minimum island "
        + ", ".join(f"{g} {n}" for g, n in ctx.space.min_island)
        + f"\n[search] run folder {run.dir}"
        + (f"\n[search] resuming: {run.resumed} trials already done" if run.resumed else ""),
        flush=True,
    )
    idle = idle_types(planner, settings.inventory)
    notes = [
        f"no island of {g} (not even all {settings.inventory.count(g)} of them) can hold {planner.model.name}: "
        f"those GPUs stay idle in every plan"
        for g in idle
    ]
    for note in notes:
        print(f"[search] warning: {note}", flush=True)
    ref_path = run.dir / "reference.json"
    if ref_path.exists():
        saved = json.loads(ref_path.read_text())
        run.ref = ExactResult(**{**saved, "islands": tuple(tuple(t) for t in saved["islands"])})
    elif settings.reference or settings.planner == "exact":
        limit = settings.reference_time_limit_s
        print(f"[search] solving the exact reference MILP (at most {limit:g} s; Ctrl-C stops the search) ...",
              flush=True)  # fmt: skip
        bar = Progress("search", "exact reference MILP", limit, "s", every_s=15.0)
        run.ref = reference(settings, ctx, planner,
                            tick=lambda: bar.update(bar.elapsed, f"exact reference: {bar.elapsed:.0f} s of at most "
                                                                 f"{limit:g} s"))  # fmt: skip
        bar.close()
        r = run.ref
        if run.gap_is_bound:  # stopped by its time limit with a layout: the optimum lies between the two
            print(f"[search] exact reference stopped at its time limit ({r.solve_ms / 1e3:.1f} s): the optimum is "
                  f"between {r.rate_req_s:.2f} and {r.bound:.2f} req/s; gaps below are against the upper end "
                  "(raise search.reference_time_limit_s to close it)", flush=True)  # fmt: skip
        else:
            print(f"[search] exact optimum {r.rate_req_s:.2f} req/s at ${r.cost_per_hour:,.0f}/h "
                  f"({r.status}, {r.solve_ms / 1e3:.1f} s)", flush=True)  # fmt: skip
        write_json(ref_path, {**run.ref.__dict__, "islands": [list(t) for t in run.ref.islands]})
    state_path = run.dir / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    params = {
        "inventory": settings.inventory.describe(),
        "workload": settings.workload_name,
        "model": planner.model.name,
        "cost_profile": planner.profile.name,
        "calibration": "none"
        if settings.calibration is None
        else f"{settings.calibration.name} ({settings.calibration.source or 'fitted'})"
        + (", robust: 10th percentile" if settings.robust else ""),
        "generator": settings.generator,
        "sampler": settings.sampler,
        "objective": settings.objective,
        "iterations": settings.iterations,
        "batch": settings.batch,
        "seed": settings.seed,
        "run_dir": str(run.dir),
        # the rest of the search settings, each once (the ones above by their short name)
        **{f"search.{k}": v for k, v in settings.config["search"].items()
           if k not in ("resume", "generator", "sampler", "objective", "iterations", "batch", "seed")},
    }  # fmt: skip
    resumed_parent = state.get("parent_run_id")
    note = (f"Search: {settings.inventory.describe()}, workload {settings.workload_name}, {what}, objective "
            f"{settings.objective}. Children: one run per trial (layout_id, status, rates). "
            f"Run folder: {run.dir}")  # fmt: skip
    state["parent_run_id"] = tracker.start_parent(run.dir.parent.name, params, resumed_parent, note)
    write_json(state_path, state)
    write_json(run.dir / "config.json", settings.config)
    try:
        return _finish(run, cfg, settings, ctx, trial_fn, tracker, resumed_parent is not None, notes)
    except KeyboardInterrupt:
        tracker.end_parent("KILLED")
        raise
    except BaseException:
        tracker.end_parent("FAILED")
        raise


def _what(settings: Any) -> str:
    """How the layout is found, in the banner's words."""
    if settings.planner == "exact":
        return "the exact MILP plans the layout (no trials)"
    polish = f" (the last {round(settings.polish * settings.trials)} polish the best)" if settings.polish else ""
    return (f"{settings.generator} layouts, sampler {settings.sampler}, {settings.iterations} x {settings.batch} "
            f"trials{polish}")  # fmt: skip


def _finish(
    run: SearchRun,
    cfg: Any,
    settings: Any,
    ctx: Context,
    trial_fn: TrialFn,
    tracker: Tracker,
    resumed: bool,
    notes: list[str],
) -> int:
    """The trials, the plan and its outputs, once the parent MLflow run is open."""
    planner = ctx.planner
    if resumed:
        run.reconcile(tracker.child_names())
        run.log_trials()
    t_start = time.perf_counter()
    complete = True
    if settings.planner == "exact":
        assert run.ref is not None
        best_layout = exact_layout(run.ref)
    else:
        complete = with_ray(settings, lambda: run.run_tune(trial_fn))
        run.progress(force=True)
        best_layout = Layout.of(ctx.space.layout(run.best["params"])) if run.best else None
    wall_s = time.perf_counter() - t_start
    run.log_trials()

    df = write_trials(run.dir / "trials.parquet", run.records)
    unit = "req/s per $/h" if settings.objective == "rate_per_dollar" else "req/s"
    ref_score = None
    if run.ref is not None:
        ref_score = run.ref.rate_per_dollar if settings.objective == "rate_per_dollar" else run.ref.rate_req_s
    convergence_plot(
        run.dir / "convergence.png",
        run.records,
        settings.batch,
        (run.ref.bound if run.gap_is_bound else ref_score) if settings.objective != "thesis" else None,
        unit,
        f"{settings.inventory.name}, {settings.workload_name}: {settings.sampler} ({settings.generator})",
        run.polish_from,
        run.gap_is_bound,
    )
    if best_layout is None:
        return _no_plan(run, settings, tracker, complete, wall_s)
    plan = build_plan(planner, best_layout, ctx.inner_time_limit_s, ctx.backend)
    score = plan["searched_req_s"]  # the gap compares the search's model with the reference's: the same one
    if settings.objective == "rate_per_dollar":
        score = score / plan["cost_per_hour"] if plan["cost_per_hour"] > 0 else 0.0
    plan.update(
        {
            "objective": settings.objective,
            "reference_optimum_req_s": None if run.ref is None else run.ref.rate_req_s,
            "reference_rate_per_dollar": None if run.ref is None else run.ref.rate_per_dollar,
            "gap": run.gap(score) if settings.objective != "thesis" else _thesis_gap(run, plan),
            "gap_is_bound": run.gap_is_bound,  # the reference stopped at its time limit: gap <= this
            "reference_layout_ahead": _reference_ahead(run, settings, score),
            "reference_bound_req_s": None if run.ref is None or run.ref.bound != run.ref.bound else run.ref.bound,
            "workload": settings.workload_name,
            "inventory": {
                "name": settings.inventory.name,
                "gpus": {g.name: n for g, n in zip(settings.inventory.gpus, settings.inventory.counts, strict=True)},
                "cost_per_hour": settings.inventory.cost_per_hour,
            },
            "model": planner.model.name,
            "cost_profile": planner.profile.name,
            "sampler": settings.sampler,
            "generator": settings.generator,
            "trials": len(run.records),
            "failed": sum(r["status"] == "error" for r in run.records),
            "rejected": sum(r["status"] == "rejected" for r in run.records),
            "complete": complete,
            "wall_s": wall_s,
            "notes": notes,
        }
    )
    if settings.objective == "goodput" and run.best is not None:
        plan["simulated_req_s"] = run.best.get("simulated_req_s")  # the goodput the search scored it with
    plan["robust"] = settings.robust
    plan["band"] = None
    if settings.calibration is not None and settings.calibration.uncertain and settings.band_draws:
        from pipeline.band import rate_band

        t0 = time.perf_counter()
        print(f"[search] rate band: the best layout under {settings.band_draws} draws of calibration "
              f"{settings.calibration.name} ...", flush=True)  # fmt: skip
        plan["band"] = rate_band(planner, best_layout, plan["rate_req_s"], plan["searched_req_s"],
                                 settings.calibration, settings.band_draws, ctx.inner_time_limit_s, ctx.backend,
                                 settings.seed)  # fmt: skip
        if plan["band"]:
            b = plan["band"]
            print(f"[search] rate band: {b['p10_req_s']:.1f} - {b['p90_req_s']:.1f} req/s (10th-90th percentile; "
                  f"{time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip
    write_json(run.dir / "plan.json", plan)
    if settings.verify and plan["rate_req_s"] > 0:
        _verify(run, plan, cfg, settings)
    elif settings.verify:
        print("[search] warning: the best layout serves no requests (no island can run the model in one role): "
              "nothing to simulate; see report.md's islands", file=sys.stderr, flush=True)  # fmt: skip
    routing_plot(run.dir / "routing.png", plan, f"{settings.inventory.name}, {settings.workload_name}: routing")
    write_text(
        run.dir / "report.md",
        report(
            plan,
            df,
            f"# Search: {run.dir.parent.name}\n\n{settings.inventory.describe()}; workload "
            f"{settings.workload_name}; model {planner.model.name}, cost profile {planner.profile.name}; "
            f"{settings.generator} + {settings.sampler}, objective {settings.objective}",
            "routing.png" if (run.dir / "routing.png").exists() else None,
        ),
    )
    tracker.finish_parent(
        {
            "best_rate_req_s": plan.get("rate_req_s", 0.0),
            "best_rate_per_dollar": plan.get("rate_per_dollar", 0.0),
            "output_tok_s": plan.get("output_tok_s", 0.0),
            "cost_per_hour": plan.get("cost_per_hour", 0.0),
            "usd_per_m_output_tokens": usd_per_m_tokens(plan),
            "gap": plan["gap"] if plan["gap"] is not None else float("nan"),
            "reference_optimum_req_s": plan["reference_optimum_req_s"] or float("nan"),
            "wall_s": wall_s,
            "trials": float(len(run.records)),
            "fluid_req_s": plan["fluid_req_s"],
            "searched_req_s": plan["searched_req_s"],
            **({f"band_{k}": v for k, v in plan["band"].items() if k.endswith("_req_s")} if plan.get("band") else {}),
            **({"goodput_req_s": float(plan["simulated_req_s"])} if plan.get("simulated_req_s") is not None else {}),
            **{
                f"simulated_{k}": float(v)
                for k, v in plan.get("verification", {}).items()
                if isinstance(v, (int, float))  # `sustained` logs as 1 or 0
            },
        },
        [
            run.dir / f
            for f in ("plan.json", "report.md", "convergence.png", "routing.png", "trials.parquet", "reference.json")
        ],
        status="FINISHED" if complete else "KILLED",
        series={"best_so_far": best_so_far(run.records)},
    )
    gap = plan["gap"]
    tracker.describe_parent(
        f"{plan['rate_req_s']:.2f} req/s ({plan['output_tok_s']:.0f} output tok/s) at ${plan['cost_per_hour']:,.0f}/h "
        f"on {settings.inventory.describe()}, workload {settings.workload_name}"
        + (f", {run.gap_text(gap)} to the exact optimum" if gap is not None and gap == gap else "")
        + f". {len(run.records)} trials ({_what(settings)}). Plan, report and trials are this run's artifacts; "
        f"run folder {run.dir}"
    )
    link_latest(settings.run_root.parent, run.dir)  # outputs/search/latest: the newest finished plan
    refined = plan["searched_req_s"] != plan["rate_req_s"]
    v, sim = plan.get("verification") or {}, ""
    if not v.get("sustained", True) and "sustained_req_s" in v:  # the SLOs broke at the plan's rate
        low = v["sustained_req_s"]
        sim = f" (the simulator sustains {low:.2f})" if low else " (the simulator sustains under half of it)"
    print(
        f"[search] plan: {plan.get('rate_req_s', 0.0):.2f} req/s"
        + (" within the SLOs" if planner.cost.slo else "")
        + sim
        + f" (${plan.get('cost_per_hour', 0.0):,.0f}/h)"
        + (f"; scored {plan['searched_req_s']:.2f} in the search's model (whole-mix caps)" if refined else "")
        + (f", {run.gap_text(gap)} to the exact optimum" if gap is not None and gap == gap else "")
        + f"; wrote {run.dir}/ (plan.json, report.md, routing.png, convergence.png, trials.parquet)",
        flush=True,
    )
    ahead = plan["reference_layout_ahead"]
    if ahead is not None and ahead > REFERENCE_AHEAD:
        print(f"[search] the exact reference's own layout scores {ahead:.2%} more than the plan's in the same model: "
              "search.sampler=exact plans it (its islands are in reference.json)", flush=True)  # fmt: skip
    _unlogged_warning(run)
    if not complete:
        print(
            f"[search] interrupted after {len(run.records)}/{settings.trials} trials; finished trials are kept. "
            "Continue with the same command plus search.resume=true",
            file=sys.stderr,
            flush=True,
        )
        return cli.INTERRUPTED
    return 0


def _verify(run: SearchRun, plan: dict[str, Any], cfg: Any, settings: Any) -> None:
    """Simulate the plan at its stated rate; plan.json gets the result, the console a line, and where the
    SLOs break the rate the simulator sustains (a warning when that is more than 5 % below the stated
    rate, or the throughput is more than 5 % off)."""
    from pipeline.simulate import VERIFY_LOW, verify

    print(f"[search] simulating the plan at its stated {plan['rate_req_s']:.1f} req/s ...", flush=True)
    v = verify(plan, run.dir / "plan.json", cfg, settings.workload_name)
    plan["verification"] = v
    write_json(run.dir / "plan.json", plan)
    print(
        f"[search] simulated: {v['throughput_req_s']:.1f} req/s = {v['simulated_over_stated']:.3f} x stated; TTFT p50 "
        f"{v['ttft_ms_p50']:.0f} / p99 {v['ttft_ms_p99']:.0f} ms, TPOT p99 {v['tpot_ms_p99']:.1f} ms, "
        f"{v['slo_attainment']:.1%} within the SLOs ({v['requests']:,} requests, {v['sim_wall_s']:.1f} s)",
        flush=True,
    )
    if v["steady_state"]:
        print(f"[search] warning: in the simulated check {v['steady_state']}", file=sys.stderr, flush=True)
    off = abs(v["simulated_over_stated"] - 1.0) > 0.05
    if v["sustained"] and not off:
        return
    if v["sustained_req_s"] > 0:
        below = f"it sustains {v['sustained_req_s']:.1f} req/s ({v['sustained_over_stated']:.3f} x stated)"
    else:
        below = f"none of the rates tried down to {VERIFY_LOW:g} x stated held either"
    if not v["sustained"] and v["holds_at_0_95"] and not off:  # within 5 %: a finite simulation at the edge
        print(f"[search] at the stated rate the simulator finds {v['why_not']}; {below}", flush=True)
    else:
        why = f"{v['why_not']}; {below}" if v["why_not"] else f"simulated / stated = {v['simulated_over_stated']:.3f}"
        print(f"[search] warning: the simulator does not confirm the stated rate ({why})", file=sys.stderr, flush=True)


def _no_plan(run: SearchRun, settings: Any, tracker: Tracker, complete: bool, wall_s: float) -> int:
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
        why, fix = (
            "inner solves ran out of time",
            f"raise search.inner_time_limit_s (now {run.ctx.inner_time_limit_s:g})",
        )
    elif counts.get("rejected"):
        why, fix = "every proposal broke the inventory", "set search.on_violation=repair or lower search.k_slots"
    else:
        why, fix = "no trial produced a layout that serves requests", "check the failed trials' notes in trials.jsonl"
    tracker.finish_parent({"trials": float(len(run.records)), "wall_s": wall_s},
                          [run.dir / "trials.parquet", run.dir / "convergence.png"], status="FAILED")  # fmt: skip
    print(
        f"error: no plan: {why} ({seen}); {fix}. Trials are kept in {run.dir}/trials.jsonl",
        file=sys.stderr,
        flush=True,
    )
    _unlogged_warning(run)
    return cli.INTERRUPTED if not complete else NO_PLAN


def _unlogged_warning(run: SearchRun) -> None:
    if run.unlogged and not run.log_trials():
        print(
            f"[search] warning: MLflow did not take {len(run.unlogged)} trial(s) (trials "
            f"{', '.join(str(r['trial']) for r in run.unlogged[:10])}{' ...' if len(run.unlogged) > 10 else ''}); "
            "they are in trials.jsonl, and search.resume=true logs them",
            file=sys.stderr,
            flush=True,
        )


def _reference_ahead(run: SearchRun, settings: Any, score: float) -> float | None:
    """How much more the exact reference's own layout scores than the plan's (0.0035: 0.35 % more), where a
    search planned and the reference solves the search's model (max_rate, rate_per_dollar); else None.

    Cut short by its time limit the reference still has a layout (solvers/exact.py), at thousands of GPUs
    often a better one than the search's."""
    if run.ref is None or settings.planner == "exact" or score <= 0:
        return None
    if settings.objective not in ("max_rate", "rate_per_dollar"):
        return None
    ref = run.ref.rate_per_dollar if settings.objective == "rate_per_dollar" else run.ref.rate_req_s
    return ref / score - 1.0


def _thesis_gap(run: SearchRun, plan: dict[str, Any]) -> float | None:
    """For the thesis objective: the best layout's max_rate Λ against the exact optimum of that model."""
    if run.ref is None or run.ref.rate_req_s <= 0 or "rate_req_s" not in plan:
        return None
    return 1.0 - float(plan["searched_req_s"]) / run.ref.rate_req_s


if __name__ == "__main__":
    cli.main("search", execute)

"""The thesis's chapter-5 experiments as commands: repeated searches over a grid of settings.

    python -m pipeline.experiment +experiment=table_5_1 [experiment.smoke=true] [costmodel=shallowsim] ...

An experiment (`conf/experiment/<name>.yaml`) is a grid of *cells* (every combination of one
value per axis: an inventory, a workload, `search.batch=8`, ...) and a number of *trials*: each
trial is one whole search (the thesis's meaning of the word) with its own seed. Every override
after the experiment's applies to every cell (e.g. `costmodel=shallowsim`, `ranges.width=125`).

Each search runs as one Ray task: an in-process Optuna ask/tell loop over `run_trial`, with
batches told back together exactly as `pipeline.search` does under Ray Tune. Whole searches,
not single trials, are what run in parallel, so an experiment of thousands of trials costs
solve time, not orchestration. The exact reference MILP runs once per distinct model
(inventory, workload, minimum island, ...), also as a Ray task.

Outputs, in `outputs/experiments/<name>-<hash>/`: `results.parquet` (one row per evaluated
layout), `summary.parquet` and `table.md` (one row per cell), `convergence.png` (mean best so
far per iteration with min-max and +-std bands, and the overall maximum, thesis Fig 5.5 style),
`timing.png` where the experiment measures execution time. MLflow: one parent run per
experiment, one child run per search (best-so-far per iteration as a step metric).

A finished search is appended to `searches.jsonl` at once; running the same command again
skips every finished search (Ctrl-C exits 130 and keeps them).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline import cli
from pipeline.cli import plain
from pipeline.experiment.report import best_so_far_per_iteration, best_trial, markdown, plot, tables
from pipeline.experiment.spec import Cell, build_cells, digest, spec_from_cfg
from pipeline.planning.planner import layout_id
from pipeline.records.journal import Journal, write_json
from pipeline.search.reference import exact_layout, reference
from pipeline.search.samplers import make_sampler
from pipeline.search.settings import Settings, calibration_identity, run_identity
from pipeline.search.trial import OK, Context, ask_tell, score_layout

# --- the work of one Ray task --------------------------------------------------------------------

KEEP = ("score", "rate_req_s", "evaluated_req_s", "deviation", "cost_per_hour", "solve_ms", "trial_ms", "status")


def one_search(ctx: Context, sampler: str, seed: int, evals: int, batch: int, polish: float) -> dict[str, Any]:
    """One whole search in this process: every trial's numbers, the best layout and the wall time."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    results = ask_tell(ctx, make_sampler(sampler, seed, ctx.space, polish, evals), evals, batch)
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["status"] in OK]
    best = max(ok, key=lambda r: r["score"]) if ok else None
    return {
        "wall_s": wall,
        "trials": [{k: r[k] for k in KEEP} for r in results],
        "best_islands": best["islands"] if best else "",
    }


def exact_search(settings: Settings, ctx: Context) -> dict[str, Any]:
    """The `exact` sampler as an experiment trial: the reference MILP's layout, solved and scored."""
    t0 = time.perf_counter()
    layout = exact_layout(reference(settings, ctx, ctx.planner))
    if layout is None:
        return {"wall_s": time.perf_counter() - t0, "trials": [], "best_islands": ""}
    out = score_layout(ctx, layout)
    return {"wall_s": time.perf_counter() - t0, "trials": [{k: out[k] for k in KEEP}], "best_islands": out["islands"]}


def reference_task(settings: Settings, ctx: Context) -> dict[str, Any]:
    ref = reference(settings, ctx, ctx.planner)
    return {
        "rate_req_s": ref.rate_req_s,
        "rate_per_dollar": ref.rate_per_dollar,
        "status": ref.status,
        "islands": [list(t) for t in ref.islands],
    }


# --- the driver ----------------------------------------------------------------------------------


def run_experiment(cfg: Any, passthrough: Sequence[str], command: Sequence[str] | None = None) -> int:
    """Run (or finish) the experiment `cfg` describes; the exit code (0 done, 130 interrupted).

    `command`: the command line's overrides after `+experiment=NAME`, as the table quotes them.
    """
    from pipeline.records.tracking import Tracker
    from pipeline.search.tune.driver import with_ray

    spec = spec_from_cfg(cfg)
    cells = build_cells(spec, passthrough)
    first = cells[0].settings
    out_root = Path(str(cfg.out_root)).parent / "experiments"
    ident = digest(  # the whole composed config of every cell: a changed default is a new experiment
        {
            "experiment": plain(cfg.experiment),
            "cells": [run_identity(c.settings.config) for c in cells],
            "calibrations": [calibration_identity(c.settings.calibration) for c in cells],
        }
    )
    run_dir = out_root / f"{spec.name}{'-smoke' if spec.smoke else ''}-{ident}"
    run_dir.mkdir(parents=True, exist_ok=True)
    journal = Journal(run_dir / "searches.jsonl")
    done = _by_search(journal)
    refs_path = run_dir / "references.json"
    refs: dict[str, dict[str, Any]] = json.loads(refs_path.read_text()) if refs_path.exists() else {}
    runnable = [c for c in cells if not c.skipped]
    # a search that failed as a whole (its task raised) runs again; finished ones are kept
    todo = [
        (c, seed) for c in runnable for seed in c.seeds(spec.trials) if "error" in done.get((c.key, seed), {"error": 1})
    ]
    total = sum(len(c.seeds(spec.trials)) for c in runnable)
    for c in cells:
        if c.skipped:
            print(f"[experiment] skipped {c.key}: {c.skipped}", flush=True)
    print(
        f"[experiment] {spec.name}: {spec.title}\n[experiment] {len(cells)} cells x {spec.trials} trials "
        f"({total} searches); folder {run_dir}"
        + (f"\n[experiment] resuming: {total - len(todo)} searches already done" if len(todo) < total else ""),
        flush=True,
    )
    tracker = Tracker(first.mlflow.tracking_uri, first.mlflow.experiment, EXPERIMENT_NOTE,
                      ("metrics.best_score", "metrics.wall_s", "metrics.searches", "params.experiment", "params.seed",
                       "params.sampler", "params.layout_id"))  # fmt: skip
    state_path = run_dir / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    tracker.start_parent(
        f"experiment:{run_dir.name}",
        {
            "experiment": spec.name,
            "trials": spec.trials,
            "cells": len(cells),
            "smoke": spec.smoke,
            "axes": json.dumps(dict(spec.axes)),
            "overrides": " ".join([*spec.overrides, *passthrough]),
            "run_dir": str(run_dir),
        },
        state.get("parent_run_id"),
        f"Experiment {spec.name}: {spec.title}. {len(cells)} cells x {spec.trials} seeded searches; children: one "
        f"run per search (its cell, seed, best score); artifacts table.md, results and plots. Folder {run_dir}",
        state_path,
    )

    t0 = time.perf_counter()
    complete = with_ray(first.ray.address, first.ray.num_cpus,
                        lambda: _run_tasks(cells, todo, refs, refs_path, journal, tracker, t0))  # fmt: skip
    done = _by_search(journal)
    results, summary = tables(spec, cells, done, refs)
    if not results.empty:
        results.to_parquet(run_dir / "results.parquet", index=False)
    summary.to_parquet(run_dir / "summary.parquet", index=False)
    table = markdown(spec, cells, summary, passthrough if command is None else command)
    (run_dir / "table.md").write_text(table)
    unit = "req/s per $/h" if first.search.objective == "rate_per_dollar" else "req/s"
    plots = plot(spec, results, summary, run_dir, unit)
    tracker.finish_parent(
        {"searches": float(len(done)), "wall_s": time.perf_counter() - t0},
        [run_dir / "table.md", run_dir / "results.parquet", run_dir / "summary.parquet", *plots],
        status="FINISHED" if complete else "KILLED",
    )
    print(table, flush=True)
    print(f"[experiment] wrote {run_dir}/ (table.md, results.parquet, summary.parquet, plots)", flush=True)
    if not complete:
        print(
            f"[experiment] interrupted: {len(done)}/{total} searches done and kept; run the same command "
            "again to finish the rest",
            file=sys.stderr,
            flush=True,
        )
        return cli.INTERRUPTED
    return 0


def _by_search(journal: Journal) -> dict[tuple[str, int], dict[str, Any]]:
    """The journal's records by (cell, seed), the last one winning (a failed search re-run)."""
    return {(rec["cell"], rec["seed"]): rec for rec in journal.load()}


def _run_tasks(
    cells: list[Cell],
    todo: list[tuple[Cell, int]],
    refs: dict[str, dict[str, Any]],
    refs_path: Path,
    journal: Journal,
    tracker: Any,
    t0: float,
) -> bool:
    import ray

    search_task = ray.remote(num_cpus=1)(one_search)
    exact_task = ray.remote(num_cpus=1)(exact_search)
    ref_task = ray.remote(num_cpus=1)(reference_task)
    ctx_refs = {c.key: ray.put(c.ctx) for c in cells if not c.skipped}
    pending: dict[Any, tuple[str, Any]] = {}
    needs_ref = {c.ref_key: c for c in cells if not c.skipped and c.settings.search.reference and c.ref_key not in refs}
    for key, c in needs_ref.items():  # once per distinct model, beside the searches
        pending[ref_task.remote(c.settings, ctx_refs[c.key])] = ("ref", key)
    for c, seed in todo:
        s = c.settings
        if s.mode == "exact":
            fut = exact_task.remote(s, ctx_refs[c.key])
        else:
            o = s.search
            fut = search_task.remote(ctx_refs[c.key], o.sampler, seed, o.trials, o.batch, o.polish)
        pending[fut] = ("search", (c, seed))
    n_todo, finished = len(todo), 0
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)  # wakes up for Ctrl-C
            if not ready:
                continue
            kind, what = pending.pop(ready[0])
            try:
                out = ray.get(ready[0])
            except ray.exceptions.RayTaskError as err:
                cause = getattr(err, "cause", None) or err
                line = f"{type(cause).__name__}: {cause}"[:300]
                if kind == "ref":
                    print(f"[experiment] exact reference failed: {line}", flush=True)
                    continue
                cell, seed = what
                print(f"[experiment] {cell.key} seed {seed} failed: {line}", flush=True)
                journal.append({"cell": cell.key, "seed": seed, "error": line, "wall_s": 0.0, "trials": []})
                continue
            if kind == "ref":
                refs[what] = out
                write_json(refs_path, refs)
                continue
            cell, seed = what
            finished += 1
            rec = {"cell": cell.key, "seed": seed, **out}
            journal.append(rec)
            _log_child(tracker, cell, seed, rec)
            best = max((t["score"] for t in out["trials"] if t["status"] in OK), default=0.0)
            print(
                f"[experiment] {finished}/{n_todo} searches  {cell.key} seed {seed}: best {best:.4g} in "
                f"{out['wall_s']:.1f} s  ({time.perf_counter() - t0:.0f} s elapsed)",
                flush=True,
            )
    except KeyboardInterrupt:
        for fut in pending:
            ray.cancel(fut, force=True)
        return False
    return True


EXPERIMENT_NOTE = (
    "Archipelago experiments (`python -m pipeline.experiment +experiment=NAME`): each parent run is one "
    "experiment (a grid of cells, several seeded searches each), with table.md and plots as artifacts; each child "
    "run is one search, with its best score, wall time and best_so_far per iteration."
)


def _log_child(tracker: Any, cell: Cell, seed: int, rec: Mapping[str, Any]) -> None:
    curve = best_so_far_per_iteration(rec["trials"], cell.settings.search.batch)
    best = best_trial(rec["trials"])
    tracker.child(
        f"{cell.key} seed={seed}",
        {
            **dict(cell.label),
            "seed": seed,
            "sampler": cell.settings.search.sampler,
            "layout_id": layout_id(rec["best_islands"] or ""),
        },
        {
            "best_score": best["score"] if best else 0.0,
            "best_deviation": best["deviation"] if best else float("nan"),
            "wall_s": rec["wall_s"],
            "trials": float(len(rec["trials"])),
        },
        failed=False,
        series={"best_so_far": curve},
        tags={
            "islands": rec["best_islands"] or "-",
            "description": f"{cell.key}, seed {seed}: best {best['score'] if best else 0.0:.4g} with islands "
            f"{rec['best_islands'] or '-'}",
        },
    )


# --- command line --------------------------------------------------------------------------------


def _overrides() -> list[str]:
    """The command line's overrides after `+experiment=NAME`."""
    from hydra.core.hydra_config import HydraConfig

    return [o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith("experiment=")]


def _passthrough(overrides: Sequence[str]) -> list[str]:
    """The overrides other than the experiment's own: they apply to every cell."""
    return [o for o in overrides if not o.lstrip("+~").startswith("experiment")]


def task(cfg: Any) -> int:
    overrides = _overrides()
    return run_experiment(cfg, _passthrough(overrides), overrides)

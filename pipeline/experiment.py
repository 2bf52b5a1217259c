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

import hashlib
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodel.catalog import CONF_DIR
from pipeline.config import ConfigError, choice, plain, positive_int
from pipeline.planner import Layout
from pipeline.search import (
    GROUPS,
    Context,
    Settings,
    ask_tell,
    make_sampler,
    reference,
    run_identity,
    score_layout,
    settings_from_cfg,
)


@dataclass(frozen=True)
class Cell:
    label: tuple[tuple[str, str], ...]  # (axis, value) per axis
    settings: Settings
    ctx: Context
    ref_key: str  # identity of the exact reference this cell shares with others
    skipped: str = ""  # why this cell cannot run here (e.g. a sampler's optional extra is missing)

    @property
    def key(self) -> str:
        return ",".join(f"{a}={v}" for a, v in self.label)


@dataclass(frozen=True)
class Spec:
    name: str
    title: str
    trials: int
    axes: tuple[tuple[str, tuple[str, ...]], ...]
    overrides: tuple[str, ...]
    table: str  # "cells" or "table_5_1"
    timing: bool
    smoke: bool


def spec_from_cfg(cfg: Any) -> Spec:
    if "experiment" not in cfg:
        names = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
        raise ConfigError(f"choose an experiment: +experiment=NAME with NAME one of {names}")
    e = cfg.experiment
    smoke = bool(e.get("smoke", False))
    axes_cfg = {**plain(e.axes), **((plain(e.get("smoke_axes")) or {}) if smoke else {})}
    axes = tuple((str(k), tuple(str(v) for v in vs)) for k, vs in axes_cfg.items())
    for axis, values in axes:
        if not values:
            raise ConfigError(f"experiment.axes.{axis} is empty: give it at least one value")
        if axis in GROUPS:
            names = {p.stem for p in (CONF_DIR / axis).glob("*.yaml")}
            unknown = [v for v in values if v not in names]
            if unknown:
                raise ConfigError(f"experiment.axes.{axis}: {unknown} not in conf/{axis}/ ({sorted(names)})")
    overrides = tuple(str(o) for o in e.overrides) + (tuple(str(o) for o in e.smoke_overrides) if smoke else ())
    trials = positive_int(e.smoke_trials if smoke else e.trials, "experiment.trials")
    table = str(e.get("table", "cells"))
    if table not in ("cells", "table_5_1"):
        raise ConfigError(f"experiment.table={table!r}: choose cells or table_5_1")
    return Spec(str(e.name), str(e.title), trials, axes, overrides, table, bool(e.get("timing", False)), smoke)


def _axis_override(axis: str, value: str) -> str:
    """An axis names a config group (`workload`), a search setting (`batch` = `search.batch`) or any key."""
    if axis == "inventory":
        return f"+inventory={value}"
    if axis in GROUPS or "." in axis:
        return f"{axis}={value}"
    return f"search.{axis}={value}"


def _merge(overrides: Sequence[str]) -> list[str]:
    """One override per key, the last one winning (an axis beats the command line beats the experiment)."""
    by_key = {o.lstrip("+~").partition("=")[0]: o for o in overrides}
    return list(by_key.values())


def build_cells(spec: Spec, passthrough: Sequence[str]) -> list[Cell]:
    """Compose the search config of every cell (Hydra compose, as `python -m pipeline.search` would)."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig

    outer = HydraConfig.instance().cfg
    cells: list[Cell] = []
    try:
        for combo in itertools.product(*(vals for _, vals in spec.axes)):
            label = tuple((axis, v) for (axis, _), v in zip(spec.axes, combo, strict=True))
            overrides = _merge(
                ["+inventory=hetero_a", *spec.overrides, *passthrough, *(_axis_override(a, v) for a, v in label)]
            )
            cfg = compose("search", overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            settings, ctx = settings_from_cfg(cfg, choice("inventory"), cfg.inventory)
            record = dict(settings.config)
            s = record["search"]
            ref_id = {
                **{k: v for k, v in record.items() if k not in ("search", "ray", "mlflow", "out_root")},
                "search": {k: s.get(k) for k in ("min_island", "min_island_per_type", "objective", "budget_per_hour")}
                | {"kv_transfer": s.get("kv_transfer")},
            }
            skipped = ""
            try:
                if settings.sampler != "exact":  # the reference MILP, not an Optuna sampler
                    make_sampler(settings.sampler, 0, ctx.space)
            except ConfigError as err:
                skipped = str(err)
            cells.append(Cell(label, settings, ctx, _digest(ref_id), skipped))
    finally:
        if outer is not None:
            HydraConfig.instance().set_config(outer)
    return cells


def _digest(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


# --- the work of one Ray task --------------------------------------------------------------------

KEEP = ("score", "rate_req_s", "evaluated_req_s", "deviation", "cost_per_hour", "solve_ms", "trial_ms", "status")


def one_search(ctx: Context, sampler: str, seed: int, evals: int, batch: int, polish: float) -> dict[str, Any]:
    """One whole search in this process: every trial's numbers, the best layout and the wall time."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    results = ask_tell(ctx, make_sampler(sampler, seed, ctx.space, polish, evals), evals, batch)
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["status"] in ("optimal", "feasible")]
    best = max(ok, key=lambda r: r["score"]) if ok else None
    return {
        "wall_s": wall,
        "trials": [{k: r[k] for k in KEEP} for r in results],
        "best_islands": best["islands"] if best else "",
    }


def exact_search(settings: Settings, ctx: Context) -> dict[str, Any]:
    """The `exact` sampler as an experiment trial: the reference MILP's layout, solved and scored."""
    t0 = time.perf_counter()
    ref = reference(settings, ctx, ctx.planner)
    if not ref.islands:
        return {"wall_s": time.perf_counter() - t0, "trials": [], "best_islands": ""}
    out = score_layout(ctx, Layout.of([(g, n) for g, n, _ in ref.islands]))
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


class Journal:
    """Finished searches, one JSON line each, flushed and synced as they land."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[tuple[str, int], dict[str, Any]]:
        done: dict[tuple[str, int], dict[str, Any]] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill: that search runs again
                done[(rec["cell"], rec["seed"])] = rec
        return done

    def append(self, rec: Mapping[str, Any]) -> None:
        cut = False  # a line cut short by a kill must not swallow the next one
        if self.path.exists() and self.path.stat().st_size > 0:
            with self.path.open("rb") as f:
                f.seek(-1, os.SEEK_END)
                cut = f.read(1) != b"\n"
        with self.path.open("a") as f:
            f.write(("\n" if cut else "") + json.dumps(rec, default=float) + "\n")
            f.flush()
            os.fsync(f.fileno())


def run_experiment(cfg: Any, passthrough: Sequence[str], command: Sequence[str] | None = None) -> int:
    """Run (or finish) the experiment `cfg` describes; the exit code (0 done, 130 interrupted).

    `command`: the command line's overrides after `+experiment=NAME`, as the table quotes them.
    """
    from pipeline.plan import write_json
    from pipeline.search import _with_ray
    from pipeline.tracking import Tracker

    spec = spec_from_cfg(cfg)
    cells = build_cells(spec, passthrough)
    first = cells[0].settings
    out_root = Path(str(cfg.out_root)).parent / "experiments"
    ident = _digest(  # the whole composed config of every cell: a changed default is a new experiment
        {
            "experiment": plain(cfg.experiment),
            "cells": [run_identity(c.settings.config) for c in cells],
        }
    )
    run_dir = out_root / f"{spec.name}{'-smoke' if spec.smoke else ''}-{ident}"
    run_dir.mkdir(parents=True, exist_ok=True)
    journal = Journal(run_dir / "searches.jsonl")
    done = journal.load()
    refs_path = run_dir / "references.json"
    refs: dict[str, dict[str, Any]] = json.loads(refs_path.read_text()) if refs_path.exists() else {}
    runnable = [c for c in cells if not c.skipped]
    # a search that failed as a whole (its task raised) runs again; finished ones are kept
    todo = [(c, seed) for c in runnable for seed in _seeds(c, spec) if "error" in done.get((c.key, seed), {"error": 1})]
    total = sum(len(_seeds(c, spec)) for c in runnable)
    for c in cells:
        if c.skipped:
            print(f"[experiment] skipped {c.key}: {c.skipped}", flush=True)
    print(
        f"[experiment] {spec.name}: {spec.title}\n[experiment] {len(cells)} cells x {spec.trials} trials "
        f"({total} searches); folder {run_dir}"
        + (f"\n[experiment] resuming: {total - len(todo)} searches already done" if len(todo) < total else ""),
        flush=True,
    )
    tracker = Tracker(first.mlflow_uri, first.mlflow_experiment)
    state_path = run_dir / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    state["parent_run_id"] = tracker.start_parent(
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
    )
    write_json(state_path, state)

    t0 = time.perf_counter()
    complete = _with_ray(first, lambda: _run_tasks(cells, todo, refs, refs_path, journal, tracker, t0))
    done = journal.load()
    results, summary = tables(spec, cells, done, refs)
    if not results.empty:
        results.to_parquet(run_dir / "results.parquet", index=False)
    summary.to_parquet(run_dir / "summary.parquet", index=False)
    table = markdown(spec, cells, summary, passthrough if command is None else command)
    (run_dir / "table.md").write_text(table)
    unit = "req/s per $/h" if first.objective == "rate_per_dollar" else "req/s"
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
        return 130
    return 0


def _seeds(cell: Cell, spec: Spec) -> list[int]:
    """The exact sampler is deterministic: one trial says all."""
    n = 1 if cell.settings.sampler == "exact" else spec.trials
    return [cell.settings.seed + k for k in range(n)]


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

    from pipeline.plan import write_json

    search_task = ray.remote(num_cpus=1)(one_search)
    exact_task = ray.remote(num_cpus=1)(exact_search)
    ref_task = ray.remote(num_cpus=1)(reference_task)
    ctx_refs = {c.key: ray.put(c.ctx) for c in cells if not c.skipped}
    pending: dict[Any, tuple[str, Any]] = {}
    needs_ref = {c.ref_key: c for c in cells if not c.skipped and c.settings.reference and c.ref_key not in refs}
    for key, c in needs_ref.items():  # once per distinct model, beside the searches
        pending[ref_task.remote(c.settings, ctx_refs[c.key])] = ("ref", key)
    for c, seed in todo:
        s = c.settings
        if s.sampler == "exact":
            fut = exact_task.remote(s, ctx_refs[c.key])
        else:
            fut = search_task.remote(ctx_refs[c.key], s.sampler, seed, s.trials, s.batch, s.polish)
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
            best = max((t["score"] for t in out["trials"] if t["status"] in ("optimal", "feasible")), default=0.0)
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


def _log_child(tracker: Any, cell: Cell, seed: int, rec: Mapping[str, Any]) -> None:
    curve = best_so_far_per_iteration(rec["trials"], cell.settings.batch)
    best = _best_trial(rec["trials"])
    tracker.child(
        f"{cell.key} seed={seed}",
        {**dict(cell.label), "seed": seed, "sampler": cell.settings.sampler, "islands": rec["best_islands"]},
        {
            "best_score": best["score"] if best else 0.0,
            "best_deviation": best["deviation"] if best else float("nan"),
            "wall_s": rec["wall_s"],
            "trials": float(len(rec["trials"])),
        },
        failed=False,
        series={"best_so_far": curve},
    )


def _best_trial(trials: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    ok = [t for t in trials if t["status"] in ("optimal", "feasible")]
    return max(ok, key=lambda t: t["score"]) if ok else None


def best_so_far_per_iteration(trials: Sequence[Mapping[str, Any]], batch: int) -> list[float]:
    scores = [t["score"] if t["status"] in ("optimal", "feasible") else 0.0 for t in trials]
    if not scores:
        return []
    best = np.maximum.accumulate(scores)
    return [float(best[min(len(best), (k + 1) * batch) - 1]) for k in range(math.ceil(len(best) / batch))]


# --- tables and plots ----------------------------------------------------------------------------


def tables(
    spec: Spec, cells: Sequence[Cell], done: Mapping[tuple[str, int], Mapping[str, Any]], refs: Mapping[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, summ = [], []
    for c in cells:
        recs = [done[(c.key, s)] for s in _seeds(c, spec) if (c.key, s) in done]
        bests, devs, walls = [], [], []
        for rec in recs:
            for k, t in enumerate(rec["trials"]):
                rows.append({**dict(c.label), "seed": rec["seed"], "trial": k, "iteration": k // c.settings.batch, **t})
            b = _best_trial(rec["trials"])
            if "error" not in rec:
                bests.append(b["score"] if b else 0.0)
                devs.append(b["deviation"] if b else float("nan"))
                walls.append(rec["wall_s"])
        ref = refs.get(c.ref_key)
        ref_score = None
        if ref is not None:
            ref_score = ref["rate_per_dollar"] if c.settings.objective == "rate_per_dollar" else ref["rate_req_s"]
        summ.append(
            {
                **dict(c.label),
                "cell": c.key,
                "sampler": c.settings.sampler,
                "searches": len(bests),
                "failed": sum("error" in r for r in recs),
                "best_mean": _stat(np.mean, bests),
                "best_std": _stat(np.std, bests),
                "best_min": _stat(np.min, bests),
                "best_max": _stat(np.max, bests),
                "deviation_mean": _stat(np.nanmean, devs),
                "deviation_std": _stat(np.nanstd, devs),
                "exact": ref_score if ref_score is not None else float("nan"),
                "best_over_exact": _stat(np.mean, bests) / ref_score if ref_score else float("nan"),
                "wall_s_mean": _stat(np.mean, walls),
                "wall_s_std": _stat(np.std, walls),
                "evaluations": c.settings.trials if c.settings.sampler != "exact" else 1,
                "skipped": c.skipped,
            }
        )
    return pd.DataFrame(rows), pd.DataFrame(summ)


def _stat(fn: Any, xs: Sequence[float]) -> float:
    arr = np.asarray(xs, dtype=float)
    if arr.size == 0 or np.isnan(arr).all():
        return float("nan")
    return float(fn(arr))


def _pm(mean: float, std: float, digits: int = 1) -> str:
    return "-" if mean != mean else f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown(spec: Spec, cells: Sequence[Cell], summary: pd.DataFrame, command: Sequence[str]) -> str:
    seed0 = cells[0].settings.seed
    smoke = " experiment.smoke=true" if spec.smoke and "experiment.smoke=true" not in command else ""
    head = [
        f"# {spec.title}",
        "",
        f"`python -m pipeline.experiment +experiment={spec.name}" + "".join(f" {o}" for o in command) + smoke + "`",
        "",
        f"{spec.trials} trials (searches, seeds {seed0}..{seed0 + spec.trials - 1}) per cell; "
        "best = best score of a search; D_total = the thesis's deviation of that best layout; "
        f"exact = the global optimum of the same model (exact reference MILP).",
        "",
    ]
    if spec.table == "table_5_1":
        return "\n".join(head + _table_5_1(cells, summary)) + "\n"
    unit = "req/s per $/h" if cells[0].settings.objective == "rate_per_dollar" else "req/s"
    axes = [a for a, _ in spec.axes]
    lines = [
        "| " + " | ".join(axes) + f" | best {unit} (mean ± std) | min | max | D_total | exact | best/exact | "
        "wall s (mean ± std) | evaluations | searches |",
        "|" + "---|" * len(axes) + "---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for _, r in summary.iterrows():
        if r["skipped"]:
            lines.append("| " + " | ".join(str(r[a]) for a in axes) + f" | skipped: {r['skipped']} ||||||||")
            continue
        lines.append(
            "| "
            + " | ".join(str(r[a]) for a in axes)
            + f" | {_pm(r['best_mean'], r['best_std'], 2)} | {r['best_min']:.2f} | {r['best_max']:.2f} | "
            f"{_pm(r['deviation_mean'], r['deviation_std'])} | {r['exact']:.2f} | {r['best_over_exact']:.3f} | "
            f"{_pm(r['wall_s_mean'], r['wall_s_std'])} | {r['evaluations']} | {r['searches']}"
            + (f" ({r['failed']} failed)" if r["failed"] else "")
            + " |"
        )
    return "\n".join(head + lines) + "\n"


def _table_5_1(cells: Sequence[Cell], summary: pd.DataFrame) -> list[str]:
    """The thesis's Table 5.1 layout: inventories as rows, (R_total, D_total) per workload, plus exact and ratios."""
    workloads = list(dict.fromkeys(summary["workload"]))
    inventories = list(dict.fromkeys(summary["inventory"]))
    gpu_names = list(dict.fromkeys(g.name for c in cells for g in c.settings.inventory.gpus))
    inv_of = {c.settings.inventory.name: c.settings.inventory for c in cells}
    lines = [
        "| | type | "
        + " | ".join(gpu_names)
        + " | $/h | "
        + " | ".join(f"{w} R_total | D_total | exact" for w in workloads)
        + " |",
        "|---|---|" + "---:|" * len(gpu_names) + "---:|" + "---:|---:|---:|" * len(workloads),
    ]
    for inv in inventories:
        inventory = inv_of[inv]
        counts = dict(zip((g.name for g in inventory.gpus), inventory.counts, strict=True))
        kind = "hetero" if len(inventory.gpus) > 1 else "homo"
        row = f"| {inv} | {kind} | " + " | ".join(str(counts.get(g, 0)) for g in gpu_names)
        row += f" | {inventory.cost_per_hour:,.0f} |"
        for w in workloads:
            r = summary[(summary["inventory"] == inv) & (summary["workload"] == w)].iloc[0]
            row += f" {_pm(r['best_mean'], r['best_std'])} | {_pm(r['deviation_mean'], r['deviation_std'])} | "
            row += f"{r['exact']:.1f} |"
        lines.append(row)
    homo = [i for i in inventories if len(inv_of[i].gpus) == 1]
    if homo:
        lines += ["", "Ratios to the homogeneous inventory (same $/h):", ""]
        lines += ["| | " + " | ".join(f"{w} searched | {w} exact" for w in workloads) + " |"]
        lines += ["|---|" + "---:|---:|" * len(workloads)]
        for inv in inventories:
            if inv == homo[0]:
                continue
            row = f"| {inv} / {homo[0]} |"
            for w in workloads:
                a = summary[(summary["inventory"] == inv) & (summary["workload"] == w)].iloc[0]
                b = summary[(summary["inventory"] == homo[0]) & (summary["workload"] == w)].iloc[0]
                row += f" {a['best_mean'] / b['best_mean']:.2f}x | {a['exact'] / b['exact']:.2f}x |"
            lines.append(row)
    return lines


def plot(spec: Spec, results: pd.DataFrame, summary: pd.DataFrame, run_dir: Path, unit: str) -> list[Path]:
    """Thesis Fig 5.5 style: mean best so far per iteration, min-max and +-std bands, overall max.

    Also writes `plots.json`: every panel's series, as drawn.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = [a for a, _ in spec.axes]
    panel_axis = axes[0] if len(axes) > 1 else None
    panels = list(dict.fromkeys(summary[panel_axis])) if panel_axis else [None]
    fig, axs = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    drawn: dict[str, list[str]] = {}
    for ax, panel in zip(axs[0], panels, strict=True):
        part = summary if panel is None else summary[summary[panel_axis] == panel]
        series_drawn = drawn.setdefault(str(panel) if panel_axis else spec.name, [])
        top = 0.0  # the thesis's "maximum throughput across all trials, iterations and experiments" of a figure
        for _, cell in part.iterrows():
            if cell["skipped"] or results.empty:
                continue
            sel = results[np.logical_and.reduce([results[a] == cell[a] for a in axes])]
            curves = []
            for _, g in sel.groupby("seed"):
                ok = np.where(g["status"].isin(["optimal", "feasible"]), g["score"], 0.0)
                best = np.maximum.accumulate(ok)
                curves.append(pd.Series(best).groupby(g["iteration"].to_numpy()).max().to_numpy())
            if not curves:
                continue
            n = max(len(c) for c in curves)
            arr = np.array([np.pad(c, (0, n - len(c)), mode="edge") for c in curves])
            it = np.arange(1, n + 1)
            series = cell[axes[-1]] if panel_axis else cell[axes[0]]
            mean, std = arr.mean(axis=0), arr.std(axis=0)
            (line,) = ax.plot(it, mean, lw=2, label=f"{axes[-1]}={series}", marker="o" if n == 1 else None)
            series_drawn.append(str(series))
            ax.fill_between(it, arr.min(axis=0), arr.max(axis=0), color=line.get_color(), alpha=0.12)
            ax.fill_between(it, mean - std, mean + std, color=line.get_color(), alpha=0.25)
            if cell["exact"] == cell["exact"]:
                ax.axhline(cell["exact"], color=line.get_color(), ls=":", lw=1)
            top = max(top, float(arr.max()))
        if top > 0:
            ax.axhline(top, color="k", ls="--", lw=1, label=f"max {top:.1f} (dotted: exact optimum per series)")
        ax.set(xlabel="iteration", ylabel=f"best {unit}", title=f"{panel_axis}={panel}" if panel_axis else spec.title)
        if series_drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no finished searches", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(f"{spec.name}: mean best so far (line), min-max (light), ±std (dark)", fontsize=10)
    fig.tight_layout()
    paths = [run_dir / "convergence.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    if spec.timing:
        fig, ax = plt.subplots(figsize=(7, 4))
        ok = summary[summary["skipped"] == ""]
        labels = [" ".join(str(r[a]) for a in axes) for _, r in ok.iterrows()]
        ax.bar(range(len(ok)), ok["wall_s_mean"], yerr=ok["wall_s_std"], capsize=3)
        ax.set_xticks(range(len(ok)), labels, rotation=45, ha="right", fontsize=8)
        ax.set(ylabel="execution time per search (s)", title=f"{spec.name}: execution time (thesis Figs 5.6, 5.11)")
        fig.tight_layout()
        paths.append(run_dir / "timing.png")
        fig.savefig(paths[1], dpi=110)
        plt.close(fig)
    (run_dir / "plots.json").write_text(json.dumps(drawn, indent=1) + "\n")
    return paths


# --- command line --------------------------------------------------------------------------------


def _overrides() -> list[str]:
    """The command line's overrides after `+experiment=NAME`."""
    from hydra.core.hydra_config import HydraConfig

    return [o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith("experiment=")]


def _passthrough(overrides: Sequence[str]) -> list[str]:
    """The overrides other than the experiment's own: they apply to every cell."""
    return [o for o in overrides if not o.lstrip("+~").startswith("experiment")]


def _main() -> None:
    import hydra
    from omegaconf import DictConfig

    from pipeline.config import run_cli

    def task(cfg: DictConfig) -> int:
        overrides = _overrides()
        return run_experiment(cfg, _passthrough(overrides), overrides)

    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="search")(run_cli(task))()


if __name__ == "__main__":
    from pipeline.search import precheck

    precheck(sys.argv[1:], (*GROUPS, "experiment"))
    _main()

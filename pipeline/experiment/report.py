"""An experiment's tables and plots: per-cell summaries, the markdown table (the thesis's Table 5.1
layout where it applies), convergence and timing figures, and the series each plot draws."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from pipeline.search.trial import OK

if TYPE_CHECKING:
    from pipeline.experiment.spec import Cell, Spec


def best_trial(trials: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    ok = [t for t in trials if t["status"] in OK]
    return max(ok, key=lambda t: t["score"]) if ok else None


def best_so_far_per_iteration(trials: Sequence[Mapping[str, Any]], batch: int) -> list[float]:
    scores = [t["score"] if t["status"] in OK else 0.0 for t in trials]
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
        recs = [done[(c.key, s)] for s in c.seeds(spec.trials) if (c.key, s) in done]
        bests, devs, walls = [], [], []
        for rec in recs:
            for k, t in enumerate(rec["trials"]):
                iteration = k // c.settings.search.batch
                rows.append({**dict(c.label), "seed": rec["seed"], "trial": k, "iteration": iteration, **t})
            b = best_trial(rec["trials"])
            if "error" not in rec:
                bests.append(b["score"] if b else 0.0)
                devs.append(b["deviation"] if b else float("nan"))
                walls.append(rec["wall_s"])
        ref = refs.get(c.ref_key)
        ref_score, proven = None, True
        if ref is not None:
            proven = ref.get("status", "optimal") == "optimal"
            per_dollar = c.settings.search.objective == "rate_per_dollar"
            ref_score = ref["rate_per_dollar"] if per_dollar else ref["rate_req_s"]
        summ.append(
            {
                **dict(c.label),
                "cell": c.key,
                "sampler": c.settings.search.sampler,
                "searches": len(bests),
                "failed": sum("error" in r for r in recs),
                "best_mean": _stat(np.mean, bests),
                "best_std": _stat(np.std, bests),
                "best_min": _stat(np.min, bests),
                "best_max": _stat(np.max, bests),
                "deviation_mean": _stat(np.nanmean, devs),
                "deviation_std": _stat(np.nanstd, devs),
                "exact": ref_score if ref_score is not None else float("nan"),
                "exact_proven": proven,  # False: the reference's best layout within its time limit, not proven
                "best_over_exact": _stat(np.mean, bests) / ref_score if ref_score else float("nan"),
                "wall_s_mean": _stat(np.mean, walls),
                "wall_s_std": _stat(np.std, walls),
                "evaluations": c.settings.search.trials if c.settings.mode == "search" else 1,
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
    seed0 = cells[0].settings.search.seed
    smoke = " experiment.smoke=true" if spec.smoke and "experiment.smoke=true" not in command else ""
    head = [
        f"# {spec.title}",
        "",
        f"`python -m pipeline.experiment +experiment={spec.name}" + "".join(f" {o}" for o in command) + smoke + "`",
        "",
        f"{spec.trials} trials (searches, seeds {seed0}..{seed0 + spec.trials - 1}) per cell; "
        "best = best score of a search; D_total = the thesis's deviation of that best layout; "
        f"exact = the global optimum of the same model (exact reference MILP; * where its time limit ended it "
        "before the optimum was proven: its best layout then, a lower bound).",
        "",
    ]
    if spec.table == "table_5_1":
        return "\n".join(head + _table_5_1(cells, summary)) + "\n"
    unit = "req/s per $/h" if cells[0].settings.search.objective == "rate_per_dollar" else "req/s"
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
            f"{_pm(r['deviation_mean'], r['deviation_std'])} | {_exact(r, 2)} | {r['best_over_exact']:.3f} | "
            f"{_pm(r['wall_s_mean'], r['wall_s_std'])} | {r['evaluations']} | {r['searches']}"
            + (f" ({r['failed']} failed)" if r["failed"] else "")
            + " |"
        )
    return "\n".join(head + lines) + "\n"


def _exact(r: pd.Series, digits: int) -> str:
    """A cell's exact reference, starred where its solve was not proven optimal."""
    return f"{r['exact']:.{digits}f}" + ("" if r.get("exact_proven", True) else "*")


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
        counts = inventory.by_name
        kind = "hetero" if len(inventory.gpus) > 1 else "homo"
        row = f"| {inv} | {kind} | " + " | ".join(str(counts.get(g, 0)) for g in gpu_names)
        row += f" | {inventory.cost_per_hour:,.0f} |"
        for w in workloads:
            r = summary[(summary["inventory"] == inv) & (summary["workload"] == w)].iloc[0]
            row += f" {_pm(r['best_mean'], r['best_std'])} | {_pm(r['deviation_mean'], r['deviation_std'])} | "
            row += f"{_exact(r, 1)} |"
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

"""Solve one fixed island layout under both inner objectives; write tables, JSON and plots.

    python -m pipeline.solve_layout +layout=table_5_2_a        (and _b, _c, _d: thesis Table 5.2)
    python -m pipeline.solve_layout +layout=table_5_2_d costmodel=shallowsim workload=azure_code

Writes to `out_dir` (default outputs/inner/<layout>_<profile>/): results.md, problem.json and
problem_thesis.json (the `solvers.inner` contract), benchmarks.png, assignment.png,
throughput_per_range.png and per_length.png (thesis Figs 5.1-5.4).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from costmodel.catalog import CONF_DIR, gpu_names, load_gpu
from pipeline import cli
from pipeline.checks import boolean, make_dir, number, optional_positive
from pipeline.cli import plain
from pipeline.errors import ConfigError
from pipeline.planning.planner import Layout, Planner, layout_from_cfg
from pipeline.records.journal import write_json
from pipeline.search.settings import planner_from_cfg
from solvers.inner import BACKENDS, InnerProblem, InnerSolution, problem_to_json


def results_table(rows: list[tuple[str, InnerProblem, InnerSolution, float]]) -> str:
    lines = [
        "| objective | status | rate (req/s) | R_P (req/s) | R_D (req/s) | D_total | evaluated (req/s) | solve ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, _, s, ev in rows:
        lines.append(
            f"| {name} | {s.status} | {s.rate_req_s:.2f} | {s.prefill_req_s:.2f} | {s.decode_req_s:.2f} | "
            f"{s.deviation:.2f} | {ev:.2f} | {s.solve_ms:.0f} |"
        )
    return "\n".join(lines)


def island_table(layout: Layout, planner: Planner, sols: dict[str, InnerSolution]) -> str:
    lines = ["| island | prefill config | decode config | role (max_rate) | role (thesis) |", "|---|---|---|---|---|"]
    for i, (g, n) in enumerate(layout.islands):
        b = planner.benchmark(g, n)
        cfg = {ph: b.config(ph) for ph in ("prefill", "decode")}
        txt = {ph: (f"tp{c['tp']} dp{c['dp']} ep{c['ep']}" if c else "does not fit") for ph, c in cfg.items()}
        lines.append(
            f"| {n} x {g} | {txt['prefill']} | {txt['decode']} | {sols['max_rate'].roles[i]} | "
            f"{sols['thesis'].roles[i]} |"
        )
    return "\n".join(lines)


def _classes(layout: Layout) -> list[tuple[tuple[str, int], list[int]]]:
    out: dict[tuple[str, int], list[int]] = {}
    for i, isl in enumerate(layout.islands):
        out.setdefault(isl, []).append(i)
    return list(out.items())


def plot_all(out: Path, layout: Layout, planner: Planner, prob: InnerProblem, sol: InnerSolution) -> None:
    mids = planner.ranges.mid
    classes = _classes(layout)
    # Fig 5.1: benchmarks per island class
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharex=True)
    for (g, n), idx in classes:
        axes[0].plot(mids, prob.prefill_req_s[idx[0]], label=f"{g} x{n}")
        axes[1].plot(mids, prob.decode_req_s[idx[0]], label=f"{g} x{n}")
    for ax, t in zip(axes, ("prefill", "decode"), strict=True):
        ax.set(title=f"{t} benchmark per island", xlabel="input length (tokens)", ylabel="req/s (whole island)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "benchmarks.png", dpi=110)
    plt.close(fig)
    # Fig 5.2 and 5.3: assignment and throughput per range, stacked by island class
    for fname, use_rate in (("assignment.png", False), ("throughput_per_range.png", True)):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharex=True)
        for ax, x, b, t in (
            (axes[0], sol.x_prefill, prob.prefill_req_s, "prefill"),
            (axes[1], sol.x_decode, prob.decode_req_s, "decode"),
        ):
            bottom = np.zeros(len(mids))
            for (g, n), idx in classes:
                val = (x[idx] * b[idx]).sum(axis=0) if use_rate else x[idx].sum(axis=0)
                if val.any():
                    ax.bar(
                        mids,
                        val,
                        width=planner.ranges.end - planner.ranges.start,
                        bottom=bottom,
                        label=f"{g} x{n}",
                        align="center",
                    )
                    bottom += val
            ylabel = "req/s" if use_rate else "island capacity (island units)"
            ax.set(
                title=f"{t}: {'throughput' if use_rate else 'assignment'} per range",
                xlabel="input length",
                ylabel=ylabel,
            )
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)


def plot_per_length(out: Path, planner: Planner, layout: Layout, prob: InnerProblem, sol: InnerSolution) -> float:
    """Fig 5.4: per-length capacity, model (range resolution) vs evaluated (every length) vs the trace."""
    ev, lengths = planner.evaluate(layout, prob, sol)
    p_len = planner.workload.pmf[lengths]
    range_of = np.searchsorted(planner.ranges.end, lengths, side="right")
    p_j = planner.ranges.p[range_of]
    exact = planner.exact_rates(layout, prob)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharex=True)
    for ax, x, mid, full, phase in (
        (axes[0], sol.x_prefill, prob.prefill_req_s, exact[0], "prefill"),
        (axes[1], sol.x_decode, prob.decode_req_s, exact[1], "decode"),
    ):
        model = (mid * x).sum(axis=0)[range_of] * p_len / np.where(p_j > 0, p_j, 1)
        # island i spends x_ij of its time on range j's mix: length s gets x_ij p(s) / Σ_{s' in j} p(s')/b_i(s')
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(full > 0, p_len / full, 0.0)
        per_range = np.array([np.bincount(range_of, weights=row, minlength=len(planner.ranges)) for row in inv])
        denom = per_range[:, range_of]
        evald = np.where(denom > 0, x[:, range_of] * p_len / np.where(denom > 0, denom, 1), 0.0).sum(axis=0)
        ax.plot(lengths, model, lw=0.8, label="model (range resolution)")
        ax.plot(lengths, evald, lw=0.8, label="evaluated (every length)")
        ax.plot(lengths, sol.rate_req_s * p_len, lw=0.8, ls="--", label="trace x Λ")
        ax.set(title=f"{phase} capacity per input length", xlabel="input length", ylabel="req/s per length")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "per_length.png", dpi=110)
    plt.close(fig)
    return ev.rate_req_s


def execute(cfg: Any) -> None:
    if "layout" not in cfg:
        layouts = sorted(p.stem for p in (CONF_DIR / "layout").glob("*.yaml"))
        raise ConfigError(f"no layout given: add +layout=NAME, one of {layouts}")
    name = str(cfg.layout.get("name", "layout"))
    layout = layout_from_cfg(plain(cfg.layout.islands), f"conf/layout/{name}.yaml")
    unknown = sorted({g for g, _ in layout.islands} - set(gpu_names()))
    if unknown:
        raise ConfigError(f"conf/layout/{name}.yaml: unknown GPU(s) {unknown}; choose from {gpu_names()}")
    planner = planner_from_cfg(
        cfg,
        {g: load_gpu(g) for g, _ in layout.islands},
        boolean(cfg.solver.kv_transfer, "solver.kv_transfer"),
        optional_positive(cfg.solver.budget_per_hour, "solver.budget_per_hour"),
    )
    workload = planner.workload
    limit = number(cfg.solver.time_limit_s, "solver.time_limit_s", low=0.001)
    out = Path(str(cfg.out_dir))
    make_dir(out, "out_dir", out)
    backend = str(cfg.solver.backend).upper()
    if backend not in BACKENDS:
        raise ConfigError(f"solver.backend={cfg.solver.backend!r}: choose from {list(BACKENDS)}")
    rows, sols = [], {}
    for objective in ("max_rate", "thesis"):
        kw = {"tau": float(cfg.solver.tau), "M": float(cfg.solver.M)} if objective == "thesis" else {}
        prob, sol = planner.solve(layout, objective, limit, backend=backend, **kw)
        fname = "problem.json" if objective == "max_rate" else "problem_thesis.json"
        write_json(out / fname, problem_to_json(prob, limit))
        ev_rate = (
            plot_per_length(out, planner, layout, prob, sol)
            if objective == "max_rate"
            else planner.evaluate(layout, prob, sol)[0].rate_req_s
        )
        if objective == "max_rate":
            plot_all(out, layout, planner, prob, sol)
        rows.append((objective, prob, sol, ev_rate))
        sols[objective] = sol
    text = (
        f"# Inner loop: {name}\n\nLayout: {layout.describe()}  \nModel {planner.model.name}, cost profile "
        f"{planner.profile.name}, workload {workload.name} ({len(planner.ranges)} ranges of {cfg.ranges.width} "
        f"tokens; mean decode {workload.mean_decode:.0f}, max {workload.max_decode})\n\n"
        f"{results_table(rows)}\n\n{island_table(layout, planner, sols)}\n"
    )
    (out / "results.md").write_text(text)
    print(text)
    print(
        f"wrote {out}/ (results.md, problem.json, problem_thesis.json, benchmarks.png, assignment.png, "
        "throughput_per_range.png, per_length.png)"
    )


if __name__ == "__main__":
    cli.main("inner", execute)

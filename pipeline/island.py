"""Print one island's chosen configurations and its throughput per input length.

python -m pipeline.island gpu=H200 size=16 model=deepseek_v3
python -m pipeline.island gpu=H20 size=32 costmodel=shallowsim slo.tpot_ms=50 rows=0
"""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.island_bench import IslandBenchmark, PhaseTable, benchmark_island
from pipeline import cli
from pipeline.checks import positive_int
from pipeline.cli import choice, plain
from pipeline.errors import ConfigError
from pipeline.planning.config import (
    calibrated_for,
    cost_settings_from_cfg,
    fallback_note,
    gpu_from_cfg,
    model_from_cfg,
)
from pipeline.planning.workload import Ranges, Workload, ranges_from_cfg, workload_from_cfg


def island_report(bench: IslandBenchmark, workload: Workload, ranges: Ranges, rows: int, dense: bool = False) -> str:
    """A person-readable report: chosen configs, runner-up configs, throughput per length (`dense`: a dense model's,
    whose configurations are replicas of tp GPUs, with no expert-parallel group)."""
    out = [
        f"Island: {bench.size} x {bench.gpu} serving {bench.model} (cost profile {bench.profile})",
        f"Workload: {workload.name}: {len(ranges)} ranges of input length, mean input "
        f"{workload.mean_input:.0f} tokens, decode mean {workload.mean_decode:.0f} / max {workload.max_decode}",
        "",
    ]
    for phase in ("prefill", "decode", "aggregated"):
        table = bench.table(phase)
        if table is not None:
            out += _phase_lines(phase, table, dense)
    out.append("")
    out.append(_length_table(bench, ranges, rows, workload.mean_decode))
    return "\n".join(out)


def _phase_lines(phase: str, t: PhaseTable, dense: bool = False) -> list[str]:
    if t.chosen < 0:
        return [f"{phase.capitalize():8s} infeasible: {t.reason}"]
    order = np.argsort(t.deviation, kind="stable")
    group = f"{int(t.dp[t.chosen])} replicas" if dense else f"ep={int(t.ep[t.chosen])}"
    head = (
        f"{phase.capitalize():8s} tp={int(t.tp[t.chosen])} dp={int(t.dp[t.chosen])} "
        f"{group}  weighted deviation from per-length best "
        f"{100 * t.deviation[t.chosen]:.1f}%  ({len(t.tp)} configurations)"
    )
    others = ", ".join(f"tp={int(t.tp[i])}/dp={int(t.dp[i])}: {100 * t.deviation[i]:.1f}%" for i in order[1:4])
    return [head] + ([f"{'':9s}next best: {others}"] if others else [])


def _length_table(bench: IslandBenchmark, ranges: Ranges, rows: int, mean_decode: float) -> str:
    n = len(ranges)
    groups = np.array_split(np.arange(n), min(rows, n)) if rows else [np.array([i]) for i in range(n)]
    pre, dec = bench.prefill, bench.decode
    header = (
        f"{'input tokens':>13s} {'share':>6s} {'prefill req/s':>14s} {'prefill ms':>11s} "
        f"{'decode req/s':>13s} {'batch':>6s} {'step ms':>8s} {'out tok/s':>10s}"
        + (f" {'aggregated req/s':>17s} {'TPOT ms':>8s}" if bench.aggregated is not None else "")
    )
    lines = [header, "-" * len(header)]
    for g in groups:
        i = g[len(g) // 2]  # show the middle range of the group
        p_share = ranges.p[g].sum()
        rp = bench.prefill_req_s[i]
        rd = bench.decode_req_s[i]
        tp_ms = pre.time_ms[pre.chosen, i] if pre.chosen >= 0 else np.nan
        batch = dec.batch[dec.chosen, i] if dec.chosen >= 0 else 0
        step = dec.time_ms[dec.chosen, i] if dec.chosen >= 0 else np.nan
        span = f"{ranges.start[g[0]]}-{ranges.end[g[-1]] - 1}"
        line = (f"{span:>13s} {100 * p_share:5.1f}% {rp:14.1f} {tp_ms:11.1f} {rd:13.1f} "
                f"{batch:6.0f} {step:8.1f} {rd * mean_decode:10.0f}")  # fmt: skip
        agg = bench.aggregated
        if agg is not None:
            tpot = agg.time_ms[agg.chosen, i] if agg.chosen >= 0 else np.nan
            line += f" {bench.aggregated_req_s[i]:17.1f} {tpot:8.1f}"
        lines.append(line)
    if rows and rows < n:
        lines.append(f"(each row: the middle range of ~{n // rows} merged ranges; rows=0 prints all {n})")
    return "\n".join(lines)


def execute(cfg: Any) -> None:
    gpu = gpu_from_cfg(choice("gpu"), cfg.gpu)
    model = model_from_cfg(choice("model"), cfg.model)
    cost = cost_settings_from_cfg(cfg, model.name)
    calibrated_for(cost, model)
    if note := fallback_note(cfg.costmodel, model.name):
        print(f"[island] note: {note}", flush=True)
    workload = workload_from_cfg(choice("workload"), plain(cfg.workload))
    ranges = ranges_from_cfg(workload, cfg.ranges.width, most=cfg.ranges.get("max"))
    size = positive_int(cfg.size, "size")
    rows = cfg.rows
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ConfigError(f"`rows >= 0` (whole number; 0 = every range) must hold, got rows={rows!r}")
    bench = benchmark_island(
        gpu,
        size,
        model,
        ranges.benchmark_lengths(cost.slo.any),
        ranges.p,
        workload.mean_decode,
        workload.max_decode,
        cost=cost,
        output_pmf=workload.output_pmf,
    )
    if bench.prefill.chosen < 0 and bench.decode.chosen < 0:
        raise ConfigError(bench.decode.reason)
    print(island_report(bench, workload, ranges, rows, dense=model.dense))


if __name__ == "__main__":
    cli.main("island", execute)

"""Check the `shallowsim` profile against outputs of the original program.

    python -m costmodel.reference FILE.csv [--model deepseek_v3] [--tol 1e-9]

FILE.csv has the columns of `reference/shallowsim_reference.csv` (phase, metric, gpu, seq_len,
decode_len, tp, dp, ep, batch_size, ..., output_value). Every row is evaluated with this
package's functions under `CostProfile.shallowsim()`; the worst relative error per metric is
printed and, last, `rows=<N> max_rel_err=<x>`. Exit 0 only if every row is within --tol.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from costmodel.catalog import CatalogError, load_gpu, load_model
from costmodel.cli import ArgumentParser, run
from costmodel.formulas import DecodeRun, decode_parts, max_batch, prefill_parts
from costmodel.profile import CostProfile
from costmodel.specs import Model

SHALLOWSIM = CostProfile.shallowsim()
# The original program's decode search grid (spec 4.12).
SEARCH_EP = (8, 16, 36, 72, 144, 320)
SEARCH_TP = (1, 4, 8)

PREFILL_KEYS = {
    "prefill_total_Sum": "Sum",
    "prefill_total_Compute": "Compute",
    "prefill_total_Comm": "Comm",
    **{
        f"prefill_per_layer_{k}": k
        for k in (
            "MLA",
            "TP_MLA",
            "DenseMLP",
            "Shared_Expert",
            "Routed_Expert",
            "Dispatch",
            "Combine",
            "Overlap1",
            "Overlap2",
        )
    },
}


class RowError(ValueError):
    pass


def _num(row: dict[str, str], col: str, line: int) -> float:
    text = (row.get(col) or "").strip()
    try:
        return float(text)
    except ValueError:
        raise RowError(f"line {line}: column `{col}` must be a number, got {text!r}") from None


def _flag(row: dict[str, str], col: str) -> bool:
    return (row.get(col) or "").strip().lower() in ("true", "1", "yes")


def _prefill(row: dict[str, str], line: int, model: Model) -> float:
    key = PREFILL_KEYS[row["metric"]]
    parts = prefill_parts(
        load_gpu(row["gpu"]),
        model,
        _num(row, "seq_len", line),
        _num(row, "tp", line),
        _num(row, "dp", line),
        cache_hit=_num(row, "kv_cache_rate", line),
        profile=SHALLOWSIM,
    )
    return float(parts[key])


def _decode(row: dict[str, str], line: int, model: Model) -> float:
    metric = row["metric"].removeprefix("decode_")
    bs = _num(row, "batch_size", line)
    parts = decode_parts(
        load_gpu(row["gpu"]),
        model,
        _num(row, "seq_len", line),
        bs,
        _num(row, "tp", line),
        _num(row, "ep", line),
        profile=SHALLOWSIM,
        run=DecodeRun(fp8_combine=_flag(row, "fp8_combine")),
    )
    if metric == "TPS":
        return 1000.0 / float(parts["TPOT"])
    if metric == "Total":
        return 1000.0 / float(parts["TPOT"]) * bs
    return float(parts[metric])


def _max_batch(row: dict[str, str], line: int, model: Model) -> float:
    routed = _num(row, "expert_num", line) - model.n_shared_experts
    return float(
        max_batch(
            load_gpu(row["gpu"]),
            model,
            _num(row, "seq_len", line),
            _num(row, "decode_len", line),
            _num(row, "tp", line),
            routed,
            profile=SHALLOWSIM,
        )
    )


def _search_best(row: dict[str, str], line: int, model: Model) -> float:
    """The original's argmax of Total over (tp, EP) at one batch size, memory filter applied."""
    gpu = load_gpu(row["gpu"])
    s, dl, bs = _num(row, "seq_len", line), _num(row, "decode_len", line), _num(row, "batch_size", line)
    ep = np.array(SEARCH_EP, dtype=float)[:, None]
    tp = np.array(SEARCH_TP, dtype=float)[None, :]
    gx = np.ceil(model.n_routed_experts / ep)
    fits = bs <= max_batch(gpu, model, s, dl, tp, gx, profile=SHALLOWSIM)
    tpot = decode_parts(
        gpu, model, s, bs, tp, ep, profile=SHALLOWSIM, run=DecodeRun(fp8_combine=_flag(row, "fp8_combine"))
    )["TPOT"]
    total = np.where(fits, 1000.0 / tpot * bs, -np.inf)
    if not np.isfinite(total.max()):
        raise RowError(f"line {line}: no (tp, EP) point passes the memory filter")
    return float(total.max())


def evaluator(metric: str) -> Callable[[dict[str, str], int, Model], float]:
    if metric in PREFILL_KEYS:
        return _prefill
    if metric == "max_batch_size":
        return _max_batch
    if metric == "search_best_Total":
        return _search_best
    if metric.startswith("decode_"):
        return _decode
    raise RowError(f"unknown metric {metric!r}")


def check(path: Path, model: Model) -> tuple[dict[str, float], int]:
    """Worst relative error per metric over the file, and the number of rows."""
    worst: dict[str, float] = {}
    rows = 0
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        needed = {"metric", "gpu", "output_value"}
        if not reader.fieldnames or not needed <= set(reader.fieldnames):
            raise RowError(
                f"{path}: expected columns {sorted(needed)} (the reference CSV format), got {reader.fieldnames}"
            )
        for line, row in enumerate(reader, start=2):
            want = _num(row, "output_value", line)
            got = evaluator(row["metric"])(row, line, model)
            err = abs(got - want) / max(abs(want), 1e-300)
            worst[row["metric"]] = max(worst.get(row["metric"], 0.0), err)
            rows += 1
    return worst, rows


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m costmodel.reference", description=__doc__.split("\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--model", default="deepseek_v3")
    ap.add_argument("--tol", type=float, default=1e-9)
    args = ap.parse_args(argv)
    try:
        if not args.csv.is_file():
            raise RowError(f"{args.csv}: no such file")
        worst, rows = check(args.csv, load_model(args.model))
    except (RowError, CatalogError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for metric, err in sorted(worst.items()):
        print(f"{metric:34s} max_rel_err={err:.3e}")
    overall = max(worst.values(), default=0.0)
    print(f"rows={rows} max_rel_err={overall:.3e}")
    return 0 if rows and overall <= args.tol else 1


if __name__ == "__main__":
    run(main)

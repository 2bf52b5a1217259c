"""Turn a serving engine's own benchmark output into calibration measurements (CSV rows).

    python -m costmodel.readers sglang-one-batch result.jsonl --gpu H20 --tp 8 > mine.csv
    python -m costmodel.calibrate conf/calibration/published.csv mine.csv --out mine.yaml

`sglang-one-batch` reads the JSON lines `python -m sglang.benchmark.one_batch --result-filename F`
appends (SGLang 0.5.x: `batch_size`, `input_len`, `output_len`, `prefill_latency` and
`median_decode_latency` in seconds, one line per batch size x input length). The benchmark runs
one engine of `--tp-size` GPUs and does not record the GPU or the TP size, so they are given
here. Each line gives two measurements: the prefill of `batch_size` prompts of `input_len`
tokens, and the median decode step of `batch_size` sequences, whose context is `input_len` plus
half the output (the median step's).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

from costmodel.catalog import CatalogError, gpu_names, load_model, model_names
from costmodel.cli import ArgumentParser, UserError, run
from costmodel.measurements import MeasurementError, read_text

HEADER = ["component", "gpu", "shape", "value", "unit", "source"]


def sglang_one_batch(path: Path, gpu: str, tp: int, model: str = "deepseek_v3") -> list[list[str]]:
    """Measurement rows from `sglang.benchmark.one_batch`'s result file."""
    if gpu not in gpu_names():
        raise UserError(f"--gpu {gpu!r} is not in the catalogue; choose from {gpu_names()}")
    if model not in model_names():
        raise UserError(f"--model {model!r} is not in the catalogue; choose from {model_names()}")
    if not path.is_file():
        raise MeasurementError(f"{path}: no such file (sglang.benchmark.one_batch --result-filename)")
    text = read_text(path, "the JSON lines sglang.benchmark.one_batch --result-filename wrote")
    rows: list[list[str]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError as err:
            raise MeasurementError(f"{where}: not a JSON line ({err.msg})") from None
        need = ("batch_size", "input_len", "output_len", "prefill_latency")
        missing = [k for k in need if k not in rec]
        if missing:
            raise MeasurementError(f"{where}: lacks {missing}: is this sglang.benchmark.one_batch's result file?")
        for k in (*need, "median_decode_latency"):
            v = rec.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v <= 0):  # fmt: skip
                raise MeasurementError(f"{where}: {k}={v!r} must be a positive number")
        for k in ("batch_size", "input_len", "output_len"):
            if rec[k] != int(rec[k]):
                raise MeasurementError(f"{where}: {k}={rec[k]!r} must be a whole number (it counts prompts or tokens)")
        b, s, o = int(rec["batch_size"]), int(rec["input_len"]), int(rec["output_len"])
        src = f"sglang.benchmark.one_batch {rec.get('run_name', '')} ({path.name}:{lineno})".replace("  ", " ")
        rows.append(["prefill_step", gpu, f"batch={b} input_len={s} tp={tp} model={model}",
                     repr(float(rec["prefill_latency"])), "s", src])  # fmt: skip
        if rec.get("median_decode_latency") is not None:
            ctx = s + max(o // 2, 1)
            rows.append(["decode_step", gpu, f"batch={b} context={ctx} tp={tp} model={model}",
                         repr(float(rec["median_decode_latency"])), "s", src])  # fmt: skip
    if not rows:
        raise MeasurementError(f"{path}: no result lines")
    return rows


READERS = {"sglang-one-batch": sglang_one_batch}


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m costmodel.readers", description=__doc__.split("\n")[0])
    ap.add_argument("format", choices=sorted(READERS))
    ap.add_argument("result", type=Path, help="the benchmark's result file")
    ap.add_argument("--gpu", required=True, help="the catalogue name of the GPUs it ran on")
    ap.add_argument("--tp", type=int, required=True, help="the engine's --tp-size")
    ap.add_argument("--model", default="deepseek_v3", help="the catalogue name of the model it served")
    args = ap.parse_args(argv)
    if args.tp < 1:
        raise UserError(f"--tp must be >= 1, got {args.tp}")
    heads = load_model(args.model).n_heads if args.model in model_names() else 0
    if heads and heads % args.tp:
        raise UserError(f"--tp {args.tp} does not divide {args.model}'s {heads} attention heads: no engine runs that "
                        "tensor-parallel size; give the engine's --tp-size")  # fmt: skip
    rows = READERS[args.format](args.result, args.gpu, args.tp, args.model)
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(HEADER)
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    run(main, (CatalogError,))

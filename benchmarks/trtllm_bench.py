"""The cost model against TensorRT-LLM's published Llama-70B serving: a dense model's check, never fitted.

    python benchmarks/trtllm_bench.py [--requests N] [--gpu H200,L40S] [--extra costmodel=corrected ...]

Two tables of NVIDIA's TensorRT-LLM performance overview (docs/source/.../perf-overview.md, conf/measured/README.md
gives the commits), Llama-3.1-70B and Llama-3.3-70B (one architecture: `llama_3_3_70b`):

- offline maximum throughput (conf/measured/trtllm_llama70b.csv, 140 rows: H200, H100, L40S in FP8 and A100 in
  FP16, TP 1-8, fixed input and output lengths from 128/128 to 32768/1024): every request queued at once,
  `trtllm-bench throughput`, output tokens/s. Simulated as one aggregated engine of the row's TP (simulator.aggregated:
  prompts chunked at `CHUNK` tokens a step beside the decoding sequences, as TensorRT-LLM's in-flight batching with
  chunked context runs them), admitting what its KV cache holds up to `MAX_BATCH` sequences (the benchmark's runtime
  batch limit), its KV cache sized as TensorRT-LLM sizes it (`kv_cache_free_gpu_mem_fraction` 0.95 of the memory the
  weights leave), `--requests` of the row's requests (its own count where smaller);
- online serving (conf/measured/trtllm_llama70b_online.csv, 36 rows: H100 and H200, TP 4, BF16, 500 requests at 2-32
  req/s and all at once): the same engine under Poisson arrivals at the row's rate; mean TTFT, mean inter-token
  latency (the simulator's TPOT) and output tokens/s.

Printed per table, GPU and metric: rows, median |error| (exp(median |ln(predicted / measured)|) - 1), the share within
+-15 % and the median of predicted / measured. TensorRT-LLM is not the engine the launch files run (SGLang, vLLM): its
kernels and scheduler are its own, and what this measures is how far the cost model's step times and memory carry to
another engine's serving of the same model on the same GPUs. Nothing here is fitted.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from common import context

from costmodel.catalog import load_gpu
from costmodel.formulas import weight_bytes_per_gpu
from costmodel.settings import MAX_MEM_FRACTION
from simulator.aggregated import AggregatedEngine, AggregatedSimulation
from simulator.metrics import benchmark_metrics
from simulator.requests import Requests
from simulator.timing import decode_timing, prefill_timing

MEASURED = Path(__file__).resolve().parents[1] / "conf" / "measured"
OFFLINE, ONLINE = MEASURED / "trtllm_llama70b.csv", MEASURED / "trtllm_llama70b_online.csv"
CHUNK = 8192  # prompt tokens a step: trtllm-bench's runtime max tokens (its printout: "Max Runtime Tokens: 8192")
MAX_BATCH = 4096  # sequences an engine runs at once: trtllm-bench's runtime batch limit ("Max Runtime Batch Size")
KV_FREE_FRACTION = 0.95  # --kv_cache_free_gpu_mem_fraction: the share of what the weights leave the KV cache takes
WITHIN = math.log(1.15)


def engine(row: dict, model: object, cost: object) -> tuple[AggregatedEngine, int]:
    """The row's engine (one of `tp` GPUs) and the sequences it runs at once; BF16 and FP16 rows priced without the
    GPU's FP8 rate (weights, KV cache and GEMMs in 16 bits)."""
    gpu = load_gpu(row["gpu"])
    if row["precision"] in ("bf16", "fp16"):
        gpu = dataclasses.replace(gpu, tflops_fp8=0.0)
    tp, isl, osl = int(row["tp"]), int(row["isl"]), int(row["osl"])
    weights = float(weight_bytes_per_gpu(gpu, model, np.array(float(tp)), np.array(0.0), cost.profile))
    memory = gpu.mem_gb * 2.0**30
    fraction = min((weights + KV_FREE_FRACTION * (memory - weights)) / memory, MAX_MEM_FRACTION)
    cost = dataclasses.replace(cost, engine=dataclasses.replace(cost.engine, mem_fraction=fraction))
    dec = decode_timing(gpu, model, tp, tp, MAX_BATCH, isl + osl, cost)
    seqs = min(dec.kv_tokens // (isl + osl), MAX_BATCH)
    dec = dataclasses.replace(dec, max_seqs=max(seqs, 1))
    return AggregatedEngine(0, dec, prefill_timing(gpu, model, tp, 1, isl, cost), CHUNK), seqs


def simulate(row: dict, model: object, cost: object, n: int, rate: float | None, seed: int = 0) -> dict[str, float]:
    """`n` requests of the row's lengths, all at once (`rate` None) or Poisson at `rate` req/s, through its engine."""
    e, seqs = engine(row, model, cost)
    if seqs < 1:
        return {}
    rng = np.random.default_rng(seed)
    arrival = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1000.0 / rate, n))
    r = Requests(arrival, np.full(n, int(row["isl"])), np.full(n, int(row["osl"])))
    AggregatedSimulation(r, [e]).run()
    return benchmark_metrics(r, int(row["tp"]))


def table(errors: dict[tuple[str, str], list[float]], title: str) -> None:
    print(f"\n### {title}\n")
    print("| GPU | metric | rows | median abs error | within 15 % | median pred / meas |")
    print("|---|---|---:|---:|---:|---:|")
    metrics = sorted({m for _, m in errors})
    for gpu in [*sorted({g for g, _ in errors}), "all"]:
        for m in metrics:
            e = np.array([x for (g, mm), xs in errors.items() if mm == m and gpu in (g, "all") for x in xs])
            if len(e):
                print(f"| {gpu} | {m} | {len(e)} | {100 * (math.exp(np.median(np.abs(e))) - 1):.0f} % | "
                      f"{100 * np.mean(np.abs(e) <= WITHIN):.0f} % | {math.exp(np.median(e)):.2f} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000, help="at most this many of an offline row's requests")
    ap.add_argument("--gpu", default="", help="only these GPUs, e.g. H200,L40S")
    ap.add_argument("--extra", nargs="*", default=[], help="cost-model overrides, e.g. costmodel=corrected")
    ap.add_argument("--worst", type=int, default=6, help="worst rows listed per table")
    args = ap.parse_args()
    t0 = time.perf_counter()
    _, ctx = context(["+inventory=tiny_homo", "model=llama_3_3_70b", "costmodel=calibrated", *args.extra])
    model, cost = ctx.planner.model, ctx.planner.cost
    cal = cost.profile.calibration
    print(f"TensorRT-LLM's Llama-70B: cost model {cost.profile.name} ({'calibrated: ' + cal.name if cal else 'none'}), "
          f"{model.name}")  # fmt: skip
    keep = set(args.gpu.split(",")) if args.gpu else None
    for path, online in ((OFFLINE, False), (ONLINE, True)):
        rows = [r for r in csv.DictReader(path.open()) if keep is None or r["gpu"] in keep]
        errors: dict[tuple[str, str], list[float]] = defaultdict(list)
        worst, refused = [], []
        for row in rows:
            tp = int(row["tp"])
            if online:
                rate = None if row["qps"] == "INF" else float(row["qps"])
                got = simulate(row, model, cost, int(row["requests"]), rate)
                pairs = {"output tok/s/GPU": (got.get("output_tput_per_gpu"), float(row["output_tok_s"]) / tp),
                         "mean TTFT": (got.get("mean_ttft"), float(row["mean_ttft_ms"]) / 1e3),
                         "mean ITL (TPOT)": (got.get("mean_tpot"), float(row["mean_itl_ms"]) / 1e3)}  # fmt: skip
            else:
                got = simulate(row, model, cost, min(int(row["requests"]), args.requests), None)
                pairs = {"output tok/s/GPU": (got.get("output_tput_per_gpu"), float(row["output_tok_s"]) / tp)}
            if not got:
                refused.append(row)
                continue
            for m, (p, meas) in pairs.items():
                errors[(row["gpu"], m)].append(e := math.log(p / meas))
                worst.append((abs(e), e, m, row))
        title = "online serving (TensorRT-LLM 0.14.0, BF16)" if online else "offline maximum throughput"
        table(errors, f"{title}: {len(rows)} rows, {len(refused)} the model cannot run (no KV room for one request)")
        print(f"\nWorst {args.worst} (predicted / measured):\n")
        for _, e, m, row in sorted(worst, key=lambda x: -x[0])[: args.worst]:
            print(f"- {row['gpu']} TP{row['tp']} {row['precision']} {row['isl']}/{row['osl']}"
                  f"{' at ' + row['qps'] + ' req/s' if online else ''} (release {row['release']}): {m} "
                  f"{math.exp(e):.2f}")  # fmt: skip
    print(f"\n{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()

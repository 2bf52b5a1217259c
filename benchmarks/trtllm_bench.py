"""The cost model against TensorRT-LLM's published serving of Llama-70B (dense), Qwen3-235B, GPT-OSS-120B and
DeepSeek-R1: a check.

    python benchmarks/trtllm_bench.py [--requests N] [--model llama_3_3_70b] [--gpu H200,L40S] [--extra ...]
    python benchmarks/trtllm_bench.py --band 16 [--band-rows 40]

Tables of NVIDIA's TensorRT-LLM performance overview (docs/source/.../perf-overview.md; conf/measured/README.md gives
the commits), each row's model one of the catalogue's (Llama-3.1-70B and Llama-3.3-70B are one architecture,
`llama_3_3_70b`):

- offline maximum throughput (conf/measured/trtllm_offline.csv, 201 rows): Llama-70B on H200, H100, L40S in FP8 and
  A100 in FP16, TP 1-8; Qwen3-235B-A22B in FP8 on H200 and H100, TP 8 (its experts split by TP) and attention DP with
  EP 4 and 8; GPT-OSS-120B (its MXFP4 experts) on H200, H100, B200 and GB200; DeepSeek-R1 with attention DP on 4
  B200 or GB200 (FP4 experts) and 8 H200 (FP8); fixed input and output lengths from
  128/128 to 1024/32768; every request queued at once (`trtllm-bench throughput`), output tokens/s. Simulated as one
  aggregated engine of the row's GPUs (simulator.aggregated: prompts chunked at `CHUNK` tokens a step per attention
  rank beside the decoding sequences, as TensorRT-LLM's in-flight batching with chunked context runs them), its
  attention ranks and experts as the row ran them, admitting what its KV cache holds up to `MAX_BATCH` sequences a
  rank (the benchmark's runtime batch limit; an MXFP4 checkpoint, which trtllm-bench does not tune, at its defaults:
  2,048 a rank and a step of max(8,192, prompt + 2,048) tokens), its KV cache sized as TensorRT-LLM sizes it
  (`kv_cache_free_gpu_mem_fraction` 0.95 of the memory the weights leave; every layer at the sequence's whole
  length, a sliding layer's too, as its KV cache manager kept them), `--requests` of the row's requests (its own
  count where smaller);
- online serving (conf/measured/trtllm_online.csv, 36 rows of Llama-70B: H100 and H200, TP 4, BF16, 500 requests at
  2-32 req/s and all at once): the same engine under Poisson arrivals at the row's rate; mean TTFT, mean inter-token
  latency (the simulator's TPOT) and output tokens/s.

Each row is priced by the default cost model of its model (the commands' `costmodel=serving`: DeepSeek's fit to
InferenceX for DeepSeek-R1, the kernel tables for the others, `costmodel.fallback`; `--extra costmodel=calibrated`
prices every row with the kernel tables). Printed per table, model, GPU and metric: rows, median |error|
(exp(median |ln(predicted / measured)|) - 1), the share within +-15 % and the median of predicted / measured.
`--band N`: whether the range a plan of the row's model states (N draws of its calibration, widened on the row's GPU
as where a plan extrapolates, or as for a model no fit measured) holds the measured throughput. TensorRT-LLM is
not the engine the launch files run (SGLang, vLLM): its kernels and scheduler are its own, and what this measures is
how far the cost model's step times and memory carry to another engine's serving of the same model on the same GPUs.
Nothing here is fitted.
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
from costmodel.settings import MAX_MEM_FRACTION, CostSettings
from costmodel.specs import Model
from simulator.aggregated import AggregatedEngine, AggregatedSimulation
from simulator.metrics import benchmark_metrics
from simulator.requests import Requests
from simulator.timing import KV_SEQUENCE_TOKENS, decode_timing, prefill_timing

MEASURED = Path(__file__).resolve().parents[1] / "conf" / "measured"
OFFLINE, ONLINE = MEASURED / "trtllm_offline.csv", MEASURED / "trtllm_online.csv"
CHUNK = 8192  # prompt tokens a step: trtllm-bench's runtime max tokens (its printout: "Max Runtime Tokens: 8192")
MAX_BATCH = 4096  # sequences a rank runs at once: trtllm-bench's runtime batch limit ("Max Runtime Batch Size")
KV_FREE_FRACTION = 0.95  # --kv_cache_free_gpu_mem_fraction: the share of what the weights leave the KV cache takes
# trtllm-bench sizes a run's batch and step from its memory estimate only for the quantisations it tunes (NVFP4, FP8,
# FP8 block scales, none: tensorrt_llm/bench/build/build.py `TUNED_QUANTS`); an MXFP4 checkpoint (GPT-OSS, whose
# quant_algo is W4A8_MXFP4_MXFP8 on Blackwell and W4A16_MXFP4 on Hopper: tensorrt_llm/_torch/model_config.py) runs at
# the defaults (tensorrt_llm/builder.py `BuildConfig`): 2,048 sequences a rank, and 8,192 tokens a step raised to the
# longest prompt plus the batch, since its prompts are not chunked (bench/benchmark/utils/general.py `get_settings`)
UNTUNED = ("mxfp4",)
DEFAULT_BATCH, DEFAULT_TOKENS = 2048, 8192
WITHIN = math.log(1.15)


def engine(row: dict, model: Model, cost: CostSettings, *, max_batch: int = MAX_BATCH,
           chunk: int = CHUNK) -> tuple[AggregatedEngine, int]:  # fmt: skip
    """The row's engine and the sequences it runs at once: `tp` GPUs, attention split over them or in data parallel
    (`dp_attention`: ranks of one GPU), routed experts over an EP group of `ep` or split by TP over the engine (`ep`
    1); BF16 and FP16 rows priced without the GPU's FP8 rate (weights, KV cache and GEMMs in 16 bits); the KV cache
    in the row's `kv_dtype` where the overview's options name it (else the GPU's format, `auto`). `max_batch` and
    `chunk`: the runtime's sequences a rank and prompt tokens a rank a step (trtllm-bench's tuned values by default;
    a launch's `max_batch_size` and `max_num_tokens` where it sets them)."""
    gpu = load_gpu(row["gpu"])
    if row["precision"] in ("bf16", "fp16"):
        gpu = dataclasses.replace(gpu, tflops_fp8=0.0)
    size, ep, isl, osl = int(row["tp"]), int(row["ep"]), int(row["isl"]), int(row["osl"])
    attn_tp = 1 if row["dp_attention"] == "true" else size
    ranks = size // attn_tp
    moe_tp = not model.dense and ep == 1 and size > 1  # TensorRT-LLM's MoE without EP: every expert split by TP
    routed = model.n_routed_experts / size if moe_tp else math.ceil(model.n_routed_experts / ep)
    weights = float(weight_bytes_per_gpu(gpu, model, np.array(float(attn_tp)), np.array(routed), cost.profile))
    memory = gpu.mem_gb * 2.0**30
    fraction = min((weights + KV_FREE_FRACTION * (memory - weights)) / memory, MAX_MEM_FRACTION)
    kv = row.get("kv_dtype") or cost.engine.kv_dtype  # the KV format its options set, where the overview gives them
    cost = dataclasses.replace(cost, engine=dataclasses.replace(cost.engine, mem_fraction=fraction, kv_dtype=kv))
    batch, chunk = (DEFAULT_BATCH, max(DEFAULT_TOKENS, isl + DEFAULT_BATCH)) if row["precision"] in UNTUNED else (
        max_batch, chunk)
    dec = decode_timing(gpu, model, attn_tp, size, batch, isl + osl, cost, moe_tp=moe_tp)
    # its KV cache: TensorRT-LLM of these releases keeps every layer's KV at the whole sequence's length, a sliding
    # layer's too (one attention window, max_seq_len, unless kv_cache_config.max_attention_window names the layers'
    # windows, which the overview's options do not: _torch/pyexecutor/resource_manager.py `KVCacheManager`), where
    # `kv_tokens` counts sequences of KV_SEQUENCE_TOKENS as the model keeps them (a sliding layer its window)
    kv_tokens = dec.kv_tokens * float(model.held(float(KV_SEQUENCE_TOKENS))) / KV_SEQUENCE_TOKENS
    seqs = min(int(kv_tokens // (isl + osl)), batch * ranks)
    dec = dataclasses.replace(dec, max_seqs=max(seqs, 1))
    pre = prefill_timing(gpu, model, attn_tp, ranks, isl, cost, ranks=ranks, chunk=chunk * ranks)
    return AggregatedEngine(0, dec, pre, chunk * ranks), seqs


def simulate(row: dict, model: Model, cost: CostSettings, n: int, rate: float | None, seed: int = 0,
             ) -> dict[str, float]:  # fmt: skip
    """`n` requests of the row's lengths, all at once (`rate` None) or Poisson at `rate` req/s, through its engine."""
    e, seqs = engine(row, model, cost)
    if seqs < 1:
        return {}
    rng = np.random.default_rng(seed)
    arrival = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1000.0 / rate, n))
    r = Requests(arrival, np.full(n, int(row["isl"])), np.full(n, int(row["osl"])))
    AggregatedSimulation(r, [e]).run()
    return benchmark_metrics(r, int(row["tp"]))


def table(errors: dict[tuple[str, str, str], list[float]], title: str) -> None:
    print(f"\n### {title}\n")
    print("| model | GPU | metric | rows | median abs error | within 15 % | median pred / meas |")
    print("|---|---|---|---:|---:|---:|---:|")
    for model in sorted({m for m, _, _ in errors}):
        mine = {k: v for k, v in errors.items() if k[0] == model}
        for gpu in [*sorted({g for _, g, _ in mine}), "all"]:
            for metric in sorted({x for _, _, x in mine}):
                e = np.array([x for (_, g, m), xs in mine.items() if m == metric and gpu in (g, "all") for x in xs])
                if len(e):
                    median = 100 * (math.exp(np.median(np.abs(e))) - 1)
                    print(f"| {model} | {gpu} | {metric} | {len(e)} | {median:.0f} % "
                          f"| {100 * np.mean(np.abs(e) <= WITHIN):.0f} % | {math.exp(np.median(e)):.2f} |")  # fmt: skip


def _rows(path: Path, gpus: set[str] | None, models: set[str] | None) -> list[dict]:
    """The table's rows, of these GPUs and models only (None: all)."""
    return [r for r in csv.DictReader(path.open())
            if (gpus is None or r["gpu"] in gpus) and (models is None or r["model"] in models)]  # fmt: skip


def coverage(rows: list[dict], priced: dict[str, tuple[Model, CostSettings]], draws: int, n: int, seed: int = 0,
             ) -> None:  # fmt: skip
    """The range a plan of each row's model carries, against the row: the row simulated under `draws` draws of the
    calibration as a plan's band draws it for a model no fit measured (`Calibration.unmeasured` on the row's GPU,
    pipeline/search/steps/band.py), `n` of its requests; the share of rows whose measured output tokens/s/GPU lies
    within the draws' 10th-90th percentile, and how wide that range is, per model and GPU."""
    if not rows:
        return
    inside: dict[tuple[str, str], list[bool]] = defaultdict(list)
    width: dict[tuple[str, str], list[float]] = defaultdict(list)  # the range's 90th over its 10th percentile
    t0 = time.perf_counter()
    for row in rows:
        model, cost = priced[row["model"]]
        cal = cost.profile.calibration
        if cal is None or not cal.uncertain:
            print("\n(no band: the cost model has no calibration with an uncertainty)")
            return
        # a model the calibration measured: its range where a plan extrapolates (these rows' shapes and loads are
        # none InferenceX measured); another model: an unmeasured model's
        wide = cal.widened([row["gpu"]]) if model.name in cal.models else cal.unmeasured(model.name, [row["gpu"]])
        got = [simulate(row, model, dataclasses.replace(cost, profile=cost.profile.calibrated(c)), n, None)
               for c in wide.draws(draws, seed)]  # fmt: skip
        rates = [m.get("output_tput_per_gpu", 0.0) for m in got]
        lo, hi = np.quantile(rates, [0.1, 0.9])
        inside[(row["model"], row["gpu"])].append(bool(lo <= float(row["output_tok_s"]) / int(row["tp"]) <= hi))
        width[(row["model"], row["gpu"])].append(hi / lo if lo > 0 else math.inf)
    print(f"\n### The range's 10th-90th percentile against measured output tokens/s/GPU ({draws} draws a row, "
          f"{len(rows)} offline rows, {time.perf_counter() - t0:.0f} s)\n")  # fmt: skip
    print("| model | GPU | rows | inside the range | median 90th / 10th |\n|---|---|---:|---:|---:|")
    for key in sorted(inside):
        print(f"| {key[0]} | {key[1]} | {len(inside[key])} | {100 * np.mean(inside[key]):.0f} % | "
              f"{np.median(width[key]):.1f} |")  # fmt: skip
    every = [x for v in inside.values() for x in v]
    wide = [x for v in width.values() for x in v]
    print(f"| all | | {len(every)} | {100 * np.mean(every):.0f} % | {np.median(wide):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000, help="at most this many of an offline row's requests")
    ap.add_argument("--model", default="", help="only these catalogue models, e.g. llama_3_3_70b,gpt_oss_120b")
    ap.add_argument("--gpu", default="", help="only these GPUs, e.g. H200,L40S")
    ap.add_argument("--extra", nargs="*", default=[], help="cost-model overrides, e.g. costmodel=corrected")
    ap.add_argument("--worst", type=int, default=6, help="worst rows listed per table")
    ap.add_argument("--band", type=int, default=0, metavar="N",
                    help="also simulate offline rows under N draws of the range a plan of their model carries and "
                         "print how many measurements it holds")  # fmt: skip
    ap.add_argument("--band-rows", type=int, default=40, metavar="N",
                    help="--band over N offline rows evenly spaced (0: every row)")
    ap.add_argument("--band-requests", type=int, default=600, help="--band: at most this many requests a row")
    args = ap.parse_args()
    t0 = time.perf_counter()
    keep = set(args.gpu.split(",")) if args.gpu else None
    models = set(args.model.split(",")) if args.model else None
    priced: dict[str, tuple[Model, CostSettings]] = {}
    for path, online in ((OFFLINE, False), (ONLINE, True)):
        rows = _rows(path, keep, models)
        errors: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        worst, refused = [], []
        for row in rows:
            if row["model"] not in priced:
                _, ctx = context(["+inventory=tiny_homo", f"model={row['model']}", *args.extra])
                priced[row["model"]] = (ctx.planner.model, ctx.planner.cost)
            model, cost = priced[row["model"]]
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
                errors[(row["model"], row["gpu"], m)].append(e := math.log(p / meas))
                worst.append((abs(e), e, m, row))
        if not rows:
            continue
        title = "online serving (TensorRT-LLM 0.14.0, BF16)" if online else "offline maximum throughput"
        table(errors, f"{title}: {len(rows)} rows, {len(refused)} the model cannot run (no KV room for one request)")
        print(f"\nWorst {args.worst} (predicted / measured):\n")
        for _, e, m, row in sorted(worst, key=lambda x: -x[0])[: args.worst]:
            shape = f"{'DEP' if row.get('dp_attention') == 'true' else 'TP'}{row['tp']}"
            print(f"- {row['model']} {row['gpu']} {shape} {row['precision']} {row['isl']}/{row['osl']}"
                  f"{' at ' + row['qps'] + ' req/s' if online else ''} (release {row['release']}): {m} "
                  f"{math.exp(e):.2f}")  # fmt: skip
    if args.band:
        rows = _rows(OFFLINE, keep, models)
        if args.band_rows and args.band_rows < len(rows):
            rows = [rows[round(i * len(rows) / args.band_rows)] for i in range(args.band_rows)]
        coverage(rows, priced, args.band, args.band_requests)
    print(f"\n{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()

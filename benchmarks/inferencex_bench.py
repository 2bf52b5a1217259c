"""The cost model against InferenceX: every DeepSeek-R1 row predicted by simulating its configuration and load.

    python benchmarks/inferencex_bench.py [--rows N] [--gpu h200,b200] [--extra costmodel=corrected ...]
    python benchmarks/inferencex_bench.py --extra costmodel=serving --leave-gpu-out

Each row of conf/measured/inferencex_dsr1.csv (costmodel.measured) is one configuration measured closed-loop:
`conc` requests in flight, `conc` x 10 prompts, input and output lengths uniform on [0.8 L, L] (InferenceX's
`random-range-ratio` 0.8 in its benchmark template, with vLLM's benchmark_serving random dataset). A row the
model can express is simulated as that: its prefill and decode workers as simulator engines with step times
from the cost model of the main job's config (`--extra` overrides it) at the row's precision (routed experts
in FP8 or FP4: `experts_fp8`), a closed loop of `conc` users (simulator.core), and the benchmark's own metrics
(simulator.metrics.benchmark_metrics); an aggregated row's engines run prefill and decode in mixed steps with
chunked prefill (simulator.aggregated); an MTP row's decode steps verify a draft token each
(costmodel.measured.MTP_DRAFTS, MTP_ACCEPTED); a decode engine admits at most the requests its launch let it
(conf/measured/inferencex_admission.csv: `Row.max_running`), the other users waiting for a slot. A row it cannot
express is counted under the reason (a GPU not in the catalogue, FP4 on a GPU without an FP4 rate, a disaggregated
row without its workers); none is dropped silently.

Printed per GPU type, framework and metric: rows, median |error| (exp(median |ln(predicted / measured)|) - 1),
the share within +-15 %, the median of predicted / measured (the direction), and the worst rows; the fitting
GPUs (H200, B200, MI300X) and the check GPUs apart. Nothing here is fitted.

`--leave-gpu-out` judges the end-to-end fit (costmodel.calibrate --serving) on GPUs it did not see: for each
fitting GPU it refits the kernel tables (conf/calibration/published.csv) and the other fitting GPUs' rows, and
simulates that GPU's rows under the refit; the check GPUs are simulated under the shipped fit
(`costmodel.calibration=serving`), which never saw them.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
from common import context

from costmodel.catalog import load_gpu, priced_model_names
from costmodel.measured import (
    FITTING_GPUS,
    GPUS,
    INFERENCEX,
    MEASURED_MODELS,
    RANGE_RATIO,
    Row,
    decode_engine,
    load_inferencex,
    users_per_rank,
    worker,
)
from costmodel.settings import CostSettings
from simulator.aggregated import AggregatedEngine, AggregatedSimulation
from simulator.core import DecodeEngine, PrefillEngine, Simulation
from simulator.metrics import benchmark_metrics
from simulator.requests import Requests
from simulator.routers import PowerOfTwo
from simulator.timing import DecodeTiming, decode_timing, prefill_timing

CHUNK = 16384  # an aggregated engine's prefill tokens per step (SGLang's and TensorRT-LLM's common setting)
METRICS = ("median_tpot", "median_ttft", "tput_per_gpu", "output_tput_per_gpu")
WITHIN = math.log(1.15)
# catalogue models checked against other published measurements than InferenceX's, and where
OTHER_CHECKS = {m: f"TensorRT-LLM's published serving ({n} rows): benchmarks/trtllm_bench.py"
                for m, n in (("llama_3_3_70b", 176), ("qwen3_235b_a22b", 25), ("gpt_oss_120b", 22),
                             ("deepseek_v3", 14))}  # fmt: skip


def reason(row: Row) -> str | None:
    """Why the model cannot express `row` (None: it can)."""
    if row.hardware not in GPUS:
        return f"GPU {row.hardware} not in the catalogue"
    if row.disagg and not (row.prefill.workers and row.decode.workers):
        return "workers not recorded"  # 8 disaggregated rows give only their GPU total
    if row.precision == "fp4" and not load_gpu(GPUS[row.hardware]).has_fp4:
        return "FP4 on a GPU without an FP4 rate"
    return None


@dataclass
class Predicted:
    row: Row
    metrics: dict[str, float]  # empty when the model says the configuration cannot run (`refused`)
    seconds: float
    refused: str = ""
    held_out: bool = False  # predicted by a fit without its GPU's rows (--leave-gpu-out)


def priced(cost: CostSettings, row: Row) -> CostSettings:
    """The cost settings with the row's precision: routed experts in FP8 for an FP8 checkpoint, FP4 for an FP4 one
    (attention and dense layers in FP8 either way, as NVIDIA's FP4 DeepSeek-R1 checkpoint holds them); and the
    memory share its SGLang engines were launched with (`Row.mem_fraction`) and the KV cache's format
    (`Row.kv_dtype`), which set the KV cache they hold and the bytes decode attention reads."""
    engine = cost.engine
    if row.mem_fraction is not None:
        engine = dataclasses.replace(engine, mem_fraction=row.mem_fraction)
    if row.kv_dtype is not None:
        engine = dataclasses.replace(engine, kv_dtype=row.kv_dtype)
    return dataclasses.replace(cost, profile=cost.profile.with_fixes(experts_fp8=row.precision == "fp8"), engine=engine)


def simulate(row: Row, model: object, cost: CostSettings, seed: int = 0) -> Predicted:
    """`row`'s configuration and load in the simulator: its prefill workers (attention DP ranks as engines of one
    prompt batch each, or one tensor-parallel engine), its decode workers (one engine each, EP over the worker,
    attention DP ranks or TP), a closed loop of `conc` users."""
    t0 = time.perf_counter()
    cost = priced(cost, row)
    gpu = load_gpu(GPUS[row.hardware])
    rng = np.random.default_rng(seed)
    n = row.conc * 10
    inputs = rng.integers(max(int(row.isl * RANGE_RATIO), 1), row.isl + 1, n)
    outputs = rng.integers(max(int(row.osl * RANGE_RATIO), 1), row.osl + 1, n)
    if not row.disagg:
        return _aggregated(row, gpu, model, cost, inputs, outputs, t0)
    p, d = row.prefill, row.decode
    p_size, p_tp = worker(p)
    p_dp = p_size // p_tp
    budget = cost.engine.prefill_batch_tokens  # type: ignore[attr-defined]
    pre_t = prefill_timing(gpu, model, p_tp, p_dp, row.isl, cost, chunk=budget)  # type: ignore[arg-type]
    prefill = [PrefillEngine(i, 0, pre_t, budget) for i in range(p.workers * p_dp)]
    d_size, d_tp, _ = decode_engine(row)
    ranks = d_size // d_tp
    drafts, accepted = row.speculation
    dec_t = decode_timing(gpu, model, d_tp, d_size, users_per_rank(row), row.isl + row.osl, cost,  # type: ignore[arg-type]
                          draft_tokens=drafts, accepted=accepted, moe_tp=d.ep == 1)  # fmt: skip
    dec_t = admitting(dec_t, row)
    rebuild = prefill_timing(gpu, model, d_tp, ranks, row.isl + row.osl, cost)  # type: ignore[arg-type]
    decode = [DecodeEngine(i, 1, dec_t, rebuild) for i in range(d.workers)]
    if dec_t.kv_tokens < row.isl + row.osl:  # the model's memory: weights leave no KV room on these GPUs
        why = f"the model leaves {dec_t.kv_tokens} KV tokens per decode worker, under one request"
        return Predicted(row, {}, time.perf_counter() - t0, why)
    r = Requests(np.zeros(n), inputs, outputs)
    sim = Simulation(r, prefill, decode, PowerOfTwo(seed), concurrency=row.conc)
    sim.run()
    m = benchmark_metrics(sim.r, row.gpus, p.gpus, d.gpus)
    return Predicted(row, m, time.perf_counter() - t0)


def admitting(timing: DecodeTiming, row: Row) -> DecodeTiming:
    """A decode engine admitting what the row's launch let it (conf/measured/inferencex_admission.csv), or every
    user it is given where the launch set no limit: the users beyond it wait for a slot, their TTFT with them."""
    return timing if row.max_running is None else dataclasses.replace(timing, max_seqs=row.max_running)


def _aggregated(
    row: Row, gpu: object, model: object, cost: CostSettings, inputs: np.ndarray, outputs: np.ndarray, t0: float
) -> Predicted:
    """An aggregated row: one engine of `tp` GPUs (experts over the engine), prefill chunked at
    CHUNK tokens a step beside the decoding sequences; with DP attention an engine takes CHUNK per rank, a step's
    chunk one forward spread over the ranks (`PrefillTiming.forward_ms`). The engine polls for new requests as its
    launch set (`Row.recv_interval`)."""
    d = row.decode
    size, attn_tp, engines = decode_engine(row)  # Row.gpus: an aggregated row measures one engine
    ranks = size // attn_tp
    drafts, accepted = row.speculation
    dec_t = decode_timing(gpu, model, attn_tp, size, users_per_rank(row), row.isl + row.osl, cost,  # type: ignore[arg-type]
                          draft_tokens=drafts, accepted=accepted, moe_tp=d.ep == 1)  # fmt: skip
    dec_t = admitting(dec_t, row)
    pre_t = prefill_timing(gpu, model, attn_tp, ranks, row.isl, cost, ranks=ranks, chunk=CHUNK * ranks)  # type: ignore[arg-type]
    if dec_t.kv_tokens < row.isl + row.osl:
        why = f"the model leaves {dec_t.kv_tokens} KV tokens per engine, under one request"
        return Predicted(row, {}, time.perf_counter() - t0, why)
    pool = [AggregatedEngine(i, dec_t, pre_t, CHUNK * ranks, row.recv_interval) for i in range(engines)]
    r = Requests(np.zeros(len(inputs)), inputs, outputs)
    AggregatedSimulation(r, pool, concurrency=row.conc).run()
    return Predicted(row, benchmark_metrics(r, row.gpus), time.perf_counter() - t0)


def err(pred: Predicted, metric: str) -> float | None:
    measured, got = pred.row.metrics.get(metric), pred.metrics.get(metric)
    if not measured or not got:
        return None
    return math.log(got / measured)


def table(preds: list[Predicted], title: str) -> None:
    print(f"\n### {title}: {len(preds)} rows\n")
    print("| GPU | framework | metric | rows | median abs error | within 15 % | median pred / meas |")
    print("|---|---|---|---:|---:|---:|---:|")
    groups: dict[tuple[str, str], list[Predicted]] = defaultdict(list)
    for p in preds:
        groups[(p.row.hardware, p.row.framework)].append(p)
    for key in [*sorted(groups), ("all", "")]:
        group = preds if key == ("all", "") else groups[key]
        for metric in METRICS:
            e = np.array([x for x in (err(p, metric) for p in group) if x is not None])
            if not len(e):
                continue
            print(f"| {key[0]} | {key[1]} | {metric} | {len(e)} | {100 * (math.exp(np.median(np.abs(e))) - 1):.0f} % "
                  f"| {100 * np.mean(np.abs(e) <= WITHIN):.0f} % | {math.exp(np.median(e)):.2f} |")  # fmt: skip


def refit_without(gpu: str) -> object:
    """The end-to-end calibration refitted without `gpu`'s rows: the kernel tables and the other fitting GPUs'."""
    from costmodel.calibrate import KERNEL_TABLES, fit
    from costmodel.measured import serving_rows
    from costmodel.measurements import load_measurements

    kernels = load_measurements(KERNEL_TABLES)
    rows = [m for m in serving_rows(INFERENCEX) if m.gpu != GPUS[gpu]]
    t0 = time.perf_counter()
    cal = fit(kernels + rows, name=f"serving-without-{gpu}").calibration
    seconds = time.perf_counter() - t0
    print(f"refit without {gpu}: {len(rows)} serving rows and {len(kernels)} kernel rows, {seconds:.0f} s")
    return cal


def coverage(preds: list[Predicted], model: object, cost: CostSettings, draws: int, rows: int = 0,
             seed: int = 0) -> None:  # fmt: skip
    """The rate band's 10th-90th percentile per row against its measured total tokens/s/GPU: each row simulated
    under `draws` draws of the calibration, as a plan's band draws it (pipeline/planning/band.py), with the model's
    error spread once more on a GPU the fit never measured (`Calibration.widened`, as a plan flags such islands
    extrapolated). Printed: the share of rows whose measurement lies inside, per GPU and in all. `rows`: that many
    rows, evenly spaced over the GPUs' rows in order (0: every row)."""
    cal = cost.profile.calibration
    if cal is None or not cal.uncertain:
        print("\n(no band: the cost model has no calibration with an uncertainty)")
        return
    inside: dict[str, list[bool]] = defaultdict(list)
    t0 = time.perf_counter()
    if rows and rows < len(preds):
        preds = [preds[round(i * len(preds) / rows)] for i in range(rows)]
    for p in preds:
        measured = p.row.metrics.get("tput_per_gpu")
        if not measured:
            continue
        wide = cal if p.row.fitting else cal.widened([GPUS[p.row.hardware]])
        got = [simulate(p.row, model, dataclasses.replace(cost, profile=cost.profile.calibrated(c)), seed).metrics
               for c in wide.draws(draws, seed)]  # fmt: skip
        rates = [m["tput_per_gpu"] for m in got if m.get("tput_per_gpu")]
        if len(rates) < draws:  # a draw the model refuses (no KV room) counts as a rate of 0
            rates += [0.0] * (draws - len(rates))
        lo, hi = np.quantile(rates, [0.1, 0.9])
        inside[p.row.hardware].append(bool(lo <= measured <= hi))
    print(f"\n### The band's 10th-90th percentile against measured tokens/s/GPU ({draws} draws a row, "
          f"{len(preds)} rows, "
          f"{time.perf_counter() - t0:.0f} s)\n")  # fmt: skip
    print("| GPU | rows | inside the band |\n|---|---:|---:|")
    for gpu in sorted(inside):
        print(f"| {gpu} | {len(inside[gpu])} | {100 * np.mean(inside[gpu]):.0f} % |")
    every = [x for v in inside.values() for x in v]
    print(f"| all | {len(every)} | {100 * np.mean(every):.0f} % |")


def dump(preds: list[Predicted], path: str) -> None:
    """One line per simulated row: its key, line, run URL, and each metric predicted and measured."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["line", "key", "fitting", "held_out", *(f"{m}_{s}" for m in METRICS for s in ("pred", "meas")),
                    "run_url"])  # fmt: skip
        for p in preds:
            cells = [f"{x:.6g}" if x else "" for m in METRICS for x in (p.metrics.get(m), p.row.metrics.get(m))]
            w.writerow([p.row.line, p.row.key, p.row.fitting, int(p.held_out), *cells, p.row.run_url])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=0, help="at most this many expressible rows (0: all)")
    ap.add_argument("--gpu", default="", help="only these InferenceX GPUs, e.g. h200,b200")
    ap.add_argument("--worst", type=int, default=8, help="worst rows listed per set")
    ap.add_argument("--extra", nargs="*", default=[], help="cost-model overrides, e.g. costmodel=corrected")
    ap.add_argument("--dump", default="", help="write every simulated row's predicted and measured metrics (CSV)")
    ap.add_argument("--band", type=int, default=0, metavar="N",
                    help="also simulate every check GPU row under N draws of the calibration and print how many "
                         "rows' measured tokens/s/GPU the band's 10th-90th percentile holds")  # fmt: skip
    ap.add_argument("--band-rows", type=int, default=0, metavar="N",
                    help="--band over N check rows evenly spaced over the GPUs (0: every row)")  # fmt: skip
    ap.add_argument(
        "--leave-gpu-out",
        action="store_true",
        help="predict each fitting GPU's rows under a fit without them (and the check GPUs as given)",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = load_inferencex()
    if args.gpu:
        rows = [r for r in rows if r.hardware in args.gpu.split(",")]
    reasons = [reason(r) for r in rows]
    why = Counter(reasons)
    usable = [r for r, w in zip(rows, reasons, strict=True) if w is None]
    expressible = len(usable)
    if args.rows:
        usable = usable[: args.rows]
    _, ctx = context(["+inventory=tiny_homo", *args.extra])
    model, cost = ctx.planner.model, ctx.planner.cost
    cal = cost.profile.calibration
    print(f"InferenceX DeepSeek-R1: {len(rows)} rows; cost model {cost.profile.name} "
          f"({'calibrated: ' + cal.name if cal else 'uncalibrated'})")  # fmt: skip
    print("not expressible: " + (", ".join(f"{n} {w}" for w, n in why.most_common() if w) or "none")
          + f"; expressible {expressible}, simulated {len(usable)}")  # fmt: skip
    if args.leave_gpu_out:
        preds = []
        for gpu in FITTING_GPUS:
            held = [r for r in usable if r.hardware == gpu]
            if held:
                held_cost = dataclasses.replace(cost, profile=cost.profile.calibrated(refit_without(gpu)))
                preds += [dataclasses.replace(simulate(r, model, held_cost), held_out=True) for r in held]
        preds += [simulate(r, model, cost) for r in usable if not r.fitting]
        print("fitting GPUs: each predicted under a fit without its own rows (leave one GPU out)")
    else:
        preds = [simulate(r, model, cost) for r in usable]
    refused = [p for p in preds if p.refused]
    for p in refused:  # a row that ran but the model says cannot: a model error, shown
        print(f"- model refuses {p.row.key}: {p.refused}")
    preds = [p for p in preds if not p.refused]
    if args.dump:
        dump(preds, args.dump)
    fitting = [p for p in preds if p.row.fitting]
    check = [p for p in preds if not p.row.fitting]
    table(fitting, "Fitting GPUs (H200, B200, MI300X)")
    table(check, "Check GPUs (never fitted)")
    print("\n### Every simulated row by kind\n")
    print("| engines | precision | speculation | rows | TPOT error | tokens/s/GPU error | pred / meas, tokens/s/GPU |")
    print("|---|---|---|---:|---:|---:|---:|")
    kinds: dict[tuple[str, str, str], list[Predicted]] = defaultdict(list)
    for p in preds:
        kinds[("disaggregated" if p.row.disagg else "aggregated", p.row.precision, p.row.spec_method)].append(p)
    for kind, group in sorted(kinds.items()):
        cells = []
        for metric in ("median_tpot", "tput_per_gpu"):
            e = np.array([x for x in (err(p, metric) for p in group) if x is not None])
            cells.append(f"{100 * (math.exp(np.median(np.abs(e))) - 1):.0f} %")
        ratio = math.exp(np.median([x for x in (err(p, "tput_per_gpu") for p in group) if x is not None]))
        print(f"| {' | '.join(kind)} | {len(group)} | {' | '.join(cells)} | {ratio:.2f} |")
    scored = [(abs(e), p) for p in preds if (e := err(p, "median_tpot")) is not None]
    print(f"\nWorst {args.worst} rows by TPOT (predicted / measured):\n")
    for _, p in sorted(scored, key=lambda x: -x[0])[: args.worst]:
        ratios = ", ".join(f"{m} {math.exp(e):.2f}" for m in METRICS if (e := err(p, m)) is not None)
        print(f"- {p.row.key}: {ratios} ({p.row.run_url})")
    if args.band:
        coverage(check, model, cost, args.band, args.band_rows)
    print("\n### Per catalogue model\n")
    for name in priced_model_names():
        if name in MEASURED_MODELS:
            also = f"; {OTHER_CHECKS[name]}" if name in OTHER_CHECKS else ""
            print(f"- {name}: {len(rows)} rows (InferenceX's DeepSeek-R1, this architecture), {len(preds)} simulated, "
                  f"above{also}")  # fmt: skip
        elif name in OTHER_CHECKS:
            print(f"- {name}: no InferenceX row; {OTHER_CHECKS[name]}")
        else:
            print(f"- {name}: no public measured serving row found (docs/costmodel.md): its plans carry the wider "
                  "range of an unmeasured model")  # fmt: skip
    print(f"\n{len(preds)} rows simulated and {len(refused)} refused by the model in "
          f"{sum(p.seconds for p in preds):.1f} s; {time.perf_counter() - t0:.1f} s in all")  # fmt: skip


if __name__ == "__main__":
    main()

"""The cost model against engine teams' published DeepSeek-V3/R1 serving figures: a check, never fitted.

    python benchmarks/published_bench.py [--extra costmodel=calibrated ...]

conf/measured/published_serving.csv holds figures SGLang's, Ant Group's and TensorRT-LLM's teams published
(LMSYS blog posts, TensorRT-LLM's docs; each row names its source, its words and what the row assumes beyond
them): a prefill engine's input tokens/s per GPU at a forward of a stated batch, a decode engine's output tokens/s
per GPU (or a user's) at a stated batch a rank, context and MTP setting, on H100, H800, H20, H200, B200 and GB200.
No figure here is fitted (costmodel.calibrate fits InferenceX's H200, B200 and MI300X rows only).

Each figure is priced by the cost model of the main job's config (`--extra` overrides it) at its configuration:
- prefill: one forward of `batch` tokens a rank cut from prompts of `length` tokens, every rank of the engine busy
  (`formulas.prefill_chunk_ms`); input tokens/s per GPU = batch / forward / attention TP;
- decode: one step of `batch` sequences a rank at a mean context of `length` (`formulas.decode_step_ms`, with the
  row's MTP drafts and the experts split by TP where the engine ran them so); each sequence yields 1 + accepted
  tokens a step, so a user's tokens/s = (1 + accepted) / step and a GPU's = that x batch / attention TP;
- closed_loop: TensorRT-LLM's `trtllm-bench` runs at a concurrency, simulated as benchmarks/trtllm_bench.py simulates
  its rows (one aggregated engine, its KV cache as TensorRT-LLM sizes it) with the run's `max_batch_size` (`batch`
  users a rank) and `max_num_tokens` (`chunk`), a closed loop of its users over CLOSED_LOOP_WAVES requests each;
  output tokens/s per GPU as the benchmark counts them.

Printed: every figure (published, the model, the model over the published), the median |error| and the share
within +-15 % by kind and over all, and whether the model orders each pair of figures that differ in one setting
(Ant Group's EP 16 against EP 32 at one batch a GPU) as the measurements do.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import time
from collections import defaultdict

import numpy as np
import trtllm_bench
from common import context

from costmodel.catalog import load_gpu
from costmodel.formulas import DecodeRun, decode_step_ms, prefill_chunk_ms
from costmodel.measured import PUBLISHED, Figure, load_published
from costmodel.settings import CostSettings
from simulator.aggregated import AggregatedSimulation
from simulator.metrics import benchmark_metrics
from simulator.requests import Requests

WITHIN = 0.15  # the share of figures within +-15 % is printed
CLOSED_LOOP_WAVES = 3  # a closed-loop figure's requests: this many for each of its users


def predict(f: Figure, model: object, cost: CostSettings) -> float:
    """The cost model's value of figure `f`'s metric at its configuration (module docstring)."""
    gpu = load_gpu(f.gpu)
    profile = cost.profile.with_fixes(experts_fp8=f.experts == "fp8")
    if f.kind == "closed_loop":
        return closed_loop(f, model, dataclasses.replace(cost, profile=profile))
    one = lambda x: np.asarray([float(x)])  # noqa: E731
    if f.kind == "prefill":
        ranks = f.gpus // f.tp
        ms = prefill_chunk_ms(gpu, model, one(f.batch * ranks), one(f.length), one(f.tp), one(ranks),  # type: ignore[arg-type]
                              profile=profile)[0]  # fmt: skip
        return f.batch / (float(ms) / 1e3) / f.tp
    kv = cost.engine.kv_dtype if f.kv_dtype == "auto" else f.kv_dtype
    run = DecodeRun(cost.engine.fp8_combine, 1.0, f.drafts, f.moe == "tp", kv)
    step = float(decode_step_ms(gpu, model, one(f.length), one(f.batch), one(f.tp), one(f.gpus),  # type: ignore[arg-type]
                                profile=profile, run=run)[0])  # fmt: skip
    user = (1.0 + f.accepted) / (step / 1e3)
    return user if f.metric == "tok_s_user" else user * f.batch / f.tp


def closed_loop(f: Figure, model: object, cost: CostSettings) -> float:
    """Output tokens/s per GPU of a closed-loop `trtllm-bench` run: `batch` users a rank of its engine (attention in
    data parallel at `tp` 1, else TP over the engine), each request `length` prompt and `output` tokens."""
    if f.tp not in (1, f.gpus):
        raise ValueError(f"figure {f.id}: a closed-loop engine's attention is TP over its {f.gpus} GPUs or DP (tp 1)")
    row = {"gpu": f.gpu, "precision": f.experts, "tp": str(f.gpus), "ep": str(f.gpus if f.moe == "ep" else 1),
           "dp_attention": "true" if f.tp == 1 < f.gpus else "false", "isl": str(f.length), "osl": str(f.output),
           "kv_dtype": "" if f.kv_dtype == "auto" else f.kv_dtype}  # fmt: skip
    engine, _ = trtllm_bench.engine(row, model, cost, max_batch=f.batch, chunk=f.chunk)  # type: ignore[arg-type]
    users = f.batch * (f.gpus // f.tp)
    n = CLOSED_LOOP_WAVES * users
    r = Requests(np.zeros(n), np.full(n, f.length), np.full(n, f.output))
    AggregatedSimulation(r, [engine], concurrency=users).run()
    return benchmark_metrics(r, f.gpus)["output_tput_per_gpu"]


def summary(ratios: list[float]) -> str:
    """`rows | median |error| | within +-15 % | median model / published` of `ratios` (model / published)."""
    e = np.abs(np.log(ratios))
    within = sum(abs(r - 1.0) <= WITHIN for r in ratios)
    return (f"{len(ratios)} | {100 * (math.exp(float(np.median(e))) - 1):.0f} % | {within} of {len(ratios)} | "
            f"{math.exp(float(np.median(np.log(ratios)))):.2f}")  # fmt: skip


def orderings(figures: list[Figure], pred: dict[str, float]) -> list[str]:
    """Pairs of decode figures on one GPU at one batch, context and MTP setting that differ only in the engine's GPUs:
    whether the model orders them as published."""
    groups: dict[tuple, list[Figure]] = defaultdict(list)
    for f in figures:
        if f.kind == "decode":
            groups[(f.gpu, f.tp, f.moe, f.experts, f.batch, f.length, f.drafts, f.accepted, f.metric)].append(f)
    lines = []
    for group in groups.values():
        group.sort(key=lambda f: f.gpus)
        for a, b in itertools.pairwise(group):
            if a.gpus == b.gpus:
                continue
            published, priced = b.value > a.value, pred[b.id] > pred[a.id]
            lines.append(f"- {a.gpu}, batch {a.batch} a GPU: {b.gpus} GPUs over {a.gpus} published "
                         f"{b.value / a.value:.2f}x, the model {pred[b.id] / pred[a.id]:.2f}x: "
                         f"{'the same order' if published == priced else 'the other order'}")  # fmt: skip
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--figures", default=str(PUBLISHED), help="a published-serving table (its columns)")
    ap.add_argument("--extra", nargs="*", default=[], help="cost-model overrides, e.g. costmodel=calibrated")
    args = ap.parse_args()
    t0 = time.perf_counter()
    figures = load_published(args.figures)
    _, ctx = context(["+inventory=tiny_homo", *args.extra])
    model, cost = ctx.planner.model, ctx.planner.cost
    cal = cost.profile.calibration
    print(f"Published DeepSeek-V3/R1 serving figures: {len(figures)}; cost model {cost.profile.name} "
          f"({'calibrated: ' + cal.name if cal else 'uncalibrated'}); none of them fitted\n")  # fmt: skip
    pred = {f.id: predict(f, model, cost) for f in figures}
    print("| figure | GPU | engine | batch | length | MTP | metric | published | model | model / published |")
    print("|---|---|---|---:|---:|---|---|---:|---:|---:|")
    for f in figures:
        engine = f"TP {f.tp} x {f.gpus // f.tp}" if f.tp > 1 and f.gpus > f.tp else f"{f.gpus} GPUs, TP {f.tp}"
        mtp = f"{f.drafts} ({1 + f.accepted:.2f} a step)" if f.drafts else "-"
        ratio = pred[f.id] / f.value
        print(f"| {f.id} | {f.gpu} | {engine}, experts {f.moe.upper()} {f.experts.upper()} | {f.batch} | "
              f"{f.length} | {mtp} | {f.metric} | {f.value:,.1f} | {pred[f.id]:,.1f} | {ratio:.2f} |")  # fmt: skip
    print("\n| set | figures | median abs error | within 15 % | median model / published |")
    print("|---|---:|---:|---:|---:|")
    for kind in ("prefill", "decode", "closed_loop"):
        ratios = [pred[f.id] / f.value for f in figures if f.kind == kind]
        if ratios:
            print(f"| {kind} | {summary(ratios)} |")
    print(f"| all | {summary([pred[f.id] / f.value for f in figures])} |")
    lines = orderings(figures, pred)
    if lines:
        print("\nThe same engine at two sizes:\n")
        print("\n".join(lines))
    print(f"\n{len(figures)} figures priced in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()

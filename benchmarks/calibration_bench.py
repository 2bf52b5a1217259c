"""How far the cost model's components are off, before and after calibration, and what it does to plans.

    python benchmarks/calibration_bench.py                 # the shipped measurements, the Table 5.1 cells
    python benchmarks/calibration_bench.py --data mine.csv --cells hetero_a:azure_code

1. Held-out error per component: for every measurement row, |log(predicted / measured)| under
   `shallowsim`, `corrected` (no fit), `corrected` with the structure refinements the calibration
   is fitted on (profile.MODEL_DOCS, no fit), and the calibration fitted to all the other rows
   (leave-one-out); the table gives each component's median, as a percentage. The target: the
   calibration halves `corrected`'s median error on held-out rows.
2. The wall time of one fit and of the leave-one-out (one fit per row), measured in this run.
3. An independent end-to-end check, never fitted: DeepSeek's published statistics of its H800
   serving fleet (`check`), against the same profiles and the one fitted to InferenceX's serving
   measurements (conf/calibration/serving.yaml).
4. The Table 5.1 cells: the exact optimum (default settings, node-aligned islands) with
   `corrected` and with the calibration, side by side, and the calibrated optimum's range (10th /
   90th percentile over draws of the calibration's factors, pipeline/band.py).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.calibrate import KERNEL_TABLES, fit, leave_one_out, log_errors
from costmodel.measurements import COMPONENTS, load_measurements
from costmodel.profile import CostProfile

CELLS = [f"{i}:{w}" for i in ("hetero_a", "hetero_b", "homo_c") for w in ("azure_code", "azure_conv")]


def pct(v: np.ndarray) -> str:
    return f"{100 * (math.exp(float(np.median(np.abs(v)))) - 1):.1f} %" if len(v) else "-"


def errors(data: list[str]) -> None:
    rows = load_measurements(data)
    t0 = time.perf_counter()
    f = fit(rows)
    t_fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    loo = leave_one_out(rows)
    t_loo = time.perf_counter() - t0
    ss = log_errors(rows, CostProfile.shallowsim())
    corr = log_errors(rows, CostProfile.corrected())
    refined = f.before  # the fit's base: corrected with the refinements
    print(f"{len(rows)} measurements ({', '.join(Path(d).name for d in data)}); one fit {t_fit:.2f} s, "
          f"leave-one-out ({len(rows)} fits) {t_loo:.1f} s\n")  # fmt: skip
    print("Median |error|, held-out rows (calibration: fitted without the row):\n")
    print("| component | rows | shallowsim | corrected | corrected + refinements | calibrated (held out) | "
          "calibrated (in sample) | ratio |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    comps = [c for c in COMPONENTS if any(r.component == c for r in rows)]
    for comp in [*comps, "all"]:
        idx = [i for i, r in enumerate(rows) if comp in ("all", r.component)]
        med_c, med_l = np.median(np.abs(corr[idx])), np.median(np.abs(loo[idx]))
        ratio = f"{med_l / med_c:.2f}" if med_c > 0 else "-"
        label = "**all**" if comp == "all" else comp
        print(f"| {label} | {len(idx)} | {pct(ss[idx])} | {pct(corr[idx])} | {pct(refined[idx])} | {pct(loo[idx])} | "
              f"{pct(f.after[idx])} | {ratio} |")  # fmt: skip
    med_c, med_l = np.median(np.abs(corr)), np.median(np.abs(loo))
    print(f"\nheld-out median error: corrected {pct(corr)}, calibrated {pct(loo)}: the calibration "
          f"{'halves' if med_l <= med_c / 2 else 'does not halve'} it "
          f"(ratio {med_l / med_c:.2f}, target <= 0.50)")  # fmt: skip


# DeepSeek's published 24-hour statistics of its DeepSeek-V3/R1 service on H800 nodes (8 GPUs):
# github.com/deepseek-ai/open-infra-index at 56d8685,
# 202502OpenSourceWeek/day_6_one_more_thing_deepseekV3R1_inference_system_overview.md.
# Decode: EP144 / DP144 (attention TP 1), average KV length 4,989 tokens per output token, output
# speed 20-22 tokens/s per user, ~14.8k output tokens/s per node. Prefill: EP32 / DP32, 56.3 % of
# input tokens hit the KV cache, ~73.7k input tokens/s per node including the hits. Day averages of
# a live service, so below what the same deployment sustains at full load; the prompt length is
# not published. Kept out of every fit.
E2E_SOURCE = "open-infra-index 56d8685, day-6 inference system overview"
E2E_DECODE = {"context": 4989, "ep": 144, "tok_s_per_gpu": 14.8e3 / 8, "user_tok_s": (20.0, 22.0)}
E2E_PREFILL = {"dp": 32, "cache_hit": 0.563, "tok_s_per_gpu": 73.7e3 / 8}


def check(calibration: str) -> None:
    from costmodel.calibration import load_calibration
    from costmodel.catalog import load_gpu, load_model
    from costmodel.formulas import decode_step_ms, prefill_time_ms
    from pipeline.planning.config import calibration_path

    gpu, model = load_gpu("H800"), load_model("deepseek_v3")
    cal = load_calibration(calibration_path(calibration))
    serving = load_calibration(calibration_path("serving"))
    profiles = {"shallowsim": CostProfile.shallowsim(), "corrected": CostProfile.corrected(),
                "calibrated": CostProfile.corrected().calibrated(cal),
                "serving (InferenceX fit)": CostProfile.corrected().calibrated(serving)}  # fmt: skip
    d, f = E2E_DECODE, E2E_PREFILL
    print(f"\nEnd-to-end check, not fitted ({E2E_SOURCE}): the model's rate per H800 over the published "
          "day average (>1: the model is more optimistic than the service's average)\n")  # fmt: skip
    print("| quantity | published | " + " | ".join(profiles) + " |")
    print("|---|---:|" + "---:|" * len(profiles))
    # decode: the published per-GPU throughput at the published per-user speed implies the batch;
    # the model's step time at that batch against the published one (1 / speed)
    for speed in d["user_tok_s"]:
        batch = d["tok_s_per_gpu"] / speed
        cells = [f"{(1e3 / speed) / float(decode_step_ms(gpu, model, d['context'], batch, 1, d['ep'], profile=p)):.2f}"
                 for p in profiles.values()]  # fmt: skip
        print(f"| decode step at {batch:.0f} sequences/GPU, context {d['context']} | {1e3 / speed:.1f} ms | "
              + " | ".join(cells) + " |")  # fmt: skip
    for s in (2048, 4096, 8192):  # the prompt length is not published: three plausible ones
        rates = [s / (float(prefill_time_ms(gpu, model, s, 1, f["dp"], cache_hit=f["cache_hit"], profile=p)) / 1e3)
                 for p in profiles.values()]  # fmt: skip
        cells = [f"{r / f['tok_s_per_gpu']:.2f}" for r in rates]
        print(f"| prefill input tok/s/GPU (hits included), {s}-token prompts | {f['tok_s_per_gpu']:.0f} | "
              + " | ".join(cells) + " |")  # fmt: skip


def plans(cells: list[str], calibration: str, draws: int) -> None:
    from common import context

    from pipeline.planning.band import rate_band
    from pipeline.planning.build import build_plan
    from pipeline.search.reference import exact_layout, reference

    def optimum(inv: str, wl: str, cal: str | None) -> tuple[float, Any, Any, Any]:
        settings, ctx = context([f"+inventory={inv}", f"workload={wl}", "costmodel=corrected",
                                 f"costmodel.calibration={cal or 'null'}"])  # fmt: skip
        ref = reference(settings, ctx, ctx.planner)
        layout = exact_layout(ref)
        plan = build_plan(ctx.planner, layout, 30.0) if layout is not None else None
        return ref.rate_req_s, plan, ctx.planner, layout

    print(f"\nThe Table 5.1 cells, exact optimum (default SLOs, node-aligned islands), corrected vs calibration "
          f"{calibration}:\n")  # fmt: skip
    print("| cell | corrected (req/s) | calibrated (req/s) | change | calibrated range, 10th-90th pct (req/s) | "
          "range width | s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for cell in cells:
        inv, wl = cell.split(":")
        t0 = time.perf_counter()
        base, _, _, _ = optimum(inv, wl, None)
        cal_rate, plan, planner, layout = optimum(inv, wl, calibration)
        band = None
        if plan is not None:
            band = rate_band(planner, layout, plan.rate_req_s, plan.rates.searched_req_s,
                             planner.profile.calibration, draws, time_limit_s=30.0)  # fmt: skip
        rng = "-" if band is None else f"{band.p10_req_s:.1f} - {band.p90_req_s:.1f}"
        width = "-" if band is None or plan is None else f"{(band.p90_req_s - band.p10_req_s) / plan.rate_req_s:.0%}"
        print(f"| {cell} | {base:.2f} | {cal_rate:.2f} | {cal_rate / base - 1:+.1%} | {rng} | {width} | "
              f"{time.perf_counter() - t0:.0f} |", flush=True)  # fmt: skip
    print("\n(the range is of the calibrated plan's headline, rate within the SLOs; the exact optima are the "
          "whole-mix model's, as the search's gap uses)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="+", default=[str(path) for path in KERNEL_TABLES])
    ap.add_argument("--calibration", default="published", help="for the plans: a shipped name or a file")
    ap.add_argument("--cells", default=",".join(CELLS), help="comma-separated inventory:workload (empty: none)")
    ap.add_argument("--draws", type=int, default=32)
    args = ap.parse_args()
    errors(args.data)
    check(args.calibration)
    if args.cells:
        plans(args.cells.split(","), args.calibration, args.draws)


if __name__ == "__main__":
    main()

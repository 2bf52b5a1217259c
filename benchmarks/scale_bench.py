"""How planning time and quality grow with GPUs and GPU types: the default search on generated inventories.

    python benchmarks/scale_bench.py                          # 2,500 and 10,000 GPUs of 8 types, 10,000 of 3
    python benchmarks/scale_bench.py --cells 8:0.25 3:0.25    # types:scale
    python benchmarks/scale_bench.py --cells 8:1 --verify     # with the simulated check, as users run it
    python benchmarks/scale_bench.py --reference --prove      # the exact reference cut short, against the optimum

Each cell is `python -m pipeline.search` (default settings: 240 trials, the exact reference, the rate
band; `search.verify=false` unless --verify) on an inventory written to a temporary config dir. With 8 types it is
2000 H200, 1500 H800, 2500 H20, 1500 H100-SXM, 1000 DGX-B200, 800 MI300X, 400 A100-80GB and 300
H20-3E, times the scale. With 3 types it is H200, H800 and H20 in the proportions of hetero_a,
with the same total. The table gives the wall time, the exact reference's share, and the search's
gap to the exact optimum, all measured in this run. Target: 10,000 GPUs of 8 types within 5
minutes on a 2-core machine.

`--reference` instead solves the exact reference of the first cell in-process, as a search cut
short by its time limit makes it: the LP relaxation's bound, then each starting layout (the
relaxation's counts made whole three ways) before and after the count search
(solvers/count_search.py), the MILP over the sizes near where those end, then the reference as the
main job runs it (`--limit`, 120 s); with `--prove` also the MILP left to prove the optimum (about
3.5 minutes at 10,000 GPUs), so every layout's share of the optimum is printed beside its share of
the bound.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, context, scale_inventory


def run(types: int, scale: float, extra: list[str], verify: bool = False) -> str:
    inv = scale_inventory(types, scale)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "inventory").mkdir()
        (Path(tmp) / "inventory" / "scale.yaml").write_text("gpus: " + json.dumps(inv) + "\n")
        cmd = [sys.executable, "-m", "pipeline.search", "--config-dir", tmp, "+inventory=scale",
               f"search.verify={str(verify).lower()}", f"out_root={tmp}/out", f"mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db",
               *extra]  # fmt: skip
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        plans = list(Path(tmp, "out").glob("*/*/plan.json"))
        v = json.loads(plans[0].read_text()).get("verification", {}) if plans else {}
    if r.returncode != 0:
        return f"| {sum(inv.values()):,} | {types} | failed: {r.stderr.strip().splitlines()[-1][:120]} | | |"
    ref = re.search(r"exact (?:optimum .*?, ([\d.]+) s\)|reference stopped at its time limit \(([\d.]+) s\))", r.stdout)
    gap = re.search(r"gap ((?:<= )?[\d.]+%) to the exact optimum", r.stdout)
    ref_s = float(ref.group(1) or ref.group(2)) if ref else float("nan")
    row = (f"| {sum(inv.values()):,} | {types} | {wall:.0f} s | {ref_s:.0f} s ({ref_s / wall:.0%}) | "
           f"{gap.group(1) if gap else '-'} |")  # fmt: skip
    if verify:
        held = "SLOs held" if v.get("sustained") else f"sustains {v.get('sustained_over_stated', 0):.3f} x"
        row += (f" {v['simulated_over_stated']:.3f} x, {held}; {v['requests']:,} requests, {v['sim_wall_s']:.1f} s |"
                if v else " - |")  # fmt: skip
    return row


def bench_reference(types: int, scale: float, limit_s: float, prove: bool) -> None:
    from pipeline.search.reference import type_options
    from solvers import count_search
    from solvers.exact import (
        NEAR_SIZES,
        exact_optimum,
        island_classes,
        near_sizes,
        round_counts,
        round_pooled,
        solve_counts,
    )

    inv = scale_inventory(types, scale)
    settings, ctx = context(["search.verify=false"], inv)
    t0 = time.perf_counter()
    options, kv = type_options(settings, ctx, ctx.planner)
    p, budget, classes = ctx.planner.ranges.p, ctx.planner.budget_per_hour, island_classes(options)
    print(f"{sum(inv.values()):,} GPUs of {types} types: {len(classes)} (type, size) classes, "
          f"benchmarked in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    t0 = time.perf_counter()
    relaxed, frac = solve_counts(options, p, budget=budget, kv_gb=kv, time_limit_s=600.0, relax=True)
    bound = relaxed.rate_req_s
    print(f"LP relaxation: bound {bound:,.1f} req/s ({time.perf_counter() - t0:.1f} s)")
    rows: list[tuple[str, float, float]] = []
    ends = []
    for name, start in (("pooled", round_pooled(options, frac, budget)),
                        ("rounded down, largest parts up", round_counts(options, frac, budget, False)),
                        ("rounded down, parts filled", round_counts(options, frac, budget, True))):  # fmt: skip
        before = solve_counts(options, p, budget=budget, kv_gb=kv, time_limit_s=600.0, fix=start)[0].rate_req_s
        t0 = time.perf_counter()
        after, end = count_search.improve(options, classes, p, start, kv_gb=kv, budget=budget, time_limit_s=120.0)
        ends.append(end)
        rows += [(f"{name}, made whole", before, float("nan")), (f"{name}, then the count search", after,
                                                                 time.perf_counter() - t0)]  # fmt: skip
    t0 = time.perf_counter()
    near = near_sizes(options, ends, NEAR_SIZES)
    res = solve_counts(near, p, budget=budget, kv_gb=kv, time_limit_s=120.0)[0]
    rows.append((f"the MILP over the sizes within {NEAR_SIZES} of those three ({len(island_classes(near))} classes): "
                 f"{res.status}", res.rate_req_s, time.perf_counter() - t0))  # fmt: skip
    t0 = time.perf_counter()
    ref = exact_optimum(options, p, budget_per_hour=budget, kv_gb=kv, time_limit_s=limit_s)
    rows.append((f"the reference as a search runs it ({limit_s:g} s limit): {ref.status}", ref.rate_req_s,
                 time.perf_counter() - t0))  # fmt: skip
    optimum = float("nan")
    if prove:
        t0 = time.perf_counter()
        best = exact_optimum(options, p, budget_per_hour=budget, kv_gb=kv, time_limit_s=1800.0)
        optimum = best.rate_req_s if best.status == "optimal" else float("nan")
        rows.append((f"the MILP left to finish: {best.status}", best.rate_req_s, time.perf_counter() - t0))
    print("\n| layout | req/s | / bound | / optimum | time |\n|---|---:|---:|---:|---:|")
    for name, rate, s in rows:
        rate = max(rate, 0.0) + 0.0  # an LP's -0.0 prints as 0.0
        took = "" if s != s else f"{s:.1f} s"
        share = "-" if optimum != optimum else f"{rate / optimum:.4f}"
        print(f"| {name} | {rate:,.1f} | {rate / bound:.4f} | {share} | {took} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", nargs="+", default=["8:0.25", "8:1", "3:1"], help="types:scale (scale 1 = 10,000 GPUs)")
    ap.add_argument("--extra", nargs="*", default=[], help="config overrides for every search")
    ap.add_argument("--verify", action="store_true", help="keep the main job's simulated check on (a column)")
    ap.add_argument("--reference", action="store_true", help="the exact reference cut short (first cell; default 8:1)")
    ap.add_argument("--limit", type=float, default=120.0, help="--reference: the reference's time limit (s)")
    ap.add_argument("--prove", action="store_true", help="--reference: also let the MILP prove the optimum")
    args = ap.parse_args()
    if args.reference:
        types, scale = (args.cells[0] if args.cells != ap.get_default("cells") else "8:1").split(":")
        bench_reference(int(types), float(scale), args.limit, args.prove)
        return
    check = " simulated / stated, verdict; requests, check's time |" if args.verify else ""
    print("| GPUs | types | wall | exact reference (share) | gap to the exact optimum |" + check)
    print("|---:|---:|---:|---:|---:|" + ("---|" if args.verify else ""))
    for cell in args.cells:
        types, scale = cell.split(":")
        print(run(int(types), float(scale), args.extra, args.verify), flush=True)


if __name__ == "__main__":
    main()

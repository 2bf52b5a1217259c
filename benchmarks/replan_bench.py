"""The Table 5.1 cells re-planned under the cost model fitted to measured serving: what moves.

    python benchmarks/replan_bench.py                       # the six cells: `calibrated`, `serving`, `serving` + MTP
    python benchmarks/replan_bench.py --cells homo_c:azure_code --models calibrated,serving,corrected
    python benchmarks/replan_bench.py --models "serving,serving costmodel.aggregated=true"  # may islands aggregate?

For each cell (inventory:workload) and each cost model (conf/costmodel), the exact optimum of the search's model
(default settings and SLOs, node-aligned islands: pipeline.search.reference): its rate, and its islands by GPU
type and role (`2x16 P` = two prefill islands of 16 GPUs). `calibrated` is the main job's model (kernel tables
only); `serving` adds the end-to-end fit to InferenceX's H200, B200 and MI300X rows (costmodel.calibrate
--serving; docs/costmodel.md); a model may carry overrides after its name (`serving costmodel.mtp.drafts=1`: MTP
with one draft a step). Printed as a Markdown table, then each cell's change of rate.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from common import context

from pipeline.search.reference import reference

CELLS = [f"{i}:{w}" for i in ("hetero_a", "hetero_b", "homo_c") for w in ("azure_code", "azure_conv")]


def islands(found: tuple[tuple[str, int, str], ...]) -> str:
    """`H200 8x8 D + 2x16 P; H20 ...`: the islands by GPU type, count x size, and role."""
    by_type: dict[str, Counter[tuple[int, str]]] = {}
    for gpu, size, role in found:
        by_type.setdefault(gpu, Counter())[(size, role)] += 1
    return "; ".join(
        f"{gpu} " + " + ".join(f"{n}x{size} {role[0].upper()}" for (size, role), n in sorted(c.items(), reverse=True))
        for gpu, c in sorted(by_type.items())
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default=",".join(CELLS), help="comma-separated inventory:workload")
    ap.add_argument("--models", default="calibrated,serving,serving costmodel.mtp.drafts=1",
                    help="conf/costmodel names, each with its overrides after it; the first the baseline")  # fmt: skip
    args = ap.parse_args()
    models = args.models.split(",")
    print("| cell | cost model | exact optimum (req/s) | islands (count x GPUs each; P prefill, D decode, "
          "A aggregated) | s |")  # fmt: skip
    print("|---|---|---:|---|---:|")
    rates: dict[tuple[str, str], float] = {}
    for cell in args.cells.split(","):
        inv, wl = cell.split(":")
        for model in models:
            t0 = time.perf_counter()
            name, *overrides = model.split()
            settings, ctx = context([f"+inventory={inv}", f"workload={wl}", f"costmodel={name}", *overrides])
            ref = reference(settings, ctx, ctx.planner)
            rates[(cell, model)] = ref.rate_req_s
            print(f"| {cell} | {model} | {ref.rate_req_s:.1f} | {islands(ref.islands)} | "
                  f"{time.perf_counter() - t0:.0f} |", flush=True)  # fmt: skip
    print(f"\nChange against {models[0]}:\n")
    for cell in args.cells.split(","):
        base = rates[(cell, models[0])]
        print(f"- {cell}: " + ", ".join(f"{m} {rates[(cell, m)] / base - 1:+.1%}" for m in models[1:]))


if __name__ == "__main__":
    main()

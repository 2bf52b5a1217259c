"""The AIConfigurator planning cases (benchmarks/peer_bench.py part B) on Archipelago alone: each plan's promised
output tokens/s/GPU, its range's 10th percentile in the same unit, its islands outside measured serving, and the
best InferenceX row measured within the limits on that GPU at those lengths.

    python benchmarks/aic_cases_band.py [--extra costmodel=serving ...]

The question it answers: where a plan promises more than anything measured, does it say it extrapolates, and does
its range reach down to what was measured (its 10th percentile at or below the best measured row)?
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from peer_bench import FLEETS, archipelago_plan, best_measured, limits

from costmodel.measured import load_inferencex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extra", nargs="*", default=[], help="overrides for every plan")
    args = ap.parse_args()
    rows = load_inferencex()
    ttft_ms, tpot_ms = limits()
    print("| case | promised | range 10th pct | best measured (median limits) | promised / measured | "
          "10th pct <= measured | islands outside measured serving |")
    print("|---|---:|---:|---:|---:|---|---|")
    for gpu, inventory, n in FLEETS:
        for isl, osl in ((1024, 1024), (8192, 1024)):
            with tempfile.TemporaryDirectory() as tmp:
                p, _, _ = archipelago_plan(inventory, isl, osl, args.extra, Path(tmp))
            if isinstance(p, str):
                print(f"| {n} {gpu} {isl}/{osl} | {p} |")
                continue
            promised = p["rates"]["output_tok_s"] / n
            band = p.get("band")
            low = band["p10_req_s"] / p["rates"]["rate_req_s"] * promised if band else None
            best = best_measured(rows, gpu, isl, osl, ttft_ms / 1e3, tpot_ms / 1e3, at="median", precision=None)
            out = [f"{i['size']} x {i['gpu']} {i['role']}: {'; '.join(i['outside'])}" for i in p["islands"]
                   if i["role"] != "idle" and i.get("outside")]  # fmt: skip
            cells = [f"{n} {gpu} {isl}/{osl}", f"{promised:.0f}", "-" if low is None else f"{low:.0f}"]
            if best and low is not None:
                cells += [f"{best[0]:.0f}", f"{promised / best[0]:.2f}", "yes" if low <= best[0] else "no"]
            else:
                cells += ["-" if not best else f"{best[0]:.0f}", "-", "-"]
            print(f"| {' | '.join(cells)} | {' / '.join(out) or 'none'} |")


if __name__ == "__main__":
    main()

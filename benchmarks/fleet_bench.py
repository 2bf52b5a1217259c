"""Fleets: the shipped fleets planned as a user runs them, beside the default single-model job, in one run.

    python benchmarks/fleet_bench.py [two_models three_models] [--inventory hetero_a] [--out DIR]
    python benchmarks/fleet_bench.py three_models --objective min_cost
    python benchmarks/fleet_bench.py --spare-hosts 0       # planned with every host up (the default: one host lost)

Per fleet (`python -m pipeline.search +fleet=NAME`, a new process each): its wall time and its ratio to the default
job's (`python -m pipeline.search`, DeepSeek-V3 on the same inventory, run first in the same session), the common
fraction of every demand the joint plan serves, the exact optimum and its gap, the best split planned one model at
a time and what pooling gains, the worst host lost, and per model its simulated / stated rate. Nothing is fitted.
The target a fleet of three models is held to is 60 s on 2 cores; its joint MILP stops at the fleet's time_limit_s
(35 s) with its best layout and HiGHS's proven bound, the gap stated against that bound. `--objective min_cost` asks
the sizing question instead (`search.objective=min_cost`): per fleet, the $/h of the cheapest islands serving every
demand, HiGHS's proven least, the cheapest split sized one model at a time and what pooling saves. A fleet is
planned for one host lost by default (its reserve's fraction, the bound with every host up, the gap between them);
`--spare-hosts 0` plans it with every host up, to compare.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(out: Path, *args: str, no_plan_ok: bool = False) -> tuple[float, str]:
    """`python -m pipeline.search args` with its records under `out`: (wall s, its stdout); `no_plan_ok`: its exit 1
    (no layout serves the demands: said on its console) is a result, not a failure."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pipeline.search", *args, f"out_root={out}/search",
           f"mlflow.tracking_uri=sqlite:///{out}/mlflow.db"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode and not (no_plan_ok and done.returncode == 1):
        sys.exit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return time.perf_counter() - t0, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fleets", nargs="*", default=["two_models", "three_models"])
    ap.add_argument("--inventory", default="hetero_a")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--objective", choices=("max_rate", "min_cost"), default="max_rate")
    ap.add_argument("--spare-hosts", choices=("auto", "0", "1"), default="auto",
                    help="search.spare_hosts for the fleets (auto, the default: one host lost)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    inv = f"+inventory={args.inventory}"
    single_s, _ = run(out, inv)
    print(f"default job (DeepSeek-V3, {args.inventory}): {single_s:.1f} s", flush=True)
    if args.objective == "min_cost":
        print("\n| fleet | wall (s) | x default job | $/h of islands | the least proven ($/h) | gap | cheapest split "
              "($/h) | pooling saves | served (least rate / demand) | simulated / stated |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    else:
        print("\n| fleet | wall (s) | x default job | served | joint MILP: best layout, bound | gap | best split | "
              "pooling gains | one host lost | simulated / stated |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.fleets:
        wall, said = run(out, inv, f"+fleet={name}", f"search.objective={args.objective}",
                         f"search.spare_hosts={args.spare_hosts}", no_plan_ok=args.objective == "min_cost")  # fmt: skip
        error = next((line for line in said.splitlines() if line.startswith("[fleet] error:")), None)
        if error:  # the sizing question with no answer: the demands are more than the inventory holds
            print(f"| {name} | {wall:.1f} | {wall / single_s:.2f} | {error.removeprefix('[fleet] error: ')} |",
                  flush=True)  # fmt: skip
            continue
        record = json.loads(max((out / "fleet").glob(f"{name}-{args.inventory}-*/*/fleet.json"),
                                key=lambda p: p.stat().st_mtime).read_text())  # fmt: skip
        if args.objective == "min_cost":
            print(cheapest_row(name, wall, single_s, record), flush=True)
            continue
        ref, split, worst = record["reference"], record["split"], record.get("worst_host")
        sims = ", ".join(f"{m['model']} {m['simulated_over_stated']:.3f}" for m in record["models"])
        lost = f"{worst['served']:.3f} ({worst['gpu']} host {worst['node']})" if worst else "n/a"
        gap = "n/a" if ref["gap"] is None else f"{ref['gap']:.2%}"
        gain = "n/a" if split["pooling_gain"] is None else f"{split['pooling_gain']:+.1%}"
        name += " (one host lost)" if ref.get("lost_hosts") else " (every host up)"
        print(f"| {name} | {wall:.1f} | {wall / single_s:.2f} | {record['served']:.3f} | {ref['fraction']:.3f}, "
              f"{ref['bound']:.3f} ({ref['status']}, MILP {ref['solve_s']:.1f} s) | {gap} | {split['fraction']:.3f} | "
              f"{gain} | {lost} | "
              f"{sims} |", flush=True)  # fmt: skip
    print(f"\nrecords: {out}")


def cheapest_row(name: str, wall: float, single_s: float, record: dict) -> str:
    """One fleet's line of the sizing table."""
    ref, split = record["reference"], record["split"]
    name += " (one host lost)" if ref.get("lost_hosts") else " (every host up)"
    sims = ", ".join(f"{m['model']} {m['simulated_over_stated']:.3f}" for m in record["models"])
    gap = "n/a" if ref["gap"] is None else f"{ref['gap']:.2%}"
    cheapest = "none serves" if split is None else f"{split['cost_per_hour']:,.2f}"
    saves = "n/a" if split is None or split["saving"] is None else f"{split['saving']:.1%}"
    return (f"| {name} | {wall:.1f} | {wall / single_s:.2f} | {record['cost_per_hour']:,.2f} ({ref['status']}, MILP "
            f"{ref['solve_s']:.1f} s) | {ref['bound']:,.2f} | {gap} | {cheapest} | {saves} | {record['served']:.3f} | "
            f"{sims} |")


if __name__ == "__main__":
    main()

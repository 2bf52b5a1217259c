"""Sizing on the Table 5.1 inventories: the cheapest fleet for three demands each, its gap to the exact reference,
and the max-rate plan's answer asked back as a demand.

    python benchmarks/sizing_bench.py [hetero_a hetero_b homo_c] [--out DIR] [--docs docs/results]
    python benchmarks/sizing_bench.py --out DIR --tables     # the tables again, from the records left in DIR

Per inventory, as a user runs them (`python -m pipeline.search`, new processes):
1. the default max-rate search: its best layout's rate with its worst host lost, in the search's model (the score
   its trials gave it), and its plan's $/h;
2. one Hydra multirun of the sizing search over three demands: a quarter and a half of the most the inventory
   serves with every host up (its exact optimum), and the max-rate plan's rate with a host lost. Every sizing
   search plans for one host lost (the default) and solves its exact reference in that objective
   (search.reference=spare), so the gap is exact, not a bound.
The table gives each demand's fleet: what the search found ($/h, in its model: the gap is its), the plan's (sized
again where the search's fleet holds less than the demand as the plan states rates), the exact cheapest $/h, and
the sweep's wall time per demand; the last rows compare the max-rate plan with the fleet for its own rate (it must
cost at most the inventory). `--docs DIR` copies each sweep's cost_curve.png there. Nothing here is fitted.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INVENTORIES = ("hetero_a", "hetero_b", "homo_c")


def search(out: Path, *args: str) -> float:
    """`python -m pipeline.search args` with its records under `out`; its wall time (s)."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pipeline.search", *args, f"out_root={out}/search",
           f"mlflow.tracking_uri=sqlite:///{out}/mlflow.db"]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return time.perf_counter() - t0


def plans(out: Path) -> list[tuple[Path, dict]]:
    return [(p.parent, json.loads(p.read_text())) for p in sorted((out / "search").glob("*/*/plan.json"))]


def wall_s(run: Path) -> float:
    """A run's wall time: from its folder's name (the time it started) to its report.md's last write."""
    started = datetime.strptime(run.name, "%Y%m%d-%H%M%S-%f").timestamp()
    return (run / "report.md").stat().st_mtime - started


def fleet(plan: dict) -> str:
    gpus: dict[str, int] = {}
    for isl in plan["islands"]:
        if isl["role"] != "idle":
            gpus[isl["gpu"]] = gpus.get(isl["gpu"], 0) + isl["size"]
    return " + ".join(f"{n} {g}" for g, n in gpus.items())


def main() -> None:
    args = sys.argv[1:]
    docs = Path(args[args.index("--docs") + 1]) if "--docs" in args else None
    root = Path(args[args.index("--out") + 1]) if "--out" in args else Path(tempfile.mkdtemp(prefix="sizing-"))
    names = [a for a in args if not a.startswith("--") and Path(a) not in (docs, root)] or list(INVENTORIES)
    for inv in names:
        if "--tables" in args:  # the tables of the records an earlier run left under --out
            continue
        base = root / inv
        search(base / "max_rate", f"+inventory={inv}")
        most, kept, _ = max_rate_plan(base)
        demands = [round(0.25 * most), round(0.5 * most), math.floor(kept * 100) / 100]
        search(base / "sizing", "-m", f"+inventory={inv}", "search.objective=min_cost", "search.reference=spare",
               "search.reference_time_limit_s=900", "search.demand_req_s=" + ",".join(f"{d:g}" for d in demands))
    if docs is not None:
        for inv in names:
            (sweep,) = sorted((root / inv / "sizing" / "multirun").glob("*"))[-1:]
            docs.mkdir(parents=True, exist_ok=True)
            shutil.copy(sweep / "cost_curve.png", docs / f"cost_curve_{inv}.png")
    tables(root, names)


def max_rate_plan(base: Path) -> tuple[float, float, dict]:
    """The max-rate run's most the inventory serves (its exact reference, every host up), its best layout's rate
    with a host lost (what its trials scored), and its plan."""
    (run, mx), = plans(base / "max_rate")
    most = json.loads((run / "reference.json").read_text())["rate_req_s"]
    trials = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines() if line.strip()]
    kept = max(t["score"] for t in trials if t["status"] in ("optimal", "feasible"))
    return most, kept, mx


def tables(root: Path, names: list[str]) -> None:
    """The two tables of the records under `root`; the gap is the search's fleet against the exact cheapest."""
    rows, compare = [], []
    for inv in names:
        base = root / inv
        _, kept, mx = max_rate_plan(base)
        wall_max = wall_s(plans(base / "max_rate")[0][0])
        runs = sorted(plans(base / "sizing"), key=lambda rp: rp[1]["sizing"]["demand_req_s"])
        found = [p for _, p in runs]
        for run, p in runs:
            wall = wall_s(run)
            z = p["sizing"]
            gap = None if not z["cheapest_per_hour"] or not z["searched_per_hour"] else \
                1 - z["cheapest_per_hour"] / z["searched_per_hour"]  # fmt: skip
            rows.append((inv, z["demand_req_s"], fleet(p), z["searched_per_hour"], p["cost_per_hour"],
                         z["cheapest_per_hour"], gap, z["inventory_cost_per_hour"], wall))  # fmt: skip
        p = min(found, key=lambda p: abs(p["sizing"]["demand_req_s"] - math.floor(kept * 100) / 100))
        compare.append((inv, kept, mx["cost_per_hour"], mx["rates"]["rate_req_s"], p["cost_per_hour"], fleet(p),
                        p["sizing"]["inventory_cost_per_hour"], wall_max))  # fmt: skip
    print(f"records under {root}\n")
    print("| inventory | demand (req/s, a host lost) | the plan's fleet | search's fleet $/h | plan's $/h | exact "
          "cheapest $/h | gap | inventory $/h | wall (s) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for inv, d, f, searched, cost, best, gap, whole, w in rows:
        gap_text = "n/a" if gap is None else f"{gap:.2%}"
        best_text = "n/a" if best is None else f"{best:,.2f}"
        print(f"| {inv} | {d:g} | {f} | {searched:,.2f} | {cost:,.2f} | {best_text} | {gap_text} | {whole:,.2f} | "
              f"{w:.0f} |")
    print("\n| inventory | max-rate plan: rate with a host lost (search's model) | its $/h (its rate, every host up) | "
          "the fleet for that rate | its $/h | inventory $/h | max-rate search wall (s) |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for inv, kept, cost, rate, fcost, f, whole, w in compare:
        print(f"| {inv} | {kept:.2f} | {cost:,.2f} ({rate:.2f}) | {f} | {fcost:,.2f} | {whole:,.2f} | {w:.0f} |")


if __name__ == "__main__":
    main()

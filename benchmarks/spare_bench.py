"""The roles that keep the most with a host lost (`search.spare_hosts`, every trial of the main job): the class model
by cuts (`solvers.spare.by_cuts`, the default) against the same model as a MILP under SCIP (`CLASS_SCIP`), side by side
in one run on the same layouts.

    python benchmarks/spare_bench.py [--layouts 200] [--seed 0] [--every-host-up] [overrides ...]

`--every-host-up`: the roles with no host lost (a re-plan scores each candidate so, `search.from_plan`): the cuts
against the per-island MILP (`by_island`, SCIP then HiGHS), which solved that case before.

The layouts are the main job's (hetero_a, Azure code, the default cost model; overrides as the search takes them),
drawn as the search's random start draws them (the divider's parameters, uniformly), distinct ones kept; each is
priced once (its islands' benchmarks cached) and its loss scenarios placed as the search places them, then solved
both ways. Printed: the layouts, the combinations of decode counts (median, largest), the total and median time of
each, their ratio, and how many optima agree (to 1e-6) and how many role assignments are the same (which of identical
islands take a role aside). Target: the cuts at least 3x faster than the MILP with every optimum the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter

import numpy as np
from common import compose
from optuna.distributions import IntDistribution

from pipeline.planning.build import place
from pipeline.planning.failures import loss_scenarios
from pipeline.planning.planner import Layout
from pipeline.search.settings import context, inventory_of, read_settings
from solvers.layouts import LayoutRejected
from solvers.spare import _Classes, _units, by_cuts, by_island, class_milp


def layouts(ctx: object, n: int, seed: int) -> list[Layout]:
    """`n` distinct layouts of the search's space, its parameters drawn uniformly (the random start's draws)."""
    rng = np.random.default_rng(seed)
    found: dict[str, Layout] = {}
    for _ in range(50 * n):
        params = {}
        for name, dist in ctx.space.distributions().items():
            if isinstance(dist, IntDistribution):
                params[name] = int(rng.integers(dist.low, dist.high + 1))
            else:
                params[name] = float(rng.uniform(dist.low, dist.high))
        try:
            islands = ctx.space.layout(params)
        except LayoutRejected:
            continue
        if islands:
            layout = Layout.of(islands)
            found.setdefault(layout.key, layout)
        if len(found) == n:
            break
    return list(found.values())


def assigned(bp: np.ndarray, bd: np.ndarray, roles: tuple[str, ...]) -> Counter[tuple[bytes, bytes, str]]:
    """How many islands of each rates (both roles') take each role."""
    return Counter(zip(map(bytes, bp), map(bytes, bd), roles, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every-host-up", action="store_true", help="no host lost: the cuts against by_island's MILP")
    args, overrides = ap.parse_known_args()
    cfg = compose(overrides)
    settings = read_settings(cfg, *inventory_of(cfg))
    ctx = context(settings)
    planner = ctx.planner
    cuts_ms, milp_ms, counts, same, roles_same, n = [], [], [], 0, 0, 0
    for layout in layouts(ctx, args.layouts, args.seed):
        prob = planner.problem(layout, "max_rate")
        hosts = place(layout.islands, {g: planner.gpus[g].node_gpus for g, _ in layout.islands})
        scen = [frozenset()] if args.every_host_up else [d for _, d in loss_scenarios(layout.islands, hosts, 1)]
        bp, bd = prob.prefill_req_s, prob.decode_req_s
        if _units(bp, bd, scen, None) is None:  # not the class model's (a host of unlike islands)
            continue
        n += 1
        t0 = time.perf_counter()
        k = _Classes.of(bp, bd, prob.p, scen, None)
        cut = by_cuts(k, len(bp), 10.0, t0)
        cuts_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        if args.every_host_up:
            milp = by_island(bp, bd, prob.p, scen, time_limit_s=10.0, backend="AUTO", fixed=None, t0=t0)
        else:
            k = _Classes.of(bp, bd, prob.p, scen, None)
            milp = class_milp(k, len(bp), 10.0, "SCIP", t0)
        milp_ms.append((time.perf_counter() - t0) * 1e3)
        counts.append(int(np.prod(k.m + 1)))
        rate = milp.rate_req_s if milp.status == "optimal" else float("nan")
        same += abs(cut.rate_req_s - rate) <= 1e-6 * max(rate, 1.0)
        # the same roles up to identical islands (which of a class's islands decode: a tie either way)
        roles_same += assigned(bp, bd, cut.roles) == assigned(bp, bd, milp.roles)
    if not n:
        sys.exit("no layout of the class model was drawn")
    lost = "every host up" if args.every_host_up else "one host lost"
    print(f"{n} distinct layouts of {settings.inventory.describe()}, {lost}; combinations of decode counts: "
          f"median {statistics.median(counts):,.0f}, largest {max(counts):,}")  # fmt: skip
    print(f"by cuts:     {sum(cuts_ms) / 1e3:6.2f} s in all, median {statistics.median(cuts_ms):6.1f} ms")
    print(f"{'MILP (by_island)' if args.every_host_up else 'MILP (SCIP)'}: {sum(milp_ms) / 1e3:6.2f} s in all, "
          f"median {statistics.median(milp_ms):6.1f} ms")
    print(f"MILP / cuts: {sum(milp_ms) / sum(cuts_ms):.2f}x (target >= 3x); the same optimum on {same} of {n}, "
          f"the same roles on {roles_same} of {n}")  # fmt: skip


if __name__ == "__main__":
    main()

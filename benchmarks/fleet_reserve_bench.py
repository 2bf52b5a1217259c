"""How much the reserve of a fleet planned for a host lost gives up: its layout against the exact optimum with one
island lost, on the shipped fleets' own benchmarked islands, side by side in one run.

    python benchmarks/fleet_reserve_bench.py [two_models ...] [--inventory hetero_a] [--time-limit 600]

Per fleet, each model's islands benchmarked as `python -m pipeline.search +fleet=NAME` benchmarks them, restricted to
island sizes of 2^k GPUs (where the exact model is solved in minutes: `solvers.fleet.coarse_sizes`): the reserve's
fraction with a host lost (`fleet_optimum(spare=True)`, solved whole) and the exact optimum with any one island lost
(`spare_fleet_optimum`: a routing per loss, the losses joining as they bind), each with its time and status, and the
optimum with every host up, which bounds both. Islands of whole hosts lose one island with a host; islands below a
host can lose several, so there the exact model's optimum is an upper bound on the true one with a host lost, and the
reserve's shortfall from it an upper bound on the reserve's. Nothing is fitted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def members_of(fleet: str, inventory: str) -> list:
    """The fleet's models as its joint MILP sees them (`pipeline.fleet.run`), islands of 2^k GPUs only."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from costmodel.catalog import CONF_DIR
    from pipeline.cli import choice, plain, respelled
    from pipeline.fleet.config import fleet_from_cfg
    from pipeline.fleet.run import compose_member
    from pipeline.search.reference import type_options
    from pipeline.search.settings import inventory_of
    from solvers.fleet import Member, coarse_sizes

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("search", overrides=respelled([f"+fleet={fleet}", f"+inventory={inventory}"]),
                      return_hydra_config=True)  # fmt: skip
    HydraConfig.instance().set_config(cfg)
    spec = fleet_from_cfg(fleet, plain(cfg.fleet))
    name, inv_cfg = inventory_of(cfg)
    out = []
    for m in spec.members:
        c = compose_member(m, name, inv_cfg, choice("costmodel"))
        types, kv = type_options(c.settings, c.ctx, c.ctx.planner)
        out.append(Member(m.model, [coarse_sizes(t) for t in types], c.ctx.planner.ranges.p, m.demand, kv))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fleets", nargs="*", default=["two_models"])
    ap.add_argument("--inventory", default="hetero_a")
    ap.add_argument("--time-limit", type=float, default=600.0, help="each solve's limit (s)")
    args = ap.parse_args()
    from solvers.fleet import fleet_optimum, spare_fleet_optimum

    print("| fleet | every host up | reserve with a host lost | exact with an island lost | reserve / exact |")
    print("|---|---|---|---|---|")
    for name in args.fleets:
        members = members_of(name, args.inventory)
        up = fleet_optimum(members, time_limit_s=args.time_limit)
        t0 = time.perf_counter()
        reserve = fleet_optimum(members, time_limit_s=args.time_limit, spare=True, phased=False)
        reserve_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        exact = spare_fleet_optimum(members, time_limit_s=args.time_limit)
        exact_s = time.perf_counter() - t0
        bound = "" if exact.status == "optimal" else f", at most {exact.bound:.4f}"
        share = reserve.fraction / exact.fraction if exact.fraction else float("nan")
        print(f"| {name} ({args.inventory}, islands of 2^k GPUs) | {up.fraction:.4f} ({up.status}) | "
              f"{reserve.fraction:.4f} ({reserve.status}, {reserve_s:.1f} s) | {exact.fraction:.4f} ({exact.status}"
              f"{bound}, {exact_s:.1f} s) | {share:.3f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()

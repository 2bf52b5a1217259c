"""The price of deployability: the exact optimum with node-aligned islands against free island sizes.

For each cell (inventory x workload; default: the Table 5.1 cells) the exact reference MILP is
solved twice, `search.shapes=nodes` (every island a divisor of a host or whole hosts) and
`search.shapes=any` (the thesis's free sizes), under the same SLOs and minimum islands, and
the table prints both optima, what node alignment costs, and the solve times, side by side.

    python benchmarks/deploy_bench.py                          # default SLOs, min_island auto
    python benchmarks/deploy_bench.py --extra slo=null search.min_island=2   # the thesis's settings
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

from costmodel.catalog import CONF_DIR
from pipeline.reference import reference
from pipeline.settings import settings_from_cfg

CELLS = [f"{i}:{w}" for i in ("hetero_a", "hetero_b", "homo_c") for w in ("azure_code", "azure_conv")]


def optimum(inv: str, wl: str, shapes: str, extra: list[str], limit: float) -> tuple[float, str, float]:
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("search", [f"+inventory={inv}", f"workload={wl}", f"search.shapes={shapes}",
                                 f"search.reference_time_limit_s={limit}", *extra], return_hydra_config=True)  # fmt: skip
    HydraConfig.instance().set_config(cfg)
    settings, ctx = settings_from_cfg(cfg, inv, cfg.inventory)
    t0 = time.perf_counter()
    ref = reference(settings, ctx, ctx.planner)
    return ref.rate_req_s, ref.status, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--extra", nargs="*", default=[], help="config overrides for every solve")
    ap.add_argument("--time-limit", type=float, default=600.0, help="per exact solve, s")
    args = ap.parse_args()
    print(f"overrides: {' '.join(args.extra) or '(defaults)'}")
    print("| cell | exact, nodes (req/s) | exact, any (req/s) | price of deployability | solve s (nodes / any) |")
    print("|---|---:|---:|---:|---:|")
    for cell in args.cells.split(","):
        inv, wl = cell.split(":")
        nodes, st_n, t_n = optimum(inv, wl, "nodes", args.extra, args.time_limit)
        free, st_a, t_a = optimum(inv, wl, "any", args.extra, args.time_limit)
        tag = "" if st_n == st_a == "optimal" else f" ({st_n} / {st_a})"
        print(f"| {cell} | {nodes:.2f} | {free:.2f} | {1 - nodes / free:.1%}{tag} | {t_n:.0f} / {t_a:.0f} |", flush=True)


if __name__ == "__main__":
    main()

"""A plan's fluid Λ against the rate the request-level simulator sustains, for the Table 5.1 cells.

    python benchmarks/sim_saturation.py [--duration 240] [--routers plan,mapper]

For each inventory (hetero_a, hetero_b, homo_c) and Azure workload (code, conversation), the
plan is the exact optimum's layout (`search.sampler=exact`); the simulator sweeps Poisson
arrivals at 0.5-1.2 x Λ with lengths drawn from the workload, `duration` seconds of them
(throughput is measured over the second half, which must start after the longest request
could have finished: a 1,000-token answer takes over a minute), and reports the highest rate
whose queues stay bounded (token throughput within 3 % of offered), with p99 TTFT there.
No SLO is applied here; `python -m pipeline.simulate mode=saturate` adds one.
"""

from __future__ import annotations

import argparse

from common import exact_plan

from pipeline.planning.simulation import RequestMix
from simulator.build import build
from simulator.core import Simulation
from simulator.metrics import summary

SCALES = (0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1, 1.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=240.0, help="seconds of arrivals per simulation")
    ap.add_argument("--routers", default="plan,mapper")
    ap.add_argument("--inventories", default="hetero_a,hetero_b,homo_c")
    ap.add_argument("--workloads", default="azure_code,azure_conv")
    args = ap.parse_args()
    routers = args.routers.split(",")
    print(
        "| inventory | workload | Λ (plan) | " + " | ".join(f"{r}: sustained / Λ (p99 TTFT s)" for r in routers) + " |"
    )
    print("|---|---|---:|" + "---:|" * len(routers))
    for inv in args.inventories.split(","):
        for wl in args.workloads.split(","):
            _, ctx, plan = exact_plan([f"+inventory={inv}", f"workload={wl}"])
            lam, mix = plan.rate_req_s, RequestMix.of(ctx.planner.workload)
            cells = []
            for router in routers:
                best, ttft = 0.0, float("nan")
                for scale in SCALES:
                    r = mix.requests(int(lam * scale * args.duration), lam * scale, "poisson", seed=0)
                    stats = {"mean_input": r.input_len.mean(), "mean_output": r.output_len.mean(),
                             "std_output": r.output_len.std()}  # fmt: skip
                    pre, dec, rt = build(plan, ctx.planner.gpus, router=router, max_len=int(r.input_len.max()),
                                         max_context=int((r.input_len + r.output_len).max()), stats=stats)  # fmt: skip
                    sim = Simulation(r, pre, dec, rt)
                    sim.run()
                    m = summary(sim, float(r.arrival[len(r) // 10]))
                    if m["throughput_req_s"] >= 0.97 * m["offered_req_s"]:
                        best, ttft = m["offered_req_s"], m["ttft_ms_p99"] / 1e3
                    else:
                        break  # past saturation
                cells.append(f"{best / lam:.2f} ({ttft:.1f})" if best > 0 else f"< {SCALES[0]:.2f}")
            print(f"| {inv} | {wl} | {lam:.1f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

"""The workload's arrival model against its trace, and what its bursts do to a plan over a whole trace's day.

    python benchmarks/arrivals_bench.py                      # both Azure traces; the main job's exact plan
    python benchmarks/arrivals_bench.py --plan PATH/plan.json --scales 1,0.5,0.25

A. Fidelity: each shipped trace (../shared/data/traces, the Azure LLM inference traces 2023, CC BY 4.0)
   against arrivals drawn from its model (`arrivals=workload`: a Cox process over the trace's rate per
   10-s bin, simulator/arrivals.py), one whole cycle of the profile per seed, at the trace's own rate and at
   100 times it: the inter-arrival coefficient of variation and the 99th percentile and maximum of the
   request rate in 1-, 10- and 60-s windows over the mean. Nothing is fitted to these numbers beyond the
   profile itself. Beside them the trace itself at 100 times its rate, replayed on its own time scale
   (`arrivals=trace`) and with its timestamps divided by 100 (`arrivals=trace_compressed`).
B. A plan simulated over one whole cycle of its workload's profile (every bin of the trace's day once), with
   the workload's arrivals at `--scales` x its stated rate and with Poisson arrivals at its stated rate: the
   share of requests within the SLOs and the SLO percentiles over the whole day.
C. `--cells`: each Table 5.1 cell's exact plan for Poisson arrivals and its exact plan for the workload's own
   arrivals (search.arrivals=workload: the SLO caps under them, `costmodel.queueing.modulated_cap`), each
   with the queueing model's mean rate under those arrivals (`rates.bursty_req_s`) and the mean rate it
   sustains under them in the simulator, as search.arrivals=workload states it (`pipeline.planning.check.bursts`,
   seed 0); then the second plan's simulated rate simulated again on other draws of the arrivals (seeds 1 and
   2: another start in the profile, other Poisson draws, other lengths), and where it breaks there, 5 % below
   it: the share of requests within the SLOs, the verdict, and the throughput over the offered rate.
D. `--replay`: the rate the queueing model states under the workload's bursts (`rates.bursty_req_s`, from the
   trace's rate per `PROFILE_BIN_S`-second bin), for hetero_a's exact plan of each Azure workload, checked on the
   trace itself replayed on its own clock at that rate (`arrivals=trace`, its whole hour, `--seeds` draws of the
   copies): the share of requests within the SLOs, TTFT and TPOT p99, and whether the SLOs held. Beside it the
   rate the same model states from 10-s bins, the arrival model before sub-10-s clumps were kept, replayed alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.planning.simulation import RequestMix, Runner, SimSettings
from pipeline.planning.traces import load_trace
from simulator.arrivals import PROFILE_BIN_S, modulated_ms, rate_profile, replayed

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "data" / "traces"
WINDOWS = (1, 10, 60)


def burstiness(t_s: np.ndarray) -> list[float]:
    """[CV of the gaps, then per window: p99 / mean, max / mean of the rate in windows of that many seconds]."""
    t = np.sort(t_s - t_s.min())
    gaps = np.diff(t)
    out = [float(gaps.std() / gaps.mean())]
    for w in WINDOWS:
        c = np.bincount((t // w).astype(int)).astype(float)
        out += [float(np.percentile(c, 99) / c.mean()), float(c.max() / c.mean())]
    return out


def fidelity(seeds: int) -> None:
    head = ["CV"] + [f"{w}-s {k}" for w in WINDOWS for k in ("p99", "max")]
    print("## A. The arrival model against its trace (rate in windows over the mean; CV of the gaps)\n")
    print("| trace | arrivals | " + " | ".join(head) + " |")
    print("|---|---|" + "---:|" * len(head))
    for name in ("code", "conv"):
        trace = load_trace(TRACES / f"AzureLLMInferenceTrace_{name}.csv")
        t = trace.arrival_s
        rate = len(t) / float(t.max() - t.min())
        prof = rate_profile(t)
        print(f"| {name} | the trace ({rate:.2f} req/s) | " + " | ".join(f"{v:.2f}" for v in burstiness(t)) + " |")
        for scale in (1, 100):
            rows = []
            for seed in range(seeds):
                n = int(rate * scale * len(prof) * PROFILE_BIN_S)  # one whole cycle of the profile
                rows.append(burstiness(modulated_ms(n, rate * scale, prof, np.random.default_rng(seed)) / 1e3))
            mean = np.mean(rows, axis=0)
            print(f"| {name} | model at {scale} x its rate ({seeds} seeds) | " + " | ".join(f"{v:.2f}" for v in mean)
                  + " |")  # fmt: skip
        for label, kind in (("replayed", replayed), ("compressed", None)):  # arrivals=trace, arrivals=trace_compressed
            if kind is None:
                at = t / 100  # the timestamps divided by the rate scale: every burst 100 times shorter
            else:
                at = kind(t, trace.input_tokens, trace.output_tokens, 100.0, 100 * len(t))[0].arrival / 1e3
            print(f"| {name} | the trace {label} at 100 x its rate | " + " | ".join(f"{v:.2f}" for v in
                  burstiness(at)) + " |")  # fmt: skip
    print()


def day(plan_path: str | None, scales: list[float]) -> None:
    import plan as plans

    if plan_path is None:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from common import exact_plan

        _, ctx, plan = exact_plan(["+inventory=hetero_a"])
        mix, where = RequestMix.of(ctx.planner.workload), "the main job's exact plan (hetero_a, azure_code)"
    else:
        from pipeline.planning.simulation import request_mix

        plan = plans.load(plan_path)
        mix, where = request_mix(plan.workload, plan.spec_of_workload), plan_path
    if mix.profile is None:
        raise SystemExit(f"workload {mix.name} has no arrival model (no trace): nothing to compare")
    day_s = len(mix.profile) * PROFILE_BIN_S
    runner = Runner(plan, plan.slo, SimSettings())
    print(f"## B. {where}: {plan.rate_req_s:.1f} req/s stated, simulated over one whole cycle of the workload's "
          f"{day_s:,.0f}-s arrival profile ({plan.slo.text()})\n")  # fmt: skip
    print("| arrivals | mean rate (req/s) | requests | within the SLOs | TTFT p99 (ms) | TPOT p99 (ms) | "
          "throughput / offered | s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind, scale in [("poisson", 1.0), *(("workload", s) for s in scales)]:
        rate = plan.rate_req_s * scale
        t0 = time.perf_counter()
        _, m, _ = runner.simulate(mix.requests(int(rate * day_s), rate, kind, 0))
        print(f"| {kind} | {rate:.1f} ({scale:g} x) | {int(rate * day_s):,} | {m['slo_attainment']:.1%} | "
              f"{m['ttft_ms_p99']:,.0f} | {m['tpot_ms_p99']:.1f} | {m['throughput_req_s'] / m['offered_req_s']:.3f} "
              f"| {time.perf_counter() - t0:.0f} |", flush=True)  # fmt: skip


CELLS = [f"{i}:{w}" for i in ("hetero_a", "hetero_b", "homo_c") for w in ("azure_code", "azure_conv")]


def cells(which: list[str]) -> None:
    from common import exact_plan

    from pipeline.planning.check import bursts

    print("\n## C. The Table 5.1 cells under their workload's own arrivals\n")
    print("Each cell twice: its exact plan for Poisson arrivals (the default) and its exact plan for the workload's "
          "arrivals (search.arrivals=workload: every island's SLO caps under them). For each, the queueing model's "
          "rate under the bursts (`rates.bursty_req_s`, every plan states it) and the rate the simulator sustains "
          "over a whole day of them (`check.bursts`, seed 0, its first probe the model's rate). The second plan's "
          "simulated rate is simulated again on seeds 1 and 2, and 5 % below where it breaks there.\n")  # fmt: skip
    print("| cell | Poisson plan: stated | model | simulated | model / simulated | burst plan: stated (Poisson) | "
          "model | simulated | model / simulated | seed 1: within the SLOs, verdict, throughput / offered | "
          "seed 2 | s |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|")
    for cell in which:
        inv, wl = cell.split(":")
        t0 = time.perf_counter()
        row = [cell]
        for extra in ([], ["search.arrivals=workload"]):
            _, ctx, plan = exact_plan([f"+inventory={inv}", f"workload={wl}", *extra])
            mix = RequestMix.of(ctx.planner.workload)
            b = bursts(plan, mix)
            model = plan.rates.bursty_req_s
            row += [f"{plan.rate_req_s:.1f}", f"{model:.1f}", f"{b.rate_req_s:.1f}", f"{model / b.rate_req_s:.2f}"]
        day_s = len(mix.profile) * PROFILE_BIN_S
        for seed in (1, 2):  # the burst plan's simulated rate on other draws
            runner = Runner(plan, plan.slo, SimSettings(seed=seed))
            text = []
            for at in (1.0, 0.95):  # the stated rate; where it breaks on this draw, 5 % below it
                rate = b.rate_req_s * at
                _, m, _ = runner.simulate(mix.requests(int(rate * day_s), rate, "workload", seed))
                why = runner.verdict(m)
                text.append(f"{at:g} x: {m['slo_attainment']:.1%}, {why or 'held'}, "
                            f"{m['throughput_req_s'] / m['offered_req_s']:.3f}")  # fmt: skip
                if not why:
                    break
            row.append("; ".join(text))
        print("| " + " | ".join(row) + f" | {time.perf_counter() - t0:.0f} |", flush=True)


def replay(seeds: int) -> None:
    import dataclasses

    from common import context

    from costmodel.queueing import RateProfile
    from pipeline.planning.build import build_plan
    from pipeline.search.reference import exact_layout, reference

    print("\n## D. The rate stated under the bursts, on the trace replayed on its own clock\n")
    print("hetero_a's exact plan of each workload; the queueing model's rate under the workload's arrivals from its "
          f"trace's rate per {PROFILE_BIN_S:g}-s bin (as shipped) and per 10-s bin; each replayed over the trace's "
          f"whole hour at that rate (arrivals=trace), seeds 0-{seeds - 1}.\n")  # fmt: skip
    print("| workload | Poisson rate (req/s) | profile bins | stated under the bursts (req/s) | seed | within the SLOs "
          "| TTFT p99 (ms) | TPOT p99 (ms) | verdict | s |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---|---:|")
    for name in ("code", "conv"):
        settings, ctx = context(["+inventory=hetero_a", f"workload=azure_{name}"])
        layout = exact_layout(reference(settings, ctx, ctx.planner))
        plan = build_plan(ctx.planner, layout, ctx.inner_time_limit_s, ctx.backend)
        roles = tuple(str(isl.role) for isl in plan.islands)
        trace = load_trace(TRACES / f"AzureLLMInferenceTrace_{name}.csv")
        t = trace.arrival_s
        span_s, own = float(t.max() - t.min()), len(t) / float(t.max() - t.min())
        for bin_s in (PROFILE_BIN_S, 10.0):
            if bin_s == PROFILE_BIN_S:
                rate = plan.rates.bursty_req_s
            else:
                poisson = ctx.planner.poisson()
                coarse = dataclasses.replace(poisson, arrivals=RateProfile(rate_profile(t, bin_s), bin_s), _caps={},
                                             _other=poisson)  # fmt: skip
                sol = coarse.solve(layout, "max_rate", ctx.inner_time_limit_s, backend=ctx.backend, roles=roles)[1]
                rate = sol.rate_req_s
            for seed in range(seeds):
                t0 = time.perf_counter()
                reqs = replayed(t, trace.input_tokens, trace.output_tokens, rate / own, int(rate * span_s), seed)[0]
                runner = Runner(plan, plan.slo, SimSettings(seed=seed))
                _, m, _ = runner.simulate(reqs)
                why = runner.verdict(m)
                print(f"| {name} | {plan.rate_req_s:.1f} | {bin_s:g} s | {rate:.2f} | {seed} | "
                      f"{m['slo_attainment']:.1%} | {m['ttft_ms_p99']:,.0f} | {m['tpot_ms_p99']:.1f} | "
                      f"{why or 'held'} | {time.perf_counter() - t0:.0f} |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", default=None, help="a plan.json (default: the main job's exact plan)")
    ap.add_argument("--scales", default="1,0.5,0.25", help="mean rates to simulate, as multiples of the stated")
    ap.add_argument("--seeds", type=int, default=None, help="draws: 5 for part A, 3 for part D")
    ap.add_argument("--cells", nargs="?", const=",".join(CELLS), default="",
                    help="part C only, on these inventory:workload cells (default: the Table 5.1 cells)")  # fmt: skip
    ap.add_argument("--replay", action="store_true", help="part D only")
    args = ap.parse_args()
    if args.replay:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        replay(args.seeds or 3)
        return
    if args.cells:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        cells(args.cells.split(","))
        return
    fidelity(args.seeds or 5)
    day(args.plan, [float(s) for s in args.scales.split(",")])


if __name__ == "__main__":
    main()

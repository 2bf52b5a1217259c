"""The rate under the workload's own arrivals: the mean rate the plan sustains within its SLOs over whole days of
its trace's bursts, simulated (`pipeline.planning.check.bursts`), from the queueing model's rate under them. The
plan's `bursts`; run with search.arrivals=workload (off: search.arrivals=poisson). The queueing model's rate under
the bursts (`rates.bursty_req_s`, every plan of a workload with a trace) is reported here too."""

from __future__ import annotations

from pipeline.planning.check import BURST_PROBES, bursts
from pipeline.search.steps.base import PlanStep, StepContext
from plan import Bursts, Plan
from simulator.arrivals import PROFILE_BIN_S


class WorkloadBursts(PlanStep):
    name = "bursts"
    field = "bursts"
    what = "the simulations under the workload's arrivals"
    off = "search.arrivals=poisson"
    on = ("search.arrivals=workload",)
    stage = 2  # after the check: its first probe is the rate the plan states

    def wanted(self, plan: Plan, sc: StepContext) -> bool:
        return sc.settings.search.arrivals == "workload" and plan.serves

    def announce(self, plan: Plan, sc: StepContext) -> str | None:
        profile = sc.mix.profile
        day = 0 if profile is None else len(profile) * PROFILE_BIN_S
        return f"under the workload's own arrivals: {BURST_PROBES} simulations of its {day:,.0f}-s day ..."

    def compute(self, plan: Plan, sc: StepContext) -> Bursts:
        return bursts(plan, sc.mix)

    def lines(self, plan: Plan, sc: StepContext, seconds: float) -> list[str]:
        b = plan.bursts
        if b is None:
            return []
        share = b.rate_req_s / plan.rate_req_s
        return [f"under the workload's own arrivals (its {PROFILE_BIN_S:g}-s rate at most {b.peak_to_mean:.2f} x the "
                f"mean for {b.percentile:g} % of requests): the plan sustains {b.rate_req_s:.1f} req/s within its SLOs "
                f"over the day, {share:.1%} of its rate under Poisson arrivals ({b.sim_wall_s:.0f} s)"]  # fmt: skip

    def scored(self, plan: Plan, sc: StepContext) -> str | None:
        if sc.ctx.planner.arrivals is None or plan.rates.bursty_req_s is None:
            return None
        ref = plan.reference
        gap = f", {ref.gap_text()} to the exact optimum there" if ref is not None and ref.gap is not None else ""
        return (f"planned for the workload's own arrivals: the trials scored each layout by its rate under them in the "
                f"queueing model, {plan.rates.bursty_req_s:.2f} req/s for this one{gap}")  # fmt: skip

    def summary(self, plan: Plan, sc: StepContext) -> list[str]:
        model = plan.rates.bursty_req_s
        if model is None or plan.bursts is not None or plan.rate_req_s <= 0:
            return []
        return [f"under the workload's own arrivals (its trace's bursts) the queueing model gives {model:.2f} req/s "
                f"({model / plan.rate_req_s:.1%} of the rate) within the SLOs over a day; search.arrivals=workload "
                "plans for them and simulates it"]  # fmt: skip

    def metrics(self, plan: Plan) -> dict[str, float]:
        out = {}
        if plan.rates.bursty_req_s is not None:
            out["bursty_model_req_s"] = plan.rates.bursty_req_s
        if plan.bursts is not None:
            out.update(bursty_rate_req_s=plan.bursts.rate_req_s, burst_peak_to_mean=plan.bursts.peak_to_mean)
        return out

    def rows(self, plan: Plan) -> list[str]:
        """The mean rate the plan sustains under its workload's own arrivals: the queueing model's (every plan of a
        workload with a trace) and the simulated one."""
        model, b = plan.rates.bursty_req_s, plan.bursts
        rows = []
        if model is not None:
            share = model / plan.rate_req_s if plan.rate_req_s > 0 else 0.0
            rows.append(f"| under the workload's own arrivals, queueing model (each island's SLO caps under its "
                        f"trace's bursts, the percentiles over the whole day) | {model:.2f} req/s mean ({share:.1%} of "
                        "the rate) |")  # fmt: skip
        if b is None:
            return rows
        share = b.rate_req_s / plan.rate_req_s if plan.rate_req_s > 0 else 0.0
        held = f"none of the rates tried held ({b.why_above})"
        if b.rate_req_s > 0:
            held = (f"{b.slo_attainment:.1%} of requests within the SLOs, TTFT p99 {b.ttft_ms_p99:,.0f} ms, TPOT p99 "
                    f"{b.tpot_ms_p99:.1f} ms")  # fmt: skip
            if not b.why_above:  # no rate tried broke: the probes stopped at their ceiling, not at the plan's
                held += "; every rate tried held, this the highest: the plan sustains at least this"
        rows.append(f"| **under the workload's own arrivals** (a {b.day_s:,.0f}-s day of its trace's bursts, "
                    f"simulated) | **{b.rate_req_s:.2f} req/s** mean ({share:.1%} of the rate above; it tolerates "
                    f"peaks of {1 / share if share > 0 else float('inf'):.1f} x that mean): {held}; its "
                    f"{PROFILE_BIN_S:g}-s rate is at most {b.peak_to_mean:.2f} x the mean for {b.percentile:g} % of "
                    f"requests (the rate / that: {b.estimate_req_s:.2f}) |")  # fmt: skip
        return rows

"""The simulated check: the plan simulated request by request at its stated rate, judged by its own SLOs
(`pipeline.planning.check.check`); where the SLOs break, the highest lower rate the simulator sustains. The plan's
`verification`; off with search.verify=false."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.checks import boolean
from pipeline.planning.check import LOW, check
from pipeline.search.steps.base import PlanStep, StepContext
from plan import Plan, Verification


class Check(PlanStep):
    name = "check"
    field = "verification"
    what = "the simulated check"
    off = "search.verify=false"
    on = ("search.verify=true",)
    forks = True  # beside the rate band: each on its own core

    def read(self, search: Any) -> bool:
        return boolean(search.verify, "search.verify")

    def wanted(self, plan: Plan, sc: StepContext) -> bool:
        return bool(self.options(sc))

    def announce(self, plan: Plan, sc: StepContext) -> str | None:
        if not plan.serves:
            return None
        return f"simulating the plan at its stated {plan.rate_req_s:.1f} req/s, judged by its {plan.slo.text()} ..."

    def compute(self, plan: Plan, sc: StepContext) -> Verification | None:
        return check(plan, sc.mix) if plan.serves else None

    def lines(self, plan: Plan, sc: StepContext, seconds: float) -> list[str]:
        """What the simulator found (a warning when it sustains more than 5 % below the stated rate, or the
        throughput is more than 5 % off)."""
        if not plan.serves:
            return ["warning: the best layout serves no requests (no island can run the model in one role): nothing "
                    "to simulate; see report.md's islands"]  # fmt: skip
        v = plan.verification
        if v is None:  # interrupted
            return []
        out = [
            f"simulated: {v.throughput_req_s:.1f} req/s = {v.simulated_over_stated:.3f} x stated (± "
            f"{v.precision:.1%}); TTFT p50 {v.ttft_ms_p50:.0f} / p99 {v.ttft_ms_p99:.0f} ms, TPOT p99 "
            f"{v.tpot_ms_p99:.1f} ms, {v.slo_attainment:.1%} within the SLOs ({v.requests:,} requests, "
            f"{v.sim_wall_s:.1f} s)"
        ]
        if v.steady_state:
            out.append(f"warning: in the simulated check {v.steady_state}")
        if v.cache_hit_rate is not None:
            out.append(f"prefix caches: {v.cache_hit_rate:.1%} of prompt tokens found cached in the simulated check"
                       + _expected_hits(plan))  # fmt: skip
        off = abs(v.simulated_over_stated - 1.0) > max(0.05, 2 * v.precision)  # more than chance gives this window
        if v.sustained and not off:
            return out
        if v.sustained_req_s > 0:
            below = f"it sustains {v.sustained_req_s:.1f} req/s ({v.sustained_over_stated:.3f} x stated)"
        else:
            below = f"none of the rates tried down to {LOW:g} x stated held either"
        if not v.sustained and v.holds_at_0_95 and not off:  # within 5 %: a finite simulation at the edge
            return [*out, f"at the stated rate the simulator finds {v.why_not}; {below}"]
        why = f"{v.why_not}; {below}" if v.why_not else f"simulated / stated = {v.simulated_over_stated:.3f}"
        return [*out, f"warning: the simulator does not confirm the stated rate ({why})"]

    def metrics(self, plan: Plan) -> dict[str, float]:
        v = plan.verification
        if v is None:
            return {}
        return {f"simulated_{k}": float(x) for k, x in dataclasses.asdict(v).items()
                if isinstance(x, (int, float)) and x == x and abs(x) != float("inf")}  # fmt: skip

    def rows(self, plan: Plan) -> list[str]:
        v = plan.verification
        caches = [] if v is None or v.cache_hit_rate is None else [
            f"| prefix caches | {v.cache_hit_rate:.1%} of prompt tokens found cached in the simulated check"
            f"{_expected_hits(plan)} |"]  # fmt: skip
        return verification_rows(v) + caches


def verification_rows(v: Verification | None) -> list[str]:
    """The simulated check's rows of report.md."""
    if v is None:
        return ["| simulated | not checked (search.verify=false) |"]
    verdict = "SLOs held" if v.sustained else f"**not sustained**: {v.why_not}"
    if not v.sustained and v.sustained_req_s:  # the highest rate below the stated one that held
        verdict += (f"; the simulator sustains **{v.sustained_req_s:.2f} req/s** ({v.sustained_over_stated:.3f} x "
                    "stated): plan with that")  # fmt: skip
    elif not v.sustained:
        verdict += "; none of the lower rates simulated held either (down to half the stated rate)"
    rows = [
        f"| simulated at that rate | {v.throughput_req_s:.2f} req/s = {v.simulated_over_stated:.3f} x stated"
        + (f" (± {v.precision:.1%}: its window's sampling noise)" if v.precision else "")
        + f"; {verdict} |",
        f"| simulated latency | TTFT p50 {v.ttft_ms_p50:.0f} ms, p99 {v.ttft_ms_p99:.0f} ms; TPOT p99 "
        f"{v.tpot_ms_p99:.1f} ms; {v.slo_attainment:.1%} of requests within the SLOs ({v.slo}) |",
    ]
    if v.steady_state:  # the verdict rests on a window that may be too short (or an overload)
        rows.append(f"| simulated window | {v.requests:,} requests: {v.steady_state} |")
    return rows


def _expected_hits(plan: Plan) -> str:
    """"; per prefill island, simulated (expected): ..." where the plan priced its prefill at its caches' hit rates."""
    v = plan.verification
    if v is None or v.cache_hit_rates is None:
        return ""
    pairs = [f"{isl.size} x {isl.gpu} {v.cache_hit_rates[k]:.0%} ({isl.cache_hit_expected:.0%})"
             for k, isl in enumerate(plan.serving) if isl.cache_hit_expected is not None]  # fmt: skip
    return f"; per prefill island, simulated (expected): {', '.join(pairs)}" if pairs else ""

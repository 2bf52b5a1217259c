"""The rate band: the plan's layout re-planned under draws of the calibration's factors, its rate's 10th, 50th and
90th percentile (`pipeline.planning.band.rate_band`). The plan's `band`; off with search.band_draws=0, and without
an uncertain calibration."""

from __future__ import annotations

from typing import Any

from costmodel.calibration import Calibration
from costmodel.measured import MEASURED_MODELS
from pipeline.checks import whole_number
from pipeline.planning.band import rate_band
from pipeline.search.steps.base import PlanStep, StepContext
from plan import Band, Plan


def band_calibration(cal: Calibration, plan: Plan) -> Calibration:
    """The calibration a plan's range is drawn from: the model's own error spread once more where the plan
    extrapolates (pipeline/planning/envelope.py), and on every GPU of the plan for a model no shipped measurement is
    of (`costmodel.measured.MEASURED_MODELS`)."""
    if plan.model.name in MEASURED_MODELS:
        return cal.widened(isl.gpu for isl in plan.serving if isl.outside)
    return cal.unmeasured(plan.model.name, (isl.gpu for isl in plan.serving))


class RateBand(PlanStep):
    name = "band"
    field = "band"
    what = "the rate band"
    off = "search.band_draws=0"
    on = ("costmodel=serving", "search.band_draws=4")

    def read(self, search: Any) -> int:
        """Draws of the calibration the plan's layout is re-planned under (0: no band)."""
        return whole_number(search.get("band_draws", 0), "search.band_draws")

    def wanted(self, plan: Plan, sc: StepContext) -> bool:
        cal = sc.settings.calibration
        return cal is not None and cal.uncertain and bool(self.options(sc))

    def announce(self, plan: Plan, sc: StepContext) -> str | None:
        cal = sc.settings.calibration.name
        return f"rate band: the best layout under {self.options(sc)} draws of calibration {cal} ..."

    def compute(self, plan: Plan, sc: StepContext) -> Band | None:
        s, ctx = sc.settings, sc.rates
        cal = band_calibration(s.calibration, plan)
        return rate_band(ctx.planner, sc.layout, plan.rate_req_s, plan.rates.searched_req_s, cal,
                         self.options(sc), time_limit_s=ctx.inner_time_limit_s, backend=ctx.backend,
                         seed=s.search.seed)  # fmt: skip

    def lines(self, plan: Plan, sc: StepContext, seconds: float) -> list[str]:
        b = plan.band
        if b is None:
            return []
        return [f"rate band: {b.p10_req_s:.1f} - {b.p90_req_s:.1f} req/s (10th-90th percentile; {seconds:.1f} s)"]

    def metrics(self, plan: Plan) -> dict[str, float]:
        b = plan.band
        if b is None:
            return {}
        return {"band_p10_req_s": b.p10_req_s, "band_p50_req_s": b.p50_req_s, "band_p90_req_s": b.p90_req_s}

    def rows(self, plan: Plan) -> list[str]:
        """The headline's range over the calibration's uncertainty, or why it has none."""
        rows = []
        if plan.search is not None and plan.search.robust:
            rows.append("| planned at | every calibration factor's 10th percentile (search.robust) |")
        band = plan.band
        if band is None:
            uncalibrated = plan.cost.profile.calibration is None
            why = "no calibration (costmodel.calibration)" if uncalibrated else "search.band_draws=0"
            return [*rows, f"| range | not estimated: {why} |"]
        return [
            *rows,
            f"| range over the calibration (10th / 50th / 90th percentile) | {band.p10_req_s:.1f} / "
            f"{band.p50_req_s:.1f} / {band.p90_req_s:.1f} req/s ({band.draws} draws of {band.calibration}) |",
        ]

"""report.md (pipeline/records/report.py): what a reader of a plan is told, row by row."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

import plan as plans
from helpers import REPO, plan_of, tiny_plan
from pipeline.records.report import TWO_MODELS, report
from pipeline.search.steps import STEPS
from pipeline.search.steps.check import verification_rows
from plan import Hosts, Reference, SearchInfo, Verification


def test_a_reference_stopped_at_its_time_limit_is_a_bound_and_says_so() -> None:
    plan = dataclasses.replace(
        tiny_plan(96.0),
        reference=Reference(optimum_req_s=90.0, rate_per_dollar=1.0, bound_req_s=120.0, gap=0.2, gap_is_bound=True),
        search=SearchInfo("max_rate", "tpe", "divider", 1, 0, 0, True, 1.0),
    )
    text = report(plan, pd.DataFrame(), "# plan")
    bound = "| gap to it | at most 20.00% (the reference stopped at its time limit; the optimum is at most 120.00"
    assert bound in text
    assert "| the exact reference, stopped at its time limit: its layout | 90.00 req/s |" in text  # not "optimum"
    assert "| trials | 1 (0 failed, 0 rejected) |" in text
    assert f"Two rates of one layout: {TWO_MODELS}" in text  # the gap's model and the headline's, explained once


def test_identical_islands_side_by_side_share_a_row_of_the_report(tmp_path: Path) -> None:
    """A 10,000-GPU plan has hundreds of identical islands: report.md gives each run of them one row, (xN)
    counting them, and the node map the hosts they cover."""
    path, _ = plan_of(tmp_path)
    plan = plans.load(path)
    first = next(isl for isl in plan.islands if isl.serving)
    assert first.hosts is not None
    copies = [dataclasses.replace(first, hosts=Hosts(first.hosts.node_gpus, tuple(range(10 + k * len(first.hosts.nodes),
              10 + (k + 1) * len(first.hosts.nodes))), 0)) for k in range(3)]  # fmt: skip
    plan = dataclasses.replace(plan, islands=(*copies, *(isl for isl in plan.islands if isl is not first)))
    text = report(plan, pd.DataFrame(), "# plan")
    name = f"{first.size} x {first.gpu}"
    islands_table = text.split("Node map")[0].split("Where the plan extrapolates")[0]
    assert islands_table.count(f"| {name} (x3) | {first.role} |") == 1
    last = 10 + 3 * len(first.hosts.nodes) - 1
    assert f"| {first.gpu} nodes 10-{last} | {name} (x3) | {first.role} |" in text
    # one row in each table: the islands, the node map, and where the plan extrapolates if these do
    assert text.count(f"{name} (x3)") == 2 + bool(first.outside)


def test_the_simulated_check_rows_say_what_held_and_what_to_plan_with() -> None:
    def check(**kw: object) -> Verification:
        base = dict(offered_req_s=10.0, throughput_req_s=9.9, simulated_over_stated=0.99, ttft_ms_p50=100.0,
                    ttft_ms_p99=900.0, tpot_ms_p99=40.0, ttft_ms_at_slo=900.0, tpot_ms_at_slo=40.0, slo_attainment=1.0,
                    sustained=True, why_not="", steady_state="", requests=3000, sim_wall_s=1.0,
                    slo="SLO TTFT p99 <= 2000 ms", sustained_req_s=10.0, sustained_over_stated=1.0)  # fmt: skip
        return Verification(**{**base, **kw})  # type: ignore[arg-type]

    assert verification_rows(None) == ["| simulated | not checked (search.verify=false) |"]
    held = verification_rows(check())
    assert "SLOs held" in held[0] and len(held) == 2
    broke = verification_rows(check(sustained=False, why_not="TTFT 2100 > 2000 ms", sustained_req_s=8.5,
                                     sustained_over_stated=0.85, steady_state="the window is short"))  # fmt: skip
    assert "**not sustained**: TTFT 2100 > 2000 ms; the simulator sustains **8.50 req/s** (0.850 x stated)" in broke[0]
    assert broke[-1] == "| simulated window | 3,000 requests: the window is short |"
    none = verification_rows(check(sustained=False, why_not="TTFT 9000 > 2000 ms", sustained_req_s=0.0))
    assert "none of the lower rates simulated held either (down to half the stated rate)" in none[0]


def test_the_previous_releases_main_job_plan_reports_the_rows_it_reported() -> None:
    """tests/data/plan_v2_hetero_a.json and report_v2_hetero_a.md: the main job's plan.json (schema 2) and report.md
    as the previous release wrote them. Read by this release, the plan reports every row as it did (all but the
    trials' table, which comes from trials.parquet)."""
    data = REPO / "tests" / "data"
    plan = plans.load(data / "plan_v2_hetero_a.json")
    before = (data / "report_v2_hetero_a.md").read_text().splitlines()
    trials = before.index("Top layouts (each once: the first trial that scored it, and how many trials did):")
    now = report(plan, pd.DataFrame(), "\n".join(before[:3]), "routing.png", STEPS).splitlines()
    # since, the first block is the headline: four numbered sentences and a blank line after the header
    assert [line[:3] for line in now[4:8]] == ["1. ", "2. ", "3. ", "4. "] and now[8] == ""
    now = now[:4] + now[9:]
    # and the roles compared moved from the top table to the diagnostics: the same row there
    roles = next(line for line in before if line.startswith("| roles compared"))
    assert before.index(roles) < before.index("Diagnostics:") < now.index(roles)
    before, now = [line for line in before if line != roles], [line for line in now if line != roles]
    # and the top table's rows follow the headline's order since: the host lost before the bursts
    lost = next(i for i, line in enumerate(before) if line.startswith("| one host lost"))
    bursts = next(i for i, line in enumerate(before) if line.startswith("| under the workload's own arrivals"))
    assert bursts == lost - 1 and now.index(before[lost]) == now.index(before[bursts]) - 1
    before[bursts], before[lost] = before[lost], before[bursts]
    trials -= 1
    assert len(now) == trials - 1
    for old, new in zip(before[: trials - 1], now, strict=True):
        # the node map has gained a column since: the share of the rate kept with a host of the island lost
        assert new == old or (old.startswith(("Node map", "|")) and new.startswith(old.removesuffix("):"))), old


def test_the_headline_plans_with_what_the_simulator_sustains_and_scales_the_rest_by_it() -> None:
    """The previous release's main job plan stated 586.57 req/s, and the simulator sustained 582.91 within the SLOs
    (its TTFT p99 over the target at the stated rate): the headline plans with 582.91 and moves its band, worst host
    and rate under bursts by the same ratio. Had the simulator sustained the stated rate, they are plan.json's."""
    import dataclasses

    import pytest

    from pipeline.records.report import Headline

    plan = plans.load(REPO / "tests" / "data" / "plan_v2_hetero_a.json")
    v, band, losses, bursty = plan.verification, plan.band, plan.host_losses, plan.rates.bursty_req_s
    assert v is not None and not v.sustained and band is not None and losses is not None and bursty is not None
    held = Headline.of(dataclasses.replace(plan, verification=dataclasses.replace(v, sustained=True)))
    assert held.metrics == {"plan_req_s": plan.rate_req_s, "plan_range_p10_req_s": band.p10_req_s,
                            "plan_range_p90_req_s": band.p90_req_s, "plan_host_lost_req_s": losses.worst.rate_req_s,
                            "plan_bursty_req_s": bursty}  # fmt: skip
    assert held.sentences[0].startswith(f"Plan with {plan.rate_req_s:.2f} req/s: the simulator sustains it")
    cut = Headline.of(plan)
    ratio = v.sustained_req_s / plan.rate_req_s
    assert cut.rate_req_s == pytest.approx(582.91, abs=0.01) and 0.99 < ratio < 1
    assert cut.metrics == pytest.approx({k: ratio * x for k, x in held.metrics.items()})
    assert cut.sentences[0].startswith("Plan with 582.91 req/s: what the simulator sustains within the SLOs, below "
                                       "the 586.57 the model states")  # fmt: skip

"""A plan's rate under its workload's own arrivals (search.arrivals=workload; pipeline/planning/check.py `bursts`):
the burst height a model starts from, the rate the whole-day simulations find, and how a search records it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import plan as plans
from helpers import SMALL, in_process, one_line, plan_of


def test_the_peak_to_mean_is_the_burst_height_that_many_requests_arrive_at_or_below() -> None:
    """Profile 1/3, 8/3, 0, 1 (requests 5, 40, 0, 15 of 60): 40 of 60 requests arrive at 8/3 x the mean, so for
    99 % of them the rate is at most 8/3; 15 + 5 = 20 of 60 (33 %) at 1 or below."""
    from pipeline.planning.check import peak_to_mean

    prof = np.array([1 / 3, 8 / 3, 0.0, 1.0])
    assert peak_to_mean(prof, 99.0) == pytest.approx(8 / 3)
    assert peak_to_mean(prof, 30.0) == pytest.approx(1.0)
    assert peak_to_mean(prof, 5.0) == pytest.approx(1 / 3)


@pytest.mark.xdist_group("step_searches")
def test_the_rate_under_the_workloads_bursts_holds_over_the_day_and_the_next_rate_up_does_not(
    step_searches: dict[str, Path],
) -> None:
    """The plan of a small inventory (conftest `STEP_INVENTORY`) under its workload's own arrivals (azure_code;
    conftest `step_searches`, whose search ran `bursts` on it): the rate `bursts` found holds over the whole day (the
    draws its probes made), 30 % more does not (near the edge a day's draws move the verdict: the lowest probe
    above the rate found failed, TTFT p99 2.9 s, where 15 % above it held), and it is far below the Poisson rate
    (the code trace's 10-s rate reaches 23.4 x its mean for 1 % of its requests, at 1-s bins)."""
    import yaml

    from costmodel.catalog import CONF_DIR
    from pipeline.planning.check import BURST_PROBES, peak_to_mean
    from pipeline.planning.simulation import Runner, SimSettings, request_mix
    from simulator.arrivals import PROFILE_BIN_S

    (path,) = (step_searches["first"] / "out").glob("*/*/plan.json")
    plan = plans.load(path)
    mix = request_mix(plan.workload, yaml.safe_load((CONF_DIR / "workload" / f"{plan.workload}.yaml").read_text()))
    b = plan.bursts
    assert b is not None and 0 < b.rate_req_s < plan.rate_req_s and b.probes == BURST_PROBES == 7
    assert b.peak_to_mean == pytest.approx(peak_to_mean(mix.profile, b.percentile)) and b.peak_to_mean > 10
    assert b.estimate_req_s == pytest.approx(plan.rate_req_s / b.peak_to_mean)
    assert b.day_s == len(mix.profile) * PROFILE_BIN_S
    runner = Runner(plan, plan.slo, SimSettings(seed=b.seed))
    for rate, holds in ((b.rate_req_s, True), (b.rate_req_s * 1.3, False)):  # the same draws as the probes'
        day = mix.requests(int(np.ceil(rate * b.day_s)), rate, "workload", b.seed)
        assert day.arrival[-1] / 1e3 == pytest.approx(b.day_s, rel=0.1)  # a whole day of the profile
        _, m, _ = runner.simulate(day)
        assert (runner.verdict(m) == "") is holds, (rate, runner.verdict(m))


@pytest.mark.xdist_group("step_searches")
def test_a_search_under_the_workloads_arrivals_states_both_rates(step_searches: dict[str, Path]) -> None:
    """The search of a small inventory (conftest `STEP_INVENTORY`) by the exact MILP with search.arrivals=workload
    (conftest `step_searches`, which the post-search steps' contract shares)."""
    from mlflow.tracking import MlflowClient

    first = step_searches["first"]
    stdout = (first / "console.txt").read_text()
    (folder,) = {p.parent for p in (first / "out").glob("*/*/plan.json")}
    plan = plans.load(folder / "plan.json")
    b = plan.bursts
    assert b is not None and 0 < b.rate_req_s < plan.rate_req_s
    assert json.loads((folder / "plan.json").read_text())["bursts"]["rate_req_s"] == b.rate_req_s
    assert f"the plan sustains {b.rate_req_s:.1f} req/s within its SLOs over the day" in stdout
    # the search planned for the bursts: its exact optimum is the plan's rate under them in the queueing model
    model = plan.rates.bursty_req_s
    assert model is not None and 0 < model < plan.rate_req_s
    assert plan.reference is not None and plan.reference.optimum_req_s == pytest.approx(model, rel=1e-6)
    assert f"{model:.2f} req/s for this one, gap 0.00%" in stdout
    text = (folder / "report.md").read_text()
    assert "| **under the workload's own arrivals**" in text and "queueing model (each island's SLO caps" in text
    # a rate above it broke, so it is the plan's; had none broken, the row says the rate is a floor
    from pipeline.search.steps.bursts import WorkloadBursts

    assert b.why_above and "every rate tried held" not in text
    (row,) = [r for r in WorkloadBursts().rows(dataclasses.replace(plan, bursts=dataclasses.replace(b, why_above="")))
              if "**under the workload's own arrivals**" in r]  # fmt: skip
    assert "every rate tried held, this the highest: the plan sustains at least this" in row
    client = MlflowClient(f"sqlite:///{first}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("archipelago").experiment_id])
    assert run.data.metrics["bursty_rate_req_s"] == pytest.approx(b.rate_req_s, rel=1e-5)
    assert run.data.metrics["bursty_model_req_s"] == pytest.approx(model, rel=1e-5)


def test_the_queueing_model_under_the_bursts_loads_every_island_less_than_under_poisson(tmp_path: Path) -> None:
    """The planner of search.arrivals=workload (azure_code: its 1-s rate reaches 23.4 x its mean) caps every
    island's load at under half the Poisson cap, and its plan is that of the roles it scores best under them,
    stated at Poisson's rates (the same planner without the bursts, `poisson`, gives that plan's rate) with the
    rate under the bursts beside them. A plan made for Poisson arrivals states that rate too, for its own roles."""
    from pipeline.planning.build import build_plan
    from pipeline.planning.planner import Layout

    path, planner = plan_of(tmp_path, "search.arrivals=workload")
    plan = plans.load(path)
    flat = planner.poisson()
    assert planner.arrivals is not None and flat.arrivals is None
    assert flat.poisson() is flat and flat.bursty() is planner and planner.bursty() is planner
    for gpu, size in {(isl.gpu, isl.size) for isl in plan.islands}:
        bench = planner.benchmark(gpu, size)
        runs = (bench.prefill.chosen >= 0, bench.decode.chosen >= 0)  # the phases the island can run
        for can, bursty, poisson in zip(runs, planner.caps(gpu, size), flat.caps(gpu, size), strict=True):
            assert not can or ((poisson > 0).all() and (bursty < 0.5 * poisson).all())
        assert any(runs)
    layout = Layout.of([(isl.gpu, isl.size) for isl in plan.islands])
    best = planner.solve(layout, "max_rate", 10.0)[1]
    assert tuple(isl.role for isl in plan.islands) == best.roles
    assert plan.rates.bursty_req_s == pytest.approx(best.rate_req_s)
    again = build_plan(flat, layout, 10.0, roles=best.roles)
    assert plan.rate_req_s == pytest.approx(again.rate_req_s) and plan.rate_req_s > 2 * best.rate_req_s
    assert again.rates.bursty_req_s == pytest.approx(best.rate_req_s)  # the Poisson planner states it too
    fresh = flat.with_cost(flat.cost)
    assert fresh.bursty() is not None and fresh.bursty() is not planner  # fresh caches, its own twin


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["search.arrivals=bursty"], "error: search.arrivals='bursty': choose poisson, or workload"),
        (["search.arrivals=workload", "workload=synthetic_fig4_2"],
         "error: search.arrivals=workload plans disaggregated islands by the queueing model under the workload's "
         "bursts: workload synthetic_fig4_2 has no trace's arrival model (a synthetic one): use "
         "search.arrivals=poisson"),
        (["search.arrivals=workload", "costmodel.aggregated=true"],
         "error: search.arrivals=workload plans disaggregated islands by the queueing model under the workload's "
         "bursts; costmodel.aggregated=true lets islands run aggregated engines, whose SLO model is Poisson's: drop "
         "one of the two"),
        (["search.arrivals=workload", "search.objective=goodput"],
         "error: search.arrivals=workload plans disaggregated islands by the queueing model under the workload's "
         "bursts; search.objective=goodput scores each layout by the requests the simulator serves within the SLOs, "
         "under Poisson arrivals: drop one of the two"),
    ],
)  # fmt: skip
def test_arrivals_it_cannot_plan_for_is_one_line(tmp_path: Path, extra: list[str], says: str) -> None:
    from pipeline.search.run import execute

    r = in_process(execute, "search", *SMALL, *extra, f"out_root={tmp_path}/out",
                   f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db")  # fmt: skip
    one_line(r, says)
    assert not (tmp_path / "out").exists()

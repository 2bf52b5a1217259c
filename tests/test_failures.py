"""A host lost (pipeline/planning/failures.py): which islands stop, the rate the router keeps, that rate held by the
simulator, and how the search records it (plan.json, report.md, the console)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import plan as plans
from helpers import SMALL, compose, in_process


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any, Any, Any]:
    """(planner context, layout, plan, its host losses) of tiny_hetero's exact plan: one H20 decode island over
    four hosts, an H200 prefill island on each of two hosts, and an H800 prefill island over two hosts."""
    from pipeline.planning.build import build_plan
    from pipeline.planning.failures import host_losses
    from pipeline.search.reference import exact_layout, reference
    from pipeline.search.settings import inventory_of, settings_from_cfg

    cfg = compose(["+inventory=tiny_hetero", "ranges.width=1000"])
    settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    layout = exact_layout(reference(settings, ctx, ctx.planner))
    assert layout is not None
    plan = build_plan(ctx.planner, layout, ctx.inner_time_limit_s, ctx.backend)
    return ctx, layout, plan, host_losses(ctx.planner, layout, plan, ctx.inner_time_limit_s, ctx.backend)


def test_every_host_of_a_serving_island_is_lost_in_turn_and_stops_the_islands_on_it(tiny: Any) -> None:
    _, _, plan, losses = tiny
    roles = sorted((isl.gpu, isl.size, isl.role, isl.hosts.nodes) for isl in plan.islands if isl.serving)
    assert roles == [("H20", 32, "decode", (0, 1, 2, 3)), ("H200", 8, "prefill", (0,)), ("H200", 8, "prefill", (1,)),
                     ("H800", 16, "prefill", (0, 1))]  # fmt: skip
    assert [(h.gpu, h.node) for h in losses.losses] == [("H20", k) for k in range(4)] + [
        ("H200", 0), ("H200", 1), ("H800", 0), ("H800", 1)]  # fmt: skip
    by = {(h.gpu, h.node): h for h in losses.losses}
    for h in losses.losses:  # the islands with a GPU on the host, and only those
        assert {plan.islands[i].gpu for i in h.islands} == {h.gpu}
        assert all(h.node in plan.islands[i].hosts.nodes for i in h.islands)
        assert 0.0 <= h.rate_req_s <= plan.rate_req_s * (1 + 1e-9)
    # the only decode island spans the four H20 hosts: losing any of them stops decoding
    assert all(by[("H20", k)].rate_req_s == 0.0 for k in range(4)) and losses.worst.gpu == "H20"
    # an H200 host stops one of the two prefill islands of H200; the other and the H800 island take its prompts
    assert 0.5 * plan.rate_req_s < by[("H200", 0)].rate_req_s < plan.rate_req_s
    assert by[("H800", 0)].islands == by[("H800", 1)].islands and by[("H800", 0)].rate_req_s < plan.rate_req_s


def test_alike_hosts_share_a_rate_that_solving_each_gives_too(tiny: Any) -> None:
    """H200 hosts 0 and 1 each stop one of two identical islands: the loss is solved once; solving the second
    host's problem on its own gives the same rate."""
    ctx, layout, plan, losses = tiny
    by = {(h.gpu, h.node): h for h in losses.losses}
    second = by[("H200", 1)]
    roles = [isl.role for isl in plan.islands]
    _, own = ctx.planner.solve_without(layout, roles, second.islands, ctx.inner_time_limit_s, ctx.backend)
    assert own.rate_req_s == pytest.approx(second.rate_req_s, rel=1e-6)
    assert by[("H200", 0)].islands != second.islands and by[("H200", 0)].rate_req_s == second.rate_req_s


def test_the_rate_with_a_host_lost_holds_in_the_simulator(tiny: Any) -> None:
    """The plan as it runs without H200 host 0 (the router's shares re-solved, every engine as launched),
    simulated request by request at the rate `host_losses` gives it: within 5 % and its SLOs hold."""
    from pipeline.planning.check import check
    from pipeline.planning.failures import without_host
    from pipeline.planning.simulation import RequestMix

    ctx, layout, plan, losses = tiny
    lost = next(h for h in losses.losses if (h.gpu, h.node) == ("H200", 0))
    reduced = without_host(ctx.planner, layout, plan, lost.islands, ctx.inner_time_limit_s, ctx.backend)
    assert reduced.rate_req_s == pytest.approx(lost.rate_req_s, rel=1e-9)
    assert [isl.role for isl in reduced.islands][lost.islands[0]] == "idle"
    for now, was in zip(reduced.islands, plan.islands, strict=True):
        if now.serving:  # the engine as launched, its role and batch kept
            assert (now.role, now.tp, now.dp, now.batch) == (was.role, was.tp, was.dp, was.batch)
    v = check(reduced, RequestMix.of(ctx.planner.workload))
    assert abs(v.simulated_over_stated - 1.0) <= 0.05
    assert v.sustained or v.holds_at_0_95, v.why_not


def test_a_plan_with_its_host_losses_reads_back_from_plan_json(tiny: Any, tmp_path: Path) -> None:
    from pipeline.records.report import report

    _, _, plan, losses = tiny
    with_losses = dataclasses.replace(plan, host_losses=losses)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plans.to_json(with_losses)))
    back = plans.load(path)
    assert back.host_losses == losses
    assert json.loads(path.read_text())["host_losses"]["worst"] == {"gpu": "H20", "node": 0}
    text = report(back, pd.DataFrame(), "# plan")
    assert "| one host lost (worst of 8) | 0.00 req/s (0%): H20 node 0 stops the 32 x H20 decode island;" in text
    assert "| 0.00 | 0% | H20 0-3 | the 32 x H20 decode island |" in text


def test_a_search_reports_its_worst_host_on_the_console_in_plan_json_and_mlflow(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from pipeline.search.run import execute

    r = in_process(execute, "search", *SMALL, "search.sampler=exact", "search.band_draws=0",
                   f"out_root={tmp_path}/out", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db")  # fmt: skip
    assert r.returncode == 0, r.stderr
    (folder,) = {p.parent for p in (tmp_path / "out").glob("*/*/plan.json")}
    plan = plans.load(folder / "plan.json")
    assert plan.host_losses is not None
    w = plan.host_losses.worst
    assert f"[search] one host lost: at worst {w.gpu} node {w.node}" in r.stdout
    assert "Hosts lost, one at a time" in (folder / "report.md").read_text()
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("archipelago").experiment_id])
    assert run.data.metrics["one_host_lost_req_s"] == pytest.approx(w.rate_req_s, rel=1e-5)

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
    """(planner context, layout, plan, its host losses) of tiny_hetero's exact plan under the kernel-calibrated
    model: one H20 decode island over four hosts, an H200 prefill island on each of two hosts, and an H800 prefill
    island over two hosts. That shape (alike islands, one island over many hosts) is what these tests need; the
    default model's plan of tiny_hetero splits its islands otherwise."""
    from pipeline.planning.build import build_plan
    from pipeline.planning.failures import host_losses
    from pipeline.search.reference import exact_layout, reference
    from pipeline.search.settings import inventory_of, settings_from_cfg

    cfg = compose(["+inventory=tiny_hetero", "ranges.width=1000", "costmodel=calibrated"])
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
    assert all(f"{by[('H20', k)].rate_req_s:.2f}" == "0.00" for k in range(4))  # printed so too, not "-0.00"
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
    from pipeline.search.steps import STEPS

    _, _, plan, losses = tiny
    with_losses = dataclasses.replace(plan, host_losses=losses)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plans.to_json(with_losses)))
    back = plans.load(path)
    assert back.host_losses == losses
    assert json.loads(path.read_text())["host_losses"]["worst"] == {"gpu": "H20", "node": 0}
    text = report(back, pd.DataFrame(), "# plan", None, STEPS)
    assert "| one host lost (worst of 8) | 0.00 req/s (0%): H20 node 0 stops the 32 x H20 decode island;" in text
    assert "| 0.00 | 0% | H20 0-3 | the 32 x H20 decode island |" in text


def test_a_search_reports_its_worst_host_on_the_console_in_plan_json_and_mlflow(tmp_path: Path, local_ray: Any) -> None:
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


def lowest_over(bp: Any, bd: Any, p: Any, scenarios: list[set[int]], roles: tuple[str, ...]) -> float:
    """The lowest rate over `scenarios` (each: the islands that stop) with `roles` fixed, each scenario's routing
    solved as an LP (`solvers.inner`): what a role assignment keeps, by brute force."""
    import numpy as np

    from solvers.inner import InnerProblem, solve

    n_i = len(bp)
    rates = []
    for down in scenarios:
        keep = np.array([i not in down for i in range(n_i)])[:, None]
        prob = InnerProblem(tuple(("X", 1 + i) for i in range(n_i)), p, bp * keep, bd * keep, roles=roles)
        rates.append(solve(prob).rate_req_s)
    return min(rates)


def solved_as_classes(bp: Any, bd: Any, p: Any, scenarios: list[set[int]], fixed: list[str | None]) -> Any:
    """`spare_roles` on `scenarios`, checked against brute force over every role assignment the kept roles allow
    (its rate the best one's, its roles reaching it) and against the model over the islands one by one
    (`by_island`, the same rate); the roles it found."""
    import itertools
    import time

    from solvers.spare import by_island, spare_roles

    def lowest(roles: tuple[str, ...]) -> float:
        return lowest_over(bp, bd, p, scenarios, roles)

    brute = max(lowest(roles) for roles in itertools.product(("prefill", "decode"), repeat=len(bp))
                if all(f is None or f == r for f, r in zip(fixed, roles, strict=True)))  # fmt: skip
    found = spare_roles(bp, bd, p, scenarios, fixed=fixed)
    assert found.status == "optimal" and found.rate_req_s > 0
    assert found.rate_req_s == pytest.approx(brute, rel=1e-6)
    assert lowest(found.roles) == pytest.approx(found.rate_req_s, rel=1e-6)
    one_by_one = by_island(bp, bd, p, [frozenset(s) for s in scenarios], time_limit_s=10.0, backend="AUTO",
                           fixed=fixed, t0=time.perf_counter())  # fmt: skip
    assert one_by_one.rate_req_s == pytest.approx(found.rate_req_s, rel=1e-6)
    return found.roles


def test_spare_roles_keep_the_most_with_an_island_lost_as_every_role_assignment_tried_in_turn_says() -> None:
    """`solvers/spare.py` against brute force: every assignment of prefill / decode roles, each scenario's
    routing solved as an LP with those roles fixed (`solvers.inner`), the lowest over the scenarios; the best
    assignment's rate is the MILP's, and its roles reach it."""
    import itertools

    import numpy as np

    from solvers.inner import InnerProblem, solve
    from solvers.spare import spare_roles

    rng = np.random.default_rng(7)
    n_i, n_j = 5, 3
    bp, bd = rng.uniform(5, 40, (n_i, n_j)), rng.uniform(5, 40, (n_i, n_j))
    p = np.array([0.5, 0.3, 0.2])
    scenarios = [{0}, {1, 2}, {3}, {4}]

    def lowest(roles: tuple[str, ...]) -> float:
        return lowest_over(bp, bd, p, scenarios, roles)

    brute = {roles: lowest(roles) for roles in itertools.product(("prefill", "decode"), repeat=n_i)}
    found = spare_roles(bp, bd, p, scenarios)
    assert found.status == "optimal"
    assert found.rate_req_s == pytest.approx(max(brute.values()), rel=1e-6)
    assert lowest(found.roles) == pytest.approx(found.rate_req_s, rel=1e-6)
    # the roles that serve the most with every island up are not the ones that keep the most with one lost here
    all_up = solve(InnerProblem(tuple(("X", 1 + i) for i in range(n_i)), p, bp, bd))
    assert brute[all_up.roles] < found.rate_req_s


def test_identical_islands_solved_as_classes_keep_what_every_role_assignment_tried_in_turn_keeps() -> None:
    """One island lost at a time: `solvers/spare.py` solves over classes of identical islands (`by_class`); against
    brute force over every role assignment of the islands, and against the model over the islands one by one
    (`by_island`), with an island on no host (never lost) and an island whose role is kept."""
    import numpy as np

    rng = np.random.default_rng(11)
    n_j = 3
    kinds_p, kinds_d = rng.uniform(5, 40, (3, n_j)), rng.uniform(5, 40, (3, n_j))
    which = [0, 0, 0, 1, 1, 2]  # three alike islands, two alike, one of its own
    bp, bd, n_i = kinds_p[which], kinds_d[which], len(which)
    p = np.array([0.5, 0.3, 0.2])
    scenarios = [{i} for i in range(n_i - 1)]  # the last island is on no host
    fixed = [None, None, None, "decode", "decode", None]  # ... and the alike pair keep their decode role
    assert solved_as_classes(bp, bd, p, scenarios, fixed)[3:5] == ("decode", "decode")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_roles_with_every_island_up_are_solved_as_classes_and_keep_what_every_role_assignment_keeps(seed: int) -> None:
    """No island lost (what a re-plan scores each candidate by): the class model (`by_class`, by cuts) over classes
    of alike islands, against brute force over every role assignment and the model over the islands one by one
    (`by_island`), with kept roles; a scenario losing nothing beside one that loses an island changes nothing."""
    import numpy as np

    from solvers.spare import _units, spare_roles

    rng = np.random.default_rng(seed)
    n_j = 3
    kinds_p, kinds_d = rng.uniform(5, 40, (4, n_j)), rng.uniform(5, 40, (4, n_j))
    which = [0, 0, 0, 1, 1, 2, 3]
    bp, bd = kinds_p[which], kinds_d[which]
    p = np.array([0.5, 0.3, 0.2])
    fixed: list[str | None] = [None, None, "prefill", None, None, "decode", None]
    assert _units(bp, bd, [frozenset()], fixed) == {}  # the class model applies, no island in a scenario
    solved_as_classes(bp, bd, p, [set()], fixed)
    one = spare_roles(bp, bd, p, [{0}], fixed=fixed)
    assert spare_roles(bp, bd, p, [set(), {0}], fixed=fixed).rate_req_s == pytest.approx(one.rate_req_s, rel=1e-9)


@pytest.mark.parametrize("seed", [4, 6, 24])
def test_hosts_of_several_alike_islands_solved_as_classes_keep_what_every_role_assignment_keeps(seed: int) -> None:
    """One host lost at a time, a host holding two or three alike islands (small islands of one GPU type: two
    4-GPU islands a host): the class model (`by_class`, its islands spread evenly over the hosts) against brute force
    over every role assignment and against the model over the islands one by one (`by_island`), with a host of one
    island, an island on no host and a host whose islands keep their roles."""
    import numpy as np

    from solvers.spare import _units

    rng = np.random.default_rng(seed)
    n_j = 3
    kinds_p, kinds_d = rng.uniform(5, 40, (4, n_j)), rng.uniform(5, 40, (4, n_j))
    which = [0, 0, 0, 0, 1, 1, 1, 2, 3, 3]  # hosts {0, 1}, {2, 3} | {4, 5, 6} | {7} | island 8 on none | {9}... kept
    bp, bd = kinds_p[which], kinds_d[which]
    p = np.array([0.5, 0.3, 0.2])
    scenarios = [{0, 1}, {2, 3}, {4, 5, 6}, {7}, {9}]
    fixed = [None] * 9 + ["decode"]
    assert _units(bp, bd, [frozenset(s) for s in scenarios], fixed) is not None  # the class model applies
    solved_as_classes(bp, bd, p, scenarios, fixed)
    # a host of two unlike islands, or alike islands stopping in unequal numbers, is not the class model's (it is
    # the host model's, below)
    assert _units(bp, bd, [frozenset({3, 4})], fixed) is None
    assert _units(bp, bd, [frozenset({0, 1}), frozenset({2})], fixed) is None
    assert _units(bp, bd, [frozenset({0, 1}), frozenset({0, 1})], fixed) == {0: 0, 1: 0}  # the same host twice


@pytest.mark.parametrize("seed", range(6))
def test_the_class_model_by_cuts_is_the_class_milps_optimum(seed: int) -> None:
    """`by_class` solves by cuts over every count of decode islands (`by_cuts`); against the class MILP (SCIP) on
    layouts shaped like the main job's (6-9 classes of 1-5 islands, 29 ranges, rates of three GPU kinds scaled by
    island size), with hosts of two alike islands, islands on no host, a kept role and a range one role's classes
    serve only partly: the same rate, and roles that keep it."""
    import time

    import numpy as np

    from solvers.inner import _solve_matrix
    from solvers.spare import CLASS_SCIP, _class_model, _Classes, by_cuts

    rng = np.random.default_rng(seed)
    n_j = 29
    p = rng.dirichlet(np.ones(n_j))
    shape = np.linspace(1.0, 0.2, n_j)  # longer prompts: slower, more so on some GPUs
    kinds = [(rng.uniform(2, 12) * shape ** rng.uniform(0.5, 2.0), rng.uniform(2, 12) * shape ** rng.uniform(0.5, 2.0))
             for _ in range(3)]  # fmt: skip
    bp, bd, scen, fixed = [], [], [], []
    for c in range(int(rng.integers(6, 10))):
        size, kind, m = float(rng.choice([1, 2, 3, 4])), kinds[c % 3], int(rng.integers(1, 6))
        per_host = 2 if c == 1 and m % 2 == 0 else 1  # one class of two alike islands a host
        first = len(bp)
        for _ in range(m):
            bp.append(size * kind[0])
            bd.append(size * kind[1])
            fixed.append("decode" if c == 2 else None)
        hosts = [list(range(first + h, first + h + per_host)) for h in range(0, m, per_host)]
        scen += [set(h) for h in hosts[: m if c != 3 else 0]]  # class 3's islands are on no host
    bp, bd = np.array(bp), np.array(bd)
    bd[: len(bd) // 2, -3:] = 0.0  # the longest ranges: decode on some classes only
    scenarios = [frozenset(s) for s in scen]
    k = _Classes.of(bp, bd, p, scenarios, fixed)
    cuts = by_cuts(k, len(bp), 10.0, time.perf_counter())
    model, col_lam = _class_model(k)
    status, x = _solve_matrix(model, "SCIP", 10.0, CLASS_SCIP)
    assert cuts.status == status == "optimal"
    assert cuts.rate_req_s == pytest.approx(x[col_lam], rel=1e-6) and cuts.rate_req_s > 0
    assert all(r == "decode" for r, f in zip(cuts.roles, fixed, strict=True) if f == "decode")
    assert lowest_over(bp, bd, p, [set(s) for s in scenarios], cuts.roles) == pytest.approx(cuts.rate_req_s, rel=1e-6)


@pytest.mark.parametrize("seed", [1, 3, 11])
def test_hosts_of_unlike_islands_solved_by_host_type_keep_what_every_role_assignment_keeps(seed: int) -> None:
    """One host lost at a time, hosts holding unlike islands (a small model's islands of several sizes side by
    side): the host model (`by_host`: hosts of one make-up counted per role configuration) against brute force over
    every role assignment and the model over the islands one by one, with two hosts of one make-up, alike islands
    stopping in unequal numbers, a host of one island, an island on no host and an island that keeps its role."""
    import numpy as np

    from solvers.spare import _one_host_each, _units

    rng = np.random.default_rng(seed)
    n_j = 3
    kinds_p, kinds_d = rng.uniform(5, 40, (3, n_j)), rng.uniform(5, 40, (3, n_j))
    which = [0, 0, 1, 0, 0, 1, 0, 2, 1, 2]  # hosts {0, 1, 2}, {3, 4, 5} (A A B) | {6, 7} (A C) | {8} (B) | 9 on none
    bp, bd = kinds_p[which], kinds_d[which]
    p = np.array([0.5, 0.3, 0.2])
    scenarios = [{0, 1, 2}, {3, 4, 5}, {6, 7}, {8}]
    fixed: list[str | None] = [None] * 10
    fixed[5] = "decode"  # (its class apart: a kept role is part of an island's class)
    scen = [frozenset(s) for s in scenarios]
    assert _units(bp, bd, scen, fixed) is None and _one_host_each(scen)  # the host model applies
    roles = solved_as_classes(bp, bd, p, scenarios, fixed)
    assert roles[5] == "decode"
    # an island in two scenarios (two hosts lost at once, or an island across hosts): island by island
    assert not _one_host_each([frozenset({0, 1}), frozenset({1, 2})])
    assert _one_host_each([frozenset({0, 1}), frozenset({0, 1})])  # the same host twice is one


def test_four_alike_islands_keep_half_with_one_lost_and_two_keep_nothing() -> None:
    import numpy as np

    from solvers.spare import spare_roles

    b, p = np.full((4, 1), 10.0), np.array([1.0])
    assert spare_roles(b, b, p, []).rate_req_s == pytest.approx(20.0)  # every island up: two prefill, two decode
    one = spare_roles(b, b, p, [{0}, {1}, {2}, {3}])
    assert one.rate_req_s == pytest.approx(10.0) and sorted(one.roles) == ["decode", "decode", "prefill", "prefill"]
    assert spare_roles(b[:2], b[:2], p, [{0}, {1}]).rate_req_s == 0.0  # one prefill, one decode: either loss stops


def test_loss_scenarios_keep_the_sets_no_other_includes() -> None:
    from pipeline.planning.build import place
    from pipeline.planning.failures import loss_scenarios

    islands = [("H20", 16), ("H20", 8), ("H20", 8), ("H200", 8)]  # H20 hosts 0-1, 2, 3; H200 host 0
    hosts = place(islands, {"H20": 8, "H200": 8})
    one = loss_scenarios(islands, hosts, 1)
    assert sorted(sorted(d) for _, d in one) == [[0], [1], [2], [3]]  # hosts 0 and 1 stop the same island: once
    two = loss_scenarios(islands, hosts, 2)
    assert all(len(lost) == 2 for lost, _ in two)
    downs = [d for _, d in two]
    assert not any(a < b for a in downs for b in downs)  # none inside another
    assert frozenset({0, 1}) in downs and frozenset({0}) not in downs  # H20 hosts 0 and 1 together: inside {0, 1}
    assert loss_scenarios(islands, hosts, 5) == [(
        (("H20", 0), ("H20", 1), ("H20", 2), ("H20", 3), ("H200", 0)), frozenset(range(4)))]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["search.sampler=exact"], "search.spare_hosts=1 scores each trial's layout by its rate with its worst hosts "
                                   "lost, with prefill and decode roles for every island; search.sampler=exact plans "
                                   "with the exact MILP, every host up: drop one of the two"),
        (["search.objective=goodput"], "search.spare_hosts=1 scores each trial's layout by its rate with its worst "
                                       "hosts lost, with prefill and decode roles for every island; "
                                       "search.objective=goodput scores each layout by the requests the simulator"),
        (["search.spare_hosts=8"], "search.spare_hosts=8: the inventory has 8 hosts; losing 8 leaves nothing"),
        (["costmodel.aggregated=true"], "search.spare_hosts=1 scores each trial's layout by its rate with its worst "
                                        "hosts lost, with prefill and decode roles for every island; "
                                        "costmodel.aggregated=true lets islands run aggregated engines"),
        (["search.spare_hosts=2", "search.reference=spare"], "search.reference=spare solves the optimum with one "
                                                             "host lost; this search plans for 2"),
        (["search.reference=spare", "search.shapes=any", "search.min_island=2"],
         "search.reference=spare: H200 islands of 2 GPUs share a host of 8, so a host lost stops several islands"),
    ],
)
def test_spare_hosts_it_cannot_plan_for_is_one_line(tmp_path: Path, extra: list[str], says: str) -> None:
    from helpers import one_line
    from pipeline.search.run import execute

    r = in_process(execute, "search", *SMALL, "search.spare_hosts=1", *extra, f"out_root={tmp_path}/out",
                   f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db")  # fmt: skip
    one_line(r, f"error: {says}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("extra", "says"), [
    (["search.sampler=exact"], "search.sampler=exact cannot plan for it"),
    (["costmodel.aggregated=true"], "costmodel.aggregated=true cannot plan for it"),
    (["search.objective=goodput"], "search.objective=goodput cannot plan for it"),
])  # fmt: skip
def test_by_default_a_search_that_cannot_plan_for_a_host_lost_plans_every_host_up_and_says_why(
    tmp_path: Path, extra: list[str], says: str
) -> None:
    """search.spare_hosts=auto (the default): 1 where the search can plan for it, else 0, and the reason said."""
    from pipeline.search.settings import inventory_of, read_settings

    cfg = compose([*SMALL, f"out_root={tmp_path}/out", *extra])
    settings = read_settings(cfg, *inventory_of(cfg))
    assert settings.search.spare_hosts == 0 and says in settings.spare_off
    cfg = compose([*SMALL, f"out_root={tmp_path}/out"])
    settings = read_settings(cfg, *inventory_of(cfg))
    assert settings.search.spare_hosts == 1 and settings.spare_off == ""


def test_a_search_for_one_spare_host_keeps_serving_where_the_fastest_plan_stops(tmp_path: Path,
                                                                               local_ray: Any) -> None:
    """tiny_hetero under the kernel-calibrated model: the plan of most req/s (the exact planner's) decodes on one
    island over four H20 hosts, so losing any of them stops it (the default model's plan splits its decoding over
    three islands and loses a part). Planned with search.spare_hosts=1 (a real search: Ray Tune, Optuna's TPE, the
    robust roles), the plan keeps serving with its worst host lost, and says what that costs with every host up."""
    from pipeline.search.run import execute

    rates = {}
    for k, how in ((0, "search.sampler=exact"), (1, "search.iterations=4")):
        out = tmp_path / f"spare{k}"
        r = in_process(execute, "search", *SMALL, "costmodel=calibrated", f"search.spare_hosts={k}", how,
                       "search.band_draws=0", "search.verify=false", f"out_root={out}",
                       f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db")  # fmt: skip
        assert r.returncode == 0, r.stderr
        (folder,) = {p.parent for p in out.glob("*/*/plan.json")}
        plan = plans.load(folder / "plan.json")
        assert plan.host_losses is not None
        rates[k] = (plan.rate_req_s, plan.host_losses.worst.rate_req_s)
        if k:
            assert plan.host_losses.spare_req_s == pytest.approx(plan.host_losses.worst.rate_req_s)
            assert "planned for 1 host lost" in r.stdout
            spare = plan
            # a layout an earlier batch scored is handed its result, not scored again; any other is scored
            from pipeline.search.trial import REUSED

            trials = pd.read_parquet(folder / "trials.parquet").sort_values("trial")
            first: dict[str, Any] = {}
            for t in trials.itertuples():
                earlier = t.islands in first and first[t.islands].trial // 4 < t.trial // 4
                assert (t.note == REUSED) == earlier, t
                if earlier:
                    was = first[t.islands]
                    assert (t.score, t.spare_req_s, t.trial_ms) == (was.score, was.spare_req_s, 0)
                first.setdefault(t.islands, t)
    assert rates[0][1] == 0.0 < rates[1][1]  # the fastest plan stops with one host; the spare plan does not
    assert rates[1][0] <= rates[0][0] * (1 + 1e-9)  # what that costs with every host up
    # the spare plan's worst loss, as its engines then run, holds in the simulator at the rate it states
    from pipeline.planning.check import check
    from pipeline.planning.failures import without_host
    from pipeline.planning.planner import Layout
    from pipeline.planning.simulation import RequestMix
    from pipeline.search.settings import context, inventory_of, read_settings

    cfg = compose([*SMALL, "costmodel=calibrated"])
    ctx = context(read_settings(cfg, *inventory_of(cfg)))
    layout = Layout(tuple((isl.gpu, isl.size) for isl in spare.islands))
    worst = spare.host_losses.worst
    reduced = without_host(ctx.planner, layout, spare, worst.islands, ctx.inner_time_limit_s, ctx.backend)
    assert reduced.rate_req_s == pytest.approx(worst.rate_req_s, rel=1e-6)
    v = check(reduced, RequestMix.of(ctx.planner.workload))
    assert abs(v.simulated_over_stated - 1.0) <= 0.05 and (v.sustained or v.holds_at_0_95), v.why_not


@pytest.mark.parametrize("args, why", [
    (["search.spare_hosts=7"], "every layout scored 0 req/s with its worst 7 hosts lost (2 optimal); lower "
                               "search.spare_hosts."),
    (["costmodel.aggregated=true", "search.budget_per_hour=10"],
     "no layout within $10/h serves requests (2 optimal); raise search.budget_per_hour."),
    (["workload=mooncake_conversation"],
     "the best layout serves no requests even with every host up (the exact optimum is 0 req/s) (no island runs the "
     "model in a role within the SLOs) (2 optimal); relax the SLOs (slo.ttft_ms, slo.tpot_ms), add GPUs, or see what "
     "one island can do: python -m pipeline.island gpu=<GPU> size=<N>."),
])  # fmt: skip
def test_a_search_whose_best_layout_serves_nothing_writes_no_plan_and_says_why(
    tmp_path: Path, local_ray: Any, args: list[str], why: str
) -> None:
    """With 7 of tiny_hetero's 8 hosts lost, or aggregated islands under a budget no island fits, or Mooncake's
    126k-token prompts under the default 2 s TTFT (the exact reference proves nothing serves with every host up: the
    hosts lost are not why), every layout
    scores 0: no plan.json, no outputs/search/latest, exit 1 and one line saying why and what to change; the trials
    are kept."""
    from helpers import one_line
    from pipeline.search.run import execute

    r = in_process(execute, "search", *SMALL, *args, "search.iterations=1", "search.batch=2",
                   f"out_root={tmp_path}/out/search", f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db")  # fmt: skip
    one_line(r, f"error: no plan: {why} Trials are kept in", code=1)
    assert not list((tmp_path / "out").rglob("plan.json")) and not (tmp_path / "out" / "latest").exists()
    assert len(list((tmp_path / "out").rglob("trials.jsonl"))) == 1


def test_the_node_map_flags_an_island_whose_loss_costs_more_than_its_share_of_the_gpus(tiny: Any) -> None:
    """tiny's plan decodes on one island of 32 H20 over four hosts: losing any of them stops the plan (keeps 0 %,
    with half of the serving GPUs), flagged; each H200 prefill island is 8 of 64 serving GPUs (12.5 %) and its
    loss costs less than that share or more, as the losses say."""
    from pipeline.records.report import _node_map

    _, _, plan, losses = tiny
    rows = {line.split(" | ")[1]: line for line in _node_map(plan.islands, losses) if line.startswith("| H")}
    assert "**keeps 0%** (has 50% of the GPUs)" in rows["32 x H20"]
    gpus = sum(isl.size for isl in plan.islands if isl.serving)
    for i, isl in enumerate(plan.islands):
        if isl.gpu != "H200" or not isl.serving:
            continue
        keep = min(h.rate_req_s for h in losses.losses if i in h.islands) / losses.rate_req_s
        row = next(r for label, r in rows.items() if label.endswith("x H200") or "H200 (x" in label)
        assert f"keeps {keep:.0%}" in row
        assert ("**" in row) == (1 - keep > isl.size / gpus)
    assert not any("a host lost" in line for line in _node_map(plan.islands, None))


def test_the_optimum_with_the_worst_host_lost_is_what_every_layout_and_role_tried_in_turn_keeps() -> None:
    """`solvers.exact.spare_optimum` against brute force: two GPU types, islands of one or two hosts, every count
    of prefill and decode islands of each size that fits the inventory, each scored by its lowest rate over losing
    any one of its islands (an LP with the counts fixed); the best of them is the optimum, and its layout keeps
    it. It is below the optimum with every host up, which loses nothing."""
    import itertools

    import numpy as np

    from solvers.exact import _loss_rates, exact_optimum, island_classes, solve_counts, spare_optimum
    from solvers.type_options import TypeOptions

    rng = np.random.default_rng(5)
    p = np.array([0.6, 0.4])
    types = [TypeOptions(g, count, 1.0, np.array([8, 16]), rng.uniform(2, 20, (2, 2)) * [[1], [2.1]],
                         rng.uniform(2, 20, (2, 2)) * [[1], [1.9]]) for g, count in (("A", 32), ("B", 24))]  # fmt: skip
    classes = island_classes(types)
    most = [types[ti].count // int(types[ti].sizes[si]) for ti, si in classes]
    best = 0.0
    for counts in itertools.product(*[[(a, b) for a in range(m + 1) for b in range(m + 1 - a)] for m in most]):
        used = {ti: 0 for ti in range(len(types))}
        for (ti, si), (a, b) in zip(classes, counts, strict=True):
            used[ti] += int(types[ti].sizes[si]) * (a + b)
        if any(used[ti] > types[ti].count for ti in used):
            continue
        whole = [(float(a), float(b)) for a, b in counts]
        losses = _loss_rates(types, p, whole)
        up = solve_counts(types, p, time_limit_s=60.0, fix=whole)[0].rate_req_s
        best = max(best, min(losses.values(), default=up))
    found = spare_optimum(types, p, time_limit_s=60.0)
    assert found.status == "optimal" and found.lost_hosts == 1 and best > 0
    assert found.rate_req_s == pytest.approx(best, rel=1e-6) and found.bound == pytest.approx(best, rel=1e-6)
    assert found.rate_req_s < exact_optimum(types, p).rate_req_s
    mine = [tuple(float(found.islands.count((types[ti].gpu, int(types[ti].sizes[si]), role)))
                  for role in ("prefill", "decode")) for ti, si in classes]  # fmt: skip
    assert min(_loss_rates(types, p, mine).values()) == pytest.approx(best, rel=1e-6)  # type: ignore[arg-type]


def test_a_standby_island_takes_over_when_the_host_it_stands_by_for_is_lost() -> None:
    """Planned for a host lost, three 8-H20 islands and one 8-H200 island of DeepSeek-V3 on tiny_hetero keep the
    most in the roles (decode, prefill, prefill, decode): the H200 island decodes every request with every host up,
    so the first H20 island carries nothing and the plan lists it idle; it stands by. With the H200 host lost it
    decodes what its rate allows, as the spare roles scored it: the host losses read the roles the plan was built in,
    where reading the plan's own they put that loss at nothing."""
    from pipeline.planning.build import build_plan
    from pipeline.planning.failures import host_losses, spare_solve
    from pipeline.planning.planner import Layout
    from pipeline.search.settings import inventory_of, settings_from_cfg

    cfg = compose(["+inventory=tiny_hetero", "ranges.width=1000", "workload=azure_code"])
    _, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    layout = Layout.of([("H20", 8)] * 3 + [("H200", 8)])
    found = spare_solve(ctx.planner, layout, 1, ctx.inner_time_limit_s, ctx.backend)
    assert found.status == "optimal" and found.roles == ("decode", "prefill", "prefill", "decode")
    plan = build_plan(ctx.planner, layout, ctx.inner_time_limit_s, ctx.backend, roles=found.roles)
    assert [isl.role for isl in plan.islands] == ["idle", "prefill", "prefill", "decode"]
    plain = host_losses(ctx.planner, layout, plan, ctx.inner_time_limit_s, ctx.backend)
    kept = host_losses(ctx.planner, layout, plan, ctx.inner_time_limit_s, ctx.backend, found.roles)
    assert plain is not None and kept is not None
    h200 = {(x.gpu, x.node): x.rate_req_s for x in kept.losses}[("H200", 0)]
    assert {(x.gpu, x.node): x.rate_req_s for x in plain.losses}[("H200", 0)] == 0.0  # the plan's roles: nothing
    assert h200 > 0 and min(x.rate_req_s for x in kept.losses) == pytest.approx(found.rate_req_s, rel=1e-6)

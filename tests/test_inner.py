"""Inner solver: hand-worked optima, constraints on random instances, aggregation, bounds."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers.inner import InnerProblem, island_classes, problem_from_json, problem_to_json, solve

REPO = Path(__file__).resolve().parents[1]


def prob(
    bp: list[list[float]],
    bd: list[list[float]],
    p: list[float],
    objective: str = "max_rate",
    islands: list[tuple[str, int]] | None = None,
    **kw: float,
) -> InnerProblem:
    isl = islands or [(f"G{i}", 8) for i in range(len(bp))]
    return InnerProblem(tuple(isl), np.array(p, float), np.array(bp, float), np.array(bd, float), objective, **kw)


def test_two_islands_two_ranges_by_hand() -> None:
    # A prefills fast on range 0 (20/s) and slowly on range 1 (5/s); B decodes 10/s on both.
    # A prefill, B decode: prefill needs Λ/2/20 + Λ/2/5 <= 1 -> Λ <= 8; decode Λ/2/10 * 2 <= 1 -> Λ <= 10.
    # The other role split gives at most 1. Optimum Λ = 8 with x^P_A = (0.2, 0.8), B decode 0.4 + 0.4.
    s = solve(prob([[20, 5], [1, 1]], [[1, 1], [10, 10]], [0.5, 0.5]))
    assert s.status == "optimal" and s.rate_req_s == pytest.approx(8.0)
    assert s.roles == ("prefill", "decode")
    np.testing.assert_allclose(s.x_prefill[0], [0.2, 0.8], atol=1e-6)
    np.testing.assert_allclose(s.x_decode[1], [0.4, 0.4], atol=1e-6)


def test_three_islands_by_hand() -> None:
    # A: prefill 10, decode 4; B: prefill 4, decode 10; C: 6 and 6 (one range).
    # A=P, B=D, C either: min(16, 10) = 10 = min(10, 16). Every other split is worse (e.g. A,B=P: min(14, 6)).
    s = solve(prob([[10], [4], [6]], [[4], [10], [6]], [1.0]))
    assert s.rate_req_s == pytest.approx(10.0)
    assert s.roles[0] == "prefill" and s.roles[1] == "decode"


def test_thesis_objective_reports_min_of_phases_and_its_large_M_pathology() -> None:
    # With M = 1 the thesis model finds the good split (R^P = 8 after share matching, R^D = 10).
    s = solve(prob([[20, 5], [1, 1]], [[1, 1], [10, 10]], [0.5, 0.5], "thesis"))
    assert s.status == "optimal" and s.roles == ("prefill", "decode")
    assert s.rate_req_s == pytest.approx(min(s.prefill_req_s, s.decode_req_s))
    assert s.rate_req_s >= 8.0 - 1e-6  # shares may deviate by up to tau, so it can beat Λ = 8
    # Every island must spend all its capacity (constraint 1), so with a large M the mismatch
    # penalty wins and the model prefers the matched but slow split: min(R^P, R^D) = 1.
    bad = solve(prob([[20, 5], [1, 1]], [[1, 1], [10, 10]], [0.5, 0.5], "thesis", M=100.0))
    assert bad.roles == ("decode", "prefill") and bad.rate_req_s == pytest.approx(1.0)


def test_all_zero_capacity_is_rate_zero_or_infeasible_not_a_crash() -> None:
    z = [[0.0, 0.0]]
    assert solve(prob(z, z, [0.5, 0.5])).rate_req_s == 0.0
    assert solve(prob(z, z, [0.5, 0.5], "thesis")).status == "infeasible"


def random_problem(seed: int, n_i: int, n_j: int, objective: str = "max_rate") -> InnerProblem:
    rng = np.random.default_rng(seed)
    types = rng.integers(0, 3, n_i)
    base_p = rng.uniform(1, 100, (3, n_j)) * np.linspace(1, 0.1, n_j)
    base_d = rng.uniform(1, 100, (3, n_j))
    p = rng.dirichlet(np.ones(n_j))
    return InnerProblem(tuple((f"T{t}", 8) for t in types), p, base_p[types], base_d[types], objective)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 7), st.integers(1, 6))
def test_random_instances_satisfy_every_constraint(seed: int, n_i: int, n_j: int) -> None:
    pr = random_problem(seed, n_i, n_j)
    s = solve(pr)
    assert s.status == "optimal"
    dec = np.array([r == "decode" for r in s.roles])
    tol = 1e-6
    assert (s.x_prefill >= -tol).all() and (s.x_decode >= -tol).all()
    assert (s.x_prefill.sum(axis=1) <= 1 + tol).all() and (s.x_decode.sum(axis=1) <= 1 + tol).all()
    assert (s.x_prefill[dec] <= tol).all() and (s.x_decode[~dec] <= tol).all()
    cap_p = (pr.prefill_req_s * s.x_prefill).sum(axis=0)
    cap_d = (pr.decode_req_s * s.x_decode).sum(axis=0)
    assert (cap_p >= s.rate_req_s * pr.p - 1e-5).all() and (cap_d >= s.rate_req_s * pr.p - 1e-5).all()
    # never above giving each phase every island's capacity (an independent LP: SciPy's HiGHS)
    assert (
        s.rate_req_s
        <= min(all_capacity_bound(pr.prefill_req_s, pr.p), all_capacity_bound(pr.decode_req_s, pr.p)) + 1e-6
    )


def all_capacity_bound(b: np.ndarray, p: np.ndarray) -> float:
    """max Λ s.t. Σ_i b_ij x_ij >= Λ p_j, Σ_j x_ij <= 1, x >= 0 (every island in this phase)."""
    from scipy.optimize import linprog

    n_i, n_j = b.shape
    c = np.zeros(n_i * n_j + 1)
    c[-1] = -1.0
    a_ub, b_ub = [], []
    for j in range(n_j):
        row = np.zeros(n_i * n_j + 1)
        row[[i * n_j + j for i in range(n_i)]] = -b[:, j]
        row[-1] = p[j]
        a_ub.append(row)
        b_ub.append(0.0)
    for i in range(n_i):
        row = np.zeros(n_i * n_j + 1)
        row[i * n_j : (i + 1) * n_j] = 1.0
        a_ub.append(row)
        b_ub.append(1.0)
    res = linprog(c, A_ub=np.array(a_ub), b_ub=b_ub, bounds=(0, None), method="highs")
    assert res.status == 0
    return float(-res.fun)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 7), st.integers(1, 5))
def test_aggregation_matches_one_binary_per_island(seed: int, n_i: int, n_j: int) -> None:
    pr = random_problem(seed, n_i, n_j)
    agg = solve(pr)
    assert len(island_classes(pr)) <= 3
    # the same islands made distinguishable: one class per island, i.e. one binary each
    distinct = InnerProblem(tuple((f"I{i}", 8) for i in range(n_i)), pr.p, pr.prefill_req_s, pr.decode_req_s)
    assert len(island_classes(distinct)) == n_i
    assert solve(distinct).rate_req_s == pytest.approx(agg.rate_req_s, rel=1e-6, abs=1e-9)


def test_thesis_solution_satisfies_its_constraints() -> None:
    pr = random_problem(7, 5, 4, "thesis")
    s = solve(pr)
    assert s.status == "optimal"
    tot = s.x_prefill.sum(axis=1) + s.x_decode.sum(axis=1)
    np.testing.assert_allclose(tot, 1.0, atol=1e-6)
    dec = np.array([r == "decode" for r in s.roles])
    assert (s.x_prefill[dec] <= 1e-6).all() and (s.x_decode[~dec] <= 1e-6).all()
    assert s.prefill_req_s >= 0.01 - 1e-9 and s.decode_req_s >= 0.01 - 1e-9


def test_json_contract_round_trip_and_cli(tmp_path: Path) -> None:
    pr = prob([[20, 5], [1, 1]], [[1, 1], [10, 10]], [0.5, 0.5])
    f = tmp_path / "p.json"
    f.write_text(json.dumps(problem_to_json(pr, 5.0)))
    again, limit = problem_from_json(json.loads(f.read_text()))
    assert limit == 5.0 and again.islands == pr.islands
    r = subprocess.run([sys.executable, "-m", "solvers.inner", str(f)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {
        "status",
        "rate_req_s",
        "roles",
        "x_prefill",
        "x_decode",
        "prefill_req_s",
        "decode_req_s",
        "deviation",
        "solve_ms",
    }
    assert out["rate_req_s"] == pytest.approx(8.0)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"islands": []}', "missing key 'ranges'"),
        (
            '{"islands": [{"gpu": "A", "size": 8}], "ranges": [{"start": 0, "end": 1, "p": 1}], '
            '"prefill_req_s": [[1, 2]], "decode_req_s": [[1]]}',
            "must be islands x ranges = 1 x 1",
        ),
        (
            '{"objective": "fastest", "islands": [{"gpu": "A", "size": 8}], '
            '"ranges": [{"start": 0, "end": 1, "p": 1}], "prefill_req_s": [[1]], "decode_req_s": [[1]]}',
            "unknown objective 'fastest'",
        ),
    ],
)
def test_cli_rejects_malformed_problems(tmp_path: Path, payload: str, message: str) -> None:
    f = tmp_path / "p.json"
    f.write_text(payload)
    r = subprocess.run([sys.executable, "-m", "solvers.inner", str(f)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_evaluator_equals_solver_when_throughput_is_flat_within_ranges() -> None:
    from solvers.evaluate import PhaseRouting, evaluate

    pr = random_problem(3, 4, 3)
    s = solve(pr)
    lengths_per_range = 5
    rol = np.repeat(np.arange(3), lengths_per_range)
    p_len = np.repeat(pr.p / lengths_per_range, lengths_per_range)
    ev = evaluate(
        PhaseRouting(s.x_prefill, pr.prefill_req_s, pr.prefill_req_s[:, rol]),
        PhaseRouting(s.x_decode, pr.decode_req_s, pr.decode_req_s[:, rol]),
        rol,
        p_len,
    )
    assert ev.rate_req_s == pytest.approx(s.rate_req_s, rel=1e-6)
    assert ev.island_load.max() <= 1 + 1e-9
    # slower lengths inside a range lower the evaluated rate, never raise it
    slower = pr.prefill_req_s[:, rol] * np.tile([1.0, 0.9, 0.8, 0.9, 1.0], 3)
    ev2 = evaluate(
        PhaseRouting(s.x_prefill, pr.prefill_req_s, slower),
        PhaseRouting(s.x_decode, pr.decode_req_s, pr.decode_req_s[:, rol]),
        rol,
        p_len,
    )
    assert ev2.prefill_req_s < ev.prefill_req_s and ev2.rate_req_s <= ev.rate_req_s + 1e-9


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.integers(1, 4))
def test_thesis_aggregated_matches_one_binary_per_island(seed: int, n_i: int, n_j: int) -> None:
    pr = random_problem(seed, n_i, n_j, "thesis")
    agg, literal = solve(pr), solve(pr, aggregate=False)
    assert agg.status == literal.status == "optimal"
    assert agg.extra["objective"] == pytest.approx(literal.extra["objective"], rel=1e-6, abs=1e-6)
    assert literal.extra["classes"] == n_i


def test_kv_transfer_caps_prefill_egress_by_hand() -> None:
    # Two identical islands, 10 req/s either phase: one prefills, one decodes, Λ = 10.
    # Each request moves 1 GB of KV; a 4 GB/s link lets the prefill island ship only 4 req/s.
    base = prob([[10], [10]], [[10], [10]], [1.0], islands=[("G", 8), ("G", 8)])
    assert solve(base).rate_req_s == pytest.approx(10.0)
    kv = prob(
        [[10], [10]],
        [[10], [10]],
        [1.0],
        islands=[("G", 8), ("G", 8)],
        kv_gb=np.array([1.0]),
        link_gb_s=np.full(2, 4.0),
    )
    assert solve(kv).rate_req_s == pytest.approx(4.0)
    # decode islands take the same KV in, so three islands stay at 4 (one side has one island);
    # four split 2 + 2 share the links on both sides: 8
    for n, rate in ((3, 4.0), (4, 8.0)):
        isl = [("G", 8)] * n
        kv_n = prob([[10]] * n, [[10]] * n, [1.0], islands=isl, kv_gb=np.array([1.0]), link_gb_s=np.full(n, 4.0))
        assert solve(kv_n).rate_req_s == pytest.approx(rate)


def test_budget_leaves_islands_idle_by_hand() -> None:
    # Four identical $1/h islands at 10 req/s: 2 prefill + 2 decode = 20 req/s for $4/h.
    # $2/h buys one of each (10 req/s); $3/h buys nothing better (min(20, 10) = 10).
    four = [("G", 8)] * 4
    kw = {"islands": four, "cost_per_hour": np.ones(4)}
    for budget, rate, used in ((None, 20.0, 4), (2.0, 10.0, 2), (3.0, 10.0, None), (1.0, 0.0, None)):
        s = solve(prob([[10]] * 4, [[10]] * 4, [1.0], budget_per_hour=budget, **kw))
        assert s.rate_req_s == pytest.approx(rate, abs=1e-9), budget
        if used is not None:
            assert 4 - s.roles.count("idle") == used


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 7), st.integers(1, 4), st.floats(0.1, 1.0))
def test_budget_and_kv_hold_in_the_returned_solution(seed: int, n_i: int, n_j: int, frac: float) -> None:
    base = random_problem(seed, n_i, n_j)
    rng = np.random.default_rng(seed)
    cost = rng.uniform(1, 10, n_i)
    kv, link = rng.uniform(0.01, 0.1, n_j), rng.uniform(0.5, 5, n_i)
    pr = InnerProblem(
        base.islands, base.p, base.prefill_req_s, base.decode_req_s,
        kv_gb=kv, link_gb_s=link, cost_per_hour=cost, budget_per_hour=frac * cost.sum(),
    )  # fmt: skip
    s = solve(pr)
    assert s.status == "optimal"
    used = np.array([r != "idle" for r in s.roles])
    assert cost[used].sum() <= frac * cost.sum() + 1e-6
    assert (s.x_prefill[~used] == 0).all() and (s.x_decode[~used] == 0).all()
    assert ((pr.prefill_req_s * s.x_prefill) @ kv <= link + 1e-6).all()
    assert ((pr.decode_req_s * s.x_decode) @ kv <= link + 1e-6).all()
    # each constraint only removes options
    assert s.rate_req_s <= solve(base).rate_req_s + 1e-6


def test_fixed_roles_solve_as_an_lp_to_the_milp_optimum() -> None:
    pr = random_problem(11, 6, 4)
    milp = solve(pr)
    lp_prob = InnerProblem(pr.islands, pr.p, pr.prefill_req_s, pr.decode_req_s, roles=milp.roles)
    lp = solve(lp_prob)
    assert lp.status == "optimal" and lp.roles == milp.roles
    assert lp.rate_req_s == pytest.approx(milp.rate_req_s, rel=1e-6)
    flipped = tuple("decode" if r == "prefill" else "prefill" for r in milp.roles)
    assert solve(InnerProblem(pr.islands, pr.p, pr.prefill_req_s, pr.decode_req_s, roles=flipped)).rate_req_s <= (
        milp.rate_req_s + 1e-6
    )


@pytest.mark.parametrize("backend", ["SCIP", "HIGHS", "CBC"])
def test_other_milp_backends_reach_the_same_optimum(backend: str) -> None:
    for objective in ("max_rate", "thesis"):
        pr = random_problem(5, 6, 4, objective)
        key = "objective" if objective == "thesis" else None
        a, b = solve(pr), solve(pr, backend=backend)
        va = a.extra[key] if key else a.rate_req_s
        vb = b.extra[key] if key else b.rate_req_s
        assert b.status == "optimal" and vb == pytest.approx(va, rel=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_scip_without_cuts_and_heuristics_reaches_highs_optimum_on_many_classes(seed: int) -> None:
    # SCIP runs max_rate with separation and primal heuristics off (SCIP_PARAMETERS). A divider layout
    # has ~20 distinct classes, most of them one island: 3 GPU types x growing sizes, rates scaling
    # with size and a per-island efficiency, as the cost model's benchmarks do.
    rng = np.random.default_rng(seed)
    n_i, n_j = 20, 12
    fall = np.linspace(1.0, 0.1, n_j)
    gpu, size = np.arange(n_i) % 3, 4 + 2 * (np.arange(n_i) // 3)
    eff = rng.uniform(0.8, 1.2, (n_i, 1))
    bp = (rng.uniform(5, 20, (3, n_j)) * fall)[gpu] * size[:, None] * eff
    bd = (rng.uniform(5, 20, (3, n_j)) * np.sqrt(fall))[gpu] * size[:, None] ** 1.3 / eff
    islands = tuple((f"T{g}", int(s)) for g, s in zip(gpu, size, strict=True))
    pr = InnerProblem(islands, rng.dirichlet(np.ones(n_j)), bp, bd)
    scip, highs = solve(pr, backend="SCIP"), solve(pr, backend="HIGHS")
    assert scip.status == highs.status == "optimal"
    assert scip.rate_req_s == pytest.approx(highs.rate_req_s, rel=1e-6)


def test_auto_hands_over_to_highs_when_scip_runs_out_of_its_stint(monkeypatch: pytest.MonkeyPatch) -> None:
    from solvers import inner

    pr = random_problem(12, 20, 6, "max_rate")
    scip = solve(pr, backend="SCIP")
    monkeypatch.setattr(inner, "AUTO_SCIP_S", 1e-6)  # SCIP stops at once: HiGHS must finish the job
    calls: list[str] = []
    real = inner._solve_matrix

    def spy(model: Any, backend: str, limit: float, *scip: str) -> Any:
        calls.append(backend)
        out = real(model, backend, limit, *scip)
        calls.append(out[0])
        return out

    monkeypatch.setattr(inner, "_solve_matrix", spy)
    auto = solve(pr, backend="AUTO")
    assert calls[:2] == ["AUTO", "SCIP"] and "HIGHS" in calls and calls[-1] == "optimal", calls
    assert auto.status == scip.status == "optimal"
    assert auto.rate_req_s == pytest.approx(scip.rate_req_s, rel=1e-6)


def test_constraints_the_thesis_model_lacks_are_refused() -> None:
    with pytest.raises(ValueError, match="belong to `max_rate`"):
        prob([[1]], [[1]], [1.0], "thesis", cost_per_hour=np.ones(1), budget_per_hour=1.0)
    with pytest.raises(ValueError, match="needs both `kv_gb`"):
        prob([[1]], [[1]], [1.0], kv_gb=np.ones(1))
    with pytest.raises(ValueError, match="unknown MILP backend"):
        solve(prob([[1]], [[1]], [1.0]), backend="GUROBI")


def test_json_contract_carries_the_optional_constraints(tmp_path: Path) -> None:
    pr = prob([[10], [10]], [[10], [10]], [1.0], kv_gb=np.array([1.0]), link_gb_s=np.full(2, 4.0))
    again, _ = problem_from_json(json.loads(json.dumps(problem_to_json(pr))))
    assert solve(again).rate_req_s == pytest.approx(4.0)
    with pytest.raises(ValueError, match="`kv_gb` must be a number"):
        problem_from_json({**problem_to_json(pr), "kv_gb": [["x"]]})


@pytest.mark.parametrize("backend", ["SCIP", "HIGHS", "AUTO"])
def test_the_returned_routing_delivers_the_returned_rate_exactly(backend: str) -> None:
    # SCIP once left 4e-7 of prefill on this instance's decode class: within its tolerance, but lost
    # when classes became islands, so the reported rate exceeded what the routing carried by 1e-5
    pr = random_problem(1206, 7, 2)
    s = solve(pr, backend=backend)
    cap_p = (pr.prefill_req_s * s.x_prefill).sum(axis=0)
    cap_d = (pr.decode_req_s * s.x_decode).sum(axis=0)
    assert (cap_p >= s.rate_req_s * pr.p - 1e-9).all() and (cap_d >= s.rate_req_s * pr.p - 1e-9).all()
    assert (s.x_prefill >= 0).all() and (s.x_prefill.sum(axis=1) <= 1 + 1e-12).all()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_out_of_time_without_an_incumbent_the_role_search_gives_a_feasible_bounded_answer(seed: int) -> None:
    # every island distinct (no classes merge): a MILP stopped at 1 ms has no incumbent of its own
    rng = np.random.default_rng(seed)
    n_i, n_j = 20, 12
    fall = np.linspace(1.0, 0.1, n_j)
    prob = InnerProblem(
        tuple((f"T{k}", 8) for k in range(n_i)),
        rng.dirichlet(np.ones(n_j)),
        rng.uniform(5, 100, (n_i, n_j)) * fall,
        rng.uniform(5, 100, (n_i, n_j)) * np.sqrt(fall),
        "max_rate",
    )
    exact = solve(prob, time_limit_s=60.0, backend="SCIP")
    quick = solve(prob, time_limit_s=0.001, backend="SCIP")
    assert exact.status == "optimal" and quick.status == "feasible"
    # achievable (every range served at the stated rate by islands in one role each) and bounded
    assert 0 < quick.rate_req_s <= exact.rate_req_s * (1 + 1e-9) <= quick.extra["bound_req_s"] * (1 + 1e-9)
    for i, role in enumerate(quick.roles):
        assert quick.x_prefill[i].sum() == 0 if role == "decode" else quick.x_decode[i].sum() == 0
    served_p = (prob.prefill_req_s * quick.x_prefill).sum(axis=0)
    served_d = (prob.decode_req_s * quick.x_decode).sum(axis=0)
    assert np.all(served_p >= quick.rate_req_s * prob.p * (1 - 1e-6))
    assert np.all(served_d >= quick.rate_req_s * prob.p * (1 - 1e-6))


def test_out_of_time_a_role_search_that_fails_leaves_the_rounded_relaxation(monkeypatch: pytest.MonkeyPatch) -> None:
    from solvers import role_search

    def fails(*args: object, **kw: object) -> None:
        raise RuntimeError("role search: a phase LP ended with status 2")

    rng = np.random.default_rng(4)
    n_i, n_j = 16, 8
    prob = InnerProblem(
        tuple((f"T{k}", 8) for k in range(n_i)),
        rng.dirichlet(np.ones(n_j)),
        rng.uniform(5, 100, (n_i, n_j)),
        rng.uniform(5, 100, (n_i, n_j)),
        "max_rate",
    )
    searched = solve(prob, time_limit_s=0.001, backend="SCIP")
    monkeypatch.setattr(role_search, "improve", fails)
    rounded = solve(prob, time_limit_s=0.001, backend="SCIP")
    assert rounded.status == searched.status == "feasible"
    assert 0 < rounded.rate_req_s <= searched.rate_req_s * (1 + 1e-9)
    assert rounded.extra["bound_req_s"] == pytest.approx(searched.extra["bound_req_s"])


def test_an_unproven_exact_reference_still_has_a_layout_below_the_optimum_and_a_bound_above_it() -> None:
    """When the exact MILP stops at its time limit, the LP relaxation bounds the optimum and its
    counts made whole, improved by the count search, give a layout that fits the inventory
    (solvers/exact.py `_unproven`)."""
    from solvers.exact import ExactResult, TypeOptions, exact_optimum, unproven

    for seed in range(4):
        rng = np.random.default_rng(seed)
        n_j = 12
        fall = np.linspace(1.0, 0.2, n_j)
        types = []
        for t, count in enumerate((48, 40, 96)):
            sizes = np.array([8, 16, 32])
            types.append(TypeOptions(f"T{t}", count, 1.0 + t, sizes,
                                     rng.uniform(5, 100, (3, n_j)) * fall * sizes[:, None] / 8,
                                     rng.uniform(5, 100, (3, n_j)) * np.sqrt(fall) * sizes[:, None] / 8))  # fmt: skip
        p = rng.dirichlet(np.ones(n_j))
        best = exact_optimum(types, p, time_limit_s=60)
        assert best.status == "optimal"
        stopped = ExactResult("time_limit", 0.0, 0.0, (), 1.0, 1, float("nan"))
        out = unproven(types, p, stopped, [], time.perf_counter())
        assert out.status == "feasible"
        assert out.rate_req_s <= best.rate_req_s * (1 + 1e-9) <= out.bound * (1 + 1e-9)
        # the relaxation's counts made whole alone gave 0.83-0.98 here, the count search 0.976-1.000; with
        # only 3 sizes the MILP near its layouts is the whole MILP, so 1.000 (tests/test_count_search.py
        # has types of 40 sizes, where it is not)
        assert out.rate_req_s >= 0.95 * best.rate_req_s
        for t in types:  # the layout fits the inventory
            assert sum(size for g, size, _ in out.islands if g == t.gpu) <= t.count


@pytest.mark.parametrize("fill", [False, True, "pooled"])
def test_rounded_relaxation_counts_are_whole_and_fit_the_inventory_and_the_budget(fill: bool | str) -> None:
    from solvers.exact import TypeOptions, island_classes, round_counts, round_pooled

    rng = np.random.default_rng(7)
    sizes = np.array([8, 16, 32, 64])
    types = [TypeOptions(f"T{t}", count, 1.0 + t, sizes, rng.uniform(1, 9, (4, 3)), rng.uniform(1, 9, (4, 3)))
             for t, count in enumerate((72, 40, 128))]  # fmt: skip
    classes = island_classes(types)
    gpus = np.array([types[ti].sizes[si] for ti, si in classes], dtype=float)
    price = np.array([types[ti].price_per_gpu_hour for ti, _ in classes]) * gpus
    of_type = np.array([ti for ti, _ in classes])
    for trial in range(20):
        # fractional counts as a relaxation gives them: within every type's GPUs and the budget
        counts = rng.uniform(0, 2, (len(classes), 2))
        for ti, t in enumerate(types):
            counts[of_type == ti] *= min(1.0, t.count / (gpus[of_type == ti] @ counts[of_type == ti].sum(axis=1)))
        budget = None if trial % 2 else 150.0
        if budget is not None:
            counts *= min(1.0, budget / (price @ counts.sum(axis=1)))
        frac = [tuple(c) for c in counts]
        whole = np.array(
            round_pooled(types, frac, budget) if fill == "pooled" else round_counts(types, frac, budget, fill)
        )
        assert (whole == np.round(whole)).all() and (whole >= 0).all()
        assert (whole >= np.floor(counts + 1e-9)).all()  # nothing the relaxation had whole is dropped
        for ti, t in enumerate(types):
            assert gpus[of_type == ti] @ whole[of_type == ti].sum(axis=1) <= t.count
        if budget is not None:
            assert price @ whole.sum(axis=1) <= budget + 1e-9

"""Role search (`solvers.role_search`): the max_rate fallback when the MILP runs out of time.

Its moves are ordered and pruned by bounds from the phases' LP duals, so the tests check those
bounds against the true rate after every move, and the local optimum against brute force over
every move with the roles fixed in `solvers.inner.solve` (an independent model)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from solvers import role_search
from solvers.inner import InnerProblem, solve


def distinct(seed: int, n_i: int, n_j: int, kv: bool = False) -> InnerProblem:
    """Every island its own class: random rows, prefill throughput falling with length."""
    rng = np.random.default_rng(seed)
    fall = np.linspace(1.0, 0.1, n_j)
    extra = {}
    if kv:  # links tight enough that some islands' KV rows bind
        extra = {"kv_gb": rng.uniform(0.05, 0.5, n_j), "link_gb_s": rng.uniform(2.0, 20.0, n_i)}
    return InnerProblem(
        tuple((f"T{k}", 8) for k in range(n_i)),
        rng.dirichlet(np.ones(n_j)),
        rng.uniform(5, 100, (n_i, n_j)) * fall,
        rng.uniform(5, 100, (n_i, n_j)) * np.sqrt(fall),
        "max_rate",
        **extra,
    )


def fixed_rate(prob: InnerProblem, decode: np.ndarray) -> float:
    """The rate with every island's role fixed, solved by the inner model itself."""
    fixed = dataclasses.replace(prob, roles=tuple("decode" if d else "prefill" for d in decode))
    s = solve(fixed)
    return s.rate_req_s if s.status == "optimal" else 0.0


def phases(prob: InnerProblem, decode: np.ndarray) -> tuple[role_search.Phase, role_search.Phase]:
    m = np.ones(len(decode), dtype=int)
    return (
        role_search.Phase(prob.prefill_req_s, prob.p, m - decode, prob.kv_gb, prob.link_gb_s),
        role_search.Phase(prob.decode_req_s, prob.p, decode, prob.kv_gb, prob.link_gb_s),
    )


@pytest.mark.parametrize(("seed", "kv"), [(0, False), (1, False), (2, True), (3, True)])
def test_the_dual_bounds_bound_every_move(seed: int, kv: bool) -> None:
    prob = distinct(seed, 10, 6, kv)
    decode = np.random.default_rng(seed).integers(0, 2, 10)
    pre, dec = phases(prob, decode)
    gain_p, loss_p = pre.bounds()
    gain_d, loss_d = dec.bounds()
    for c in range(10):
        moved = decode.copy()
        moved[c] ^= 1
        after_p, after_d = phases(prob, moved)
        if decode[c]:  # decode -> prefill
            assert after_p.rate <= pre.rate + gain_p[c] + 1e-7 and after_d.rate <= dec.rate - loss_d[c] + 1e-7
        else:
            assert after_p.rate <= pre.rate - loss_p[c] + 1e-7 and after_d.rate <= dec.rate + gain_d[c] + 1e-7
        # and the identity they rest on: a phase's rate is its islands' dual values summed
    assert pre.rate == pytest.approx(((1 - decode) * loss_p).sum(), rel=1e-9)
    assert dec.rate == pytest.approx((decode * loss_d).sum(), rel=1e-9)


@pytest.mark.parametrize(("seed", "kv"), [(4, False), (5, False), (6, True)])
def test_the_search_ends_where_no_move_or_swap_improves_and_never_above_the_optimum(seed: int, kv: bool) -> None:
    prob = distinct(seed, 12, 5, kv)
    start = np.random.default_rng(seed).integers(0, 2, 12)
    m = np.ones(12, dtype=int)
    decode, rate = role_search.improve(
        prob.prefill_req_s, prob.decode_req_s, prob.p, m, start, kv_gb=prob.kv_gb, link_gb_s=prob.link_gb_s,
        budget_s=30.0,
    )  # fmt: skip
    assert rate == pytest.approx(fixed_rate(prob, decode), rel=1e-7)
    assert rate >= fixed_rate(prob, start) * (1 - 1e-9)
    exact = solve(prob, time_limit_s=60.0)
    assert exact.status == "optimal" and rate <= exact.rate_req_s * (1 + 1e-7)
    for a in range(12):  # every single move and every swap, by brute force
        for b in range(a, 12):
            moved = decode.copy()
            moved[a] ^= 1
            if b != a:
                if decode[b] == decode[a]:
                    continue
                moved[b] ^= 1
            assert fixed_rate(prob, moved) <= rate * (1 + 1e-7), (a, b)


def test_classes_move_one_island_at_a_time() -> None:
    """Three classes of four islands: the search moves counts, never past 0 or m_c."""
    rng = np.random.default_rng(7)
    bp, bd = rng.uniform(5, 100, (3, 4)), rng.uniform(5, 100, (3, 4))
    p = rng.dirichlet(np.ones(4))
    m = np.array([4, 4, 4])
    decode, rate = role_search.improve(bp, bd, p, m, np.array([4, 4, 4]), budget_s=30.0)
    assert ((decode >= 0) & (decode <= m)).all()
    islands = np.repeat(np.arange(3), 4)
    prob = InnerProblem(tuple((f"T{c}", 8) for c in islands), p, bp[islands], bd[islands], "max_rate")
    per_island = np.concatenate([[1] * d + [0] * (4 - d) for d in decode])
    assert rate == pytest.approx(fixed_rate(prob, per_island), rel=1e-7)
    assert rate <= solve(prob).rate_req_s * (1 + 1e-7)

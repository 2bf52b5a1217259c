"""The queueing model against closed forms on small cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from costmodel.queueing import erlang_c, max_utilisation, mix_moments, mix_quantile, wait_quantile


def test_erlang_c_matches_its_closed_form() -> None:
    # M/M/1: P(wait) = ρ. M/M/2 with a = 1 (ρ = 0.5): C = (a²/2!)/((1-ρ)(1 + a) + a²/2!) = 0.5/1.5 = 1/3
    assert erlang_c(1, 0.7) == pytest.approx(0.7)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(4, 4.5) == 1.0 and erlang_c(3, 0.0) == 0.0
    # many servers, light load: almost nobody waits
    assert erlang_c(1000, 500.0) < 1e-12


def test_mm1_wait_quantile_is_exact() -> None:
    # M/M/1: P(W > t) = ρ exp(-μ(1-ρ) t), so W_q = ln(ρ/(1-q)) / (μ(1-ρ))
    mu, rho, q = 4.0, 0.8, 0.99
    w = wait_quantile(1, rho * mu, 1 / mu, 1.0, q)
    assert w == pytest.approx(math.log(rho / (1 - q)) / (mu * (1 - rho)), rel=1e-12)
    assert wait_quantile(1, 0.001 * mu, 1 / mu, 1.0, q) == 0.0  # P(wait) below 1 - q: no wait at p99
    assert wait_quantile(1, mu, 1 / mu, 1.0, q) == math.inf


def test_md1_mean_wait_is_pollaczek_khinchine() -> None:
    # the approximation's mean C (1 + Cs²) / (2 (cμ - λ)) with c = 1, Cs² = 0 is the M/D/1 mean wait
    # ρ S / (2 (1 - ρ)); its tail at q is ln(ρ/(1-q)) times that mean / ρ
    s, rho, q = 0.25, 0.6, 0.95
    mean_wait = rho * s / (2 * (1 - rho))
    assert wait_quantile(1, rho / s, s, 0.0, q) == pytest.approx(math.log(rho / (1 - q)) * mean_wait / rho)


def test_mix_moments_and_quantile() -> None:
    mean, cs2 = mix_moments(np.array([1.0, 3.0]), np.array([1.0, 1.0]))
    assert mean == 2.0 and cs2 == pytest.approx(0.25)
    assert mix_quantile(np.array([3.0, 1.0, 2.0]), np.array([0.2, 0.7, 0.1]), 0.5) == 1.0
    assert mix_quantile(np.array([3.0, 1.0, 2.0]), np.array([0.2, 0.7, 0.1]), 0.95) == 3.0


def test_max_utilisation_meets_the_target_exactly_and_grows_with_servers() -> None:
    s, w, target, q = np.array([0.1, 0.3]), np.array([0.5, 0.5]), 2.0, 0.99
    mean, cs2 = mix_moments(s, w)
    for c in (1, 2, 8):
        rho = max_utilisation(c, s, w, target, q)
        assert 0 < rho < 1
        at = wait_quantile(c, rho * c / mean, mean, cs2, q) + mix_quantile(s, w, q)
        assert at == pytest.approx(target, rel=1e-6)  # the cap is where the bound meets the target
    assert (
        max_utilisation(1, s, w, target, q) < max_utilisation(2, s, w, target, q) < max_utilisation(8, s, w, target, q)
    )
    assert max_utilisation(1, s, w, 0.2, q) == 0.0  # the longest service alone breaks the target


def test_mm1_cap_is_its_closed_form() -> None:
    # M/M/1 with a deterministic-free check: exponential service has Cs² = 1; a one-point mix has Cs² = 0,
    # so compare against M/D/1 (the model's tail) solved by hand for ρ: ln(ρ/(1-q)) ρ S/(2ρ(1-ρ)) = T - S
    s, target, q = 0.5, 3.0, 0.9
    rho = max_utilisation(1, np.array([s]), np.array([1.0]), target, q)
    lhs = math.log(rho / (1 - q)) * s / (2 * (1 - rho))
    assert lhs == pytest.approx(target - s, rel=1e-6)


def test_grid_caps_never_exceed_the_exact_cap_and_miss_it_by_a_grid_step_at_most() -> None:
    from costmodel.queueing import utilisation_caps

    s, w, q = np.array([0.1, 0.3]), np.array([0.5, 0.5]), 0.99
    mean, cs2 = mix_moments(s, w)
    for c in (1, 3, 8, 200):
        for target in (0.5, 2.0, 5.0):
            exact = max_utilisation(c, s, w, target, q)
            (grid,) = utilisation_caps(c, mean, cs2, np.array([target - mix_quantile(s, w, q)]), q)
            assert exact - 1 / 2000 <= grid <= exact + 1e-12, (c, target, exact, grid)
    assert utilisation_caps(4, mean, cs2, np.array([-0.1]), q)[0] == 0.0


def test_vectorised_erlang_c_matches_the_recursion() -> None:
    from costmodel.queueing import RHO_GRID, erlang_c_grid

    for c in (1, 2, 7, 64, 900):
        rho = RHO_GRID[::97]
        assert np.allclose(erlang_c_grid(c, rho), [erlang_c(c, r * c) for r in rho], rtol=1e-9, atol=1e-300)


def test_tpot_step_cap_by_hand() -> None:
    from costmodel.queueing import tpot_step_cap_ms

    # every answer has 2 tokens: TPOT = st + A with A ~ U(0, st); P(st + A > 50) <= 1 % needs 2 st <= 50 / 0.99... :
    # P = 1 - (50 - st)/st <= 0.01  ->  st <= 50 / 1.99
    two = np.zeros(3)
    two[2] = 1.0
    assert tpot_step_cap_ms(50.0, 0.99, two) == pytest.approx(50 / 1.99, rel=1e-9)
    # long answers amortise the wait: with 1,000 tokens the step may reach 50 * 999 / 999.99
    long = np.zeros(1001)
    long[1000] = 1.0
    assert tpot_step_cap_ms(50.0, 0.99, long) == pytest.approx(50 * 999 / (999 + 0.99), rel=1e-9)
    # one-token answers are not measured by TPOT; a mix is between its parts
    mix = np.zeros(1001)
    mix[[1, 2, 1000]] = [0.5, 0.25, 0.25]
    assert 50 / 1.99 < tpot_step_cap_ms(50.0, 0.99, mix) < 50 * 999 / 999.99


def test_batching_lowers_the_cap_by_the_work_batched_behind_a_job() -> None:
    from costmodel.queueing import RHO_GRID, erlang_c, utilisation_caps

    c, mean, cs2, q, budget = 4, 0.2, 1.0, 0.99, 1.0
    plain = utilisation_caps(c, mean, cs2, np.array([budget]), q)[0]
    assert utilisation_caps(c, mean, cs2, np.array([budget]), q, 0.0)[0] == plain

    def wq(rho: float) -> float:  # the M/M/c wait quantile written out
        pw = erlang_c(c, rho * c)
        return 0.0 if pw <= 1 - q else np.log(pw / (1 - q)) * (1 + cs2) / (2 * (c / mean) * (1 - rho))

    # an unbounded batch adds rho x W: the cap is the largest grid rho with (1 + rho) W <= budget
    big = utilisation_caps(c, mean, cs2, np.array([budget]), q, 1e9)[0]
    ok = [r for r in RHO_GRID if (1 + r) * wq(r) <= budget]
    assert big == pytest.approx(max(ok)) and big < plain
    # a small batch adds at most its own time
    small = utilisation_caps(c, mean, cs2, np.array([budget]), q, 0.05)[0]
    ok = [r for r in RHO_GRID if wq(r) + min(r * wq(r), 0.05) <= budget]
    assert small == pytest.approx(max(ok)) and big <= small <= plain


def test_a_flat_rate_profile_gives_the_poisson_cap() -> None:
    """Arrivals at the mean rate in every bin are Poisson's: the modulated cap is `utilisation_caps`' own."""
    from costmodel.queueing import RateProfile, modulated_cap, utilisation_caps

    flat = RateProfile(np.ones(6), 10.0)
    for c, mean, cs2, wait, batch in ((4, 0.3, 0.5, 1.2, 0.4), (1, 0.2, 0.3, 1.5, 0.0), (2000, 30.0, 0.5, 0.0, 0.0)):
        poisson = utilisation_caps(c, mean, cs2, np.array([wait]), 0.99, batch)[0]
        assert 0 < poisson < 1
        assert modulated_cap(c, mean, cs2, wait, 0.99, flat, batch) == pytest.approx(poisson)


def test_a_burst_is_absorbed_while_its_backlog_stays_within_the_wait_budget() -> None:
    """Bins of 10 s alternating at 0.5 and 1.5 x the mean, on servers so many and so fast that only the fluid
    backlog waits: a hot bin at load 1.5 ρ > 1 builds (1.5 ρ - 1) s of work per second, and its arrivals (75 % of
    all) wait that out. Followed at 1-s steps, the last step's middle (9.5 s in) must stay under the 2-s budget
    for 99 % of arrivals to meet it: ρ = (1 + 2 / 9.5) / 1.5. With no budget at all (a decode slot's "no wait"),
    no backlog may build: ρ = 1 / 1.5."""
    from costmodel.queueing import RateProfile, modulated_cap

    hot_cold = RateProfile(np.array([0.5, 1.5]), 10.0)
    assert modulated_cap(1000, 1e-5, 1.0, 2.0, 0.99, hot_cold) == pytest.approx((1 + 2 / 9.5) / 1.5, rel=1e-4)
    assert modulated_cap(1000, 1e-5, 1.0, 0.0, 0.99, hot_cold) == pytest.approx(1 / 1.5, rel=1e-4)
    assert modulated_cap(1000, 1e-5, 1.0, -0.1, 0.99, hot_cold) == 0.0  # a budget spent before any wait


def test_a_clump_within_a_second_is_kept_by_the_profile_and_caps_the_load() -> None:
    """A trace with 20 requests inside the first second of every 10 s: a 10-s profile sees a flat rate, the
    workload's 1-s profile (`PROFILE_BIN_S`) 20 requests in one bin of ten, 20 x 291 / 600 = 9.7 x the mean (the
    trace ends 0.9 s into its 291st second). On servers so many and so fast that only the fluid backlog waits,
    with no wait allowed: the 10-s profile lets the load reach the Poisson cap (0.93: one arrival in a hundred may
    wait), the 1-s one only 1 / 9.7, since the clump's bin must not build a backlog."""
    from costmodel.queueing import RateProfile, modulated_cap, utilisation_caps
    from simulator.arrivals import PROFILE_BIN_S, rate_profile

    trace = np.concatenate([10.0 * k + np.linspace(0.0, 0.9, 20) for k in range(30)])
    coarse, fine = rate_profile(trace, 10.0), rate_profile(trace, PROFILE_BIN_S)
    assert np.allclose(coarse, 1.0) and len(fine) == 291 and fine.max() == pytest.approx(9.7)
    flat = modulated_cap(1000, 1e-5, 1.0, 0.0, 0.99, RateProfile(coarse, 10.0))
    clumped = modulated_cap(1000, 1e-5, 1.0, 0.0, 0.99, RateProfile(fine, PROFILE_BIN_S))
    poisson = utilisation_caps(1000, 1e-5, 1.0, np.array([0.0]), 0.99)[0]
    assert flat == pytest.approx(poisson) and poisson == pytest.approx(0.93, abs=0.01)
    assert clumped == pytest.approx(1 / 9.7, rel=1e-4)


def test_the_modulated_cap_walks_bins_as_a_step_by_step_fluid_queue_would() -> None:
    """`modulated_cap` follows the backlog at the bins' edges and steps inside only the bins that hold one; the
    same cap comes from walking every step of both cycles (Lindley's recursion step by step), on random profiles
    with empty bins, bins of 0.5, 1 and 10 s, one server to a thousand."""
    from costmodel.queueing import (
        STEPS_PER_BIN,
        RateProfile,
        _largest_within,
        erlang_c_grid,
        modulated_cap,
        utilisation_caps,
    )

    def walked(c: int, mean_s: float, cs2: float, wait_s: float, q: float, rel: np.ndarray, bin_s: float,
               batch_s: float) -> float:  # fmt: skip
        hat = float(utilisation_caps(c, mean_s, cs2, np.array([wait_s]), q, batch_s)[0])
        rel = rel / rel.mean()
        dt, k = bin_s / STEPS_PER_BIN, STEPS_PER_BIN

        def missed(rho: float) -> float:
            backlog, mids = 0.0, []
            for cycle in range(2):
                for r in rho * rel:
                    for _ in range(k):
                        after = max(backlog + (r - 1.0) * dt, 0.0)
                        if cycle:
                            mids.append(0.5 * (backlog + after))
                        backlog = after
            mid = np.array(mids)
            capped = np.repeat(np.minimum(rho * rel, hat), k)
            pw, theta = erlang_c_grid(c, capped), 2.0 * c / mean_s * (1.0 - capped) / (1.0 + cs2)
            t = np.maximum(wait_s / (1.0 + capped), wait_s - batch_s)
            tail = np.where((mid > 0) & (mid >= t), 1.0, np.minimum(pw * np.exp(-theta * np.maximum(t - mid, 0)), 1))
            return float(np.repeat(rel / rel.sum() / k, k) @ tail)

        return _largest_within(missed, 1.0 - q, hat, 30)

    rng = np.random.default_rng(3)
    for c, bin_s in ((1, 0.5), (8, 1.0), (64, 10.0), (1000, 1.0)):
        rel = rng.gamma(0.6, 1.0, 40) * (rng.random(40) > 0.3)
        args = (c, 0.05 * c**0.5, 0.7, 1.5, 0.99)
        assert modulated_cap(*args, RateProfile(rel, bin_s), 0.2) == pytest.approx(walked(*args, rel, bin_s, 0.2))

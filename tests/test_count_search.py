"""Count search (`solvers.count_search`): the exact reference's layout when its MILP runs out of time.

Its phase LPs are checked against the reference model with the counts fixed (`solvers.exact._solve`,
an independent model), its moves against the inventory and the budget, and its end point against
brute force over every move, each solved by that model."""

from __future__ import annotations

import numpy as np
import pytest

from solvers import count_search
from solvers.exact import TypeOptions, _classes, _round_counts, _round_pooled, _solve, exact_optimum

SIZES = np.array([8, 16, 24, 32, 48, 64])


def instance(seed: int, kv: bool = False) -> tuple[list[TypeOptions], np.ndarray, np.ndarray | None]:
    """Three GPU types, six island sizes each; bigger islands serve more per GPU, as EP does."""
    rng = np.random.default_rng(seed)
    n_j = 8
    fall = np.linspace(1.0, 0.2, n_j)
    scale = (SIZES / 8) ** rng.uniform(1.0, 1.3)
    types = [
        TypeOptions(
            f"T{t}",
            count,
            1.0 + t,
            SIZES,
            rng.uniform(5, 100, (len(SIZES), n_j)) * fall * scale[:, None],
            rng.uniform(5, 100, (len(SIZES), n_j)) * np.sqrt(fall) * scale[:, None],
            link_gb_s_per_gpu=float(rng.uniform(0.5, 4.0)),
        )
        for t, count in enumerate((56, 40, 104))
    ]
    return types, rng.dirichlet(np.ones(n_j)), rng.uniform(0.05, 0.5, n_j) if kv else None


def as_layout(counts: list[tuple[float, float]]) -> count_search.Layout:
    return {(c, r): int(n[r]) for c, n in enumerate(counts) for r in (0, 1) if n[r] > 0}


def as_counts(layout: count_search.Layout, n_classes: int) -> list[tuple[float, float]]:
    return [(float(layout.get((c, 0), 0)), float(layout.get((c, 1), 0))) for c in range(n_classes)]


def random_layout(
    types: list[TypeOptions], classes: list[tuple[int, int]], rng: np.random.Generator
) -> count_search.Layout:
    """Islands drawn one at a time while they fit their type's GPUs."""
    out: count_search.Layout = {}
    for ti, t in enumerate(types):
        free = t.count
        for _ in range(6):
            c = int(rng.choice([c for c, (tj, _) in enumerate(classes) if tj == ti]))
            size = int(t.sizes[classes[c][1]])
            if size <= free:
                r = int(rng.integers(2))
                out[(c, r)] = out.get((c, r), 0) + 1
                free -= size
    return out


@pytest.mark.parametrize("kv", [False, True])
def test_phase_lps_give_the_reference_models_rate_with_the_counts_fixed(kv: bool) -> None:
    for seed in range(3):
        types, p, kv_gb = instance(seed, kv)
        classes = _classes(types)
        rates = count_search.PhaseRates(types, classes, p, kv_gb)
        rng = np.random.default_rng(seed)
        for _ in range(6):
            layout = random_layout(types, classes, rng)
            fixed = _solve(types, p, 0.0, None, kv_gb, 60.0, "HIGHS", fix=as_counts(layout, len(classes)))[0]
            assert rates.rate(layout) == pytest.approx(fixed.rate_req_s, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("budget", [None, 180.0])
def test_every_move_changes_one_type_and_fits_its_gpus_and_the_budget(budget: float | None) -> None:
    types, _p, _ = instance(1)
    classes = _classes(types)
    gpus = np.array([types[ti].sizes[si] for ti, si in classes])
    price = np.array([types[ti].price_per_gpu_hour for ti, _ in classes]) * gpus
    rng = np.random.default_rng(5)
    for _ in range(10):
        layout = random_layout(types, classes, rng)
        start = np.array(as_counts(layout, len(classes)))
        if budget is not None and price @ start.sum(axis=1) > budget:
            continue
        moves = list(count_search.neighbours(types, classes, layout, budget))
        assert moves
        for new in moves:
            counts = np.array(as_counts(new, len(classes)))
            assert (counts >= 0).all() and new != layout
            changed = {classes[c][0] for c in np.flatnonzero((counts != start).any(axis=1))}
            assert len(changed) == 1  # one GPU type
            assert np.abs(counts - start).sum() <= 4  # at most two islands out, two in
            for ti, t in enumerate(types):
                of = np.array([tj == ti for tj, _ in classes])
                assert gpus[of] @ counts[of].sum(axis=1) <= t.count
            if budget is not None:
                assert price @ counts.sum(axis=1) <= budget + 1e-9


@pytest.mark.parametrize("kv", [False, True])
def test_the_search_ends_where_no_move_improves_and_never_above_the_optimum(kv: bool) -> None:
    for seed in range(3):
        types, p, kv_gb = instance(seed, kv)
        classes = _classes(types)
        _relaxed, frac = _solve(types, p, 0.0, None, kv_gb, 60.0, "HIGHS", relax=True)
        start = _round_counts(types, frac, None)
        start_rate = _solve(types, p, 0.0, None, kv_gb, 60.0, "HIGHS", fix=start)[0].rate_req_s
        rate, end = count_search.improve(types, classes, p, start, kv_gb=kv_gb, time_limit_s=60.0)
        best = exact_optimum(types, p, kv_gb=kv_gb, time_limit_s=60.0)
        assert best.status == "optimal"
        assert start_rate * (1 - 1e-9) <= rate <= best.rate_req_s * (1 + 1e-9)
        assert rate == pytest.approx(_solve(types, p, 0.0, None, kv_gb, 60.0, "HIGHS", fix=end)[0].rate_req_s, rel=1e-6)
        for new in count_search.neighbours(types, classes, as_layout(end), None):  # brute force, the other model
            moved = _solve(types, p, 0.0, None, kv_gb, 60.0, "HIGHS", fix=as_counts(new, len(classes)))[0]
            assert moved.rate_req_s <= rate * (1 + 1e-6)


def test_pooled_rounding_makes_a_relaxations_slivers_of_giant_islands_one_island() -> None:
    """A relaxation that decodes on slivers of two 64-GPU islands (20 GPUs' worth in all) gets one
    24-GPU decode island: the smallest size that holds the slivers' GPUs."""
    types, _, _ = instance(0)
    classes = _classes(types)
    frac = [(0.0, 0.0)] * len(classes)
    c8, c64, c48 = (classes.index((2, k)) for k in (0, 5, 4))  # T2: 104 GPUs
    frac[c8] = (4.0, 0.0)  # 32 GPUs prefill, whole
    frac[c64] = (0.0, 0.125)  # 8 GPUs' worth of decode
    frac[c48] = (0.0, 0.25)  # and 12 more
    whole = _round_pooled(types, frac, None)
    assert whole[c8] == (4.0, 0.0)
    assert whole[classes.index((2, 2))] == (0.0, 1.0)  # one 24-GPU decode island
    assert sum(sum(n) for n in whole) == 5

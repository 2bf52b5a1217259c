"""Count search (`solvers.count_search`): the exact reference's layout when its MILP runs out of time.

Its phase LPs are checked against the reference model with the counts fixed (`solvers.exact.solve_counts`,
an independent model), its moves against the inventory and the budget, and its end point against
brute force over every move, each solved by that model; then the MILP over the sizes near where it
ends (`solvers.exact.near`) against the whole MILP's optimum."""

from __future__ import annotations

import time

import numpy as np
import pytest

from solvers import count_search
from solvers.exact import (
    ExactResult,
    TypeOptions,
    exact_optimum,
    island_classes,
    near_sizes,
    round_counts,
    round_pooled,
    solve_counts,
    unproven,
)

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
        classes = island_classes(types)
        rates = count_search.PhaseRates(types, classes, p, kv_gb)
        rng = np.random.default_rng(seed)
        for _ in range(6):
            layout = random_layout(types, classes, rng)
            fixed = solve_counts(types, p, kv_gb=kv_gb, time_limit_s=60.0, fix=as_counts(layout, len(classes)))[0]
            assert rates.rate(layout) == pytest.approx(fixed.rate_req_s, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("budget", [None, 180.0])
def test_every_move_changes_one_type_and_fits_its_gpus_and_the_budget(budget: float | None) -> None:
    types, _p, _ = instance(1)
    classes = island_classes(types)
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
        classes = island_classes(types)
        _relaxed, frac = solve_counts(types, p, kv_gb=kv_gb, time_limit_s=60.0, relax=True)
        start = round_counts(types, frac, None)
        start_rate = solve_counts(types, p, kv_gb=kv_gb, time_limit_s=60.0, fix=start)[0].rate_req_s
        rate, end = count_search.improve(types, classes, p, start, kv_gb=kv_gb, time_limit_s=60.0)
        best = exact_optimum(types, p, kv_gb=kv_gb, time_limit_s=60.0)
        assert best.status == "optimal"
        assert start_rate * (1 - 1e-9) <= rate <= best.rate_req_s * (1 + 1e-9)
        fixed = solve_counts(types, p, kv_gb=kv_gb, time_limit_s=60.0, fix=end)[0]
        assert rate == pytest.approx(fixed.rate_req_s, rel=1e-6)
        for new in count_search.neighbours(types, classes, as_layout(end), None):  # brute force, the other model
            moved = solve_counts(types, p, kv_gb=kv_gb, time_limit_s=60.0, fix=as_counts(new, len(classes)))[0]
            assert moved.rate_req_s <= rate * (1 + 1e-6)


def test_pooled_rounding_makes_a_relaxations_slivers_of_giant_islands_one_island() -> None:
    """A relaxation that decodes on slivers of two 64-GPU islands (20 GPUs' worth in all) gets one
    24-GPU decode island: the smallest size that holds the slivers' GPUs."""
    types, _, _ = instance(0)
    classes = island_classes(types)
    frac = [(0.0, 0.0)] * len(classes)
    c8, c64, c48 = (classes.index((2, k)) for k in (0, 5, 4))  # T2: 104 GPUs
    frac[c8] = (4.0, 0.0)  # 32 GPUs prefill, whole
    frac[c64] = (0.0, 0.125)  # 8 GPUs' worth of decode
    frac[c48] = (0.0, 0.25)  # and 12 more
    whole = round_pooled(types, frac, None)
    assert whole[c8] == (4.0, 0.0)
    assert whole[classes.index((2, 2))] == (0.0, 1.0)  # one 24-GPU decode island
    assert sum(sum(n) for n in whole) == 5


def many_sizes(seed: int) -> tuple[list[TypeOptions], np.ndarray]:
    """Three GPU types of 40 island sizes each (8-320 GPUs), rates smooth in the size, as the cost model's are."""
    rng = np.random.default_rng(seed)
    n_j, sizes = 6, np.arange(8, 328, 8)
    fall = np.linspace(1.0, 0.2, n_j)
    types = []
    for t, count in enumerate((200, 136, 320)):
        scale = (sizes / 8) ** rng.uniform(1.0, 1.2)
        prefill = rng.uniform(5, 100, (1, n_j)) * fall * scale[:, None] * rng.uniform(0.9, 1.1, (len(sizes), n_j))
        decode = (
            rng.uniform(5, 100, (1, n_j)) * np.sqrt(fall) * scale[:, None] * rng.uniform(0.9, 1.1, (len(sizes), n_j))
        )
        types.append(TypeOptions(f"T{t}", count, 1.0 + t, sizes, prefill, decode))
    return types, rng.dirichlet(np.ones(n_j))


def test_near_keeps_the_sizes_a_layout_holds_and_their_neighbours_only() -> None:
    types, _ = many_sizes(0)
    classes = island_classes(types)
    layout = [(0.0, 0.0)] * len(classes)
    layout[classes.index((0, 0))] = (3.0, 0.0)  # T0: 8-GPU islands ...
    layout[classes.index((0, 15))] = (0.0, 1.0)  # ... and one of 128
    near = near_sizes(types, [layout], 4)
    assert near[0].sizes.tolist() == [8 * (k + 1) for k in [*range(0, 5), *range(11, 20)]]
    assert near[0].prefill_req_s.tolist() == types[0].prefill_req_s[[*range(0, 5), *range(11, 20)]].tolist()
    assert len(near[1].sizes) == len(near[2].sizes) == 0  # types the layouts do not use


def test_cut_short_the_reference_finds_the_optimum_among_sizes_near_the_count_searchs_layouts() -> None:
    """On 40 sizes a type, the count search alone ends at 0.95-0.998 of the optimum (seeds 0-3); the
    MILP over the sizes within NEAR_SIZES of where it ended reaches the optimum on seeds 0, 1 and 3 and
    0.99996 of it on seed 2 (HiGHS 1.12 through OR-Tools 9.15; the same at a 60 s and a 600 s limit, so
    not a matter of time; nothing guarantees the optimum lies that near). Seed 3 here: 9 s, where seed 2
    takes 24 s."""
    for seed in (3,):
        types, p = many_sizes(seed)
        best = exact_optimum(types, p, time_limit_s=120.0)
        assert best.status == "optimal"
        stopped = ExactResult("time_limit", 0.0, 0.0, (), 1.0, 1, float("nan"))
        out = unproven(types, p, stopped, [], time.perf_counter(), search_s=60.0)
        assert out.status == "feasible" and out.bound >= best.rate_req_s * (1 - 1e-9)
        assert out.rate_req_s == pytest.approx(best.rate_req_s, rel=1e-6)
        # its islands are a layout of the whole model, and it delivers what it states there
        classes = island_classes(types)
        counts = [(0.0, 0.0)] * len(classes)
        for gpu, size, role in out.islands:
            ti = next(k for k, t in enumerate(types) if t.gpu == gpu)
            c = classes.index((ti, int(np.flatnonzero(types[ti].sizes == size)[0])))
            counts[c] = (counts[c][0] + (role == "prefill"), counts[c][1] + (role == "decode"))
        fixed = solve_counts(types, p, time_limit_s=60.0, fix=counts)[0]
        assert fixed.rate_req_s == pytest.approx(out.rate_req_s, rel=1e-6)


def test_a_phase_lp_goes_to_the_next_backend_where_one_gives_no_optimum() -> None:
    """`solve_lp`: a backend that cannot solve the phase (here one this OR-Tools build lacks; GLOP's ABNORMAL on a
    badly scaled phase takes the same path) hands it to the next, HiGHS, which finds GLOP's optimum; with no
    backend left the error names what each said. By hand: two islands serving two lengths of demand shares
    0.5 / 0.5 at rates (4, 2) and (1, 3), one unit each: island 1 serves length 1 alone (3 >= 0.5 Λ), island 0 gives
    length 0 a share x and length 1 the rest, 4 x = 0.5 Λ = 2 (1 - x) + 3: x = 5/6, Λ = 20/3."""
    from solvers import role_search

    b, p, u = np.array([[4.0, 2.0], [1.0, 3.0]]), np.array([0.5, 0.5]), np.array([1.0, 1.0])
    glop = count_search.solve_lp(role_search.phase_model(b, p, u, None, None))
    highs = count_search.solve_lp(role_search.phase_model(b, p, u, None, None), ("no-such-backend", "highs"))
    assert glop == pytest.approx(20 / 3, rel=1e-9) and highs == pytest.approx(20 / 3, rel=1e-9)
    with pytest.raises(RuntimeError, match="no-such-backend: not in this OR-Tools build"):
        count_search.solve_lp(role_search.phase_model(b, p, u, None, None), ("no-such-backend",))

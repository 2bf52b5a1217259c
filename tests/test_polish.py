"""Local refinement: `Space.neighbours` (the moves) and `PolishSampler` (the schedule), on toy
objectives where every expected proposal can be checked (the real search: tests/test_search.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.distributions import IntDistribution

from pipeline.search.polish import PolishSampler, with_polish
from pipeline.search.space import Space

DIVIDER = Space("divider", (("A", 24), ("B", 40)), (("A", 2), ("B", 4)), skew_range=3.0, max_islands=8)
DIRECT = Space("direct", (("A", 12), ("B", 16)), (("A", 2), ("B", 2)), k_slots=3)


def random_points(space: Space, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` random parameter sets that stand for a layout (a direct proposal over the inventory does not)."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out: list[dict[str, Any]] = []
    while len(out) < n:
        params = study.ask(space.distributions()).params
        if space.layout_key(params) is not None:
            out.append(params)
    return out


@pytest.mark.parametrize("space", [DIVIDER, DIRECT], ids=["divider", "direct"])
def test_every_neighbour_is_one_parameter_moved_to_the_nearest_other_layout(space: Space) -> None:
    dists = space.distributions()
    for params in random_points(space, 12, seed=1):
        here = space.layout_key(params)
        moves = space.neighbours(params)
        keys = [space.layout_key(m) for m in moves]
        assert moves and len(set(keys)) == len(keys) and here not in keys and None not in keys
        for m in moves:
            (name,) = [k for k in params if m[k] != params[k]]  # exactly one parameter moved
            d = dists[name]
            assert d.low <= m[name] <= d.high  # type: ignore[attr-defined]
            # nothing between the start and the move changes the layout (the nearest change)
            between = (
                range(min(params[name], m[name]) + 1, max(params[name], m[name]))
                if isinstance(d, IntDistribution)
                else np.linspace(params[name], m[name], 50)[1:-1]
            )
            if isinstance(d, IntDistribution):
                assert all(space.layout_key({**params, name: v}) == here for v in between)
            else:  # a float lands inside the next layout's interval: the layout changes once on the way
                changes = sum(
                    space.layout_key({**params, name: a}) != space.layout_key({**params, name: b})
                    for a, b in zip([params[name], *between], [*between, m[name]], strict=True)
                )
                assert changes == 1
        assert space.neighbours(params) == moves  # deterministic


@pytest.mark.parametrize(
    "space",
    [
        DIVIDER,
        Space(
            "divider",
            (("H_1", 64), ("H_2", 48)),
            (("H_1", 8), ("H_2", 4)),
            max_islands=8,
            node=(("H_1", 8), ("H_2", 4)),
        ),
        Space("divider", (("A", 24), ("B", 40)), (("A", 2), ("B", 4)), max_islands=8, counts_are_bounds=True),
    ],
    ids=["divider", "node-aligned", "counts-are-bounds"],
)
def test_a_divider_walk_comparing_one_types_islands_finds_what_comparing_layouts_finds(
    space: Space, monkeypatch: pytest.MonkeyPatch
) -> None:
    points = random_points(space, 10, seed=2)
    fast = [space.neighbours(p) for p in points]
    monkeypatch.setattr(Space, "_walk_key", lambda self, name: self.layout_key)  # the whole layout at each step
    assert [space.neighbours(p) for p in points] == fast
    assert any(fast)


def test_divider_neighbours_hand_worked() -> None:
    # 24 GPUs, min island 2, n=3, skew 0: 3 x 2 GPUs plus 18 shared equally -> 8, 8, 8.
    # n - 1 -> 12, 12; n + 1 -> 6, 6, 6, 6. Skew down: weights 1, 2^s, 3^s share the 18 as
    # e.g. 6.03 / 6.00 / 5.97 at s = -0.01, and the largest remainder rounds that back to 6, 6, 6;
    # from s = -0.15 to s = -0.437 it is 7 / 6 / 5 -> 9, 8, 7, so the move lands in the middle,
    # s = -0.294. Skew up gives 7, 8, 9: the same islands, so it is not a second neighbour.
    space = Space("divider", (("A", 24),), (("A", 2),), skew_range=1.0, max_islands=4)
    moves = space.neighbours({"n_A": 3, "skew_A": 0.0})
    assert [sorted((n for _, n in space.layout(m)), reverse=True) for m in moves] == [[12, 12], [6, 6, 6, 6], [9, 8, 7]]
    assert [m["n_A"] for m in moves] == [2, 4, 3]
    assert moves[2]["skew_A"] == pytest.approx((-0.15 - 0.437) / 2, abs=0.002)


def toy(space: Space, target: dict[str, Any]) -> Callable[[dict[str, Any]], float]:
    """Minus the GPUs moved (per type, L1 between sizes sorted largest first) to reach `target`'s layout."""
    want = space.layout(target)

    def f(params: dict[str, Any]) -> float:
        got = space.layout(params)
        total = 0
        for gpu, _ in space.inventory:
            a = sorted((n for g, n in got if g == gpu), reverse=True)
            b = sorted((n for g, n in want if g == gpu), reverse=True)
            a, b = a + [0] * (len(b) - len(a)), b + [0] * (len(a) - len(b))
            total += sum(abs(x - y) for x, y in zip(a, b, strict=True))
        return -float(total)

    return f


def run(sampler: optuna.samplers.BaseSampler, space: Space, f: Callable, trials: int, batch: int) -> list[Any]:
    """`trials` asked `batch` at a time and told back together (the search's batch semantics)."""
    study = optuna.create_study(direction="maximize", sampler=sampler)
    while len(study.trials) < trials:
        asked = [study.ask(space.distributions()) for _ in range(min(batch, trials - len(study.trials)))]
        for t in asked:
            study.tell(t, f(t.params))
    return study.trials


def test_polish_starts_after_the_base_sampler_and_steps_to_neighbours_of_the_best() -> None:
    f = toy(DIVIDER, {"n_A": 3, "skew_A": 0.5, "n_B": 5, "skew_B": -1.0})
    plain = run(optuna.samplers.RandomSampler(seed=3), DIVIDER, f, 40, 4)
    polished = run(PolishSampler(optuna.samplers.RandomSampler(seed=3), DIVIDER, 40, 0.5), DIVIDER, f, 40, 4)
    assert [t.params for t in polished[:20]] == [t.params for t in plain[:20]]  # the base sampler's, unchanged
    for k in range(20, 40, 4):  # each batch: untried neighbours of the best finished layout (best first)
        before = polished[:k]
        order = sorted(before, key=lambda t: (-t.value, t.number))
        tried = {DIVIDER.layout_key(t.params) for t in before}
        expected: list[dict[str, Any]] = []
        seen = set()
        for best in order:
            if DIVIDER.layout_key(best.params) in seen:
                continue
            seen.add(DIVIDER.layout_key(best.params))
            for m in DIVIDER.neighbours(best.params):
                if DIVIDER.layout_key(m) not in tried and len(expected) < 4:
                    expected.append(m)
                    tried.add(DIVIDER.layout_key(m))
        assert [t.params for t in polished[k : k + 4]] == expected
    assert max(t.value for t in polished) >= max(t.value for t in plain[:20])


def test_polish_with_budget_to_spare_ends_at_a_layout_no_single_move_improves() -> None:
    f = toy(DIVIDER, {"n_A": 4, "skew_A": 1.2, "n_B": 6, "skew_B": 0.3})
    trials = run(PolishSampler(optuna.samplers.RandomSampler(seed=0), DIVIDER, 200, 0.9), DIVIDER, f, 200, 8)
    best = max(trials, key=lambda t: t.value)
    value = {DIVIDER.layout_key(t.params): t.value for t in trials}
    around = [DIVIDER.layout_key(m) for m in DIVIDER.neighbours(best.params)]
    assert around and all(k in value for k in around)  # every neighbour was evaluated ...
    assert all(value[k] <= best.value for k in around)  # ... and none is better: a local optimum
    assert best.value > max(t.value for t in trials[:20])  # the refinement improved on the start


def test_polish_zero_is_the_sampler_itself_and_out_of_range_is_refused() -> None:
    base = optuna.samplers.TPESampler(seed=0)
    assert with_polish(base, DIVIDER, 100, 0.0) is base
    with pytest.raises(ValueError, match=r"search\.polish"):
        PolishSampler(base, DIVIDER, 100, 1.5)

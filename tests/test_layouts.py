"""Layout generators: thesis 4.9.2 divider cases, direct constraint handling, one shared contract."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ConfigError
from pipeline.search.space import Space
from solvers.layouts import LayoutError, LayoutRejected, direct_layout, divide, divider_layout


def test_divider_fig_4_8_setting_by_hand() -> None:
    # G = 100, N = 5, I_min = 1: 95 GPUs left after the base allocation.
    assert divide(100, 5, 0.0, 1) == [20] * 5  # equal weights: 19 each + 1
    # s = 1: w = 1..5, ideal 95 k / 15 = 6.33, 12.67, 19, 25.33, 31.67 -> floors 6, 12, 19, 25, 31 (93);
    # the two largest fractions (k = 2 and 5, .67) get one more each.
    assert divide(100, 5, 1.0, 1) == [7, 14, 20, 26, 33]
    # s = -1 favours low indices; the sum is always G
    neg = divide(100, 5, -1.0, 1)
    assert neg == sorted(neg, reverse=True) and sum(neg) == 100
    # higher |skew| -> larger spread (Fig 4.8)
    spread = [max(divide(100, 5, s, 1)) - min(divide(100, 5, s, 1)) for s in (0.0, 1.0, 3.0, 5.0)]
    assert spread == sorted(spread) and spread[0] == 0 and spread[-1] > 50


def test_divider_preconditions_and_empty_cases() -> None:
    with pytest.raises(LayoutError, match="minimum island size must be > 0"):
        divide(10, 2, 0.0, 0)
    with pytest.raises(LayoutError, match=">= 0"):
        divide(-1, 2, 0.0, 1)
    assert divide(0, 3, 0.0, 1) == []  # no GPUs
    assert divide(10, 0, 0.0, 1) == []  # no islands wanted
    assert divide(3, 2, 0.0, 4) == []  # not even one island of I_min
    assert divide(10, 5, 2.0, 4) == [4, 6]  # N_actual = floor(10 / 4) = 2; remaining 2 -> weights 1, 4
    assert divide(9, 1, 3.0, 2) == [9]  # one island takes everything
    assert divide(8, 4, 1.0, 2) == [2, 2, 2, 2]  # nothing remains after the base allocation
    assert divide(100, 5, 1e-12, 1) == [20] * 5  # near-zero skew counts as zero


def test_direct_rejects_or_repairs_over_inventory_proposals() -> None:
    inv, mins = {"H200": 16}, {"H200": 2}
    assert direct_layout(inv, {"H200": [8, 0, 1, 6]}, mins) == [("H200", 8), ("H200", 6)]  # 1 < min: no island
    with pytest.raises(LayoutRejected, match="sum to 20 > 16"):
        direct_layout(inv, {"H200": [12, 8]}, mins)
    repaired = direct_layout(inv, {"H200": [12, 8]}, mins, repair=True)
    assert sum(n for _, n in repaired) <= 16 and all(n >= 2 for _, n in repaired) and len(repaired) == 2


INVENTORIES = [{"H200": 16, "H20": 32}, {"DGX-B300": 128, "H200": 256}, {"H800": 5}]


def spaces() -> st.SearchStrategy[tuple[Space, dict[str, object]]]:
    @st.composite
    def build(draw: st.DrawFn) -> tuple[Space, dict[str, object]]:
        inv = draw(st.sampled_from(INVENTORIES))
        gen = draw(st.sampled_from(["divider", "direct"]))
        mins = {g: draw(st.integers(1, min(8, n))) for g, n in inv.items()}
        space = Space(
            gen,
            tuple(inv.items()),
            tuple(mins.items()),
            k_slots=4,
            repair=draw(st.booleans()),
            counts_are_bounds=draw(st.booleans()),
        )
        params: dict[str, object] = {}
        for name, d in space.distributions().items():
            if hasattr(d, "step") and isinstance(d.low, int):
                params[name] = draw(st.integers(d.low, d.high))
            else:
                params[name] = draw(st.floats(d.low, d.high))
        return space, params

    return build()


@settings(max_examples=200, deadline=None)
@given(spaces())
def test_every_generator_honours_the_contract(case: tuple[Space, dict[str, object]]) -> None:
    space, params = case
    inv, mins = dict(space.inventory), dict(space.min_island)
    try:
        layout = space.layout(params)
    except LayoutRejected:
        assert space.generator == "direct" and not space.repair
        return
    used = Counter()
    for gpu, size in layout:
        used[gpu] += size
        assert size >= mins[gpu]
    for gpu, n in used.items():
        assert n <= inv[gpu]  # fits; no GPU used twice
    assert space.layout(params) == layout  # deterministic
    if space.generator == "divider" and not space.counts_are_bounds:
        # the divider uses every GPU of a type whenever one island fits
        for gpu, count in inv.items():
            assert used[gpu] == count


def test_space_rejects_a_minimum_island_larger_than_the_inventory() -> None:
    with pytest.raises(ConfigError, match="min_island for H800 is 8 but the inventory has only 5 H800"):
        Space("divider", (("H800", 5),), (("H800", 8),))


def test_divider_layout_checks_use_against_the_inventory() -> None:
    with pytest.raises(LayoutError, match="20 H200 asked for"):
        divider_layout({"H200": 16}, {"H200": 2}, {"H200": 0.0}, {"H200": 2}, {"H200": 20})


def test_node_shapes_are_divisors_of_a_host_or_whole_hosts() -> None:
    from solvers.layouts import divide_shaped, node_shapes

    assert node_shapes(8, 40) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert node_shapes(4, 10) == (1, 2, 4, 8)
    # DeepSeek-V3 on HGX H20 (min 8): whole nodes, all 128 GPUs in use, skew still shapes the sizes
    assert divide_shaped(128, 3, 0.0, 8, 8) == [48, 40, 40]
    assert divide_shaped(128, 3, 3.0, 8, 8) == [8, 32, 88]
    # below a node: units of the smallest island, unless whole nodes keep more GPUs busy
    assert divide_shaped(12, 3, 0.0, 2, 8) == [4, 4, 4]
    assert divide_shaped(64, 3, 0.0, 2, 8) == [24, 24, 16]
    assert divide_shaped(64, 3, 0.0, 6, 8) == [24, 24, 16]  # min 6 rounds up to a whole node
    assert divide_shaped(7, 1, 0.0, 8, 8) == []  # no host-aligned island of 8 in 7 GPUs


def test_max_islands_auto_leaves_the_island_count_to_the_inventory() -> None:
    from pipeline.search.space import Space

    inv, mins = (("H200", 2000), ("H20", 24)), (("H200", 8), ("H20", 8))
    auto = Space("divider", inv, mins, max_islands=None).distributions()
    capped = Space("divider", inv, mins, max_islands=32).distributions()
    assert auto["n_H200"].high == 250 and capped["n_H200"].high == 32  # 2000 H200 in islands of 8 or more
    assert auto["n_H20"].high == capped["n_H20"].high == 3

"""Search spaces: the parameters a sampler proposes, and the layout they stand for.

divider: per GPU type t, `n_<t>` (target islands, int) and `skew_<t>` (float); with counts as
upper bounds (objective rate_per_dollar, or a budget) also `gpus_<t>` (GPUs of t to use).
direct: per type, `slot_<t>_<k>` for k < K (island size, 0 = none).

`Space.neighbours` gives the parameter sets one move away from a point that stand for other
layouts (the local moves of `pipeline.search.polish`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution

from pipeline.errors import ConfigError
from solvers.layouts import LayoutRejected, direct_layout, divider_layout, node_shapes

GENERATORS = ("divider", "direct")
FLOAT_STEPS = 1000  # a float parameter is walked in steps of 1/FLOAT_STEPS of its range


@dataclass(frozen=True)
class Space:
    generator: str
    inventory: tuple[tuple[str, int], ...]  # (gpu, count)
    min_island: tuple[tuple[str, int], ...]  # (gpu, minimum island size)
    skew_range: float = 5.0
    max_islands: int | None = 32  # divider: islands per type at most (None: as many as the inventory allows)
    k_slots: int = 16
    repair: bool = False
    counts_are_bounds: bool = False  # divider: also choose how many GPUs of each type to use
    grid_points: int = 4
    node: tuple[tuple[str, int], ...] | None = None  # (gpu, GPUs per host): node-aligned islands; None = any size

    def __post_init__(self) -> None:
        if self.generator not in GENERATORS:
            raise ConfigError(f"search.generator={self.generator!r}: choose from {list(GENERATORS)}")
        for gpu, count in self.inventory:
            m = dict(self.min_island)[gpu]
            if m < 1:
                raise ConfigError(f"search.min_island for {gpu} must be >= 1, got {m}")
            if m > count:
                raise ConfigError(
                    f"search.min_island for {gpu} is {m} but the inventory has only {count} {gpu}: "
                    f"lower search.min_island (or search.min_island_per_type.{gpu})"
                )

    def distributions(self) -> dict[str, BaseDistribution]:
        out: dict[str, BaseDistribution] = {}
        mins = dict(self.min_island)
        for gpu, count in self.inventory:
            if self.generator == "divider":
                cap = count // mins[gpu] if self.max_islands is None else min(self.max_islands, count // mins[gpu])
                out[f"n_{gpu}"] = IntDistribution(1, max(1, cap))
                out[f"skew_{gpu}"] = FloatDistribution(-self.skew_range, self.skew_range)
                if self.counts_are_bounds:
                    out[f"gpus_{gpu}"] = IntDistribution(0, count)
            else:
                for k in range(self.k_slots):
                    out[f"slot_{gpu}_{k}"] = IntDistribution(0, count)
        return out

    def grid(self) -> dict[str, list[Any]]:
        """`grid_points` evenly spaced values per parameter (ints deduplicated)."""
        out: dict[str, list[Any]] = {}
        for name, d in self.distributions().items():
            vals = np.linspace(d.low, d.high, self.grid_points)  # type: ignore[attr-defined]
            out[name] = (
                sorted({int(x) for x in np.rint(vals)}) if isinstance(d, IntDistribution) else [float(v) for v in vals]
            )
        return out

    def grid_size(self) -> int:
        return int(np.prod([len(v) for v in self.grid().values()]))

    def layout(self, params: Mapping[str, Any]) -> list[tuple[str, int]]:
        """The layout these parameters stand for (LayoutRejected for an over-inventory direct proposal)."""
        inv, mins = dict(self.inventory), dict(self.min_island)
        if self.generator == "divider":
            return divider_layout(
                inv,
                {g: int(params[f"n_{g}"]) for g in inv},
                {g: float(params[f"skew_{g}"]) for g in inv},
                mins,
                {g: int(params[f"gpus_{g}"]) for g in inv} if self.counts_are_bounds else None,
                self.nodes,
            )
        slots = {g: [int(params[f"slot_{g}_{k}"]) for k in range(self.k_slots)] for g in inv}
        return direct_layout(inv, slots, mins, repair=self.repair, node=self.nodes)

    @property
    def nodes(self) -> dict[str, int] | None:
        return None if self.node is None else dict(self.node)

    def sizes(self, gpu: str) -> list[int]:
        """Every island size of `gpu` a layout of this space may hold (the exact reference's classes)."""
        count, low = dict(self.inventory)[gpu], dict(self.min_island)[gpu]
        shapes = range(1, count + 1) if self.node is None else node_shapes(dict(self.node)[gpu], count)
        return [x for x in shapes if x >= low]

    def layout_key(self, params: Mapping[str, Any]) -> tuple[tuple[str, int], ...] | None:
        """The layout as a sorted island tuple; None for a rejected direct proposal."""
        try:
            return tuple(sorted(self.layout(params)))
        except LayoutRejected:
            return None

    def neighbours(self, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One move per parameter and direction: the nearest value that changes the layout.

        An int moves by the fewest steps of 1 that change the layout (a divider's n_t past what
        fits changes nothing). A float walks in steps of 1/FLOAT_STEPS of its range to the next
        layout and lands in the middle of the interval that gives it, naming that layout robustly
        rather than by its edge. Moves to a rejected proposal are left out, and so is a layout
        reached twice.
        """
        here = self.layout_key(params)
        seen = {here}
        out: list[dict[str, Any]] = []
        for name, dist in self.distributions().items():
            for direction in (-1, 1):
                moved = self._move(params, name, dist, direction)
                if moved is not None and (key := self.layout_key(moved)) is not None and key not in seen:
                    seen.add(key)
                    out.append(moved)
        return out

    def _walk_key(self, name: str) -> Callable[[Mapping[str, Any]], Any]:
        """What a walk along parameter `name` compares to tell layouts apart. The divider's `name`
        shapes one GPU type and the others' islands cannot change, so that type's islands are enough:
        the other types are not divided again and sorted at each of up to FLOAT_STEPS steps."""
        if self.generator != "divider":
            return self.layout_key
        gpu = name.split("_", 1)[1]  # n_<t>, skew_<t>, gpus_<t>
        inv, mins, node = dict(self.inventory), dict(self.min_island), self.nodes
        one = {gpu: inv[gpu]}
        return lambda p: divider_layout(
            one,
            {gpu: int(p[f"n_{gpu}"])},
            {gpu: float(p[f"skew_{gpu}"])},
            {gpu: mins[gpu]},
            {gpu: int(p[f"gpus_{gpu}"])} if self.counts_are_bounds else None,
            None if node is None else {gpu: node[gpu]},
        )

    def _move(
        self, params: Mapping[str, Any], name: str, dist: BaseDistribution, direction: int
    ) -> dict[str, Any] | None:
        """`params` with `name` moved, in `direction`, to the nearest value that changes the layout."""
        values = _walk(dist, params[name], direction)
        key_of = self._walk_key(name)
        here = key_of(params)
        there: Any = here
        first = last = -1
        for i, v in enumerate(values):  # stop at the end of the first other layout's interval
            key = key_of({**params, name: v})
            if first < 0 and key != here:
                if isinstance(dist, IntDistribution):
                    return {**params, name: v}
                first, there = i, key
            elif first >= 0 and key != there:
                break
            last = i
        return None if first < 0 else {**params, name: (values[first] + values[last]) / 2}


def _walk(dist: BaseDistribution, start: Any, direction: int) -> list[Any]:
    """The values after `start` in `direction` up to the end of the range: steps of 1 for an int,
    of 1/FLOAT_STEPS of the range for a float."""
    low, high = dist.low, dist.high  # type: ignore[attr-defined]
    if isinstance(dist, IntDistribution):
        return list(range(int(start) + direction, high + 1 if direction > 0 else low - 1, direction))
    v = start + direction * (high - low) / FLOAT_STEPS * np.arange(1, FLOAT_STEPS + 1)
    return [float(x) for x in v[(v >= low) & (v <= high)]]


def all_grid_points(space: Space) -> list[dict[str, Any]]:
    """Every grid point in order (small spaces only; used by tests)."""
    g = space.grid()
    return [dict(zip(g, vals, strict=True)) for vals in itertools.product(*g.values())]

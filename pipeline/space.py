"""Search spaces: the parameters a sampler proposes, and the layout they stand for.

divider: per GPU type t, `n_<t>` (target islands, int) and `skew_<t>` (float); with counts as
upper bounds (objective rate_per_dollar, or a budget) also `gpus_<t>` (GPUs of t to use).
direct: per type, `slot_<t>_<k>` for k < K (island size, 0 = none).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution

from pipeline.config import ConfigError
from solvers.layouts import direct_layout, divider_layout

GENERATORS = ("divider", "direct")


@dataclass(frozen=True)
class Space:
    generator: str
    inventory: tuple[tuple[str, int], ...]  # (gpu, count)
    min_island: tuple[tuple[str, int], ...]  # (gpu, minimum island size)
    skew_range: float = 5.0
    max_islands: int = 32
    k_slots: int = 16
    repair: bool = False
    counts_are_bounds: bool = False  # divider: also choose how many GPUs of each type to use
    grid_points: int = 4

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
                out[f"n_{gpu}"] = IntDistribution(1, max(1, min(self.max_islands, count // mins[gpu])))
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
            )
        slots = {g: [int(params[f"slot_{g}_{k}"]) for k in range(self.k_slots)] for g in inv}
        return direct_layout(inv, slots, mins, repair=self.repair)


def all_grid_points(space: Space) -> list[dict[str, Any]]:
    """Every grid point in order (small spaces only; used by tests)."""
    g = space.grid()
    return [dict(zip(g, vals, strict=True)) for vals in itertools.product(*g.values())]

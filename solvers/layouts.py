"""Layout generators: from a few search parameters to a list of GPU islands (thesis 4.9).

Both take an inventory `{gpu type: count}` and return islands as `(gpu, size)` pairs, largest
first within a type. Every generator here satisfies one contract (tests/test_layouts.py):
the islands fit the inventory, no GPU is used twice, every size is >= the type's minimum
island, and the same parameters always give the same layout.

**divider** (4.9.2, as written): per type t, a target island count n_t and a skew s_t. Every
island first gets I_min GPUs; the rest are shared with weights w_k = k^s (w_k = 1 when s is
near zero), rounded by the largest-remainder method, so the sizes sum to the type's count.

**direct** (4.9.1): per type t, K slots x_t1..x_tK (GPUs per island, 0 = no island) with
Σ_k x_tk <= I_t. A slot below the type's minimum island holds no island. A proposal over the
inventory is rejected (`LayoutRejected`, the search records it) or repaired (slots scaled down
to fit), by config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

SKEW_ZERO = 1e-9  # |s| below this counts as "no skew" (thesis: "numerically close to zero")


class LayoutError(ValueError):
    """Generator parameters that break a precondition (thesis 4.9.2: raise and stop)."""


class LayoutRejected(ValueError):
    """A direct proposal that does not fit the inventory (recorded by the search, not fatal)."""


def divide(total: int, n_target: int, skew: float, min_island: int) -> list[int]:
    """Island sizes for one GPU type (thesis 4.9.2); [] when no island of min_island fits."""
    if min_island <= 0:
        raise LayoutError(f"divider: minimum island size must be > 0, got {min_island}")
    if total < 0 or n_target < 0:
        raise LayoutError(f"divider: GPU count and target islands must be >= 0, got {total} and {n_target}")
    if not math.isfinite(skew):
        raise LayoutError(f"divider: skew must be finite, got {skew}")
    n_actual = min(n_target, total // min_island)
    if n_actual == 0:
        return []
    remaining = total - n_actual * min_island
    extra = [0] * n_actual
    if remaining > 0 and n_actual == 1:
        extra[0] = remaining
    elif remaining > 0:
        weights = [1.0] * n_actual if abs(skew) < SKEW_ZERO else [float(k) ** skew for k in range(1, n_actual + 1)]
        w_sum = sum(weights)
        ideal = [w / w_sum * remaining for w in weights]
        extra = [math.floor(v) for v in ideal]
        short = round(remaining - sum(extra))
        # largest remainder; ties go to the lower index (stable sort)
        order = sorted(range(n_actual), key=lambda k: ideal[k] - extra[k], reverse=True)
        for k in order[:short]:
            extra[k] += 1
    return [min_island + e for e in extra]


def divider_layout(
    inventory: Mapping[str, int],
    n_target: Mapping[str, int],
    skew: Mapping[str, float],
    min_island: Mapping[str, int],
    use: Mapping[str, int] | None = None,
) -> list[tuple[str, int]]:
    """Every type divided by its own (n_t, s_t); `use[t]` GPUs of it (default: all)."""
    out: list[tuple[str, int]] = []
    for gpu, count in inventory.items():
        total = count if use is None else use[gpu]
        if total > count:
            raise LayoutError(f"divider: {total} {gpu} asked for, the inventory has {count}")
        sizes = divide(total, n_target[gpu], skew[gpu], min_island[gpu])
        out += [(gpu, s) for s in sorted(sizes, reverse=True)]
    return out


def direct_layout(
    inventory: Mapping[str, int],
    slots: Mapping[str, Sequence[int]],
    min_island: Mapping[str, int],
    repair: bool = False,
) -> list[tuple[str, int]]:
    """Islands from K slots per type; over-inventory proposals rejected or (repair=True) scaled to fit."""
    out: list[tuple[str, int]] = []
    for gpu, count in inventory.items():
        sizes = [int(x) for x in slots[gpu]]
        if any(x < 0 for x in sizes):
            raise LayoutError(f"direct: slot sizes must be >= 0, got {sizes} for {gpu}")
        sizes = [x for x in sizes if x >= min_island[gpu]]
        if sum(sizes) > count:
            if not repair:
                raise LayoutRejected(f"direct: slots for {gpu} sum to {sum(sizes)} > {count} in the inventory")
            sizes = _repair(sizes, count, min_island[gpu])
        out += [(gpu, s) for s in sorted(sizes, reverse=True)]
    return out


def _repair(sizes: list[int], count: int, min_island: int) -> list[int]:
    """Scale sizes down proportionally to fit `count`; drop the smallest islands that fall below the minimum."""
    sizes = sorted(sizes, reverse=True)
    while sizes:
        scale = count / sum(sizes)
        fitted = [max(min_island, math.floor(x * scale)) for x in sizes]
        if sum(fitted) <= count:
            return fitted
        sizes = sizes[:-1]
    return []

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

**Node-aligned shapes** (`node`, GPUs per host of each type; None = any size, the thesis's):
an island is a divisor of a node or a whole number of nodes (`node_shapes`), so every engine
sits inside one host or spans whole hosts. The divider then shares whole nodes (or, below a
node, whole units of the smallest allowed island) and rounds each island down to a shape; the
direct generator rounds each slot down to a shape. GPUs a rounding leaves over stay idle.
"""

from __future__ import annotations

import bisect
import functools
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


@functools.lru_cache(maxsize=1024)
def node_shapes(node: int, count: int) -> tuple[int, ...]:
    """Island sizes that fit hosts of `node` GPUs, up to `count`: divisors of a node and multiples of it."""
    if node < 1:
        raise LayoutError(f"GPUs per node must be >= 1, got {node}")
    divisors = {d for d in range(1, node + 1) if node % d == 0}
    return tuple(sorted(x for x in divisors | set(range(node, count + 1, node)) if x <= count))


def snap(size: int, shapes: Sequence[int]) -> int:
    """The largest shape <= size (0 when none is); `shapes` ascending."""
    k = bisect.bisect_right(shapes, size)
    return shapes[k - 1] if k else 0


def smallest_shape(min_island: int, shapes: Sequence[int]) -> int:
    """The smallest shape >= min_island (0 when none is)."""
    return min((x for x in shapes if x >= min_island), default=0)


def divide_shaped(total: int, n_target: int, skew: float, min_island: int, node: int) -> list[int]:
    """`divide` in whole units, each island then rounded down to a node-aligned shape.

    The unit is a node when the smallest allowed island is a node or more (for DeepSeek-V3 on HGX
    inventories every island is whole nodes). Below a node it is that island's size, unless
    sharing whole nodes keeps more GPUs busy once every island is rounded to a shape.
    """
    shapes = node_shapes(node, total)
    low = smallest_shape(min_island, shapes)
    if low == 0:
        return []
    best: list[int] = []
    for unit in sorted({low if low < node else node, node}):
        sizes = [unit * k for k in divide(total // unit, n_target, skew, max(low // unit, 1))]
        sizes = [x for x in (snap(k, shapes) for k in sizes) if x >= low]
        if sum(sizes) > sum(best):
            best = sizes
    return best


def divider_layout(
    inventory: Mapping[str, int],
    n_target: Mapping[str, int],
    skew: Mapping[str, float],
    min_island: Mapping[str, int],
    use: Mapping[str, int] | None = None,
    node: Mapping[str, int] | None = None,
) -> list[tuple[str, int]]:
    """Every type divided by its own (n_t, s_t); `use[t]` GPUs of it (default: all); node-aligned
    islands when `node` (GPUs per host of each type) is given."""
    out: list[tuple[str, int]] = []
    for gpu, count in inventory.items():
        total = count if use is None else use[gpu]
        if total > count:
            raise LayoutError(f"divider: {total} {gpu} asked for, the inventory has {count}")
        sizes = _divided(total, n_target[gpu], float(skew[gpu]), min_island[gpu], None if node is None else node[gpu])
        out += [(gpu, s) for s in sizes]
    return out


@functools.lru_cache(maxsize=1 << 16)
def _divided(total: int, n_target: int, skew: float, min_island: int, node: int | None) -> tuple[int, ...]:
    """One type's islands, largest first. Cached: a search divides the same types again and again
    (each move `pipeline.search.space.Space.neighbours` finds is checked as a whole layout, whose other
    types are unchanged; samplers repeat proposals)."""
    if node is None:
        return tuple(sorted(divide(total, n_target, skew, min_island), reverse=True))
    return tuple(sorted(divide_shaped(total, n_target, skew, min_island, node), reverse=True))


def direct_layout(
    inventory: Mapping[str, int],
    slots: Mapping[str, Sequence[int]],
    min_island: Mapping[str, int],
    repair: bool = False,
    node: Mapping[str, int] | None = None,
) -> list[tuple[str, int]]:
    """Islands from K slots per type; over-inventory proposals rejected or (repair=True) scaled to fit;
    with `node`, each slot rounded down to a node-aligned shape."""
    out: list[tuple[str, int]] = []
    for gpu, count in inventory.items():
        sizes = [int(x) for x in slots[gpu]]
        if any(x < 0 for x in sizes):
            raise LayoutError(f"direct: slot sizes must be >= 0, got {sizes} for {gpu}")
        shapes = node_shapes(node[gpu], count) if node is not None else None
        if shapes is not None:
            sizes = [snap(x, shapes) for x in sizes]
        sizes = [x for x in sizes if x >= min_island[gpu]]
        if sum(sizes) > count:
            if not repair:
                raise LayoutRejected(f"direct: slots for {gpu} sum to {sum(sizes)} > {count} in the inventory")
            sizes = _repair(sizes, count, min_island[gpu])
            if shapes is not None:
                sizes = [x for x in (snap(k, shapes) for k in sizes) if x >= min_island[gpu]]
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

"""A GPU inventory: how many GPUs of each type, at what $/h. Validated once, here."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from costmodel.catalog import gpu_names, load_gpu
from costmodel.specs import GPU
from pipeline.errors import ConfigError


@dataclass(frozen=True)
class Inventory:
    """GPU types (each with the inventory's price) and how many of each; iterating gives (GPU, count) pairs."""

    name: str
    gpus: tuple[GPU, ...]  # one per type, with the inventory's price
    counts: tuple[int, ...]

    def __iter__(self) -> Iterator[tuple[GPU, int]]:
        return iter(zip(self.gpus, self.counts, strict=True))

    @property
    def by_name(self) -> dict[str, int]:
        """{GPU type: count}."""
        return {g.name: n for g, n in self}

    @property
    def named(self) -> tuple[tuple[str, int], ...]:
        """(GPU type, count) pairs, as the search space and plan.json keep them."""
        return tuple((g.name, n) for g, n in self)

    @property
    def cost_per_hour(self) -> float:
        return sum(g.price_per_hour * n for g, n in self)

    @property
    def total_gpus(self) -> int:
        return sum(self.counts)

    @property
    def hosts(self) -> int:
        """Hosts the inventory fills, a type's last one possibly part-full."""
        return sum(-(-n // g.node_gpus) for g, n in self)

    def count(self, gpu_name: str) -> int:
        return self.by_name.get(gpu_name, 0)

    def describe(self) -> str:
        parts = " + ".join(f"{n} {g.name}" for g, n in self)
        return f"{self.name}: {parts} (${self.cost_per_hour:,.2f}/h)"


def inventory_from_cfg(name: str, cfg: Mapping[str, Any], source: str | None = None) -> Inventory:
    """Build an inventory from its `conf/inventory/<name>.yaml` mapping; errors name the file."""
    where = source or f"conf/inventory/{name}.yaml"
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{where}: expected a mapping with `gpus` (and optional `prices`)")
    unknown = sorted(set(cfg) - {"gpus", "prices"})
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; valid fields: ['gpus', 'prices']")
    gpus_cfg = cfg.get("gpus")
    if not isinstance(gpus_cfg, Mapping) or not gpus_cfg:
        raise ConfigError(f"{where}: field `gpus` must map GPU names to counts, e.g. {{H200: 64}}")
    prices = cfg.get("prices") or {}
    if not isinstance(prices, Mapping):
        raise ConfigError(f"{where}: field `prices` must map GPU names to USD per GPU-hour")
    stray = sorted(set(prices) - set(gpus_cfg))
    if stray:
        raise ConfigError(f"{where}: `prices` names GPU(s) {stray} that are not in `gpus` {sorted(gpus_cfg)}")
    gpus: list[GPU] = []
    counts: list[int] = []
    for gname, count in gpus_cfg.items():
        if str(gname) not in gpu_names():
            raise ConfigError(
                f"{where}: unknown GPU {gname!r} in `gpus`; choose from {gpu_names()} (or add conf/gpu/{gname}.yaml)"
            )
        gpu = load_gpu(str(gname))  # a malformed GPU file is its own error, naming the file
        if isinstance(count, bool) or not isinstance(count, int):
            raise ConfigError(f"{where}: `gpus.{gname}` must be a whole number of GPUs, got {count!r}")
        if count < 0:
            raise ConfigError(f"{where}: `gpus.{gname} >= 0` must hold, got {count}")
        if gname in prices:
            price = prices[gname]
            if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
                raise ConfigError(f"{where}: `prices.{gname}` must be a non-negative number, got {price!r}")
            gpu = replace(gpu, price_per_hour=float(price))
        if count > 0:  # a type with no GPUs takes no part
            gpus.append(gpu)
            counts.append(count)
    if not counts:
        raise ConfigError(f"{where}: the inventory has no GPUs (every count is 0)")
    return Inventory(name, tuple(gpus), tuple(counts))

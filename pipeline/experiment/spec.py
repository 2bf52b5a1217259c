"""An experiment's definition: its axes, trials and overrides (`conf/experiment/<name>.yaml`), and the grid of
cells they make, each composed as `python -m pipeline.search` would compose it."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from costmodel.catalog import CONF_DIR
from pipeline.checks import positive_int
from pipeline.cli import choice, plain, respelled
from pipeline.errors import ConfigError
from pipeline.search.samplers import make_sampler
from pipeline.search.settings import Settings, settings_from_cfg
from pipeline.search.trial import Context

GROUPS = ("inventory", "workload", "model", "costmodel", "search")  # config groups an axis may name


@dataclass(frozen=True)
class Cell:
    label: tuple[tuple[str, str], ...]  # (axis, value) per axis
    settings: Settings
    ctx: Context
    ref_key: str  # identity of the exact reference this cell shares with others
    skipped: str = ""  # why this cell cannot run here (e.g. a sampler's optional extra is missing)

    @property
    def key(self) -> str:
        return ",".join(f"{a}={v}" for a, v in self.label)

    def seeds(self, trials: int) -> list[int]:
        """The searches' seeds; the exact planner is deterministic: one search says all."""
        n = 1 if self.settings.mode == "exact" else trials
        return [self.settings.search.seed + k for k in range(n)]


@dataclass(frozen=True)
class Spec:
    name: str
    title: str
    trials: int
    axes: tuple[tuple[str, tuple[str, ...]], ...]
    overrides: tuple[str, ...]
    table: str  # "cells" or "table_5_1"
    timing: bool
    smoke: bool


def spec_from_cfg(cfg: Any) -> Spec:
    if "experiment" not in cfg:
        names = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
        raise ConfigError(f"choose an experiment: +experiment=NAME with NAME one of {names}")
    e = cfg.experiment
    smoke = bool(e.get("smoke", False))
    axes_cfg = {**plain(e.axes), **((plain(e.get("smoke_axes")) or {}) if smoke else {})}
    axes = tuple((str(k), tuple(str(v) for v in vs)) for k, vs in axes_cfg.items())
    for axis, values in axes:
        if not values:
            raise ConfigError(f"experiment.axes.{axis} is empty: give it at least one value")
        if axis in GROUPS:
            names = {p.stem for p in (CONF_DIR / axis).glob("*.yaml")}
            unknown = [v for v in values if v not in names]
            if unknown:
                raise ConfigError(f"experiment.axes.{axis}: {unknown} not in conf/{axis}/ ({sorted(names)})")
    overrides = tuple(str(o) for o in e.overrides) + (tuple(str(o) for o in e.smoke_overrides) if smoke else ())
    trials = positive_int(e.smoke_trials if smoke else e.trials, "experiment.trials")
    table = str(e.get("table", "cells"))
    if table not in ("cells", "table_5_1"):
        raise ConfigError(f"experiment.table={table!r}: choose cells or table_5_1")
    return Spec(str(e.name), str(e.title), trials, axes, overrides, table, bool(e.get("timing", False)), smoke)


def _axis_override(axis: str, value: str) -> str:
    """An axis names a config group (`workload`), a search setting (`batch` = `search.batch`) or any key."""
    if axis == "inventory":
        return f"+inventory={value}"
    if axis in GROUPS or "." in axis:
        return f"{axis}={value}"
    return f"search.{axis}={value}"


def _merge(overrides: Sequence[str]) -> list[str]:
    """One override per key, the last one winning (an axis beats the command line beats the experiment)."""
    by_key = {o.lstrip("+~").partition("=")[0]: o for o in overrides}
    return list(by_key.values())


def build_cells(spec: Spec, passthrough: Sequence[str]) -> list[Cell]:
    """Compose the search config of every cell (Hydra compose, as `python -m pipeline.search` would)."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig

    outer = HydraConfig.instance().cfg
    cells: list[Cell] = []
    try:
        for combo in itertools.product(*(vals for _, vals in spec.axes)):
            label = tuple((axis, v) for (axis, _), v in zip(spec.axes, combo, strict=True))
            overrides = respelled(_merge(
                ["+inventory=hetero_a", *spec.overrides, *passthrough, *(_axis_override(a, v) for a, v in label)]
            ))  # fmt: skip
            cfg = compose("search", overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            settings, ctx = settings_from_cfg(cfg, choice("inventory"), cfg.inventory)
            record = dict(settings.config)
            s = record["search"]
            ref_id = {
                **{k: v for k, v in record.items() if k not in ("search", "ray", "mlflow", "out_root")},
                "search": {k: s.get(k) for k in ("min_island", "min_island_per_type", "objective", "budget_per_hour")}
                | {"kv_transfer": s.get("kv_transfer")},
            }
            skipped = ""
            try:
                if settings.mode == "search":
                    make_sampler(settings.search.sampler, 0, ctx.space)
            except ConfigError as err:
                skipped = str(err)
            cells.append(Cell(label, settings, ctx, digest(ref_id), skipped))
    finally:
        if outer is not None:
            HydraConfig.instance().set_config(outer)
    return cells


def digest(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]

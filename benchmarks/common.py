"""What the benchmarks share: the checkout's root, a search config composed as the commands compose it, the
scale benchmarks' generated inventories, and the exact reference's plan of a config.

Each benchmark is a script (`python benchmarks/<name>.py`), so its own folder is on the import path and
`import common` finds this module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from costmodel.catalog import CONF_DIR

ROOT = Path(__file__).resolve().parents[1]
# the generated inventories of benchmarks/scale_bench.py at scale 1: about 10,000 GPUs of eight or three types
EIGHT = {"H200": 2000, "H800": 1500, "H20": 2500, "H100-SXM": 1500, "DGX-B200": 1000, "MI300X": 800,
         "A100-80GB": 400, "H20-3E": 300}  # fmt: skip
THREE = {"H200": 2500, "H800": 2500, "H20": 5000}  # hetero_a's 1 : 1 : 2


def scale_inventory(types: int, scale: float) -> dict[str, int]:
    """`EIGHT` or `THREE` scaled, each type a whole number of 8-GPU hosts."""
    base = EIGHT if types == 8 else THREE
    return {g: max(8, round(n * scale / 8) * 8) for g, n in base.items()}


def compose(overrides: list[str], config: str = "search") -> Any:
    """`conf/<config>.yaml` composed with `overrides` (spelled as the commands take them), Hydra's runtime set."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from pipeline.cli import respelled

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config, overrides=respelled(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def context(overrides: list[str], gpus: dict[str, int] | None = None) -> tuple[Any, Any]:
    """(settings, trial context) of a search: on `+inventory=...` among `overrides` (hetero_a without one), or on
    an inventory of `gpus` (type: count)."""
    from omegaconf import OmegaConf

    from pipeline.search.settings import inventory_of, settings_from_cfg

    cfg = compose(overrides)
    if gpus is None:
        return settings_from_cfg(cfg, *inventory_of(cfg))
    return settings_from_cfg(cfg, "scale", OmegaConf.create({"gpus": gpus}))


def exact_plan(overrides: list[str]) -> tuple[Any, Any, Any]:
    """(settings, context, the plan of the exact reference's layout) of the config `overrides` describe."""
    from pipeline.planning.build import build_plan
    from pipeline.search.reference import exact_layout, reference

    settings, ctx = context(overrides)
    layout = exact_layout(reference(settings, ctx, ctx.planner))
    if layout is None:
        raise SystemExit(f"the exact reference found no layout for {overrides}")
    return settings, ctx, build_plan(ctx.planner, layout, ctx.inner_time_limit_s, ctx.backend)

"""The domain objects a composed config describes: GPU, model, cost profile and calibration, SLOs, and the
one cost-settings record every layer shares.

Errors a user can fix are `ConfigError`s (`pipeline.errors`); `pipeline.cli` prints them as one
line and exits with 2.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from costmodel.calibration import Calibration, load_calibration
from costmodel.catalog import CONF_DIR, build
from costmodel.profile import CostProfile
from costmodel.settings import (
    KV_DTYPES,
    MAX_DRAFTS,
    MAX_MEM_FRACTION,
    MEM_FRACTION,
    MIN_MEM_FRACTION,
    CostSettings,
    EngineSettings,
    Mtp,
    Slo,
)
from costmodel.specs import GPU, Model, SpecError
from pipeline.checks import (
    boolean,
    fraction,
    number,
    one_of,
    optional_positive,
    optional_positive_int,
    positive_int,
    whole_number,
)
from pipeline.cli import plain
from pipeline.errors import ConfigError


def gpu_from_cfg(name: str, cfg: Mapping[str, Any]) -> GPU:
    return build(GPU, {**plain(cfg), "name": name}, f"conf/gpu/{name}.yaml (or its overrides)")


def model_from_cfg(name: str, cfg: Mapping[str, Any]) -> Model:
    return build(Model, {**plain(cfg), "name": name}, f"conf/model/{name}.yaml (or its overrides)")


def profile_from_cfg(cfg: Mapping[str, Any], model: str | None = None) -> CostProfile:
    """The `costmodel` block's profile and calibration; for `model`, the calibration `costmodel.fallback` names in
    place of one fitted to other models' measured serving (`fallback_note`)."""
    try:
        profile = CostProfile.named(str(cfg["profile"])).with_fixes(**(plain(cfg.get("fixes")) or {}))
    except ValueError as err:
        raise ConfigError(f"costmodel: {err}") from None
    cal = cfg.get("calibration")
    if cal is None:
        return profile
    try:
        loaded = _calibration(str(cal))
        instead = _fallback(cfg, loaded.models, model)
        return profile.calibrated(loaded if instead is None else _calibration(instead))
    except SpecError as err:
        raise ConfigError(f"costmodel.calibration: {err}") from None


def _fallback(cfg: Mapping[str, Any], fitted: tuple[str, ...], model: str | None) -> str | None:
    """The calibration `costmodel.fallback` names for the command's where that one was fitted to the measured
    serving of models other than `model`; None where it holds for `model` (or the map names none)."""
    if model is None or not fitted or model in fitted:
        return None
    instead = (plain(cfg.get("fallback")) or {}).get(str(cfg.get("calibration")))
    return None if instead is None else str(instead)


def fallback_note(cfg: Mapping[str, Any], model: str) -> str:
    """"" or one line saying that `model` is priced with the `costmodel.fallback` calibration, and why."""
    cal = cfg.get("calibration")
    if cal is None:
        return ""
    try:
        fitted = _calibration(str(cal)).models
    except SpecError:
        return ""
    instead = _fallback(cfg, fitted, model)
    if instead is None:
        return ""
    return (f"{model} is priced with calibration {instead!r} (costmodel.fallback): calibration {str(cal)!r} was "
            f"fitted to the measured serving of {', '.join(fitted)} only, and its end-to-end factors correct that "
            f"serving, not {model}'s")


def _calibration(name: str) -> Calibration:
    """The calibration `costmodel.calibration` names, read once per file as it stands (a command resolves it and
    says what it resolved to from the same read)."""
    path = calibration_path(name)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return load_calibration(path)  # (its own message: not found)
    return _read_calibration(str(path), stamp)


@functools.lru_cache(maxsize=16)
def _read_calibration(path: str, stamp: int) -> Calibration:
    return load_calibration(path)


def calibration_path(name: str) -> Path:
    """`costmodel.calibration`: a shipped calibration's name (conf/calibration/<name>.yaml) or a file."""
    shipped = CONF_DIR / "calibration" / f"{name}.yaml"
    if "/" not in name and not name.endswith((".yaml", ".yml", ".json")) and shipped.is_file():
        return shipped
    return Path(name).expanduser()


SLO_KEYS = ("ttft_ms", "ttft_percentile", "tpot_ms", "tpot_percentile")
FROM_PLAN = "plan"  # an SLO value that takes the plan's own (conf/slo/plan.yaml: pipeline.simulate's default)


def slo_from_cfg(cfg: Any, own: Slo | None = None) -> tuple[Slo, str]:
    """The `slo` block (conf/slo/), checked: targets in ms (null: none) and their percentiles; `slo=null`: no
    targets. A value `plan` takes the plan's own from `own`. Returns (the targets, where they come from:
    "the plan's own targets", "the command's targets", "the plan's targets, tpot_ms from the command")."""
    slo = cfg.get("slo")
    if slo is None:
        return Slo(), "no targets: slo=null"
    unknown = sorted(set(slo) - set(SLO_KEYS))
    if unknown:
        raise ConfigError(f"slo.{unknown[0]} is not an SLO setting: the settings are {list(SLO_KEYS)} (or slo=null)")
    values: dict[str, Any] = {}
    given = []
    for key in SLO_KEYS:
        v = slo.get(key, 99 if key.endswith("percentile") else None)
        if v == FROM_PLAN:
            if own is None:
                raise ConfigError(f"slo.{key}=plan takes the plan's own target, and there is no plan here: give a "
                                  "number (or null)")  # fmt: skip
            values[key] = getattr(own, key)
            continue
        given.append(key)
        if key.endswith("_ms"):
            values[key] = optional_positive(v, f"slo.{key}")
        else:
            values[key] = number(v, f"slo.{key}", low=50, high=99.99)
    source = ("the plan's own targets" if not given else "the command's targets"
              if len(given) == len(SLO_KEYS) or own is None
              else f"the plan's targets, {', '.join(given)} from the command")  # fmt: skip
    return Slo(**values), source


def mtp_from_cfg(c: Mapping[str, Any]) -> Mtp | None:
    """`costmodel.mtp` (drafts, acceptance); absent or 0 drafts: no MTP."""
    mtp = c.get("mtp") or {}
    unknown = sorted(set(mtp) - {"drafts", "acceptance"})
    if unknown:
        raise ConfigError(f"costmodel.mtp.{unknown[0]} is not an MTP setting: the settings are drafts and acceptance")
    drafts = whole_number(mtp.get("drafts", 0), "costmodel.mtp.drafts")
    if drafts > MAX_DRAFTS:
        raise ConfigError(f"`0 <= mtp.drafts <= {MAX_DRAFTS}` must hold (0: no MTP), got costmodel.mtp.drafts={drafts}")
    acceptance = mtp.get("acceptance")
    if acceptance is not None:
        acceptance = number(acceptance, "costmodel.mtp.acceptance", low=0.01, high=1.0)
    if not drafts:
        return None
    return Mtp(drafts) if acceptance is None else Mtp(drafts, acceptance)


def engine_from_cfg(cfg: Any) -> EngineSettings:
    """How the engines run (`costmodel`: prefill_batch_tokens, fp8_combine, aggregated, mem_fraction, kv_dtype,
    host_cache_gb, max_running_requests;
    `search.shapes`)."""
    c = cfg.costmodel
    return EngineSettings(
        prefill_batch_tokens=positive_int(c.prefill_batch_tokens, "costmodel.prefill_batch_tokens"),
        fp8_combine=boolean(c.fp8_combine, "costmodel.fp8_combine"),
        aggregated=boolean(c.get("aggregated", False), "costmodel.aggregated"),
        mem_fraction=number(c.get("mem_fraction", MEM_FRACTION), "costmodel.mem_fraction", MIN_MEM_FRACTION,
                            MAX_MEM_FRACTION),
        kv_dtype=one_of(c.get("kv_dtype", "auto"), "costmodel.kv_dtype", KV_DTYPES),
        host_cache_gb=number(c.get("host_cache_gb", 0.0), "costmodel.host_cache_gb", low=0.0, high=1e6),
        max_running_requests=optional_positive_int(c.get("max_running_requests"), "costmodel.max_running_requests"),
        # search.shapes=any plans the thesis's free sizes and configurations; everything else, what engines run
        runnable_only=cfg.get("search") is None or str(cfg.search.get("shapes", "nodes")) != "any",
    )


def host_cache_fits(cost: CostSettings, gpus: Mapping[str, GPU]) -> None:
    """ConfigError unless every host of `gpus` has the memory a host tier of `costmodel.host_cache_gb` per GPU takes
    (its GPUs' share together), known from its catalogue entry, and a host link to load it back over."""
    per_gpu = cost.engine.host_cache_gb
    if not per_gpu:
        return
    for g in gpus.values():
        where = f"conf/gpu/{g.name}.yaml"
        if g.host_memory_gb is None or not g.host_link_gb_s:
            what = "host_memory_gb (its hosts' DRAM)" if g.host_memory_gb is None else "host_link_gb_s (PCIe)"
            raise ConfigError(f"costmodel.host_cache_gb={per_gpu:g}: {g.name} hosts have no {what} in {where}: "
                              f"give it there, or set costmodel.host_cache_gb=0")  # fmt: skip
        need = per_gpu * g.node_gpus
        if need > g.host_memory_gb:
            raise ConfigError(f"costmodel.host_cache_gb={per_gpu:g} GB per GPU x {g.node_gpus} GPUs = {need:,.0f} GB "
                              f"is more than a {g.name} host's {g.host_memory_gb:,.0f} GB of memory ({where} "
                              f"host_memory_gb): at most {g.host_memory_gb / g.node_gpus:,.0f}")  # fmt: skip


def calibrated_for(cost: CostSettings, model: Model) -> None:
    """ConfigError unless `cost`'s calibration holds for `model`: one fitted to measured serving corrects the
    serving of the models it was fitted to (`Calibration.models`); kernel tables hold for any."""
    cal = cost.profile.calibration
    if cal is not None and cal.models and model.name not in cal.models:
        raise ConfigError(
            f"costmodel.calibration: calibration {cal.name!r} was fitted to the measured serving of "
            f"{', '.join(cal.models)}, and this plan is for {model.name}: its end-to-end factors correct that "
            f"model's serving, not this one's; use costmodel=calibrated (the kernel tables, any model), or fit one "
            f"to {model.name}'s serving (python -m costmodel.calibrate --serving)"
        )


def cost_settings_from_cfg(cfg: Any, model: str | None = None) -> CostSettings:
    """The one cost-settings record of a command: `costmodel` (profile, fixes, cache_hit, fp8_combine,
    prefill_batch_tokens, mtp, aggregated) and `slo`; for `model` (its calibration: `profile_from_cfg`)."""
    c = cfg.costmodel
    try:
        return CostSettings(
            profile=profile_from_cfg(c, model),
            cache_hit=fraction(c.cache_hit, "costmodel.cache_hit"),
            slo=slo_from_cfg(cfg)[0],
            engine=engine_from_cfg(cfg),
            mtp=mtp_from_cfg(c),
        )
    except SpecError as err:
        raise ConfigError(f"costmodel: {err}") from None

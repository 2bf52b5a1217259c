"""Turn a composed Hydra config into validated, frozen domain objects (the only place that does).

Errors a user can fix are `ConfigError`s (`pipeline.errors`); `pipeline.cli` prints them as one
line and exits with 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from costmodel.calibration import load_calibration
from costmodel.catalog import CONF_DIR, build
from costmodel.profile import CostProfile
from costmodel.settings import CostSettings
from costmodel.specs import GPU, Model, SpecError
from pipeline.errors import ConfigError


def plain(cfg: Any) -> Any:
    """A DictConfig/ListConfig as plain Python containers (resolved); anything else unchanged."""
    return OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg


def choice(group: str) -> str:
    """Which option of config group `group` Hydra composed (e.g. 'H200' for gpu)."""
    from hydra.core.hydra_config import HydraConfig

    return str(HydraConfig.get().runtime.choices[group])


def gpu_from_cfg(name: str, cfg: Mapping[str, Any]) -> GPU:
    return build(GPU, {**plain(cfg), "name": name}, f"conf/gpu/{name}.yaml (or its overrides)")


def model_from_cfg(name: str, cfg: Mapping[str, Any]) -> Model:
    return build(Model, {**plain(cfg), "name": name}, f"conf/model/{name}.yaml (or its overrides)")


def profile_from_cfg(cfg: Mapping[str, Any]) -> CostProfile:
    try:
        profile = CostProfile.named(str(cfg["profile"])).with_fixes(**(plain(cfg.get("fixes")) or {}))
    except ValueError as err:
        raise ConfigError(f"costmodel: {err}") from None
    cal = cfg.get("calibration")
    if cal is None:
        return profile
    try:
        return profile.calibrated(load_calibration(calibration_path(str(cal))))
    except SpecError as err:
        raise ConfigError(f"costmodel.calibration: {err}") from None


def calibration_path(name: str) -> Path:
    """`costmodel.calibration`: a shipped calibration's name (conf/calibration/<name>.yaml) or a file."""
    shipped = CONF_DIR / "calibration" / f"{name}.yaml"
    if "/" not in name and not name.endswith((".yaml", ".yml", ".json")) and shipped.is_file():
        return shipped
    return Path(name).expanduser()


def positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"`{key} >= 1` (whole number) must hold, got {key}={value!r}: set {key}=N on the command line"
        )
    return value


def whole_number(value: Any, key: str) -> int:
    """`value` as a whole number >= 0; ConfigError names `key` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{key} must be a whole number >= 0, got {key}={value!r}")
    return value


def optional_positive(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"`{key} > 0` must hold (or null for no cap), got {key}={value!r}")
    return float(value)


def fraction(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"`0 <= {key} < 1` must hold, got {key}={value!r}")
    return float(value)


SLO_KEYS = ("ttft_ms", "ttft_percentile", "tpot_ms", "tpot_percentile")


def slo_from_cfg(cfg: Any) -> dict[str, Any]:
    """The `slo` block, checked: targets (ms, or null for none) and their percentiles; `slo=null`: none."""
    slo = cfg.get("slo")
    if slo is None:
        return {"ttft_ms": None, "tpot_ms": None, "ttft_percentile": 99.0, "tpot_percentile": 99.0}
    unknown = sorted(set(slo) - set(SLO_KEYS))
    if unknown:
        raise ConfigError(f"slo.{unknown[0]} is not an SLO setting: the settings are {list(SLO_KEYS)} (or slo=null)")
    return {
        "ttft_ms": optional_positive(slo.get("ttft_ms"), "slo.ttft_ms"),
        "tpot_ms": optional_positive(slo.get("tpot_ms"), "slo.tpot_ms"),
        "ttft_percentile": number(slo.get("ttft_percentile", 99), "slo.ttft_percentile", low=50, high=99.99),
        "tpot_percentile": number(slo.get("tpot_percentile", 99), "slo.tpot_percentile", low=50, high=99.99),
    }


def cost_settings_from_cfg(cfg: Any) -> CostSettings:
    """The one cost-settings record of a command: `costmodel` (profile, fixes, cache_hit, fp8_combine,
    prefill_batch_tokens) and `slo`."""
    c = cfg.costmodel
    try:
        return CostSettings(
            profile_from_cfg(c),
            fraction(c.cache_hit, "costmodel.cache_hit"),
            boolean(c.fp8_combine, "costmodel.fp8_combine"),
            **slo_from_cfg(cfg),
            prefill_batch_tokens=positive_int(c.prefill_batch_tokens, "costmodel.prefill_batch_tokens"),
            # search.shapes=any plans the thesis's free sizes and configurations; everything else, what engines run
            engine_configs=cfg.get("search") is None or str(cfg.search.get("shapes", "nodes")) != "any",
        )
    except SpecError as err:
        raise ConfigError(f"costmodel: {err}") from None


def boolean(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {key}={value!r}")
    return value


def number(value: Any, key: str, low: float | None = None, high: float | None = None) -> float:
    """A finite number within [low, high] (either bound optional)."""
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and value == value
        and abs(value) != float("inf")
    )
    if ok and low is not None:
        ok = value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bounds = " and ".join(b for b in (low is not None and f">= {low:g}", high is not None and f"<= {high:g}") if b)
        raise ConfigError(f"{key} must be a number{f' {bounds}' if bounds else ''}, got {key}={value!r}")
    return float(value)


CONNECT_TIMEOUT_S = 5.0  # a service that has not answered by then is reported, not waited for


def check_answers(key: str, value: str, host: str, port: int, what: str, fix: str) -> None:
    """ConfigError unless something accepts a TCP connection at host:port within CONNECT_TIMEOUT_S."""
    import socket

    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ConfigError(f"{key}={value}: no {what} answers at {host}:{port} ({err.strerror or err}): {fix}") from None


def make_dir(path: Path, key: str, value: object) -> None:
    """mkdir -p, or a ConfigError naming the setting that chose the folder."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"{key}={value}: cannot create the folder {path} ({err.strerror}): set {key} to a folder you can write"
        ) from None

"""Turn a composed Hydra config into validated, frozen domain objects (the only place that does).

Errors a user can fix are `UserError`s; `run_cli` prints them as one line and exits with 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf

from costmodel.catalog import CatalogError, build
from costmodel.profile import CostProfile
from costmodel.specs import GPU, Model, SpecError
from pipeline.errors import WorkloadError


class ConfigError(ValueError):
    """A config value that cannot be used; the message names it and says how to fix it."""


USER_ERRORS = (ConfigError, CatalogError, SpecError, WorkloadError)


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
        return CostProfile.named(str(cfg["profile"])).with_fixes(**(plain(cfg.get("fixes")) or {}))
    except ValueError as err:
        raise ConfigError(f"costmodel: {err}") from None


def positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"`{key} >= 1` (whole number) must hold, got {key}={value!r}: set {key}=N on the command line"
        )
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


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def run_cli(
    task: Callable[[DictConfig], int | None], errors: tuple[type[Exception], ...] = ()
) -> Callable[[DictConfig], None]:
    """Wrap a Hydra task so user errors (and `errors`) end as one line on stderr and exit code 2;
    a task's non-zero return value is the exit code (130: interrupted, outputs kept)."""

    def wrapped(cfg: DictConfig) -> None:
        try:
            code = task(cfg)
        except (*USER_ERRORS, *errors) as err:
            fail(str(err))
        if code:
            sys.exit(code)

    wrapped.__name__ = task.__name__
    wrapped.__doc__ = task.__doc__
    return wrapped

"""Hydra entry points under one contract (`costmodel.cli`): user errors as one `error:` line and
exit 2 — Hydra's own (an unknown config-group option, malformed YAML in a config file, a bad
override) included —, Ctrl-C as exit 130 without a traceback, a task's non-zero return as the
exit code.

    python -m pipeline.search ...      ->  cli.main("search", execute)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from costmodel.catalog import CONF_DIR
from costmodel.cli import INTERRUPTED, USAGE_ERROR, fail, interrupted  # noqa: F401  (re-exported)
from pipeline.errors import USER_ERRORS


def _register_resolvers() -> None:
    """`${cwd:}`: the working folder. Hydra's `${hydra:runtime.cwd}` is the same folder, but a multirun's sweeper
    resolves the sweep's folder before Hydra's runtime is set, so a path it depends on (out_root) cannot use it."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("cwd"):
        OmegaConf.register_new_resolver("cwd", os.getcwd)


_register_resolvers()


def plain(cfg: Any) -> Any:
    """A DictConfig/ListConfig as plain Python containers (resolved); anything else unchanged."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg


def choice(group: str) -> str:
    """Which option of config group `group` Hydra composed (e.g. 'H200' for gpu)."""
    from hydra.core.hydra_config import HydraConfig

    return str(HydraConfig.get().runtime.choices[group])


def sweep_dir() -> str | None:
    """The folder of the Hydra multirun (`-m`) this job belongs to; None outside one."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return str(HydraConfig.get().sweep.dir)


def hydra_error_line(err: BaseException) -> str:
    """A Hydra / OmegaConf / YAML composition error as one line that says how to fix it."""
    from hydra.errors import MissingConfigException

    if isinstance(err, MissingConfigException) and err.options:
        group, _, option = str(err.missing_cfg_file or "").rpartition("/")
        return (
            f"{group}={option}: there is no config {option!r} in group {group!r} (conf/{group}/ or a "
            f"--config-dir / hydra.searchpath folder); choose from {sorted(err.options)}"
        )
    text = " ".join(str(err).split())
    cause = err.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({' '.join(str(cause).split())})"
    if "Could not append to config. An item is already at" in text:
        text += ": drop the `+` before that override"
    elif "Could not override" in text and "No match in the defaults list" in text:
        text += ": add `+` before that override (e.g. +inventory=NAME)"
    return text


def _announce_sweep_job() -> None:
    """Under `-m` (multirun) say which job starts and with which sweep values (Hydra's own log is off)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        print(f"[multirun] job {hc.job.num}: {' '.join(hc.overrides.task) or '(no overrides)'}", flush=True)


def run_task(task: Callable[[Any], int | None], errors: tuple[type[Exception], ...] = ()) -> Callable[[Any], None]:
    """Wrap a Hydra task: user errors (and `errors`) as one line and exit 2, Ctrl-C as 130, its return code."""

    def wrapped(cfg: Any) -> None:
        _announce_sweep_job()
        try:
            code = task(cfg)
        except KeyboardInterrupt:
            interrupted()
        except (*USER_ERRORS, *errors) as err:
            fail(str(err))
        if code:
            sys.exit(code)

    wrapped.__name__ = task.__name__
    wrapped.__doc__ = task.__doc__
    return wrapped


# Hydra's own options that take a value (hydra/_internal/utils.py get_args_parser); `--info` takes one optionally
VALUED = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
          "--experimental-rerun")  # fmt: skip


def options_first(argv: list[str]) -> list[str]:
    """`argv` with Hydra's options before the overrides, wherever the user put them: argparse takes an option
    after the positional overrides as an unknown argument (`+inventory=mine --config-dir DIR`)."""
    options: list[str] = []
    overrides: list[str] = []
    k = 0
    while k < len(argv):
        arg = argv[k]
        if arg in VALUED and k + 1 == len(argv):  # its value is missing: argparse says so where it stands
            overrides.append(arg)
        elif arg.startswith("-") and not arg.lstrip("-").startswith(("+", "~")):
            options.append(arg)
            if arg in VALUED:
                options.append(argv[k + 1])
                k += 1
        else:
            overrides.append(arg)
        k += 1
    return options + overrides


SPELLINGS = {"slo=null": "slo=none"}  # `slo` is a config group; null, its documented spelling, is its option `none`


def respelled(overrides: list[str]) -> list[str]:
    """Overrides as Hydra takes them (`SPELLINGS`)."""
    return [SPELLINGS.get(o, o) for o in overrides]


def usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """argparse's error as the contract's one line (Hydra's parser prints its whole usage block)."""
    fail(f"{message}: the command line is KEY=VALUE overrides and Hydra's options (see --help)")


def main(config_name: str, task: Callable[[Any], int | None], errors: tuple[type[Exception], ...] = ()) -> None:
    """Run `task` as the Hydra app of `conf/<config_name>.yaml` (run or `-m` multirun)."""
    from unittest import mock

    import hydra
    import yaml
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing a screenful: we print one line
    sys.argv = [sys.argv[0], *respelled(options_first(sys.argv[1:]))]
    app = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)(run_task(task, errors))
    try:
        with mock.patch.object(argparse.ArgumentParser, "error", usage_error):
            app()
    except KeyboardInterrupt:
        interrupted()
    except (HydraException, OmegaConfBaseException, yaml.YAMLError) as err:
        fail(hydra_error_line(err))

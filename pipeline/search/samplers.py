"""The outer loop's samplers: a registry of Optuna samplers over a `Space`, each optionally polished.

A sampler is one factory `(seed, space) -> optuna.samplers.BaseSampler` plus one line in
`SAMPLERS`; `tests/test_contracts.py` runs every registered sampler through the family's
contract (proposals inside the space, the same proposals under the same seed). Optional
dependencies are checked when the sampler is made, before any work, with the install line.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Callable
from typing import Any

import optuna

from pipeline.errors import ConfigError
from pipeline.search.polish import with_polish
from pipeline.search.space import Space


class GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, minus its `study.stop()` once every point is visited.

    That call only works inside `Study.optimize`; our ask/tell loop and Ray Tune's run outside it,
    where it raises. Trials past the grid's size re-visit points (same score), so a search keeps
    its trial count and its best is unchanged.
    """

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        pass


def require(module: str, extra: str, what: str) -> None:
    """A sampler's optional dependency, or one line saying how to install it."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ValueError:  # imported already, as a lazy module without a spec
        found = module in sys.modules
    if not found:
        raise ConfigError(
            f"search.sampler={extra} needs {what}, an optional extra: pip install -e '.[{extra}]' (or use tpe)"
        )


def _tpe(seed: int, space: Space) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)


def _random(seed: int, space: Space) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


def _qmc(seed: int, space: Space) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():  # experimental in Optuna 4.2-5.0, the versions pyproject allows
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.QMCSampler(seed=seed, scramble=True, warn_independent_sampling=False)


def _grid(seed: int, space: Space) -> optuna.samplers.BaseSampler:
    return GridSampler(space.grid(), seed=seed)


def _gp(seed: int, space: Space) -> optuna.samplers.BaseSampler:
    require_extras("gp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # deterministic_objective
        return optuna.samplers.GPSampler(seed=seed, deterministic_objective=True)


def _saasbo(seed: int, space: Space) -> optuna.samplers.BaseSampler:
    require_extras("saasbo")  # NumPyro among them: BoTorch fits the SAAS GP with it at the first model proposal
    from pipeline.search.saasbo import saasbo_sampler

    return saasbo_sampler(seed)


def _cmaes(seed: int, space: Space) -> optuna.samplers.BaseSampler:
    require_extras("cmaes")
    return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)


SAMPLERS: dict[str, Callable[[int, Space], optuna.samplers.BaseSampler]] = {
    "tpe": _tpe,
    "gp": _gp,
    "saasbo": _saasbo,
    "random": _random,
    "grid": _grid,
    "qmc": _qmc,
    "cmaes": _cmaes,
}


EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {  # sampler: (module, what it is) of its optional extra
    "gp": (("torch", "PyTorch"),),
    "saasbo": (("botorch", "BoTorch"), ("optuna_integration", "optuna-integration"), ("numpyro", "NumPyro")),
    "cmaes": (("cmaes", "the cmaes package"),),
}


def require_extras(name: str) -> None:
    """ConfigError with the install line when sampler `name` is unknown or its optional extra is missing."""
    if name not in SAMPLERS:
        raise ConfigError(f"search.sampler={name!r} is unknown: choose from {[*SAMPLERS, 'exact']}")
    for module, what in EXTRAS.get(name, ()):
        require(module, name, what)


def make_sampler(name: str, seed: int, space: Space, polish: float = 0.0, trials: int = 0) -> Any:
    """The sampler `name`; with `polish` > 0, its last `polish` of `trials` refine the best layout."""
    if name not in SAMPLERS:
        raise ConfigError(f"search.sampler={name!r} is unknown: choose from {[*SAMPLERS, 'exact']}")
    return with_polish(SAMPLERS[name](seed, space), space, trials, polish)

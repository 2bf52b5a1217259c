"""Local refinement of the best layout: the last trials of a search step to neighbouring layouts.

A sampler over the divider's (n_t, s_t) sees a landscape of plateaus: many parameter sets name
one layout, and one step in n_t or s_t can move the rate a lot. A model-based sampler finds the
right basin but spends its last trials sampling around it; near the end a search gains more by
trying the layouts next to the best one. `PolishSampler` wraps any Optuna sampler:

- the first trials (all but the last `fraction`) are the wrapped sampler's;
- each later trial is the first untried neighbour (`Space.neighbours`: one parameter moved to
  the nearest value that changes the layout) of the best finished trial; when every neighbour of
  it is tried, of the next best distinct layout; when none is left, the wrapped sampler again.

With batches (`pipeline.search.tune.batch.BatchSearcher` under Ray Tune, or `ask_tell`), the best trial is
fixed while a batch is asked, so a batch evaluates the whole neighbourhood of the incumbent at
once: steepest ascent, one step per batch. Trials the wrapped sampler did not propose are
ordinary finished trials to it (it sees their parameters and scores), so it can take over again.
The schedule reads only the study, so a resumed search continues it where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from pipeline.search.space import Space


class PolishSampler(BaseSampler):
    def __init__(self, base: BaseSampler, space: Space, trials: int, fraction: float) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"search.polish must be in [0, 1], got {fraction}")
        self.base = base
        self.space = space
        self.start = trials - round(fraction * trials)  # trials before refinement begins
        self._names = set(space.distributions())
        self._proposal: dict[int, dict[str, Any]] = {}  # trial number -> the neighbour it evaluates
        self._neighbours: dict[tuple[Any, ...], list[tuple[dict[str, Any], Any]]] = {}  # (params, layout key)
        self._keys: dict[int, Any] = {}  # trial number -> layout key (a trial's parameters never change)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        proposal = self._propose(study, trial)
        if proposal is None:
            return self.base.infer_relative_search_space(study, trial)
        self._proposal[trial.number] = proposal
        return self.space.distributions()

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        proposal = self._proposal.pop(trial.number, None)
        if proposal is None:
            return self.base.sample_relative(study, trial, search_space)
        return {k: v for k, v in proposal.items() if k in search_space}

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()

    def _propose(self, study: Study, trial: FrozenTrial) -> dict[str, Any] | None:
        """The neighbour this trial evaluates, or None when the wrapped sampler proposes it."""
        if trial.number < self.start:
            return None
        trials = [
            t for t in study.get_trials(deepcopy=False) if t.number != trial.number and set(t.params) == self._names
        ]
        for t in trials:
            if t.number not in self._keys:
                self._keys[t.number] = self.space.layout_key(t.params)
        tried = {self._keys[t.number] for t in trials}  # asked earlier, finished or not
        done = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: (-t.value, t.number))
        incumbents = set()
        for best in done:  # the best finished layout first, then the next best distinct one, ...
            key = self._keys[best.number]
            if key in incumbents:
                continue
            incumbents.add(key)
            for params, key in self._around(best.params):
                if key not in tried:
                    return params
        return None

    def _around(self, params: dict[str, Any]) -> list[tuple[dict[str, Any], Any]]:
        """The neighbours of `params` with their layouts, worked out once per incumbent."""
        at = tuple(sorted(params.items()))
        if at not in self._neighbours:
            self._neighbours[at] = [(n, self.space.layout_key(n)) for n in self.space.neighbours(params)]
        return self._neighbours[at]


def with_polish(sampler: BaseSampler, space: Space, trials: int, fraction: float) -> BaseSampler:
    """`sampler`, refined locally over the last `fraction` of `trials` (unchanged when 0)."""
    if fraction == 0:
        return sampler
    return PolishSampler(sampler, space, trials, fraction)

"""One Ray Tune trial per batch of proposals: the searcher, and the trainable that fans a batch out.

Why batches, not one Tune trial per layout: a Tune trial costs ~0.15-0.25 s of orchestration
(scheduling, the actor round trip, result handling), where scoring a layout costs ~15-30 ms on a
few hundred GPUs. Worse, Tune keeps only as many idle actors as it has trials waiting, and a
batched sampler has none waiting while it waits for its batch: after every batch all but one
actor stopped, so one-layout trials ran on a single worker, one round trip each
(docs/search.md, "Measured").

So a Tune trial is one batch, as the sampler sees it anyway (`pipeline.search.trial.ask_tell`: `batch`
proposals asked, then all `batch` results told). Its trainable deals the layouts out over the
workers of the trial's placement group (one bundle of `cpus_per_trial` per worker, as many as the
cluster has room for, on any of its nodes): it scores its own share and hands every other worker
its share as one Ray task (`pipeline.search.tune.worker`). A worker process keeps the search's planner
(and its benchmark cache) from one batch to the next. On a one-node Ray the driver starts the
other workers' processes while Ray Tune starts the trainable (`pipeline.search.tune.worker.prewarm`); on a cluster
they start with the trainable's first batch. Until one is ready (~1-1.5 s on a busy 2-core
machine) the trainable scores layouts alone, one after another, and so it does throughout with
room for one worker only.

A layout an earlier batch scored is not scored again: the trainable keeps each layout's result and hands it to
a later trial of the same layout (note: `pipeline.search.trial.REUSED`, no time of its own). The search proposes
a layout more than once (TPE's late proposals cluster; on the main job 83 of 240 trials repeat a layout).

Failures: a layout that raises is a failed trial (recorded, the search goes on). A task whose
worker dies runs again (`pipeline.search.tune.worker.RETRIES` times), then is recorded as failed; a trainable
whose actor dies is retried by Tune, batch and all.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optuna
from ray import tune
from ray.tune.search import Searcher

from pipeline.search.tune import worker as tune_worker

if TYPE_CHECKING:
    from pipeline.search.trial import TrialFn


class BatchSearcher(Searcher):
    """The sampler's proposals, one batch per Ray Tune trial, its results told back together."""

    def __init__(
        self,
        sampler: Any,
        distributions: dict[str, Any],
        batch: int,
        total: int,
        halted: Callable[[], bool] = lambda: False,
    ) -> None:
        """`halted`: True once the search must stop asking (its journal can no longer be written)."""
        super().__init__(metric="score", mode="max")
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self.dists, self.batch, self.left, self.halted = distributions, batch, total, halted
        self.asked: dict[str, list[optuna.trial.Trial]] = {}

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self.asked:
            return None  # the next batch is proposed once this one's results are told
        if self.left == 0 or self.halted():
            return Searcher.FINISHED
        n = min(self.batch, self.left)
        self.left -= n
        self.asked[trial_id] = [self.study.ask(self.dists) for _ in range(n)]
        return {"layouts": [t.params for t in self.asked[trial_id]]}

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        trials = self.asked.pop(trial_id, [])
        if not trials:  # told already (Tune reports a trial whose callback failed once more, as an error)
            return
        outs = (result or {}).get("results") if not error else None
        for t, out in zip(trials, outs or [None] * len(trials), strict=True):
            if out is None or out["status"] == "error":
                self.study.tell(t, state=optuna.trial.TrialState.FAIL)
            else:
                self.study.tell(t, float(out["score"]))

    def add_evaluated_point(self, parameters: dict[str, Any], value: float, error: bool = False, *_: Any) -> None:
        """A journalled trial of a resumed search: the sampler learns it, nothing re-runs."""
        state = optuna.trial.TrialState.FAIL if error else optuna.trial.TrialState.COMPLETE
        value_or_none = None if error else value
        self.study.add_trial(
            optuna.trial.create_trial(state=state, value=value_or_none, params=parameters, distributions=self.dists)
        )


def trainable_env() -> dict[str, Any]:
    """The runtime env Ray Tune gives a trainable's actor, and so every task the actor starts
    (`ray.tune.execution.class_cache`): a process started in another env cannot run them."""
    from ray.tune.execution.class_cache import DEFAULT_ENV_VARS, ENV_VARS_TO_PROPAGATE

    return {"env_vars": {**DEFAULT_ENV_VARS, **{k: os.environ[k] for k in ENV_VARS_TO_PROPAGATE if k in os.environ}}}


def resources(workers: int, cpus_per_trial: float) -> Any:
    """A batch trial's resources: one bundle per worker, the first the trainable's own."""
    return tune.PlacementGroupFactory([{"CPU": cpus_per_trial}] * workers)


def batch_trial(
    config: dict[str, Any], key: str, ctx_ref: list[Any], trial_fn: TrialFn, workers: int, cpus: float
) -> None:
    """The trainable: score the batch, a share of it here and the others' as Ray tasks (of `cpus`
    CPUs each, one bundle of the trial's placement group), and report it.

    While none of the other workers' processes is up yet, it scores one layout after another
    itself; once some are, it deals what is left of the batch out over itself and them."""
    from pipeline.search.trial import REUSED, layout_key, run_trial

    ctx = tune_worker.context(key, ctx_ref)
    # a layout an earlier batch scored is not scored again: the trial is a function of the layout alone (a test's
    # stand-in for it need not be, and is always called)
    keys = [layout_key(ctx, params) if trial_fn is run_trial else None for params in config["layouts"]]
    scored = _SCORED.setdefault(key, {})
    new = [i for i, k in enumerate(keys) if k not in scored]
    outs = _score_batch([config["layouts"][i] for i in new], key, ctx_ref, trial_fn, workers, cpus, ctx)
    by_index = dict(zip(new, outs, strict=True))
    outs = [by_index[i] if i in by_index else _reused(scored[keys[i]], REUSED) for i in range(len(keys))]
    for i, out in by_index.items():
        if keys[i] is not None and out["status"] != "error":
            scored.setdefault(keys[i], out)
    tune.report({"score": max(o["score"] for o in outs), "results": outs})


_SCORED: dict[str, dict[str, dict[str, Any]]] = {}  # per search (its key): each layout's result, by layout key


def _reused(out: dict[str, Any], note: str) -> dict[str, Any]:
    """An earlier trial's result for a trial of the same layout: its numbers, no time of its own, and a note."""
    return {**out, "trial_ms": 0.0, "note": note}


def _score_batch(
    layouts: list[Any], key: str, ctx_ref: list[Any], trial_fn: TrialFn, workers: int, cpus: float, ctx: Any
) -> list[dict[str, Any]]:
    """`layouts` scored, a share here and the others' on the other workers, in proposal order."""
    if not layouts:
        return []
    first: list[dict[str, Any]] = []  # scored here before any other worker was up
    ready = tune_worker.ready_helpers(key, ctx_ref, workers - 1, cpus)
    while ready == 0 and len(first) < len(layouts):
        first += tune_worker.score_here(ctx, trial_fn, [layouts[len(first)]])
        ready = tune_worker.ready_helpers(key, ctx_ref, workers - 1, cpus)
    rest = layouts[len(first) :]
    n = 1 + ready
    parts = [rest[k::n] for k in range(n)]  # dealt out, so slow and fast layouts mix
    others = [(tune_worker.score_share(key, ctx_ref, trial_fn, part, cpus), part) for part in parts[1:] if part]
    by_part = [tune_worker.score_here(ctx, trial_fn, parts[0])]  # this worker's own share
    by_part += [tune_worker.collect(ref, part) for ref, part in others]
    return first + [by_part[i % n][i // n] for i in range(len(rest))]  # back in proposal order

"""What a Ray worker of a search runs: its share of a batch, with the search's context kept per process.

Kept apart from `pipeline.search.tune.batch` so that a worker scoring layouts imports the search's own
code and Ray, not Ray Tune (another ~0.35 s of a worker's start-up on top of ~0.75 s).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:
    from pipeline.search.trial import Context, TrialFn

RETRIES = 2  # a trial whose Ray worker or node dies runs again, this many times at most

_CONTEXTS: dict[str, Context] = {}  # per worker process: the search's context, fetched once
_HELPERS: dict[str, list[Any]] = {}  # per trainable process: the other workers' start-up tasks


def context(key: str, ctx_ref: list[Any]) -> Context:
    """The search's context in this worker process: fetched from the object store once, then kept.

    `ctx_ref` holds it in Ray's object store (a list, so that Ray passes the reference on instead
    of fetching it); `key` names it in this process's cache."""
    ctx = _CONTEXTS.get(key)
    if ctx is None:
        ctx = _CONTEXTS[key] = ray.get(ctx_ref[0])
    return ctx


def prewarm(key: str, ctx_ref: list[Any], helpers: int, runtime_env: Mapping[str, Any]) -> list[Any]:
    """Start the other workers' processes from the driver, while Ray Tune starts the trainable.

    The trainable's tasks run in its runtime env (Ray Tune gives its actor one), which no idle
    worker has, so Ray would start a process for the first of them only when the first batch is
    out, and it took ~1 s to be ready. A task in that env now starts one at once; it imports the
    search's code and fetches its context, and the trainable's first task finds it idle and warm.
    It reserves no CPU (the trial's placement group holds the cluster's), so it may run on any
    node: the driver calls it on a one-node Ray only."""
    return [_warm_task.options(num_cpus=0, runtime_env=dict(runtime_env)).remote(key, ctx_ref) for _ in range(helpers)]


def ready_helpers(key: str, ctx_ref: list[Any], helpers: int, cpus: float = 1.0) -> int:
    """How many of the other workers are up, the search's code imported and its context fetched.

    On this process's first call none is: each is asked to start (a task that imports the code and
    fetches the context), and until one has, the trainable scores layouts itself rather than wait
    ~1-1.5 s for a Python process to start and import OR-Tools and NumPy."""
    if key not in _HELPERS:
        _HELPERS[key] = [_warm_task.options(num_cpus=cpus).remote(key, ctx_ref) for _ in range(helpers)]
    refs = _HELPERS[key]
    return len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else 0


def score_share(
    key: str, ctx_ref: list[Any], trial_fn: TrialFn, layouts: list[Mapping[str, Any]], cpus: float = 1.0
) -> Any:
    """Another worker's share of a batch, as a Ray task of `cpus` CPUs, the size of a bundle of the
    trial's placement group (a task that asked for more than a bundle holds could not be placed in
    it); retried when its worker dies."""
    return _score_task.options(num_cpus=cpus, max_retries=RETRIES).remote(key, ctx_ref, trial_fn, layouts)


def score_here(ctx: Context, trial_fn: TrialFn, layouts: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    from pipeline.search.trial import guarded

    node, pid = ray.get_runtime_context().get_node_id(), os.getpid()
    return [{**guarded(ctx, params, trial_fn), "node": node, "pid": pid} for params in layouts]


def collect(ref: Any, layouts: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A share's results; each layout failed, with the reason, when its worker died `RETRIES` + 1 times."""
    t0 = time.perf_counter()
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as err:
        from pipeline.search.trial import unscored

        return [unscored("error", worker_failed(" ".join(str(err).split())[:300]), t0) for _ in layouts]


def worker_failed(reason: str) -> str:
    """The note of a trial whose Ray worker (a task's, or the trainable's actor) died every time it ran."""
    return f"the trial's Ray worker failed {RETRIES + 1} times: {reason}"


@ray.remote
def _warm_task(key: str, ctx_ref: list[Any]) -> None:
    import pipeline.search.trial  # noqa: F401  (what a trial imports beside the context's own modules)

    context(key, ctx_ref)


@ray.remote
def _score_task(
    key: str, ctx_ref: list[Any], trial_fn: TrialFn, layouts: list[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    return score_here(context(key, ctx_ref), trial_fn, layouts)

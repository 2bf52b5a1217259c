"""The Ray Tune driver (pipeline/search/tune/): trials whose worker or node dies run again, every trial runs in the
environment its workers start in, fractions of a CPU per trial, and a cluster of two nodes.

The searches here run in this process, on the test process's local Ray (conftest `local_ray`); their trial
functions are shipped to Ray's workers by value (tests/ is not importable there)."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import plan as plans
from helpers import SMALL, compose
from pipeline.records.journal import Journal


def run_search(tmp: Path, trial_fn: Any, *extra: str) -> int:
    from ray import cloudpickle

    from pipeline.search.run import execute

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import tests/
    cfg = compose([*SMALL, "search.iterations=1", "search.sampler=random", "search.reference=false",
                   "search.verify=false", "search.band_draws=0", f"out_root={tmp}/out",
                   f"mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db", *extra])  # fmt: skip
    return execute(cfg, trial_fn=trial_fn)


def journal(tmp: Path) -> list[dict[str, Any]]:
    (d,) = [p.parent for p in (tmp / "out").glob("*/*/trials.jsonl")]
    return Journal(d / "trials.jsonl").load()


def dies_twice(marks: Path, ctx: Any, params: Any) -> dict[str, Any]:
    """The real trial, but the first two attempts of the search take their Ray worker down (a node
    lost twice): as many deaths as a batch survives, whether they hit the trainable or a task."""
    from pipeline.search.trial import run_trial

    for k in range(2):
        try:
            os.close(os.open(marks / f"died-{k}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        os._exit(1)
    return run_trial(ctx, params)


def test_a_trial_whose_worker_dies_is_retried_not_lost(tmp_path: Path, local_ray: Any) -> None:
    assert run_search(tmp_path, functools.partial(dies_twice, tmp_path)) == 0
    recs = journal(tmp_path)
    assert len(recs) == 4 and all(r["status"] == "optimal" for r in recs)  # each died attempt ran again
    assert len(list(tmp_path.glob("died-*"))) == 2


def notes_its_runtime_env(ctx: Any, params: Any) -> dict[str, Any]:
    import ray

    from pipeline.search.trial import run_trial

    env = ray.get_runtime_context().runtime_env.get("env_vars", {})
    return {**run_trial(ctx, params), "note": json.dumps(env, sort_keys=True)}


def test_trials_run_in_the_env_the_prewarmed_workers_start_in_on_fractions_of_a_cpu(
    tmp_path: Path, local_ray: Any
) -> None:
    """The driver starts the other workers' processes early in `trainable_env()`; Ray reuses them for
    the trainable's tasks only if that is the env Ray Tune gives the trainable (its tasks inherit it).
    ray.cpus_per_trial=0.5 on 2 CPUs: 4 bundles of half a CPU, each worker's task sized to one."""
    from pipeline.search.tune.batch import trainable_env

    assert run_search(tmp_path, notes_its_runtime_env, "ray.cpus_per_trial=0.5") == 0
    recs = journal(tmp_path)
    assert len(recs) == 4 and all(r["status"] != "error" for r in recs), [r.get("note") for r in recs]
    assert len({r["pid"] for r in recs}) > 1  # more than one worker scored the batch
    assert {r["note"] for r in recs} == {json.dumps(trainable_env()["env_vars"], sort_keys=True)}


def raising_trial(ctx: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    from pipeline.search.trial import run_trial

    if float(params["skew_H20"]) < 0:
        raise RuntimeError("injected failure for a negative H20 skew")
    return run_trial(ctx, params)


def test_a_failing_trial_is_recorded_and_the_search_goes_on(tmp_path: Path, local_ray: Any) -> None:
    # a trial of two CPUs on a Ray of two: one worker, the trainable, scores every batch itself (with more, as
    # Ray tasks: the tests above)
    assert run_search(tmp_path, raising_trial, "search.iterations=3", "ray.cpus_per_trial=2") == 0
    recs = journal(tmp_path)
    failed = [r for r in recs if r["status"] == "error"]
    assert len(recs) == 12
    assert failed and all(r["params"]["skew_H20"] < 0 for r in failed)
    assert all("injected failure" in r["note"] for r in failed)
    assert all(r["status"] == "optimal" for r in recs if r["params"]["skew_H20"] >= 0)
    assert len({r["pid"] for r in recs}) == 1  # the trainable's own process scored every batch
    (path,) = (tmp_path / "out").glob("*/*/plan.json")
    plan = plans.load(path)
    assert plan.search is not None and plan.search.failed == len(failed) and plan.rate_req_s > 0


def dies_first_or_always(marks: Path, ctx: Any, params: Any) -> dict[str, Any]:
    """Layout `once` takes its Ray worker down on its first attempt, layout `always` on every one."""
    marker = marks / f"task-died-{params['layout']}"
    if params["layout"] == "always" or not marker.exists():
        marker.touch()
        os._exit(1)
    return {"status": "optimal", "score": 1.0}


def test_a_share_whose_worker_dies_runs_again_then_is_recorded_failed(tmp_path: Path, local_ray: Any) -> None:
    from ray import cloudpickle

    from pipeline.search.tune import worker

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ctx_ref = [local_ray.put("context")]
    shares = [[{"layout": "once"}], [{"layout": "always"}]]
    fn = functools.partial(dies_first_or_always, tmp_path)
    refs = [worker.score_share(f"k-{tmp_path.name}", ctx_ref, fn, share) for share in shares]
    (once,), (always,) = [worker.collect(ref, share) for ref, share in zip(refs, shares, strict=True)]
    assert once["status"] == "optimal" and once["score"] == 1.0  # its task ran again on a new worker
    assert always["status"] == "error" and always["score"] == 0.0
    assert always["note"].startswith(f"the trial's Ray worker failed {worker.RETRIES + 1} times")


def slow_trial(ctx: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """The real trial, held for a second: with ~0.1 s trials one reused actor can finish a batch
    before a second node's actor has started, and the test is about placement, not speed."""
    from pipeline.search.trial import run_trial

    time.sleep(1.0)
    return run_trial(ctx, params)


def test_two_node_ray_cluster_runs_trials_on_both_nodes(tmp_path: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()  # this test's own cluster, not the process's local Ray
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    try:
        cluster.wait_for_nodes()
        assert run_search(tmp_path, slow_trial, "search.iterations=2", f"ray.address={cluster.address}") == 0
    finally:
        ray.shutdown()
        cluster.shutdown()
    recs = journal(tmp_path)
    assert len(recs) == 8 and all(r["status"] == "optimal" for r in recs)
    assert len({r["node"] for r in recs}) == 2


def test_a_multiruns_jobs_share_the_ray_the_first_started_and_another_ray_setting_starts_its_own(
    monkeypatch: Any,
) -> None:
    """`with_ray(keep=True)` (a Hydra multirun's job): the Ray it starts stays up for the next job with the same
    `ray` settings; a job with other settings, or one that keeps nothing, stops it first. Ray's start and stop are
    counted here, not run (tests/test_sizing.py runs a multirun on a real one)."""
    import atexit

    import ray

    import pipeline.search.tune.driver as driver

    up, calls, exits = [False], [], []
    monkeypatch.setattr(ray, "is_initialized", lambda: up[0])
    monkeypatch.setattr(ray, "shutdown", lambda: (calls.append("stop"), up.__setitem__(0, False)))
    monkeypatch.setattr(driver, "check_ray_address", lambda address: None)
    monkeypatch.setattr(driver, "start_local_ray", lambda n: (calls.append(f"start {n}"), up.__setitem__(0, True)))
    monkeypatch.setattr(atexit, "register", exits.append)
    monkeypatch.setattr(driver, "_KEPT", [])

    def job(cpus: int, keep: bool = True) -> None:
        assert driver.with_ray(None, cpus, lambda: bool(calls.append(f"job {cpus}") or True), keep=keep)

    job(2)
    job(2)
    assert calls == ["start 2", "job 2", "job 2"] and up[0] and exits == [ray.shutdown]  # stopped at exit
    job(1)
    assert calls[3:] == ["stop", "start 1", "job 1"] and up[0]
    job(1, keep=False)  # a run that keeps nothing: a Ray of its own, stopped after it
    assert calls[6:] == ["stop", "start 1", "job 1", "stop"] and not up[0] and driver._KEPT == []

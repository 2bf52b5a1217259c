"""The Ray Tune driver of a search: its remaining trials as Ray Tune trials, and the Ray it runs on.

Three layers around Ray Tune: `pipeline.search.trial.run_trial` scores a layout, the
trainable `pipeline.search.tune.batch.batch_trial` scores one batch of proposals as Ray tasks and
reports them, and `run_tune` wires the Tuner. A "trial" everywhere else (the journal, MLflow, the
progress line) is one layout; each finished batch goes back to the search's `SearchRun`.

A trial that raises is a failed trial (recorded, the search goes on); a trial whose worker or
node dies runs again (`pipeline.search.tune.worker.RETRIES` times).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import optuna

from pipeline.checks import check_answers
from pipeline.errors import ConfigError
from pipeline.search.samplers import make_sampler
from pipeline.search.trial import TrialFn, run_trial
from pipeline.search.trials import SearchRun


def run_tune(run: SearchRun, trial_fn: TrialFn = run_trial) -> bool:
    """Run the remaining trials through Ray Tune; False when interrupted."""
    remaining = run.s.search.trials - len(run.records)
    if remaining <= 0:
        return True
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy reporter honours verbose=0
    # Our journal, trials.parquet and MLflow hold every result, and a resume reads the journal:
    # Tune's per-trial JSON/CSV files and periodic experiment snapshots would only duplicate them.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "3600")
    import ray
    from ray import tune

    from pipeline.search.tune.batch import BatchSearcher, batch_trial, resources, trainable_env
    from pipeline.search.tune.worker import RETRIES, prewarm, worker_failed

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # as many workers as the cluster has room for, and no more than a batch can keep busy
    workers = max(1, min(run.s.search.batch, int(ray.cluster_resources().get("CPU", 1) / run.s.ray.cpus_per_trial)))
    searcher = BatchSearcher(
        make_sampler(run.s.search.sampler, run.s.search.seed, run.ctx.space, run.s.search.polish, run.s.search.trials),
        run.ctx.space.distributions(),
        run.s.search.batch,
        remaining,
        halted=lambda: run.fatal is not None,
    )
    for r in run.records:  # a resumed search: the sampler learns what is done, nothing re-runs
        searcher.add_evaluated_point(r["params"], float(r["score"]), error=r["status"] == "error")

    class Recorder(tune.Callback):
        def __init__(self) -> None:
            self.results: dict[str, dict[str, Any]] = {}

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            self.results[trial.trial_id] = result

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            outs = self.results.pop(trial.trial_id, trial.last_result)["results"]
            run.add_batch([(p, out, None) for p, out in zip(trial.config["layouts"], outs, strict=True)])

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            error = worker_failed(_error_line(trial))
            run.add_batch([(p, None, error) for p in trial.config["layouts"]])

    ctx_ref = [ray.put(run.ctx)]
    # one node: the other workers' processes start now, beside the trainable's (on a cluster the
    # driver cannot know which nodes the trial's bundles will be on, so they start with its first batch)
    one_node = sum(1 for n in ray.nodes() if n.get("Alive")) == 1
    warming = prewarm(run.ctx.key, ctx_ref, workers - 1, trainable_env()) if one_node else []
    cpus = run.s.ray.cpus_per_trial
    trial = tune.with_parameters(
        batch_trial, key=run.ctx.key, ctx_ref=ctx_ref, trial_fn=trial_fn, workers=workers, cpus=cpus
    )
    trainable = tune.with_resources(trial, resources(workers, cpus))
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher,  # one trial per batch (pipeline/search/tune/batch.py)
            num_samples=-1,  # the searcher says when it is done
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name="tune",
            storage_path=str(run.dir),
            verbose=0,
            callbacks=[Recorder()],
            failure_config=tune.FailureConfig(max_failures=RETRIES, fail_fast=False),
        ),
    )
    tune_log = logging.getLogger("ray.tune")
    level = tune_log.level
    tune_log.setLevel(logging.CRITICAL)  # failed trials are reported one line each, by `add`
    on_ctrl_c = signal.getsignal(signal.SIGINT)
    try:
        with run.background_logging():
            tuner.fit()
    except KeyboardInterrupt:
        pass
    finally:
        tune_log.setLevel(level)
        del warming  # its tasks' references, held while Tune ran
        # Tune's handler (it ends a run on Ctrl-C) outlives the run: what follows (the plan, the post-search steps)
        # must stop on Ctrl-C again
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, on_ctrl_c)
    if run.fatal is not None:  # the journal could not be written: what is in it is kept, the rest is not done
        raise run.fatal
    return len(run.records) >= run.s.search.trials


def _error_line(trial: Any) -> str:
    """The trial's own exception as one line (Tune keeps it pickled beside the trial)."""
    try:
        from ray import cloudpickle

        if trial.pickled_error_file and Path(trial.pickled_error_file).exists():
            err = cloudpickle.loads(Path(trial.pickled_error_file).read_bytes())
            cause = getattr(err, "cause", None) or err  # a RayTaskError wraps the trial's exception
            return f"{type(cause).__name__}: {cause}"[:500]
        lines = [ln for ln in Path(trial.error_file).read_text().splitlines() if ln.strip()]
        return lines[-1][:500]
    except Exception:  # the record must be written whatever the error looks like
        return "trial failed (see the Ray Tune log)"


# --- Ray ------------------------------------------------------------------------------------------


def check_ray_address(address: str | None) -> None:
    """A Ray address that answers on its port, checked in seconds (ray.init would wait minutes)."""
    if address is None:
        return
    if address == "auto":
        try:  # Ray's own lookup for `auto` (RAY_ADDRESS, then the last `ray start`); private, so guarded
            from ray._private.services import get_ray_address_from_environment

            address = get_ray_address_from_environment("auto", None)
        except (ImportError, AttributeError, TypeError):
            return  # another Ray version: ray.init reports it
        except ConnectionError:
            raise ConfigError(
                "ray.address=auto: no Ray cluster runs on this machine: start one (ray start --head), give its "
                "address (ray.address=HOST:6379), or drop ray.address to run on a local Ray"
            ) from None
        if address == "auto" or not isinstance(address, str):
            return
    url = urlparse(address if "://" in address else f"ray://{address}")
    host, port = url.hostname, url.port
    if not host or not port:
        raise ConfigError(f"ray.address={address}: expected host:port, ray://host:port or auto")
    check_answers("ray.address", address, host, port, "Ray cluster",
                  "start it (ray start --head) or drop ray.address to run on a local Ray")  # fmt: skip


def start_local_ray(num_cpus: int | None) -> None:
    """A new Ray of our own on this machine, never a cluster someone else started here."""
    import ray

    # Ray enables token authentication for a new local cluster and warns that it did, on every
    # start; the choice is the secure default and ours to keep, so that one notice is silenced
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        # no idle workers started ahead: a search's tasks run in its trainable's runtime env (`trainable_env`), which
        # such a worker lacks, so the two Ray starts at once on a two-core machine only took CPU from the search's own
        _system_config={"enable_worker_prestart": False, "prestart_worker_first_driver": False},
    )


_KEPT: list[tuple[str | None, int | None]] = []  # the Ray a multirun's jobs share: the (address, num_cpus) it joined


def with_ray(address: str | None, num_cpus: int | None, body: Callable[[], bool], keep: bool = False) -> bool:
    """Run `body` on a local Ray (started and stopped here) or the cluster at `ray.address`. `keep`: a Hydra
    multirun's job: the Ray it starts stays up for the next job with the same `ray` settings (a local one takes ~5 s
    to start and stop), and stops when the command exits or a job wants another."""
    import ray

    if _KEPT and (_KEPT[0] != (address, num_cpus) or not keep):
        ray.shutdown()
        _KEPT.clear()
    started = False
    if not ray.is_initialized():
        check_ray_address(address)
        try:
            if address is None:
                start_local_ray(num_cpus)
            else:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError, PermissionError) as err:
            text = " ".join(str(err).split())
            hint = " (the cluster refused this client's token: set RAY_AUTH_TOKEN)" if "auth" in text.lower() else ""
            raise ConfigError(
                f"ray.address={address}: cannot join the Ray cluster{hint}: {text[:300]}"
            ) from None
        started = True
    try:
        return body()
    finally:
        if started and keep:
            if not _KEPT:
                atexit.register(ray.shutdown)
            _KEPT[:] = [(address, num_cpus)]
        elif started:
            ray.shutdown()

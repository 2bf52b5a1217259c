"""The search driver: a run folder, its journal, MLflow runs, the progress line, and the Ray Tune loop.

Three layers around Ray Tune (STYLE.md 9): `pipeline.trial.run_trial` scores a layout, the
trainable `pipeline.tune_batch.batch_trial` scores one batch of proposals as Ray tasks and
reports them, and `SearchRun.run_tune` wires the Tuner. A "trial" everywhere else (the journal,
MLflow, the progress line) is one layout.

A trial that raises is a failed trial (recorded, the search goes on); a trial whose worker or
node dies runs again (`tune_worker.RETRIES` times). Every finished trial is journalled before
anything else, so a logging failure (an MLflow store locked or gone) can neither lose a trial nor
turn it into a failed one: its child run is logged once the store answers again, or on resume
(which also logs any journalled trial MLflow does not have). Child runs are written by a
thread beside the Tune loop, so MLflow's ~15 ms per run does not hold up the next batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import optuna

from pipeline.config import check_answers, make_dir
from pipeline.errors import ConfigError
from pipeline.journal import Journal
from pipeline.planner import layout_id
from pipeline.progress import Progress
from pipeline.samplers import make_sampler
from pipeline.settings import Settings
from pipeline.tracking import Child
from pipeline.trial import GOODPUT_METRICS, METRICS, OK, Context, TrialFn, run_trial
from solvers.exact import ExactResult


class SearchRun:
    """One search: its folder, journal, MLflow runs, progress line, and the Ray Tune loop."""

    def __init__(self, settings: Settings, ctx: Context, tracker: Any) -> None:
        self.s, self.ctx, self.tracker = settings, ctx, tracker
        self.dir = self._run_dir()
        self.journal = Journal(self.dir / "trials.jsonl")
        self.records = self.journal.load()
        self.resumed = len(self.records)
        self.best: dict[str, Any] | None = max(
            (r for r in self.records if r["status"] in OK), key=lambda r: r["score"], default=None
        )
        self.ref: ExactResult | None = None
        self.unlogged: list[dict[str, Any]] = []  # finished trials MLflow has not taken yet
        self.store_warned = False  # one console line when the store stops answering, not one per trial
        self.t0 = time.perf_counter()
        self.bar: Progress | None = None
        self.closed = False
        self._logging = threading.Lock()  # one writer of child runs at a time
        self._logger: threading.Thread | None = None  # logs child runs while Tune runs (`_background_logging`)
        self._wake = threading.Event()
        n_polish = round(settings.polish * settings.trials) if settings.planner == "search" else 0
        self.polish_from = settings.trials - n_polish if n_polish else None  # the trial polish starts at

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks, and with them this run, into its experiment state; locks do not pickle
        return {k: v for k, v in self.__dict__.items() if k not in ("_logging", "_logger", "_wake")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _logging=threading.Lock(), _logger=None, _wake=threading.Event())

    def _run_dir(self) -> Path:
        root = self.s.run_root
        if self.s.resume:
            runs = sorted(p for p in root.glob("*") if (p / "trials.jsonl").exists()) if root.exists() else []
            if not runs:
                raise ConfigError(f"search.resume=true: no earlier run of this exact config under {root}")
            return runs[-1]
        d = root / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        make_dir(d, "out_root", root.parent)
        return d

    # trials -------------------------------------------------------------------------------------

    def add_batch(self, trials: Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None, str | None]]) -> None:
        """Finished trials, in order: (params, result, or the error that stopped the trial). A batch
        comes back together, and is journalled in one write."""
        recs = [self._record(len(self.records) + k, *trial) for k, trial in enumerate(trials)]
        self.journal.extend(recs)  # first: what is journalled is done, whatever happens next
        for rec in recs:
            self.records.append(rec)
            if rec["status"] in OK and (self.best is None or rec["score"] > self.best["score"]):
                self.best = rec
            self.unlogged.append(rec)
            if rec["status"] == "error":
                print(f"[search] trial {rec['trial']} failed: {rec['note']}", flush=True)
        if self._logger is not None:
            self._wake.set()  # the logger thread takes them, off this loop
        else:
            self.log_trials()
        self.progress()

    def _record(
        self, idx: int, params: Mapping[str, Any], result: Mapping[str, Any] | None, error: str | None
    ) -> dict[str, Any]:
        rec: dict[str, Any] = {"trial": idx, "iteration": idx // self.s.batch, "params": dict(params)}
        if error is not None:
            rec.update(dict.fromkeys(METRICS, 0.0), status="error", islands="", note=error)
        else:
            assert result is not None
            rec.update({k: result.get(k) for k in (*METRICS, "status", "islands", "note", "node", "pid")})
            rec.update({k: result[k] for k in GOODPUT_METRICS if k in result})
        # a goodput trial's score is simulated; its gap is that of its analytic rate to the analytic optimum
        rec["gap"] = self.gap(rec["rate_req_s"] if self.s.objective == "goodput" else rec["score"])
        return rec

    def log_trials(self) -> bool:
        """Log the trials MLflow has not taken yet as child runs; False while the store does not answer."""
        with self._logging:
            return self._log_trials()

    def _log_trials(self) -> bool:
        while self.unlogged:
            chunk = self.unlogged[: 256 if self.tracker.bulk else 1]  # a bulk store takes them all or none
            try:
                self.tracker.children([self._child(rec) for rec in chunk])
            except Exception as err:  # the store is locked or gone: the journal has the trials
                if not self.store_warned:
                    print(f"[search] MLflow did not take trial {chunk[0]['trial']} ({_short(err)}); "
                          "logging it when the store answers again", flush=True)  # fmt: skip
                    self.store_warned = True
                return False
            del self.unlogged[: len(chunk)]
        return True

    @staticmethod
    def _child(rec: Mapping[str, Any]) -> Child:
        return Child(
            trial_run_name(rec["trial"]),
            {**rec["params"], "layout_id": layout_id(rec["islands"]), "status": rec["status"]},
            {k: rec[k] for k in (*METRICS, *GOODPUT_METRICS, "gap") if isinstance(rec.get(k), (int, float))},
            failed=rec["status"] == "error",
            tags={
                "islands": rec["islands"] or "-",
                "description": f"Trial {rec['trial']}: {rec['status']}; islands {rec['islands'] or '-'}"
                + (f"; {rec['note']}" if rec.get("note") else ""),
            },
        )

    @contextlib.contextmanager
    def _background_logging(self) -> Iterator[None]:
        """Child runs logged by a thread while the trials run; every queued one is logged (or left for
        `log_trials` to retry) by the time this exits."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                self._wake.wait(1.0)  # a new trial, or a second to retry a store that did not answer
                self._wake.clear()
                self.log_trials()

        self._logger = threading.Thread(target=loop, name="mlflow-children", daemon=True)
        self._logger.start()
        try:
            yield
        finally:
            stop.set()
            self._wake.set()
            self._logger.join()
            self._logger = None
            self.log_trials()

    def reconcile(self, logged: set[str]) -> None:
        """On resume: queue every journalled trial whose child run MLflow does not have."""
        self.unlogged = [r for r in self.records if trial_run_name(r["trial"]) not in logged]

    @property
    def gap_is_bound(self) -> bool:
        """Did the reference stop at its time limit? Then `gap` is measured against its proven bound
        on the optimum: an upper bound on the true gap."""
        return self.ref is not None and self.ref.status == "feasible" and self.s.objective == "max_rate"

    def gap(self, score: float) -> float:
        if self.ref is None or self.s.objective == "thesis":
            return float("nan")
        if self.gap_is_bound:
            ref = self.ref.bound
        else:
            ref = self.ref.rate_per_dollar if self.s.objective == "rate_per_dollar" else self.ref.rate_req_s
        return 1.0 - score / ref if ref > 0 else float("nan")

    def gap_text(self, gap: float) -> str:
        """'gap 0.84%', or 'gap <= 0.84%' where the reference only bounds the optimum."""
        return f"gap {'<= ' if self.gap_is_bound else ''}{gap:.2%}" if gap == gap else ""

    def progress(self, force: bool = False) -> None:
        """Trials done, the best score and its gap: a bar on a terminal, a line every 2 s in a log."""
        if self.bar is None:
            self.bar = Progress("search", "trials", self.s.trials, "trials")
        now = time.perf_counter()
        done_here = len(self.records) - self.resumed
        rate = done_here / max(now - self.t0, 1e-9)
        best = self.best["score"] + 0.0 if self.best else 0.0
        unit = "req/s per $/h" if self.s.objective == "rate_per_dollar" else "req/s"
        gap = self.gap(best) if self.s.objective != "goodput" else float("nan")  # simulated vs analytic: no gap
        gap_txt = f"  {self.gap_text(gap)}" if gap == gap else ""
        failed = sum(r["status"] == "error" for r in self.records)
        text = (f"{len(self.records)}/{self.s.trials} trials  best {best:.4g} {unit}{gap_txt}  "
                f"{rate:.2f} trials/s{f'  {failed} failed' if failed else ''}")  # fmt: skip
        if force or len(self.records) >= self.s.trials:
            # the last state once, with the rate it ended at (not again with the time of later work)
            if not self.closed:
                self.bar.update(len(self.records))
                self.bar.close(text)
                self.closed = True
            return
        self.bar.update(len(self.records), text)
        if self.polish_from is not None and len(self.records) == self.polish_from:
            print(f"[search] polish: trials {self.polish_from + 1}-{self.s.trials} step from the best layout so far "
                  f"to its neighbours", flush=True)  # fmt: skip

    # the loop -----------------------------------------------------------------------------------

    def run_tune(self, trial_fn: TrialFn = run_trial) -> bool:
        """Run the remaining trials through Ray Tune; False when interrupted."""
        remaining = self.s.trials - len(self.records)
        if remaining <= 0:
            return True
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy reporter honours verbose=0
        # Our journal, trials.parquet and MLflow hold every result, and a resume reads the journal:
        # Tune's per-trial JSON/CSV files and periodic experiment snapshots would only duplicate them.
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "3600")
        import ray
        from ray import tune

        from pipeline.tune_batch import BatchSearcher, batch_trial, resources, trainable_env
        from pipeline.tune_worker import RETRIES, prewarm, worker_failed

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # as many workers as the cluster has room for, and no more than a batch can keep busy
        workers = max(1, min(self.s.batch, int(ray.cluster_resources().get("CPU", 1) / self.s.cpus_per_trial)))
        searcher = BatchSearcher(
            make_sampler(self.s.sampler, self.s.seed, self.ctx.space, self.s.polish, self.s.trials),
            self.ctx.space.distributions(),
            self.s.batch,
            remaining,
        )
        for r in self.records:  # a resumed search: the sampler learns what is done, nothing re-runs
            searcher.add_evaluated_point(r["params"], float(r["score"]), error=r["status"] == "error")
        run = self

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

        ctx_ref = [ray.put(self.ctx)]
        # one node: the other workers' processes start now, beside the trainable's (on a cluster the
        # driver cannot know which nodes the trial's bundles will be on, so they start with its first batch)
        one_node = sum(1 for n in ray.nodes() if n.get("Alive")) == 1
        warming = prewarm(self.ctx.key, ctx_ref, workers - 1, trainable_env()) if one_node else []
        cpus = self.s.cpus_per_trial
        trial = tune.with_parameters(
            batch_trial, key=self.ctx.key, ctx_ref=ctx_ref, trial_fn=trial_fn, workers=workers, cpus=cpus
        )
        trainable = tune.with_resources(trial, resources(workers, cpus))
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=searcher,  # one trial per batch (pipeline/tune_batch.py)
                num_samples=-1,  # the searcher says when it is done
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name="tune",
                storage_path=str(self.dir),
                verbose=0,
                callbacks=[Recorder()],
                failure_config=tune.FailureConfig(max_failures=RETRIES, fail_fast=False),
            ),
        )
        tune_log = logging.getLogger("ray.tune")
        level = tune_log.level
        tune_log.setLevel(logging.CRITICAL)  # failed trials are reported one line each, by `add`
        try:
            with self._background_logging():
                tuner.fit()
        except KeyboardInterrupt:
            pass
        finally:
            tune_log.setLevel(level)
            del warming  # its tasks' references, held while Tune ran
        return len(self.records) >= self.s.trials


def trial_run_name(idx: int) -> str:
    return f"trial-{idx:04d}"


def _short(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:160]}"


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
    )


def with_ray(settings: Settings, body: Callable[[], bool]) -> bool:
    """Run `body` on a local Ray (started and stopped here) or the cluster at `ray.address`."""
    import ray

    started = False
    if not ray.is_initialized():
        check_ray_address(settings.ray_address)
        try:
            if settings.ray_address is None:
                start_local_ray(settings.ray_num_cpus)
            else:
                ray.init(address=settings.ray_address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError, PermissionError) as err:
            text = " ".join(str(err).split())
            hint = " (the cluster refused this client's token: set RAY_AUTH_TOKEN)" if "auth" in text.lower() else ""
            raise ConfigError(
                f"ray.address={settings.ray_address}: cannot join the Ray cluster{hint}: {text[:300]}"
            ) from None
        started = True
    try:
        return body()
    finally:
        if started:
            ray.shutdown()

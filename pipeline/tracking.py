"""MLflow: one parent run per search (or experiment), one child run per trial (or repeated search).

Default store: an absolute SQLite file `outputs/mlflow.db`; a SQLite store keeps artifacts in
`mlartifacts/` beside its database file; any tracking URI (e.g. http://host:5000) by config.
Children are logged from the driver as trials finish, so workers on other Ray nodes need no
access to the store.

The store is checked when the tracker is made, before any expensive work: a URI MLflow does not
know, a SQLite file that cannot be created or written (read-only, locked), a server that does
not answer within seconds — each is one `ConfigError` naming `mlflow.tracking_uri`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pipeline.config import check_answers, make_dir
from pipeline.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def default_uri() -> str:
    return f"sqlite:///{REPO / 'outputs' / 'mlflow.db'}"


def _check_server(uri: str) -> None:
    url = urlparse(uri)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    check_answers("mlflow.tracking_uri", uri, host, port, "tracking server",
                  "start it (mlflow server) or drop mlflow.tracking_uri for the local SQLite store")  # fmt: skip


LOCK_WAIT_S = 5.0  # how long a store another process writes may stay locked before the tracker gives up


def _check_unlocked(db: Path, uri: str) -> None:
    """Fail in seconds on a SQLite store another process holds locked, not after MLflow's 20 s wait.

    Another search writing its child runs holds the lock for milliseconds at a time; a lock held
    for `LOCK_WAIT_S` is a process that keeps it (an open transaction, a stuck writer).
    """
    import sqlite3

    if not db.is_file():
        return
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=LOCK_WAIT_S, isolation_level=None)) as con:
            con.execute("BEGIN IMMEDIATE")  # takes the write lock, as MLflow's first write will
            con.execute("ROLLBACK")
    except sqlite3.OperationalError as err:
        if "locked" in str(err):
            raise ConfigError(
                f"mlflow.tracking_uri={uri}: cannot open the tracking store for writing (database is locked: "
                f"another process has held it for {LOCK_WAIT_S:.0f} s; let it finish, or point "
                "mlflow.tracking_uri at another file)"
            ) from None
        # anything else (read-only, not a database) MLflow's own first write reports below


def _write_ahead_log(db: Path) -> None:
    """A SQLite store in write-ahead-log mode, synced at checkpoints rather than at every commit.

    A child run per trial is three transactions; with SQLite's default rollback journal each one
    syncs the file, and MLflow's ~16 ms per child (12 ms of it CPU) competes with the search for
    the driver's cores. In WAL mode a child costs ~10.5 ms, and the MLflow UI reading the store
    does not block the search writing it. What a power cut could lose (the last commits) the
    run's journal still has: a resume logs every trial MLflow is missing. WAL needs a local
    filesystem (not NFS); where the mode cannot be set (a read-only or busy file) the store
    stays as it is and the tracker's own checks report what is wrong.
    """
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    db = db.resolve()
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=1.0)) as con:
            con.execute("PRAGMA journal_mode=WAL")  # kept in the file: every later connection uses it
    except sqlite3.Error:
        return
    if db in _WAL_STORES:
        return
    _WAL_STORES.add(db)

    @event.listens_for(Engine, "connect")
    def _normal_sync(dbapi_con: Any, _record: Any) -> None:  # per connection; MLflow pools them
        if isinstance(dbapi_con, sqlite3.Connection):
            files = {Path(row[2]) for row in dbapi_con.execute("PRAGMA database_list") if row[2]}
            if db in files:
                dbapi_con.execute("PRAGMA synchronous=NORMAL")


_WAL_STORES: set[Path] = set()  # stores whose connections sync at checkpoints (one listener each)


# MLflow 3 opens an experiment on its GenAI overview unless its kind says otherwise: ours are
# training-style runs (parameters and metrics per run), which the UI shows as the runs table.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
NOTE = "mlflow.note.content"  # the description the UI shows for an experiment or a run
# A saved runs-table view (columns, order) the UI opens with `?viewStateShareKey=archipelago`: what a
# user compares shows without picking columns (pipeline/ui.py prints the address).
VIEW_KEY = "archipelago"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"


def runs_view_url(base: str, experiment_id: str) -> str:
    """The address of an experiment's runs table with Archipelago's columns, on a UI at `base`."""
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"


class Tracker:
    def __init__(self, uri: str | None, experiment: str, description: str = "", columns: Sequence[str] = ()) -> None:
        """`columns`: the runs table's columns in the saved view, as `metrics.name` / `params.name`."""
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        # a server that stops answering mid-run costs seconds per call, not minutes of retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.uri = uri or default_uri()
        scheme = urlparse(self.uri).scheme
        if scheme in ("http", "https"):
            _check_server(self.uri)
        elif scheme == "sqlite":
            make_dir(Path(self.uri.removeprefix("sqlite:///")).parent, "mlflow.tracking_uri", self.uri)
            _check_unlocked(Path(self.uri.removeprefix("sqlite:///")), self.uri)
            _write_ahead_log(Path(self.uri.removeprefix("sqlite:///")))
        elif scheme not in ("file", "databricks", "postgresql", "mysql", "mssql"):
            raise ConfigError(
                f"mlflow.tracking_uri={self.uri}: MLflow does not know the scheme {scheme!r}: use "
                "sqlite:////abs/path/mlflow.db or http://host:5000 (or null for the local store)"
            )
        import mlflow
        from mlflow.tracking import MlflowClient

        for name in ("alembic", "mlflow"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # it logs a store error with its traceback before raising it; we report the error in one line
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        try:
            mlflow.set_tracking_uri(self.uri)
            self.client = MlflowClient(self.uri)
            exp = self.client.get_experiment_by_name(experiment)
            if exp is None:
                # a SQLite store keeps its artifacts beside the database file (not in ./mlruns)
                loc = (
                    (Path(self.uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
                    if scheme == "sqlite"
                    else None
                )
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=loc)
            else:
                self.experiment_id = exp.experiment_id
            # writes, so a read-only or locked store fails now rather than after the work
            self.client.set_experiment_tag(self.experiment_id, *EXPERIMENT_KIND)
            if description:
                self.client.set_experiment_tag(self.experiment_id, NOTE, description)
            if columns:
                kind_key = [c.split(".", 1) for c in columns]
                view = {"selectedColumns": [f"{kind}.`{key}`" for kind, key in kind_key],
                        "orderByKey": "attributes.start_time", "orderByAsc": False}  # fmt: skip
                self.client.set_experiment_tag(self.experiment_id, VIEW_TAG, json.dumps(view))
        except Exception as err:
            raise ConfigError(
                f"mlflow.tracking_uri={self.uri}: cannot open the tracking store for writing "
                f"({type(err).__name__}: {' '.join(str(err).split())[:200]})"
            ) from None
        self.parent_id: str | None = None

    def start_parent(
        self, name: str, params: Mapping[str, Any], run_id: str | None = None, description: str = ""
    ) -> str:
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
            self.parent_id = run_id
            return run_id
        tags = {NOTE: description} if description else None
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        self.parent_id = run.info.run_id
        self._log(self.parent_id, params, {})
        return self.parent_id

    def describe_parent(self, description: str) -> None:
        """Replace the parent's description (e.g. with its result, once known)."""
        assert self.parent_id is not None
        self.client.set_tag(self.parent_id, NOTE, description)

    def child_names(self) -> set[str]:
        """Run names of the parent's children (a resume logs only the trials missing here)."""
        assert self.parent_id is not None
        runs = self.client.search_runs(
            [self.experiment_id], f"tags.mlflow.parentRunId = '{self.parent_id}'", max_results=50000
        )
        return {r.info.run_name for r in runs}

    def child(
        self,
        name: str,
        params: Mapping[str, Any],
        metrics: Mapping[str, float],
        failed: bool,
        series: Mapping[str, Sequence[float]] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """One child run; `series` are metrics logged per step (e.g. best so far per iteration), `tags`
        long values a user reads but does not compare (a `description` becomes the run's note)."""
        assert self.parent_id is not None
        extra = {NOTE if k == "description" else k: str(v)[:5000] for k, v in (tags or {}).items()}
        run = self.client.create_run(
            self.experiment_id, run_name=name, tags={"mlflow.parentRunId": self.parent_id, **extra}
        )
        self._log(run.info.run_id, params, metrics, series)
        self.client.set_terminated(run.info.run_id, status="FAILED" if failed else "FINISHED")

    def finish_parent(
        self,
        metrics: Mapping[str, float],
        artifacts: list[Path],
        status: str = "FINISHED",
        series: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        """`series`: metrics per step on the parent (e.g. the best score after each trial), so
        MLflow's own charts draw the convergence."""
        assert self.parent_id is not None
        self._log(self.parent_id, {}, metrics, series)
        for path in artifacts:
            if path.exists():
                self.client.log_artifact(self.parent_id, str(path))
        self.client.set_terminated(self.parent_id, status=status)

    def end_parent(self, status: str) -> None:
        """Mark the parent ended (FAILED, KILLED) when a run stops early; never raises."""
        if self.parent_id is None:
            return
        try:
            self.client.set_terminated(self.parent_id, status=status)
        except Exception:  # the store itself may be what failed; the run folder has the record
            pass

    def _log(
        self,
        run_id: str,
        params: Mapping[str, Any],
        metrics: Mapping[str, float],
        series: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        steps = [Metric(k, float(v), now, i) for k, vs in (series or {}).items() for i, v in enumerate(vs) if v == v]
        ms = [Metric(k, float(v), now, 0) for k, v in metrics.items() if v == v] + steps  # NaN dropped
        ps = [Param(k, str(v)[:6000]) for k, v in params.items()]
        # one write for a trial; MLflow takes at most 100 params and 1000 metrics per batch
        for k in range(max(-(-len(ps) // 100), -(-len(ms) // 1000))):
            self.client.log_batch(run_id, metrics=ms[1000 * k : 1000 * (k + 1)], params=ps[100 * k : 100 * (k + 1)])

"""MLflow: one parent run per search (or experiment), one child run per trial (or repeated search).

Default store: an absolute SQLite file `outputs/mlflow.db`; a SQLite store keeps artifacts in
`mlartifacts/` beside its database file; any tracking URI (e.g. http://host:5000) by config.
Children are logged from the driver as trials finish, so workers on other Ray nodes need no
access to the store. A SQL store (the default SQLite file, or a database URI) takes a batch of
children in one transaction of plain inserts into MLflow's own tables (`Tracker.children`):
0.3-1.5 ms of CPU a child (in a batch of 240, or alone) instead of the ~12 ms of MLflow's
create / log / terminate calls, which competed with the search for the driver's cores. Any
other store (a tracking server) gets those calls, one child at a time.

A new SQLite store starts as a copy of an empty store of the installed MLflow version (`_from_template`),
not after MLflow's second of schema migrations.

The store is checked when the tracker is made, before any expensive work: a URI MLflow does not
know, a SQLite file that cannot be created or written (read-only, locked) or is not a database, a
server that does not answer within seconds — each is one `ConfigError` naming `mlflow.tracking_uri`.

A search's tracker is `Served` (`open_tracker`): MLflow's import and the store's opening, about 1.2 s of
every run, take place in a forked process beside the search, which talks to it through a pipe. What
MLflow itself refuses on opening (a store of another MLflow version) is then said before the trials,
or, for the exact planner, once its plan is written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pipeline.checks import check_answers, make_dir
from pipeline.errors import ConfigError
from pipeline.forking import ctrl_c_noted, forkable
from pipeline.records.journal import read_json, write_json

REPO = Path(__file__).resolve().parents[2]


def default_uri() -> str:
    return f"sqlite:///{REPO / 'outputs' / 'mlflow.db'}"


def sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite store's URI (None for any other store)."""
    return Path(uri.removeprefix("sqlite:///")) if urlparse(uri).scheme == "sqlite" else None


def check_store(uri: str) -> None:
    """The checks of a store that need no MLflow, each a `ConfigError` naming `mlflow.tracking_uri`: a scheme
    MLflow does not know, a server that does not answer, a SQLite file whose folder cannot be made or that another
    process keeps locked."""
    scheme, db = urlparse(uri).scheme, sqlite_file(uri)
    if scheme in ("http", "https"):
        _check_server(uri)
    elif db is not None:
        make_dir(db.parent, "mlflow.tracking_uri", uri)
        _check_unlocked(db, uri)
    elif scheme not in ("file", "databricks", "postgresql", "mysql", "mssql"):
        raise ConfigError(
            f"mlflow.tracking_uri={uri}: MLflow does not know the scheme {scheme!r}: use "
            "sqlite:////abs/path/mlflow.db or http://host:5000 (or null for the local store)"
        )


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
    except sqlite3.DatabaseError as err:
        if "locked" in str(err):
            raise ConfigError(
                f"mlflow.tracking_uri={uri}: cannot open the tracking store for writing (database is locked: "
                f"another process has held it for {LOCK_WAIT_S:.0f} s; let it finish, or point "
                "mlflow.tracking_uri at another file)"
            ) from None
        if not isinstance(err, sqlite3.OperationalError):  # the file is not a database (or is damaged)
            raise ConfigError(
                f"mlflow.tracking_uri={uri}: {db} is not an MLflow store ({err}): point mlflow.tracking_uri at "
                "the store's file, or at a new file"
            ) from None
        # anything else (read-only) MLflow's own first write reports


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


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "archipelago"


def _from_template(db: Path) -> None:
    """Start a new SQLite store as a copy of an empty one with MLflow's tables at this MLflow version's schema.

    MLflow creates a new store's tables by running its schema migrations, about a second of every fresh store
    (every search into a new folder); the copy takes milliseconds. The empty store is built once per MLflow
    version in the user's cache (`$XDG_CACHE_HOME/archipelago`, else ~/.cache/archipelago) by MLflow's own
    table creation. MLflow then opens the copy as any store of its version (it checks the schema's revision)
    and adds its default experiment with this store's artifact location. Where the template cannot be built
    or copied, MLflow creates the tables itself, as without it."""
    if db.exists() and db.stat().st_size > 0:
        return
    part = db.with_name(f".{db.name}.{uuid.uuid4().hex}")
    try:
        shutil.copyfile(_template(), part)
        os.replace(part, db)
    except Exception:  # the template is only a shortcut: MLflow creates the tables itself below
        with contextlib.suppress(OSError):
            part.unlink(missing_ok=True)


def _template() -> Path:
    """The empty store of this MLflow version (built on first use; atomic, so concurrent builders are safe)."""
    import mlflow
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    path = _cache_dir() / f"mlflow-{mlflow.__version__}-empty.db"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    engine = sqlalchemy.create_engine(f"sqlite:///{part}")
    try:
        _initialize_tables(engine)
    finally:
        engine.dispose()
    os.replace(part, path)
    return path


@contextlib.contextmanager
def _creating(db: Path | None) -> Iterator[None]:
    """Hold `<db>.lock` while a SQLite store is opened: MLflow creates and migrates its tables on first use, and
    two processes doing that at once on a new file fail half-way ("duplicate column name", "table ... already
    exists"). Where the lock file cannot be made, the checks of the store report what is wrong."""
    if db is None:
        yield
        return
    import fcntl

    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        lock = (db.parent / f"{db.name}.lock").open("a")
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


SIGNIFICANT = 6  # digits a metric keeps in MLflow: a rate to 0.001 req/s, not 586.5738470304116
TINY = 1e-9  # below this a metric is float noise (a gap of 4.4e-16 is no gap): logged as 0


def tidy(value: float) -> float:
    """`value` as MLflow's tables should show it: `SIGNIFICANT` significant digits, float noise as 0."""
    v = float(value)
    return 0.0 if abs(v) < TINY else float(f"{v:.{SIGNIFICANT}g}")


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


@dataclass(frozen=True)
class Child:
    """One child run of the parent: a trial, or one search of an experiment.

    `series` are metrics logged per step (e.g. best so far per iteration); `tags` long values a user
    reads but does not compare (a `description` becomes the run's note).
    """

    name: str
    params: Mapping[str, Any]
    metrics: Mapping[str, float]
    failed: bool = False
    series: Mapping[str, Sequence[float]] | None = None
    tags: Mapping[str, str] | None = None


class Tracker:
    def __init__(self, uri: str | None, experiment: str, description: str = "", columns: Sequence[str] = ()) -> None:
        """`columns`: the runs table's columns in the saved view, as `metrics.name` / `params.name`."""
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        # a server that stops answering mid-run costs seconds per call, not minutes of retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.uri = uri or default_uri()
        db = sqlite_file(self.uri)
        with _creating(db):  # two searches starting on a new store: one creates its tables, then the other
            check_store(self.uri)
            if db is not None:
                _from_template(db)
                _write_ahead_log(db)
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
                    loc = None if db is None else (db.parent / "mlartifacts").as_uri()
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
        # does `children` write a whole batch in one transaction (all or none)? Else pass one at a time
        self.bulk = self._sql_store() is not None
        self._artifacts = self.client.get_experiment(self.experiment_id).artifact_location if self.bulk else ""

    def _sql_store(self) -> Any:
        """The SQL store MLflow's client writes through (MLflow keeps one per URI), or None."""
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        store = self.client._tracking_client.store
        return store if isinstance(store, SqlAlchemyStore) else None

    def start_parent(
        self,
        name: str,
        params: Mapping[str, Any],
        run_id: str | None = None,
        description: str = "",
        record: Path | None = None,
    ) -> None:
        """Open the parent run (`run_id`: reopen that one, a resumed search's); its id is `parent_id`, and is noted
        as `parent_run_id` in the JSON file `record` (the run folder's state.json, which a resume reads)."""
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
            self.parent_id = run_id
        else:
            tags = {NOTE: description} if description else None
            run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
            self.parent_id = run.info.run_id
            self._log(self.parent_id, params, {})
        if record is not None:
            state = read_json(record, "a new MLflow parent run records the search") or {}
            write_json(record, {**state, "parent_run_id": self.parent_id})

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
        """One child run (`Child` says what each argument is)."""
        self.children([Child(name, params, metrics, failed, series, tags)])

    def children(self, runs: Sequence[Child]) -> None:
        """Child runs of the parent, finished (FINISHED, or FAILED). A SQL store takes them in one
        transaction: all or none, so a caller that retries after an error logs none twice."""
        assert self.parent_id is not None
        if self.bulk:
            self._insert(runs)
            return
        for c in runs:
            run = self.client.create_run(self.experiment_id, run_name=c.name, tags=self._tags(c))
            self._log(run.info.run_id, c.params, c.metrics, c.series)
            self.client.set_terminated(run.info.run_id, status="FAILED" if c.failed else "FINISHED")

    def _tags(self, c: Child) -> dict[str, str]:
        extra = {NOTE if k == "description" else k: str(v)[:5000] for k, v in (c.tags or {}).items()}
        return {"mlflow.parentRunId": str(self.parent_id), **extra}

    def _insert(self, runs: Sequence[Child]) -> None:
        """`runs` as MLflow's `create_run`, `log_batch` and `set_terminated` would leave them, written as
        plain inserts into its tables (its own table definitions, its own checks of keys and values)."""
        from mlflow.entities import LifecycleStage, RunStatus, RunTag, SourceType
        from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric, SqlParam, SqlRun, SqlTag
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME
        from mlflow.utils.uri import append_to_uri_path
        from mlflow.utils.validation import _validate_batch_log_data
        from sqlalchemy import insert

        store = self._sql_store()
        now = int(time.time() * 1000)
        rows: dict[Any, list[dict[str, Any]]] = {t: [] for t in (SqlRun, SqlTag, SqlParam, SqlMetric, SqlLatestMetric)}
        for c in runs:
            run_id = uuid.uuid4().hex
            tags = {MLFLOW_RUN_NAME: c.name, **self._tags(c)}
            params, metrics = self._entities(c.params, c.metrics, c.series, now)
            _validate_batch_log_data(metrics, params, [RunTag(k, v) for k, v in tags.items()])
            status = RunStatus.FAILED if c.failed else RunStatus.FINISHED
            rows[SqlRun].append({
                "run_uuid": run_id, "name": c.name, "experiment_id": int(self.experiment_id), "user_id": "unknown",
                "artifact_uri": append_to_uri_path(self._artifacts, run_id, "artifacts"),
                "status": RunStatus.to_string(status), "start_time": now, "end_time": now, "deleted_time": None,
                "source_type": SourceType.to_string(SourceType.UNKNOWN), "source_name": "", "entry_point_name": "",
                "source_version": "", "lifecycle_stage": LifecycleStage.ACTIVE,
            })  # fmt: skip
            rows[SqlTag] += [{"run_uuid": run_id, "key": k, "value": v} for k, v in tags.items()]
            rows[SqlParam] += [{"run_uuid": run_id, "key": p.key, "value": p.value} for p in params]
            latest: dict[str, dict[str, Any]] = {}
            for m in dict.fromkeys(metrics):  # MLflow drops exact duplicates
                is_nan, value = store.sanitize_metric_value(m.value)
                row = {"run_uuid": run_id, "key": m.key, "value": value, "timestamp": m.timestamp, "step": m.step,
                       "is_nan": is_nan}  # fmt: skip
                rows[SqlMetric].append(row)
                old = latest.get(m.key)  # the latest value: highest step, then timestamp, then value, as MLflow
                if old is None or (m.step, m.timestamp, value) > (old["step"], old["timestamp"], old["value"]):
                    latest[m.key] = row
            rows[SqlLatestMetric] += latest.values()
        with store.ManagedSessionMaker(read_only=False) as session:
            for table, values in rows.items():
                if values:
                    session.execute(insert(table.__table__), values)

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

    def ready(self) -> None:
        """Nothing to wait for: the store opened in this process (`Served.ready` waits for its child)."""

    def close(self) -> None:
        """Nothing to wait for: every call ran in this process (`Served.close` waits for its child)."""

    def _log(
        self,
        run_id: str,
        params: Mapping[str, Any],
        metrics: Mapping[str, float],
        series: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        ps, ms = self._entities(params, metrics, series, int(time.time() * 1000))
        # one write for a trial; MLflow takes at most 100 params and 1000 metrics per batch
        for k in range(max(-(-len(ps) // 100), -(-len(ms) // 1000))):
            self.client.log_batch(run_id, metrics=ms[1000 * k : 1000 * (k + 1)], params=ps[100 * k : 100 * (k + 1)])

    @staticmethod
    def _entities(
        params: Mapping[str, Any],
        metrics: Mapping[str, float],
        series: Mapping[str, Sequence[float]] | None,
        now: int,
    ) -> tuple[list[Any], list[Any]]:
        """MLflow's Params and Metrics for a run: values cut to MLflow's limit, NaN left out."""
        from mlflow.entities import Metric, Param

        steps = [Metric(k, tidy(v), now, i) for k, vs in (series or {}).items() for i, v in enumerate(vs) if v == v]
        ms = [Metric(k, tidy(v), now, 0) for k, v in metrics.items() if v == v] + steps  # NaN dropped
        return [Param(k, str(v)[:6000]) for k, v in params.items()], ms


def open_tracker(
    uri: str | None, experiment: str, description: str = "", columns: Sequence[str] = ()
) -> Tracker | Served:
    """The tracker of a command's run: `Served` where this process may fork (`forking.forkable`), so MLflow's import
    and the store's opening (about 1.2 s) run beside the command's own work; a `Tracker` here otherwise."""
    if forkable():
        return Served(uri, experiment, description, columns)
    return Tracker(uri, experiment, description, columns)


class StoreError(Exception):
    """An error of the tracker's process that does not cross to this one as itself: its type's name and message."""


class Served:
    """A `Tracker` in a forked child process, called through a pipe: the same calls, run there in the order made.

    The store's checks that need no MLflow (`check_store`) run here first, so a bad URI, folder, lock or server is
    one `ConfigError` before any work. MLflow's import and the experiment's opening then run in the child while
    the caller goes on, and `start_parent` is not waited for either (its id reaches `record` from the child). Every
    other call waits for its answer, and so for every call before it: the first error among them is raised there
    (an error MLflow itself raises on opening, e.g. a file that is not a store, surfaces at the first call after
    `start_parent`). The child ignores Ctrl-C, so a run stopped by it is still marked KILLED, and exits when the
    caller closes it or exits. Calls may come from several threads (the search's trial logger): one at a time."""

    def __init__(self, uri: str | None, experiment: str, description: str = "", columns: Sequence[str] = ()) -> None:
        self.uri = uri or default_uri()
        check_store(self.uri)
        ctx = mp.get_context("fork")
        self._conn, theirs = ctx.Pipe()
        self._child = ctx.Process(target=_serve, args=(theirs, (self.uri, experiment, description, tuple(columns)),
                                                       self._conn), name="mlflow-tracker", daemon=True)  # fmt: skip
        with ctrl_c_noted():  # a Ctrl-C in the at-fork hooks is dropped; the caller's next wait sees the next one
            self._child.start()
        theirs.close()
        self._lock = threading.Lock()
        self._owed: deque[str] = deque(["open"])  # the calls whose answers have not been read, oldest first
        self._opened: dict[str, Any] = {}
        self._parent_id: str | None = None

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """A copy in another process (Ray Tune pickles the search's state with it) cannot reach the child: it is a
        `Detached` that says so when used."""
        return Detached, (self.uri,)

    @property
    def bulk(self) -> bool:
        self._settle()
        return bool(self._opened.get("bulk"))

    @property
    def experiment_id(self) -> str:
        self._settle()
        return str(self._opened["experiment_id"])

    @property
    def parent_id(self) -> str | None:
        self._settle()
        return self._parent_id

    def start_parent(
        self,
        name: str,
        params: Mapping[str, Any],
        run_id: str | None = None,
        description: str = "",
        record: Path | None = None,
    ) -> None:
        with self._lock:
            self._send("start_parent", name, params, run_id, description, record)

    def describe_parent(self, description: str) -> None:
        self._call("describe_parent", description)

    def child_names(self) -> set[str]:
        return set(self._call("child_names"))

    child = Tracker.child  # a batch of one, through `children`

    def children(self, runs: Sequence[Child]) -> None:
        self._call("children", list(runs))

    def finish_parent(
        self,
        metrics: Mapping[str, float],
        artifacts: list[Path],
        status: str = "FINISHED",
        series: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        self._call("finish_parent", metrics, artifacts, status, series)

    def end_parent(self, status: str) -> None:
        """As `Tracker.end_parent`: never raises."""
        try:
            self._call("end_parent", status)
        except BaseException:
            pass

    def ready(self) -> None:
        """Wait for the store's opening and every call made so far; raise the first error among them."""
        self._settle()

    def close(self) -> None:
        """Wait for every call made, then let the child exit."""
        with contextlib.suppress(Exception), self._lock:
            self._conn.send(None)
        self._child.join(30)
        if self._child.is_alive():
            self._child.kill()
            self._child.join(5)

    def _call(self, name: str, *args: Any) -> Any:
        with self._lock:
            self._send(name, *args)
            return self._read()

    def _settle(self) -> None:
        with self._lock:
            self._read()

    def _send(self, name: str, *args: Any) -> None:
        self._conn.send((name, args))
        self._owed.append(name)

    def _read(self) -> Any:
        """Read every answer owed; the last one's value, or the first error among them."""
        error: BaseException | None = None
        value: Any = None
        while self._owed:
            try:
                ok, value = self._conn.recv()
            except EOFError:
                raise StoreError(f"the tracker's process exited (code {self._child.exitcode})") from None
            name = self._owed.popleft()
            if not ok:
                error = error or value
            elif name == "open":
                self._opened = value
            elif name == "start_parent":
                self._parent_id = value
        if error is not None:
            raise error
        return value


class Detached:
    """A `Served` tracker copied into another process: every use is an error naming the store."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def __getattr__(self, name: str) -> Any:
        raise StoreError(f"the tracker of {self.uri} was copied out of the process that opened it: log from there")


def _serve(conn: Any, args: tuple[Any, ...], callers: Any = None) -> None:
    """The tracker's process: open the store, answer `open`, then run each call and answer it until told to stop.
    `callers`: the caller's end of the pipe, as the fork copied it here: closed, so that the caller's end closes with
    the caller however it ends (a process killed, or ended by a library, never closes its tracker) and this process
    then sees the end of the pipe and exits, rather than hold the caller's output open for whoever reads it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides what Ctrl-C stops
    if callers is not None:
        callers.close()

    def answer(ok: bool, value: Any) -> None:
        if not ok:
            try:
                pickle.loads(pickle.dumps(value))
            except Exception:  # e.g. an exception whose constructor takes more than its message
                value = StoreError(f"{type(value).__name__}: {value}")
        conn.send((ok, value))

    tracker: Tracker | None = None
    try:
        tracker = Tracker(*args)
        answer(True, {"bulk": tracker.bulk, "experiment_id": tracker.experiment_id})
    except Exception as err:
        failed: Exception = err
        answer(False, err)
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the caller exited
            return
        if message is None:
            return
        name, call_args = message
        if tracker is None:
            answer(False, failed)
            continue
        try:
            value = getattr(tracker, name)(*call_args)
            answer(True, tracker.parent_id if name == "start_parent" else value)
        except Exception as err:
            answer(False, err)

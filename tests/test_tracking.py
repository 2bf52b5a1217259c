"""MLflow (pipeline/records/tracking.py): child runs written in bulk read back as MLflow's own calls leave them; a
locked or flaky store neither fails nor doubles a trial; metrics as a reader takes them in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import SMALL, compose, in_process, one_line
from pipeline.records.tracking import Child, Tracker

CHILDREN = [
    Child("trial-0000", {"n_H200": 3, "s_H200": 0.25, "status": "optimal"},
          {"score": 1.5, "gap": float("nan"), "rate_req_s": float("inf"), "cost": -2.0},
          tags={"islands": "H200x8 H20x16", "description": "Trial 0: optimal"}),
    Child("trial-0001", {"n_H200": 4, "status": "error"}, {"score": 0.0}, failed=True,
          series={"best": [1.0, 2.0, 1.5], "score": [0.5, 0.25]}),
]  # fmt: skip


def written(tmp_path: Path, experiment: str, bulk: bool) -> tuple[Tracker, dict[str, Any]]:
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", experiment)
    assert tracker.bulk  # a SQLite store
    if not bulk:
        tracker.bulk = False  # the store as a tracking server is written: MLflow's calls, one child at a time
    tracker.start_parent("search", {"sampler": "tpe"})
    tracker.children(CHILDREN)
    runs = tracker.client.search_runs([tracker.experiment_id], f"tags.mlflow.parentRunId = '{tracker.parent_id}'")
    return tracker, {r.info.run_name: r for r in runs}


def test_bulk_child_runs_read_back_as_mlflows_own_calls_leave_them(tmp_path: Path) -> None:
    bulk, fast = written(tmp_path, "bulk", bulk=True)
    api, slow = written(tmp_path, "api", bulk=False)
    assert sorted(fast) == sorted(slow) == ["trial-0000", "trial-0001"]
    for name in fast:
        a, b = fast[name], slow[name]
        assert (a.info.status, a.info.lifecycle_stage, a.info.user_id) == (b.info.status, b.info.lifecycle_stage,
                                                                           b.info.user_id)  # fmt: skip
        assert a.data.params == b.data.params and a.data.metrics == b.data.metrics
        assert {k: v for k, v in a.data.tags.items() if k != "mlflow.parentRunId"} == {
            k: v for k, v in b.data.tags.items() if k != "mlflow.parentRunId"
        }
        assert a.data.tags["mlflow.parentRunId"] == bulk.parent_id
        assert b.data.tags["mlflow.parentRunId"] == api.parent_id
        assert a.info.artifact_uri.endswith(f"/{a.info.run_id}/artifacts") and a.info.end_time >= a.info.start_time
        for key in a.data.metrics:  # every step of a series, not only its latest value
            hist = [(m.step, m.value) for m in bulk.client.get_metric_history(a.info.run_id, key)]
            assert sorted(hist) == sorted((m.step, m.value) for m in api.client.get_metric_history(b.info.run_id, key))
    assert fast["trial-0001"].info.status == "FAILED" and fast["trial-0001"].data.metrics["best"] == 1.5
    assert "gap" not in fast["trial-0000"].data.metrics  # NaN is left out, as before
    assert bulk.child_names() == {"trial-0000", "trial-0001"}  # what a resume reads


def test_a_bulk_batch_with_one_bad_child_writes_none_of_it(tmp_path: Path) -> None:
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "bulk")
    tracker.start_parent("search", {})
    bad = Child("trial-0002", {"n_H200": 1}, {"bad key?!": 1.0})
    with pytest.raises(Exception, match="bad key"):
        tracker.children([CHILDREN[0], bad])
    assert tracker.child_names() == set()  # the caller's retry cannot double trial-0000
    tracker.children(CHILDREN)
    assert tracker.child_names() == {"trial-0000", "trial-0001"}


def test_metrics_keep_six_significant_digits_and_float_noise_is_zero() -> None:
    from pipeline.records.tracking import tidy

    assert tidy(4.440892098500626e-16) == 0.0 and tidy(-3e-12) == 0.0  # a gap of float noise is no gap
    assert tidy(586.5738470304116) == 586.574 and tidy(0.0123456789) == 0.0123457 and tidy(16355.160753) == 16355.2
    assert tidy(float("inf")) == float("inf")


class FlakyTracker:
    """A store that refuses the first `down` writes (locked), then takes everything; with `bulk`, a
    write is a whole batch, all or none (a SQL store), else one child run."""

    def __init__(self, down: int, bulk: bool = False) -> None:
        self.down, self.bulk, self.logged = down, bulk, []

    def children(self, runs: Any) -> None:
        assert self.bulk or len(runs) == 1
        if self.down > 0:
            self.down -= 1
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        self.logged += [(c.name, c.failed) for c in runs]


@pytest.mark.parametrize("bulk", [False, True], ids=["one-by-one", "bulk"])
def test_a_locked_store_neither_fails_nor_doubles_a_finished_trial(tmp_path: Path, bulk: bool) -> None:
    from pipeline.search.settings import inventory_of, settings_from_cfg
    from pipeline.search.trials import SearchRun

    cfg = compose([*SMALL, f"out_root={tmp_path}/out", "search.iterations=1"])
    settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    tracker = FlakyTracker(down=2, bulk=bulk)
    run = SearchRun(settings, ctx, tracker)
    ok = {"status": "optimal", "score": 1.0, "islands": "H200x8", "note": ""}
    run.add_batch([({"n_H200": 0}, ok, None)])  # refused
    run.add_batch([({"n_H200": 1}, ok, None)])  # refused
    run.add_batch([({"n_H200": k}, ok, None) for k in (2, 3)])  # a batch back together: one write
    assert [r["status"] for r in run.journal.load()] == ["optimal"] * 4  # journalled once each, none failed
    assert [r["trial"] for r in run.journal.load()] == [0, 1, 2, 3] == [r["trial"] for r in run.records]
    assert tracker.logged == [(f"trial-{k:04d}", False) for k in range(4)]  # caught up, in order, once
    # a resume logs exactly the journalled trials MLflow does not have
    run.reconcile({"trial-0000", "trial-0002"})
    assert [r["trial"] for r in run.unlogged] == [1, 3]


def test_a_locked_store_is_refused_before_any_work(tmp_path: Path) -> None:
    import sqlite3

    from pipeline.search.run import execute

    db = tmp_path / "mlflow.db"
    Tracker(f"sqlite:///{db}", "archipelago")  # the store exists ...
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")  # ... and another process holds it
    try:
        r = in_process(execute, "search", *SMALL, f"out_root={tmp_path}/out", f"mlflow.tracking_uri=sqlite:///{db}")
    finally:
        con.close()
    one_line(r, f"error: mlflow.tracking_uri=sqlite:///{db}: cannot open the tracking store for writing")
    assert "database is locked" in r.stderr and not (tmp_path / "out").exists()


def test_a_store_locked_only_briefly_is_waited_for(tmp_path: Path) -> None:
    import sqlite3
    import threading

    from pipeline.records.tracking import LOCK_WAIT_S

    db = tmp_path / "mlflow.db"
    Tracker(f"sqlite:///{db}", "archipelago")
    con = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    con.execute("BEGIN EXCLUSIVE")  # another writer, done within a second
    release = threading.Timer(min(1.0, LOCK_WAIT_S / 2), lambda: (con.execute("COMMIT"), con.close()))
    release.start()
    try:
        tracker = Tracker(f"sqlite:///{db}", "archipelago")
    finally:
        release.join()
    tracker.start_parent("after the lock", {"a": 1})
    assert tracker.parent_id


def _schema(db: Path) -> dict[tuple[str, str], list[str]]:
    """Every table, index and trigger as its clauses (MLflow's own migrations order a table's constraints
    differently from one creation to the next), and the schema's revision."""
    import sqlite3

    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
        revision = {("revision", r[0]): [] for r in con.execute("SELECT * FROM alembic_version")}
        return {(kind, name): sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())
                for kind, name, sql in rows} | revision  # fmt: skip
    finally:
        con.close()


def test_a_new_store_copied_from_the_empty_template_is_the_store_mlflow_creates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    own = MlflowClient(f"sqlite:///{tmp_path}/own.db")  # MLflow creates the tables itself
    default_location = own.get_experiment("0").artifact_location
    first = Tracker(f"sqlite:///{tmp_path}/a/mlflow.db", "first")
    (template,) = (tmp_path / "cache" / "archipelago").glob("mlflow-*-empty.db")
    built = template.stat().st_mtime_ns
    second = Tracker(f"sqlite:///{tmp_path}/b/mlflow.db", "second")
    assert template.stat().st_mtime_ns == built  # copied, not rebuilt
    assert _schema(tmp_path / "b" / "mlflow.db") == _schema(tmp_path / "own.db")
    assert second.client.get_experiment("0").artifact_location == default_location
    second.start_parent("search", {"sampler": "tpe"})
    second.children(CHILDREN)
    assert second.child_names() == {"trial-0000", "trial-0001"}
    assert first.client.search_runs([first.experiment_id]) == []  # the copies share nothing


def test_a_store_is_created_by_mlflow_where_the_template_cannot_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cache").write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "plain")
    tracker.start_parent("search", {"sampler": "tpe"})
    assert _schema(tmp_path / "mlflow.db")[("table", "runs")]
    assert not list(tmp_path.glob(".mlflow.db.*"))  # no half copy left beside the store


def _store(db: Path, experiment: str) -> tuple[Any, dict[str, Any]]:
    """(the parent run, its children by name) of the one parent in `experiment`, read with MLflow's own client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    (parent,) = client.search_runs([exp.experiment_id], "attributes.run_name = 'search'")
    kids = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    return parent, {r.info.run_name: r for r in kids}


def test_a_served_tracker_writes_the_runs_a_tracker_here_writes(tmp_path: Path) -> None:
    """The same calls through the forked process and in this one leave the same runs; the parent's id reaches
    the record file from the child, and the child is gone once closed."""
    from pipeline.records.tracking import Served

    artifact = tmp_path / "plan.json"
    artifact.write_text("{}\n")
    stores = {}
    for kind, make in (("here", Tracker), ("served", Served)):
        db, record = tmp_path / kind / "mlflow.db", tmp_path / kind / "state.json"
        record.parent.mkdir()
        record.write_text('{"kept": 1}\n')
        tracker = make(f"sqlite:///{db}", "both")
        tracker.start_parent("search", {"sampler": "tpe"}, description="a note", record=record)
        tracker.children(CHILDREN)
        assert tracker.bulk and tracker.child_names() == {"trial-0000", "trial-0001"}
        tracker.describe_parent("the result")
        tracker.finish_parent({"best_rate_req_s": 586.5738}, [artifact], series={"best": [1.0, 2.0]})
        assert json.loads(record.read_text()) == {"kept": 1, "parent_run_id": tracker.parent_id}
        tracker.close()
        if kind == "served":
            assert not tracker._child.is_alive() and tracker._child.exitcode == 0
        stores[kind] = _store(db, "both")
    (here, here_kids), (served, served_kids) = stores["here"], stores["served"]
    assert served.info.status == here.info.status == "FINISHED"
    assert served.data.params == here.data.params and served.data.metrics == here.data.metrics
    assert served.data.tags["mlflow.note.content"] == "the result"
    assert sorted(served_kids) == sorted(here_kids) == ["trial-0000", "trial-0001"]
    for name, kid in served_kids.items():
        assert (kid.data.params, kid.data.metrics, kid.info.status) == (
            here_kids[name].data.params, here_kids[name].data.metrics, here_kids[name].info.status)  # fmt: skip
    assert Path(served.info.artifact_uri.removeprefix("file://"), "plan.json").read_text() == "{}\n"


def test_a_served_tracker_ends_with_a_caller_that_never_closed_it(tmp_path: Path) -> None:
    """A command that ends without closing its tracker (killed, or ended by a library: Ray's core worker exits the
    process when a Ray object is freed after it stopped) leaves no tracker process behind holding its output open:
    a caller reading that output to its end (a test, a pipe into `tee`) gets it at once, not at its own timeout."""
    import os
    import subprocess
    import sys
    import time

    script = (
        "import os, sys\n"
        "from pipeline.records.tracking import Served\n"
        f"tracker = Served('sqlite:///{tmp_path}/mlflow.db', 'x')\n"
        "tracker.start_parent('search', {})\n"
        "tracker.ready()\n"
        "print(tracker._child.pid, flush=True)\n"
        "os._exit(3)\n"
    )
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[1], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 3, r.stderr[-2000:]
    assert time.monotonic() - t0 < 60  # the output ended with the caller (before, only at the timeout)
    child = int(r.stdout.split()[0])
    for _ in range(100):  # the child saw the pipe end and exited (an orphan, so it may linger as a zombie a moment)
        try:
            state = Path(f"/proc/{child}/stat").read_text().split()[2]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        raise AssertionError(f"the tracker's process {child} is still running after its caller ended")


def test_a_served_tracker_raises_what_mlflow_refuses_at_the_next_call(tmp_path: Path) -> None:
    """A store MLflow will not open (a newer schema than its own): the error of the child's opening is raised
    by the first call that waits, as the tracker here raises it at once; a failed call's error crosses too."""
    import shutil
    import sqlite3

    from pipeline.errors import ConfigError
    from pipeline.records.tracking import Served, _template

    db = tmp_path / "mlflow.db"
    shutil.copyfile(_template(), db)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    with pytest.raises(ConfigError, match="out-of-date database schema") as here:
        Tracker(f"sqlite:///{db}", "x")
    served = Served(f"sqlite:///{db}", "x")
    served.start_parent("search", {})  # not waited for
    with pytest.raises(ConfigError) as there:
        served.ready()
    assert str(there.value) == str(here.value)
    served.end_parent("FAILED")  # never raises
    served.close()

    ok = Served(f"sqlite:///{tmp_path}/ok.db", "x")
    with pytest.raises(AssertionError):  # no parent run started: the tracker's own assertion, raised here
        ok.children(CHILDREN)
    ok.start_parent("search", {})
    ok.children(CHILDREN)  # the pipe is in step after an error
    assert ok.child_names() == {"trial-0000", "trial-0001"}
    ok.close()


def test_a_served_tracker_survives_ctrl_c_and_refuses_to_be_used_from_a_copy(tmp_path: Path) -> None:
    """Ctrl-C reaches the whole process group: the child ignores it, so the caller can still mark the run KILLED.
    A copy pickled into another process (Ray Tune saves the search's state) says it cannot log."""
    import os
    import pickle
    import signal

    from pipeline.records.tracking import Served, StoreError

    served = Served(f"sqlite:///{tmp_path}/mlflow.db", "x")
    served.start_parent("search", {})
    served.ready()
    assert served._child.pid is not None
    os.kill(served._child.pid, signal.SIGINT)
    served.end_parent("KILLED")
    parent_id = served.parent_id
    served.close()
    from mlflow.tracking import MlflowClient

    assert MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(parent_id).info.status == "KILLED"
    copy = pickle.loads(pickle.dumps(served))
    with pytest.raises(StoreError, match="copied out of the process that opened it"):
        copy.children(CHILDREN)


def test_a_file_that_is_not_a_store_is_refused_before_any_work(tmp_path: Path) -> None:
    from pipeline.search.run import execute

    db = tmp_path / "notes.db"
    db.write_text("these are notes, not an MLflow store\n" * 4)
    r = in_process(execute, "search", *SMALL, f"out_root={tmp_path}/out", f"mlflow.tracking_uri=sqlite:///{db}")
    one_line(r, f"error: mlflow.tracking_uri=sqlite:///{db}: {db} is not an MLflow store (file is not a database)")
    assert not (tmp_path / "out").exists() and db.read_text().startswith("these are notes")

"""MLflow child runs: written in bulk to a SQL store, they read back as MLflow's own calls leave them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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

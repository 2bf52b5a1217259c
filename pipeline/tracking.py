"""MLflow: one parent run per search (or experiment), one child run per trial (or repeated search).

Default store: an absolute SQLite file `outputs/mlflow.db`; a SQLite store keeps artifacts in
`mlartifacts/` beside its database file; any tracking URI (e.g. http://host:5000) by config. Children are
logged from the driver as trials finish, so workers on other Ray nodes need no access to
the store.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError

REPO = Path(__file__).resolve().parents[1]


def default_uri() -> str:
    return f"sqlite:///{REPO / 'outputs' / 'mlflow.db'}"


class Tracker:
    def __init__(self, uri: str | None, experiment: str) -> None:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        import mlflow
        from mlflow.tracking import MlflowClient

        for name in ("alembic", "mlflow"):
            logging.getLogger(name).setLevel(logging.WARNING)

        self.uri = uri or default_uri()
        if self.uri.startswith("sqlite:///"):
            Path(self.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(self.uri)
        try:
            exp = self.client.get_experiment_by_name(experiment)
            if exp is None:
                # a SQLite store keeps its artifacts beside the database file (not in ./mlruns)
                loc = (
                    (Path(self.uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
                    if self.uri.startswith("sqlite:///")
                    else None
                )
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=loc)
            else:
                self.experiment_id = exp.experiment_id
        except Exception as err:
            raise ConfigError(f"mlflow.tracking_uri={self.uri}: cannot open the tracking store ({err})") from None
        self.parent_id: str | None = None

    def start_parent(self, name: str, params: Mapping[str, Any], run_id: str | None = None) -> str:
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
            self.parent_id = run_id
            return run_id
        run = self.client.create_run(self.experiment_id, run_name=name)
        self.parent_id = run.info.run_id
        self._log(self.parent_id, params, {})
        return self.parent_id

    def child(
        self,
        name: str,
        params: Mapping[str, Any],
        metrics: Mapping[str, float],
        failed: bool,
        series: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        """One child run; `series` are metrics logged per step (e.g. best so far per iteration)."""
        assert self.parent_id is not None
        run = self.client.create_run(self.experiment_id, run_name=name, tags={"mlflow.parentRunId": self.parent_id})
        self._log(run.info.run_id, params, metrics, series)
        self.client.set_terminated(run.info.run_id, status="FAILED" if failed else "FINISHED")

    def finish_parent(self, metrics: Mapping[str, float], artifacts: list[Path], status: str = "FINISHED") -> None:
        assert self.parent_id is not None
        self._log(self.parent_id, {}, metrics)
        for path in artifacts:
            if path.exists():
                self.client.log_artifact(self.parent_id, str(path))
        self.client.set_terminated(self.parent_id, status=status)

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
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if v == v] + steps,  # NaN dropped
            params=[Param(k, str(v)[:6000]) for k, v in params.items()],
        )

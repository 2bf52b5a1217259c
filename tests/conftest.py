from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO, SHARED

REFERENCE_CSV = SHARED / "reference" / "shallowsim_reference.csv"


@pytest.fixture(scope="session")
def reference_csv() -> Path:
    if not REFERENCE_CSV.is_file():
        pytest.skip(f"{REFERENCE_CSV} not present (needs ../shared beside the checkout)")
    return REFERENCE_CSV


# A small finished search (Ray Tune, MLflow, the exact reference, the simulated check), run once per test run
# and shared by the test processes: the end-to-end test checks its outputs and the browser test opens its store.
FINISHED_SEARCH = ["+inventory=tiny_hetero", "ranges.width=1000", "search.batch=4", "ray.num_cpus=2",
                   "search.iterations=3", "slo=null", "search.shapes=any",
                   "search.spare_hosts=0"]  # fmt: skip  # every host up: the exact reference's own model


@pytest.fixture(scope="session")
def finished_search(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> tuple[Path, Any]:
    """(its folder: out/ and mlflow.db, the finished command) of `FINISHED_SEARCH`. The first test process to ask
    runs it; the others wait on the lock and read what it left (pytest-xdist's own recipe for a shared fixture)."""
    import fcntl
    from types import SimpleNamespace

    root = tmp_path_factory.getbasetemp()
    root = root.parent if worker_id != "master" else root  # shared by this run's test processes, not by other runs
    tmp = root / "finished_search"
    with (root / "finished_search.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (tmp / "command.json").exists():
            tmp.mkdir(exist_ok=True)
            r = subprocess.run([sys.executable, "-m", "pipeline.search", *FINISHED_SEARCH, f"out_root={tmp}/out",
                                f"mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db"],
                               cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
            (tmp / "command.json").write_text(json.dumps({"returncode": r.returncode, "stdout": r.stdout,
                                                          "stderr": r.stderr}))  # fmt: skip
    return tmp, SimpleNamespace(**json.loads((tmp / "command.json").read_text()))


def _shared(tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str) -> Path:
    """A folder this run's test processes share (pytest-xdist's recipe: the first to take its lock makes what is in
    it, the others read it)."""
    root = tmp_path_factory.getbasetemp()
    folder = (root.parent if worker_id != "master" else root) / name
    folder.mkdir(exist_ok=True)
    return folder


# tiny_hetero less half its H200 and H20: 8 H200 + 16 H800 + 16 H20, three serving islands (the bursts step's seven
# whole-day simulations, most of these searches' time, take ~30 % less than on all 64 GPUs)
STEP_INVENTORY = ["inventory.gpus.H200=8", "inventory.gpus.H20=16"]


@pytest.fixture(scope="session")
def step_searches(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Path]:
    """Two small searches that turn every post-search step on between them (each step's `on` settings), in-process:
    `first` plans from scratch (`STEP_INVENTORY`, the exact MILP, every step on that needs no running plan, e.g. the
    workload's bursts), `second` re-plans the first's plan with the steps that start from a running plan on and
    every other step off (its `off` setting). Each is a folder: out/ (its run folder), console.txt, mlflow.db."""
    import fcntl

    from helpers import SMALL, in_process
    from pipeline.search.run import execute
    from pipeline.search.steps import STEPS

    tmp = _shared(tmp_path_factory, worker_id, "step_searches")
    replanning = [s for s in STEPS if any("{plan}" in o for o in s.on)]
    with (tmp / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in ("first", "second"):
            folder = tmp / name
            if (folder / "console.txt").exists():
                continue
            if name == "first":
                args = [o for s in STEPS if s not in replanning for o in s.on] + [s.off for s in replanning]
            else:
                (running,) = (tmp / "first" / "out").glob("*/*/plan.json")
                args = [o.replace("{plan}", str(running)) for s in replanning for o in s.on]
                args += [s.off for s in STEPS if s not in replanning]
            r = in_process(execute, "search", *SMALL, *STEP_INVENTORY, "search.sampler=exact", *args,
                           f"out_root={folder}/out", f"mlflow.tracking_uri=sqlite:///{folder}/mlflow.db")  # fmt: skip
            assert r.returncode == 0, r.stderr
            (folder / "console.txt").write_text(r.stdout)
    return {"first": tmp / "first", "second": tmp / "second"}


@pytest.fixture
def local_ray() -> Any:
    """A local Ray of two CPUs in this test process, started by the first test that asks for it and kept for the
    next (a search's `with_ray` uses a Ray that is already up, and leaves it up): a Ray start costs 4-6 s."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    return ray


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite store with MLflow's tables made (its first open runs ~40 schema migrations, 1.4 s)."""
    import sqlite3

    from pipeline.records.tracking import Tracker

    made = tmp_path_factory.mktemp("store") / "made.db"
    Tracker(f"sqlite:///{made}", "archipelago")
    template = made.with_name("template.db")
    with sqlite3.connect(made) as src, sqlite3.connect(template) as dst:
        src.backup(dst)  # whole, with what the write-ahead log still held
    return template


@pytest.fixture(autouse=True)
def _stores_made(request: pytest.FixtureRequest) -> None:
    """Every test with a `tmp_path` finds `mlflow.db` and `m.db` there with MLflow's tables already made, so the
    searches and simulations that log to them skip the migrations. Creating a store from nothing is still
    tested: conftest's finished search and test_search_run's store opened by three processes at once."""
    if "tmp_path" not in request.fixturenames:
        return
    tmp, template = request.getfixturevalue("tmp_path"), request.getfixturevalue("migrated_store")
    for name in ("mlflow.db", "m.db"):
        shutil.copyfile(template, tmp / name)

from __future__ import annotations

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


# A small finished search (Ray Tune, MLflow, the exact reference, the simulated check), run once per
# session (the tests that use it are in one xdist group, so in one process): the end-to-end test checks its
# outputs, the test of the simulated-rate check checks its plan again, and the browser test opens its MLflow store.
FINISHED_SEARCH = ["+inventory=tiny_hetero", "ranges.width=1000", "search.batch=4", "ray.num_cpus=2",
                   "search.iterations=3", "slo=null", "search.shapes=any"]  # fmt: skip


@pytest.fixture(scope="session")
def finished_search(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(its folder: out/ and mlflow.db, the finished command) of `FINISHED_SEARCH`."""
    tmp = tmp_path_factory.mktemp("finished_search")
    r = subprocess.run([sys.executable, "-m", "pipeline.search", *FINISHED_SEARCH, f"out_root={tmp}/out",
                        f"mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    return tmp, r


@pytest.fixture
def local_ray() -> Any:
    """A local Ray of two CPUs in this test process, started by the first test that asks for it and kept for the
    next (a search's `with_ray` uses a Ray that is already up, and leaves it up): a Ray start costs 4-6 s."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    return ray

"""pipeline.solve_layout end to end through Hydra on a thesis Table 5.2 layout (coarse ranges for speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from costmodel.catalog import load_gpu, load_model
from costmodel.profile import CostProfile
from costmodel.settings import CostSettings
from pipeline.planning.planner import Layout, Planner
from pipeline.planning.workload import make_ranges, synthetic_normal

REPO = Path(__file__).resolve().parents[1]


def test_table_5_2_a_writes_tables_json_and_plots(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.solve_layout",
            "+layout=table_5_2_a",
            "ranges.width=1000",
            f"out_dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "| max_rate | optimal |" in r.stdout and "| thesis |" in r.stdout
    for f in (
        "results.md",
        "problem.json",
        "problem_thesis.json",
        "benchmarks.png",
        "assignment.png",
        "throughput_per_range.png",
        "per_length.png",
    ):
        assert (tmp_path / f).stat().st_size > 0, f
    prob = json.loads((tmp_path / "problem.json").read_text())
    assert len(prob["islands"]) == 8 and len(prob["ranges"]) == 8
    # the written problem re-solves through the contract CLI to the reported rate
    out = subprocess.run(
        [sys.executable, "-m", "solvers.inner", str(tmp_path / "problem.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    rate = json.loads(out.stdout)["rate_req_s"]
    assert f"| {rate:.2f} |" in r.stdout


def test_missing_layout_is_one_clear_line() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pipeline.solve_layout"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2
    assert r.stderr.startswith("error: no layout given: add +layout=NAME, one of ['table_5_2_a'")


def test_repeated_layout_costs_only_the_solve() -> None:
    wl = synthetic_normal("n", 500, 2000, 0, 8000, 100, 1000)
    planner = Planner(
        load_model("deepseek_v3"),
        wl,
        make_ranges(wl, 500),
        CostSettings(CostProfile.corrected()),
        {"H200": load_gpu("H200"), "H20": load_gpu("H20")},
    )
    layout = Layout.of([("H200", 16), ("H20", 16), ("H20", 16)])
    _, first = planner.solve(layout)
    assert (planner.misses, planner.hits) == (2, 1)
    _, again = planner.solve(layout)
    assert (planner.misses, planner.hits) == (2, 4)
    assert again.rate_req_s == pytest.approx(first.rate_req_s)
    ev, lengths = planner.evaluate(layout, *planner.solve(layout))
    assert len(lengths) == 8001 and 0.9 * first.rate_req_s < ev.rate_req_s < 1.1 * first.rate_req_s
    assert np.isclose(ev.served_req_s.sum(), ev.rate_req_s)

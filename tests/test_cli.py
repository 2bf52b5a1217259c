"""The island command end to end through Hydra, including its one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.island", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_island_report() -> None:
    r = run("gpu=H200", "size=16", "model=deepseek_v3")
    assert r.returncode == 0, r.stderr
    assert (
        "Island: 16 x H200 serving deepseek_v3 (cost profile corrected+published)" in r.stdout
    )  # the default: calibrated
    assert re.search(r"Prefill  tp=\d+ dp=\d+ ep=16 ", r.stdout)
    assert "Decode   tp=" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.strip() and line.strip()[0].isdigit()]
    assert len(rows) == 16


def test_island_overrides_and_all_rows() -> None:
    r = run("gpu=H20", "size=32", "costmodel=shallowsim", "slo.tpot_ms=50", "rows=0")
    assert r.returncode == 0, r.stderr
    assert "cost profile shallowsim" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.strip() and line.strip()[0].isdigit()]
    assert len(rows) == 64


def test_island_bad_inputs_exit_nonzero_with_one_line() -> None:
    cases = {
        ("size=-3",): "error: `size >= 1` (whole number) must hold, got size=-3",
        (
            "gpu.mem_gb=-1",
        ): "error: conf/gpu/H200.yaml (or its overrides): `mem_gb > 0` must hold for GPU H200, got -1.0",
        ("+costmodel.fixes.warp_drive=true",): "error: costmodel: unknown cost-model switch ['warp_drive']",
        ("rows=-1",): "error: `rows >= 0` (whole number; 0 = every range) must hold, got rows=-1",
        ("costmodel.cache_hit=1.5",): "error: `0 <= costmodel.cache_hit < 1` must hold",
        ("gpu=H20", "size=4"): "error: 4 x H20 cannot hold deepseek_v3's weights",
    }
    for args, message in cases.items():
        r = run(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
        assert r.stderr.startswith(message), (args, r.stderr)


def test_unknown_gpu_is_one_line_listing_the_choices() -> None:
    r = run("gpu=H2000")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: gpu=H2000: there is no config 'H2000' in group 'gpu'")
    assert "'H200'" in r.stderr and "'MI300X'" in r.stderr

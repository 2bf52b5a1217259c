"""Expert placement (seed 004 §III-D): the MILP and Algorithm 3 on hand-worked and synthetic instances."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from solvers.expert_placement import contiguous, cut, gpu_loads, heuristic, imbalance, milp, synthetic


def test_milp_balances_a_hand_worked_layer() -> None:
    # one layer, loads 4, 3, 2, 1 on 2 GPUs of 2 experts: {4, 1} and {3, 2} give 5 and 5, so D = 0
    a = np.array([[4.0, 3.0, 2.0, 1.0]])
    pl = milp(a, np.zeros((4, 4)), 2)
    assert pl.status == "optimal"
    assert sorted(gpu_loads(a, pl, 2)[0].tolist()) == [5.0, 5.0] and imbalance(a, pl, 2) == pytest.approx(1.0)


def test_milp_keeps_heavy_traffic_on_one_gpu_when_it_outweighs_balance() -> None:
    # experts 0 and 1 exchange a lot of traffic: with beta large they share a GPU (loads 7 and 3)
    a = np.array([[4.0, 3.0, 2.0, 1.0]])
    w = np.zeros((4, 4))
    w[0, 1] = 100.0
    pl = milp(a, w, 2, alpha=1.0, beta=10.0)
    col = pl.gpu_of[0]
    assert col[0] == col[1] and cut(w, pl) == 0.0
    assert sorted(gpu_loads(a, pl, 2)[0].tolist()) == [3.0, 7.0]


def test_placements_put_every_expert_once_with_equal_counts() -> None:
    a, w = synthetic(4, 16, seed=2)
    for pl in (milp(a, w, 4, time_limit_s=20), heuristic(a, 4, {(0, 5), (0, 9)}, anchor=2), contiguous(a, 4)):
        for i in range(a.shape[0]):
            assert sorted(np.bincount(pl.gpu_of[i], minlength=4).tolist()) == [4, 4, 4, 4], pl.method
    h = heuristic(a, 4, {(0, 5), (0, 9)}, anchor=2)
    assert h.gpu_of[0, 5] == h.gpu_of[0, 9] == 2  # Algorithm 3: affinity experts on the anchor GPU


def test_a_better_placement_is_a_faster_decode_step() -> None:
    from costmodel.catalog import load_gpu, load_model
    from costmodel.formulas import DecodeRun, decode_step_ms

    a, _ = synthetic(8, 32, seed=1)
    worse, better = imbalance(a, contiguous(a, 8), 8), imbalance(a, heuristic(a, 8), 8)
    assert worse > better >= 1.0
    gpu, model = load_gpu("H20"), load_model("deepseek_v3")
    one = np.array([1.0])  # 256 sequences per rank: enough tokens per expert that its GEMMs are compute-bound

    def step(f: float) -> float:
        return float(
            decode_step_ms(gpu, model, one * 2048, one * 256, one, one * 8, run=DecodeRun(expert_imbalance=f))[0]
        )

    assert step(worse) > step(better) > step(1.0)
    with pytest.raises(ValueError, match="expert_imbalance >= 1"):
        step(0.5)


def test_the_example_gives_a_sample_to_try_and_places_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "solvers.expert_placement", "--example", str(tmp_path), "--gpus", "8",
                        "--method", "heuristic"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    a, w = np.loadtxt(tmp_path / "A.csv", delimiter=","), np.loadtxt(tmp_path / "W.csv", delimiter=",")
    assert a.shape == (4, 32) and w.shape == (32, 32) and (a > 0).all() and (w >= 0).all()
    factor = float(r.stdout.strip().splitlines()[-1].split()[-1])
    assert factor >= 1.0  # the busiest GPU over the mean
    r = subprocess.run([sys.executable, "-m", "solvers.expert_placement", "--gpus", "8"], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode != 0 and "--example DIR" in r.stderr

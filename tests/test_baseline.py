"""Seed 001's estimator (Algorithm 1 and its linear time model) and the like-for-like scoring of its deployment."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.catalog import load_gpu, load_model
from costmodel.profile import CostProfile
from pipeline.baseline import colocated_rate
from solvers.tp_estimator import batch_time_ms, estimate, plan


def test_decode_time_closed_form_is_the_sum_of_its_steps() -> None:
    p = np.array([0.0, 0.0, 0.0, 0.0, 0.01, 0.5, 0.002, 3.0])  # prefill terms zero: decode only
    b, i, o = 4, 100.0, 7.0
    steps = sum(p[4] * b * (i + k) + p[5] * b + p[6] * (i + k) + p[7] for k in range(1, 8))
    assert batch_time_ms(p, b, i, o) == pytest.approx(steps)


def test_colocated_instances_time_share_the_phases() -> None:
    # one range; each instance prefills 2 req/s or decodes 2 req/s: sharing its time it serves 1, two serve 2
    assert colocated_rate(np.array([[2.0], [2.0]]), np.array([[2.0], [2.0]]), np.array([1.0])) == pytest.approx(2.0)
    # an instance that cannot decode serves nothing on its own
    assert colocated_rate(np.array([[5.0]]), np.array([[0.0]]), np.array([1.0])) == pytest.approx(0.0)


def test_estimator_picks_a_feasible_instance_size_per_type() -> None:
    rng = np.random.default_rng(0)
    inp, out = rng.integers(100, 3000, 50), rng.integers(5, 300, 50)
    gpus = {g: load_gpu(g) for g in ("H200", "H800")}
    model, prof = load_model("deepseek_v3"), CostProfile.corrected()
    assert estimate(gpus["H800"], model, 8, 8, inp, out, prof) is None  # 8 x 80 GB cannot hold DeepSeek-V3 in FP8
    choices = {c.gpu: c for c in plan({"H200": 16, "H800": 16}, gpus, model, inp, out, prof)}
    assert choices["H800"].tp == 16 and choices["H800"].instances_per_machine == 0  # two machines per instance
    assert choices["H200"].tp in (1, 2, 4, 8) and choices["H200"].tokens_per_s > 0

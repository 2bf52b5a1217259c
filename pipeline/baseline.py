"""Seed 001's deployment estimator beside our plan, on the same inventory and workload.

    python -m pipeline.baseline [+inventory=hetero_a] [workload=azure_code] [costmodel=...]

Prints, per GPU type, the instance size seed 001's Algorithm 1 picks and its own throughput
estimate; then that deployment scored by our cost model (every instance prefills and decodes
in turns: a range's rate on it is 1 / (1/b^P + 1/b^D), routed exactly by an LP), beside our
exact optimum (the planner's global optimum with prefill and decode islands). The estimator's
own figure assumes static batches padded to their longest request, so it is only comparable
with itself; the scored line is the like-for-like comparison.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from pipeline import cli
from pipeline.errors import ConfigError
from pipeline.planning.traces import load_histogram
from pipeline.search.reference import reference
from pipeline.search.settings import inventory_of, settings_from_cfg
from solvers.tp_estimator import plan as estimator_plan

SAMPLE = 200  # requests the estimator batches (seed 001 L237 uses 200 ShareGPT requests)


def colocated_rate(b_p: np.ndarray, b_d: np.ndarray, p: np.ndarray) -> float:
    """max Λ s.t. Σ_i c_ij x_ij >= Λ p_j, Σ_j x_ij <= 1 with c = 1/(1/b^P + 1/b^D) (instances time-share phases)."""
    from scipy.optimize import linprog

    with np.errstate(divide="ignore"):
        c = np.where(
            (b_p > 0) & (b_d > 0), 1.0 / (1.0 / np.where(b_p > 0, b_p, 1) + 1.0 / np.where(b_d > 0, b_d, 1)), 0
        )
    n_i, n_j = c.shape
    # variables: x (n_i * n_j), Λ; minimise -Λ
    obj = np.zeros(n_i * n_j + 1)
    obj[-1] = -1.0
    a_ub, b_ub = [], []
    for j in range(n_j):  # Λ p_j - Σ_i c_ij x_ij <= 0
        row = np.zeros(n_i * n_j + 1)
        row[j::n_j][:n_i] = -c[:, j]
        row[-1] = p[j]
        a_ub.append(row)
        b_ub.append(0.0)
    for i in range(n_i):  # Σ_j x_ij <= 1
        row = np.zeros(n_i * n_j + 1)
        row[i * n_j : (i + 1) * n_j] = 1.0
        a_ub.append(row)
        b_ub.append(1.0)
    res = linprog(obj, A_ub=np.array(a_ub), b_ub=np.array(b_ub), bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"colocated LP: {res.message}")
    return float(res.x[-1])


def execute(cfg: Any) -> int:
    settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    planner = ctx.planner
    w = cfg.workload
    if w.get("kind") != "histogram":
        raise ConfigError(
            "the baseline samples request lengths from a shipped histogram workload: "
            "use workload=azure_code or azure_conv"
        )
    h = load_histogram(str(w.histogram))
    rng = np.random.default_rng(int(cfg.search.seed))
    draw = [rng.choice(v, SAMPLE, p=c / c.sum()) for v, c in ((h["input_values"], h["input_counts"]),
                                                             (h["output_values"], h["output_counts"]))]  # fmt: skip
    inv = settings.inventory.by_name
    t0 = time.perf_counter()
    choices = estimator_plan(inv, planner.gpus, planner.model, draw[0], draw[1], planner.profile)
    est_s = time.perf_counter() - t0
    mean_tokens = float(draw[0].mean() + draw[1].mean())
    print(
        f"# Seed 001's estimator vs our planner: {settings.inventory.describe()}, workload {settings.workload_name}\n"
    )
    print("| GPU | instance size | instances | estimator's tok/s | fit error prefill / decode |")
    print("|---|---:|---:|---:|---:|")
    islands = []
    for c in choices:
        n_inst = inv[c.gpu] // c.tp
        islands += [(c.gpu, c.tp)] * n_inst
        fit = f"{c.fit.prefill_rel_err:.1%} / {c.fit.decode_rel_err:.1%}"
        print(f"| {c.gpu} | {c.tp} | {n_inst} | {c.tokens_per_s:,.0f} | {fit} |")
    est_req = sum(c.tokens_per_s for c in choices) / mean_tokens
    b_p = np.array([planner.benchmark(g, n).prefill_req_s for g, n in islands])
    b_d = np.array([planner.benchmark(g, n).decode_req_s for g, n in islands])
    scored = colocated_rate(b_p, b_d, planner.ranges.p)
    ref = reference(settings, ctx, planner)
    print(
        f"\nestimator's own estimate: {est_req:.1f} req/s ({est_s:.1f} s; static batches padded to the longest request)"
        f"\nits deployment scored by our cost model (colocated, exact routing): {scored:.1f} req/s"
        f"\nour exact optimum (prefill/decode islands): {ref.rate_req_s:.1f} req/s "
        f"= {ref.rate_req_s / scored:.2f}x that"
    )
    return 0


if __name__ == "__main__":
    cli.main("search", execute, (ValueError,))

"""Search quality and speed on hetero_a with the Azure code workload, measured in one run.

    python benchmarks/search_bench.py [--seeds 5] [--evals 240] [--batch 16] [--samplers tpe,gp,random,grid,qmc]
                                      [--polish default,0] [--tune-trials 64] [--min-island auto] [--first-seed 0]
                                      [--ceiling]

1. The exact reference MILP: optimum and wall time. With `--ceiling`, also the best any divider
   layout reaches (a few minutes of SCIP): what the search could find at most.
2. Per sampler, the median over seeds of best rate / exact optimum after `evals` evaluations
   (the thesis's 16 x 15 = 240), divider layouts (minimum island `--min-island`: `auto`, the
   search's default, or the thesis's 2), batches of `batch` proposals told back together (the
   thesis's batch semantics, as in the Ray Tune search), with the search's default
   `search.polish` and without it (0), side by side. Target: >= 0.99 for tpe or gp. Evaluated
   in-process so that the samplers x seeds fit in minutes; the sampler sees exactly what it sees
   under Ray Tune.
3. Trials/s through Ray Tune (2 workers, MLflow children logged) vs the same `run_trial` in a
   plain in-process Optuna loop, as a ratio, with the per-trial cost breakdown.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from ortools.linear_solver import pywraplp

from costmodel.catalog import CONF_DIR
from pipeline.polish import with_polish
from pipeline.search import SearchRun, ask_tell, make_sampler, reference, run_trial, settings_from_cfg
from pipeline.tracking import Tracker
from solvers.inner import new_solver
from solvers.layouts import divide


def load(overrides: list[str]) -> Any:
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("search", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    inv = OmegaConf.load(CONF_DIR / "inventory" / "hetero_a.yaml")
    return settings_from_cfg(cfg, "hetero_a", inv)


def optuna_loop(ctx: Any, sampler: Any, evals: int, batch: int) -> tuple[list[float], list[dict[str, Any]]]:
    results = ask_tell(ctx, sampler, evals, batch)
    return list(np.maximum.accumulate([r["score"] for r in results])), results


def divider_ceiling(ctx: Any, skew_points: int = 4001) -> tuple[float, str, dict[str, int]]:
    """The best rate of any divider layout: the exact MILP (`solvers/exact.py`) with each GPU type
    limited to one of the island multisets its (n_t, s_t) can produce (s_t on a grid of
    `skew_points`). Returns the rate, the solver status and the multisets per type."""
    planner, dists, mins = ctx.planner, ctx.space.distributions(), dict(ctx.space.min_island)
    p = planner.ranges.p
    s = new_solver("SCIP", 1800)
    lam = s.NumVar(0.0, s.infinity(), "Lambda")
    cover_p: list[list[Any]] = [[] for _ in p]
    cover_d: list[list[Any]] = [[] for _ in p]
    counts: dict[str, int] = {}
    for gpu, count in ctx.space.inventory:
        skews = np.linspace(-ctx.space.skew_range, ctx.space.skew_range, skew_points)
        multisets = sorted(
            {
                tuple(sorted(divide(count, n, float(sk), mins[gpu]), reverse=True))
                for n in range(1, dists[f"n_{gpu}"].high + 1)
                for sk in skews
            }
        )
        counts[gpu] = len(multisets)
        z = [s.BoolVar(f"z[{gpu},{m}]") for m in range(len(multisets))]
        s.Add(s.Sum(z) == 1)  # one divider layout per type
        for size in sorted({x for m in multisets for x in m}):
            bench = planner.benchmark(gpu, size)
            n_p, n_d = s.IntVar(0, count // size, ""), s.IntVar(0, count // size, "")
            s.Add(n_p + n_d <= s.Sum([z[k] * m.count(size) for k, m in enumerate(multisets) if size in m]))
            x_p = [s.NumVar(0.0, count // size, "") for _ in p]
            x_d = [s.NumVar(0.0, count // size, "") for _ in p]
            s.Add(s.Sum(x_p) <= n_p)
            s.Add(s.Sum(x_d) <= n_d)
            for j in range(len(p)):
                cover_p[j].append(bench.prefill_req_s[j] * x_p[j])
                cover_d[j].append(bench.decode_req_s[j] * x_d[j])
    for j in range(len(p)):
        s.Add(s.Sum(cover_p[j]) >= p[j] * lam)
        s.Add(s.Sum(cover_d[j]) >= p[j] * lam)
    s.Maximize(lam)
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(params.RELATIVE_MIP_GAP, 1e-6)
    status = {s.OPTIMAL: "optimal", s.FEASIBLE: "feasible"}.get(s.Solve(params), "not solved")
    return lam.solution_value(), status, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--evals", type=int, default=240)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--samplers", default="tpe,gp,random,grid,qmc")
    ap.add_argument("--tune-trials", type=int, default=64)
    ap.add_argument("--min-island", default="auto", help="search.min_island: auto (the default) or a number")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--polish", default="default,0", help="search.polish values to compare (default: the config's)")
    ap.add_argument("--ceiling", action="store_true", help="also solve for the best divider layout")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="search_bench_"))
    settings, ctx = load([f"out_root={tmp}/out", f"search.batch={args.batch}", f"search.min_island={args.min_island}"])
    t = time.perf_counter()
    ref = reference(settings, ctx, ctx.planner)
    print(
        f"hetero_a, azure_code, W={ctx.planner.ranges.end[0] - ctx.planner.ranges.start[0]} "
        f"({len(ctx.planner.ranges)} ranges): exact optimum {ref.rate_req_s:.2f} req/s ({ref.status}), "
        f"exact MILP {time.perf_counter() - t:.1f} s (incl. benchmarking every island size)"
    )
    if args.ceiling:
        t = time.perf_counter()
        rate, status, counts = divider_ceiling(ctx)
        print(
            f"best divider layout {rate:.2f} req/s ({status}) = {rate / ref.rate_req_s:.4f} of the exact optimum; "
            "island multisets per type "
            + ", ".join(f"{g} {n}" for g, n in counts.items())
            + f"; {time.perf_counter() - t:.0f} s"
        )

    print(
        f"\nbest / exact after {args.evals} evaluations (batches of {args.batch}), median over {args.seeds} seeds"
        f" from {args.first_seed}; minimum island " + ", ".join(f"{g} {n}" for g, n in ctx.space.min_island) + ":"
    )
    polishes = [settings.polish if p == "default" else float(p) for p in args.polish.split(",")]
    for name in args.samplers.split(","):
        for polish in dict.fromkeys(polishes):
            ratios, walls = [], []
            label = f"{name} polish {polish:g}"
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                try:
                    sampler = with_polish(make_sampler(name, seed, ctx.space), ctx.space, args.evals, polish)
                except ValueError as err:
                    print(f"  {label:17s} skipped: {err}")
                    break
                t = time.perf_counter()
                best, _ = optuna_loop(ctx, sampler, args.evals, args.batch)
                walls.append(time.perf_counter() - t)
                ratios.append(best[-1] / ref.rate_req_s)
            if ratios:
                print(
                    f"  {label:17s} median {statistics.median(ratios):.4f}  min {min(ratios):.4f}  "
                    f"max {max(ratios):.4f}  ({statistics.median(walls):.0f} s per {args.evals}-evaluation search, "
                    "in-process)  " + " ".join(f"{r:.3f}" for r in ratios),
                    flush=True,
                )

    # orchestration: the same trials through Ray Tune vs in-process
    n = args.tune_trials
    settings, ctx = load([f"out_root={tmp}/out", f"search.batch={args.batch}", f"search.iterations={n // args.batch}",
                          "search.sampler=random", "ray.num_cpus=2"])  # fmt: skip
    t = time.perf_counter()
    sampler = with_polish(make_sampler("random", 0, ctx.space), ctx.space, n, settings.polish)  # as run_tune's
    _, results = optuna_loop(ctx, sampler, n, args.batch)
    local = time.perf_counter() - t
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    tracker = Tracker(f"sqlite:///{tmp}/mlflow.db", "bench")
    run = SearchRun(settings, ctx, tracker)
    tracker.start_parent("bench", {})
    t = time.perf_counter()
    run.run_tune(run_trial)
    tuned = time.perf_counter() - t
    ray.shutdown()
    trial_ms = np.array([r["trial_ms"] for r in run.records])
    solve_ms = np.array([r["solve_ms"] for r in run.records])
    print(
        f"\n{n} trials: in-process Optuna loop {n / local:.2f} trials/s (1 process); Ray Tune {n / tuned:.2f} "
        f"trials/s (2 workers, incl. Ray start-up of workers and MLflow child runs); ratio Tune / in-process "
        f"{local / tuned:.2f}x"
    )
    print(
        f"per trial (Tune): median {np.median(trial_ms):.0f} ms in the worker, of which inner MILP "
        f"{np.median(solve_ms):.0f} ms, layout + evaluation + first-sight benchmarks "
        f"{np.median(trial_ms - solve_ms):.0f} ms; wall per trial x workers {2 * tuned / n * 1e3:.0f} ms, so "
        f"orchestration ~{2 * tuned / n * 1e3 - np.mean(trial_ms):.0f} ms per trial"
    )
    print(f"in-process per trial: median {np.median([r['trial_ms'] for r in results]):.0f} ms")


if __name__ == "__main__":
    main()

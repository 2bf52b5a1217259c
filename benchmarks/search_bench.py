"""Search quality and speed on hetero_a with the Azure code workload, measured in one run.

    python benchmarks/search_bench.py [--seeds 5] [--evals 240] [--batch 16] [--samplers tpe,gp,random,grid,qmc]
                                      [--polish default,0] [--tune-trials 240] [--min-island auto] [--first-seed 0]
                                      [--ceiling] [--nodes] [--speed-only] [--repeats 3]

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
   plain in-process Optuna loop, as a ratio, with the per-trial cost breakdown (`--tune-trials`,
   240 by default: one default search), alternated `--repeats` times after one untimed warm-up
   (both then start from the same filled benchmark caches): the median ratio and every run's.
   Target: >= 0.7x. A diagnostic row runs the Tune search again without MLflow child runs, to show
   what they cost. With `--nodes`, trials/s on a local Ray cluster of 1 node and of 2 nodes (1 CPU
   each), side by side, for cheap trials, for trials of ~1 s (`search.objective=goodput`) and for
   the trials of a 2,488-GPU inventory of 8 types (scale_bench.py's 8:0.25, 128 trials): the whole
   search and after its first batch (the exact reference first, untimed, as in the main job).
   `--speed-only` skips 2.
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
from common import context, scale_inventory

from pipeline.records.tracking import Tracker
from pipeline.search.reference import reference
from pipeline.search.samplers import make_sampler
from pipeline.search.trial import ask_tell, run_trial
from pipeline.search.trials import SearchRun
from pipeline.search.tune.driver import run_tune, start_local_ray
from solvers.layouts import divide


def optuna_loop(ctx: Any, sampler: Any, evals: int, batch: int) -> tuple[list[float], list[dict[str, Any]]]:
    results = ask_tell(ctx, sampler, evals, batch)
    return list(np.maximum.accumulate([r["score"] for r in results])), results


def divider_layouts(space: Any, skew_points: int = 4001) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Per GPU type, every island multiset the divider's (n_t, s_t) can produce (s_t on a grid)."""
    mins, dists = dict(space.min_island), space.distributions()
    skews = np.linspace(-space.skew_range, space.skew_range, skew_points)
    return {
        gpu: tuple(
            sorted(
                {
                    tuple(sorted(divide(count, n, float(sk), mins[gpu]), reverse=True))
                    for n in range(1, dists[f"n_{gpu}"].high + 1)
                    for sk in skews
                }
            )
        )
        for gpu, count in space.inventory
    }


def main() -> None:
    args = arguments()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="search_bench_"))
    settings, ctx = context([f"out_root={tmp}/out", f"search.batch={args.batch}",
                             f"search.min_island={args.min_island}"])  # fmt: skip
    optimum = exact(settings, ctx, ceiling=args.ceiling)
    if not args.speed_only:
        samplers(settings, ctx, args, optimum)
    orchestration(tmp, args)
    if args.nodes:
        print("\ncheap trials (the default objective):")
        nodes_scaling(tmp, args.tune_trials, args.batch, [])
        print("\ntrials of ~1 s (search.objective=goodput: a simulation per layout):")
        nodes_scaling(tmp, 32, args.batch, ["search.objective=goodput"])
        gpus = scale_inventory(8, 0.25)
        print(f"\ntrials of a large inventory ({sum(gpus.values()):,} GPUs of 8 types, scale_bench.py's 8:0.25):")
        nodes_scaling(tmp, 128, args.batch, [], gpus)


def arguments() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--evals", type=int, default=240)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--samplers", default="tpe,gp,random,grid,qmc")
    ap.add_argument("--tune-trials", type=int, default=240, help="trials of the Tune vs in-process comparison")
    ap.add_argument("--repeats", type=int, default=3, help="alternated runs of the Tune vs in-process comparison")
    ap.add_argument("--speed-only", action="store_true", help="only the Tune measurements (3.), not the samplers")
    ap.add_argument("--min-island", default="auto", help="search.min_island: auto (the default) or a number")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--polish", default="default,0", help="search.polish values to compare (default: the config's)")
    ap.add_argument("--ceiling", action="store_true", help="also solve for the best divider layout")
    ap.add_argument("--nodes", action="store_true", help="also: Ray Tune trials/s on a local cluster of 1 vs 2 nodes")
    return ap.parse_args()


def exact(settings: Any, ctx: Any, *, ceiling: bool) -> float:
    """1. The exact reference's optimum (req/s) and wall time; with `ceiling`, the best divider layout's too."""
    t = time.perf_counter()
    ref = reference(settings, ctx, ctx.planner)
    print(
        f"hetero_a, azure_code, W={ctx.planner.ranges.end[0] - ctx.planner.ranges.start[0]} "
        f"({len(ctx.planner.ranges)} ranges): exact optimum {ref.rate_req_s:.2f} req/s ({ref.status}), "
        f"exact MILP {time.perf_counter() - t:.1f} s (incl. benchmarking every island size)"
    )
    if ceiling:  # the exact MILP limited to the layouts the divider can propose
        t = time.perf_counter()
        layouts = divider_layouts(ctx.space)
        best = reference(settings, ctx, ctx.planner, layouts, backend="SCIP")
        print(
            f"best divider layout {best.rate_req_s:.2f} req/s ({best.status}) = "
            f"{best.rate_req_s / ref.rate_req_s:.4f} of the exact optimum; island multisets per type "
            + ", ".join(f"{g} {len(m)}" for g, m in layouts.items())
            + f"; {time.perf_counter() - t:.0f} s"
        )
    return ref.rate_req_s


def samplers(settings: Any, ctx: Any, args: argparse.Namespace, optimum: float) -> None:
    """2. Per sampler and polish, best rate / the exact optimum after `args.evals` evaluations, over seeds."""
    print(
        f"\nbest / exact after {args.evals} evaluations (batches of {args.batch}), median over {args.seeds} seeds"
        f" from {args.first_seed}; minimum island " + ", ".join(f"{g} {n}" for g, n in ctx.space.min_island) + ":"
    )
    polishes = [settings.search.polish if p == "default" else float(p) for p in args.polish.split(",")]
    for name in args.samplers.split(","):
        for polish in dict.fromkeys(polishes):
            ratios, walls = [], []
            label = f"{name} polish {polish:g}"
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                try:
                    sampler = make_sampler(name, seed, ctx.space, polish, args.evals)
                except ValueError as err:
                    print(f"  {label:17s} skipped: {err}")
                    break
                t = time.perf_counter()
                best, _ = optuna_loop(ctx, sampler, args.evals, args.batch)
                walls.append(time.perf_counter() - t)
                ratios.append(best[-1] / optimum)
            if ratios:
                print(
                    f"  {label:17s} median {statistics.median(ratios):.4f}  min {min(ratios):.4f}  "
                    f"max {max(ratios):.4f}  ({statistics.median(walls):.0f} s per {args.evals}-evaluation search, "
                    "in-process)  " + " ".join(f"{r:.3f}" for r in ratios),
                    flush=True,
                )


def orchestration(tmp: Path, args: argparse.Namespace) -> None:
    """3. The same trials through Ray Tune vs in-process, alternated `args.repeats` times (this machine is
    shared: one pair drifts with whatever else runs, the median of alternated pairs less)."""
    n = args.tune_trials
    settings, ctx = context([f"out_root={tmp}/out", f"search.batch={args.batch}",
                             f"search.iterations={n // args.batch}", "search.sampler=random",
                             "ray.num_cpus=2"])  # fmt: skip
    import ray

    def in_process() -> tuple[list[dict[str, Any]], float]:
        t = time.perf_counter()
        sampler = make_sampler("random", 0, ctx.space, settings.search.polish, n)  # as run_tune's
        _, results = optuna_loop(ctx, sampler, n, args.batch)
        return results, time.perf_counter() - t

    def through_tune(tracker: Tracker) -> tuple[SearchRun, float]:
        """One search through Ray Tune on a Ray of its own (no worker process warm from another)."""
        start_local_ray(2)  # as the main job starts its local Ray
        run = Timed(settings, ctx, tracker)
        tracker.start_parent("bench", {})
        t = time.perf_counter()
        run_tune(run, run_trial)
        wall = time.perf_counter() - t
        ray.shutdown()
        return run, wall

    in_process()  # fills the planner's full-resolution benchmarks, which Tune's workers then receive
    local, tuned, unlogged, steady = [], [], [], []
    for _ in range(args.repeats):
        results, wall = in_process()
        local.append(wall)
        run, wall = through_tune(Tracker(f"sqlite:///{tmp}/mlflow.db", "bench"))
        tuned.append(wall)
        # after the first batch is back: Tune's per-trial cost without its start-up (the in-process
        # loop has none to leave out: its first batch takes what any other does)
        steady.append((n - args.batch) / (run.done[-1] - run.done[args.batch - 1]))
        # the same search once more with MLflow's child runs left out: what they cost, on these cores
        unlogged.append(through_tune(NoChildren(f"sqlite:///{tmp}/mlflow.db", "bench"))[1])
    ratios = [a / b for a, b in zip(local, tuned, strict=True)]
    bare = [a / b for a, b in zip(local, unlogged, strict=True)]
    med = statistics.median
    trial_ms = np.array([r["trial_ms"] for r in run.records])
    solve_ms = np.array([r["solve_ms"] for r in run.records])
    print(
        f"\n{n} trials, {args.repeats} alternated runs each (median, then every run): in-process Optuna loop "
        f"{n / med(local):.2f} trials/s (1 process); Ray Tune {n / med(tuned):.2f} trials/s (2 workers, incl. Ray "
        f"start-up of workers and MLflow child runs); ratio Tune / in-process {med(ratios):.2f}x  "
        + " ".join(f"{r:.2f}" for r in ratios)
    )
    first = [wall - (n - args.batch) / rate for wall, rate in zip(tuned, steady, strict=True)]
    print(
        f"Ray Tune after its first batch: {med(steady):.2f} trials/s, {med(steady) * med(local) / n:.2f}x the "
        f"in-process loop (the first batch, with Ray Tune's start-up: {med(first):.1f} s of {med(tuned):.1f})"
    )
    print(
        f"diagnostic, the same without MLflow child runs: {n / med(unlogged):.2f} trials/s, {med(bare):.2f}x  "
        + " ".join(f"{r:.2f}" for r in bare)
        + f" (the child runs cost {med(tuned) - med(unlogged):.1f} s of {med(tuned):.1f})"
    )
    print(
        f"per trial (Tune, last run): median {np.median(trial_ms):.0f} ms in the worker, of which inner MILP "
        f"{np.median(solve_ms):.0f} ms; in-process: median {np.median([r['trial_ms'] for r in results]):.0f} ms. "
        f"Wall x 2 workers per trial {2 * med(tuned) / n * 1e3:.0f} ms, so orchestration (Ray start-up, the "
        f"batch's round trip, MLflow, shared cores) ~{2 * med(tuned) / n * 1e3 - np.mean(trial_ms):.0f} ms per trial"
    )


class Timed(SearchRun):
    """A search that notes when each trial's result came back (seconds on the benchmark's clock)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.done: list[float] = []

    def add_batch(self, trials: Any) -> None:
        self.done += [time.perf_counter()] * len(trials)
        super().add_batch(trials)


class NoChildren(Tracker):
    """A tracker that logs no child runs (the diagnostic row only; a search always logs them)."""

    def children(self, *args: Any, **kwargs: Any) -> None:
        pass


def nodes_scaling(tmp: Path, n: int, batch: int, extra: list[str], gpus: dict[str, int] | None = None) -> None:
    """Trials/s through Ray Tune on a local Ray cluster of 1 and of 2 nodes (1 CPU each, ray.cluster_utils):
    the whole search, and after its first batch. The exact reference runs first, untimed, as in the
    main job: it benchmarks every island size, so every worker starts with the planner's cache warm."""
    import ray
    from ray.cluster_utils import Cluster

    rates, steady = {}, {}
    for nodes in (1, 2):
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        tag = f"{nodes}{'-'.join(['', *extra])}{'-big' if gpus else ''}"  # the MLflow parent's name
        out = f"{tmp}/nodes{nodes}-{len(extra)}{'-big' if gpus else ''}"
        settings, ctx = context([f"out_root={out}", f"search.batch={batch}", f"search.iterations={n // batch}",
                                 "search.sampler=random", "search.reference=false", f"ray.address={cluster.address}",
                                 *extra], gpus)  # fmt: skip
        reference(settings, ctx, ctx.planner)
        ray.init(address=cluster.address, log_to_driver=False)
        tracker = Tracker(f"sqlite:///{tmp}/mlflow.db", "bench-nodes")
        run = Timed(settings, ctx, tracker)
        tracker.start_parent(f"nodes{tag}", {})
        t = time.perf_counter()
        run_tune(run, run_trial)
        rates[nodes] = n / (time.perf_counter() - t)
        done = sorted(set(run.done))
        steady[nodes] = (n - batch) / (done[-1] - done[0])
        seen = len({r.get("node") for r in run.records})
        ray.shutdown()
        cluster.shutdown()
        print(
            f"{nodes} node(s), 1 CPU each: {rates[nodes]:.2f} trials/s, {steady[nodes]:.2f} after the first batch "
            f"({n} trials, ran on {seen} node(s))"
        )
    print(
        f"2 nodes / 1 node: {rates[2] / rates[1]:.2f}x, after the first batch {steady[2] / steady[1]:.2f}x "
        "(the driver shares this 2-core machine with both nodes)"
    )


if __name__ == "__main__":
    main()

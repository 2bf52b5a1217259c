"""The exact reference of a search: the global optimum of the same model over every layout the
inventory allows (`solvers/exact.py`), built from the search's settings and planner.

It is the yardstick of every search (each trial's gap to it) and, as `search.sampler=exact`,
a planner of its own: the exact MILP's layout is the plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from costmodel.formulas import kv_link_gb_s
from pipeline.errors import ConfigError
from pipeline.forking import Forked, ctrl_c_noted, in_ray_worker, ray_up
from pipeline.planning.planner import Layout, Planner
from pipeline.records.journal import read_json, write_json
from pipeline.records.progress import Progress
from pipeline.search.settings import Settings
from pipeline.search.trial import Context
from solvers.exact import ExactResult, SizingOptima, TypeOptions, exact_optimum, sizing_optima, spare_optimum

if TYPE_CHECKING:
    from pipeline.search.trials import SearchRun

T = TypeVar("T")


def reference(
    settings: Settings,
    ctx: Context,
    planner: Planner,
    layouts: Mapping[str, tuple[tuple[int, ...], ...]] | None = None,
    backend: str = "HIGHS",
    tick: Callable[[], None] | None = None,
) -> ExactResult:
    """The exact optimum over every layout of the inventory, or, per type in `layouts`, over those
    island multisets only (`solvers/exact.py`, (6)).

    Ctrl-C while the candidate islands are benchmarked is noted and acted on between two of them
    (`ctrl_c_noted`): allocation-heavy benchmarks run Python's garbage collector often, and a
    KeyboardInterrupt raised inside one of its callbacks is dropped."""
    with ctrl_c_noted() if not in_ray_worker() else contextlib.nullcontext([]) as pressed:
        types, kv = type_options(settings, ctx, planner, layouts, stop=lambda: bool(pressed))
        limit = settings.search.reference_time_limit_s
        if pressed:
            result = None
        elif settings.search.reference_spare and layouts is None:  # the optimum with the worst host lost
            result = interruptible(spare_optimum, types, planner.ranges.p, time_limit_s=limit, backend=backend,
                                   tick=tick)  # fmt: skip
        else:
            result = interruptible(
                exact_optimum,
                types,
                planner.ranges.p,
                objective="rate_per_dollar" if settings.search.objective == "rate_per_dollar" else "max_rate",
                budget_per_hour=planner.budget_per_hour,
                kv_gb=kv,
                time_limit_s=limit,
                backend=backend,
                tick=tick,
            )
    if pressed or result is None:  # pressed while the islands were benchmarked, or between that and the solve
        raise KeyboardInterrupt
    return result


SAMPLED = 5  # island sizes per GPU type benchmarked to estimate what the reference's benchmarks cost
ESTIMATE_ABOVE = 1000  # island sizes in all, above which the estimate is worked out and printed
PREPARE_MAX_S = 1800.0  # the longest estimated benchmarking the search starts before its reference MILP


@dataclass(frozen=True)
class ReferenceCost:
    """What the exact reference's data costs before its MILP starts: every candidate island benchmarked."""

    sizes: int  # island sizes over every GPU type
    seconds: float  # estimated benchmark time
    bytes: float  # estimated memory the benchmarks keep

    def describe(self) -> str:
        return (f"the exact reference benchmarks {self.sizes:,} island sizes first: about "
                f"{self.seconds / 60:,.1f} min and {self.bytes / 1e9:,.1f} GB")  # fmt: skip


def reference_cost(settings: Settings, ctx: Context, planner: Planner) -> ReferenceCost:
    """The reference's benchmarking cost, from `SAMPLED` sizes of each type spread over its range (those
    benchmarks are cached in the planner: the reference does not pay for them again)."""
    sizes = {g.name: ctx.space.sizes(g.name) for g in settings.inventory.gpus}
    total = sum(len(v) for v in sizes.values())
    seconds = nbytes = 0.0
    for g, ss in sizes.items():
        if not ss:
            continue
        picks = sorted({ss[int(k)] for k in np.linspace(0, len(ss) - 1, min(SAMPLED, len(ss)))})
        t0 = time.perf_counter()
        benches = [planner.benchmark(g, int(n)) for n in picks]
        seconds += (time.perf_counter() - t0) / len(picks) * len(ss)
        nbytes += float(np.mean([_nbytes(b) for b in benches])) * len(ss)
    return ReferenceCost(total, seconds, nbytes)


def _nbytes(obj: Any) -> int:
    """Bytes of the arrays a (nested) dataclass holds."""
    out = 0
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        out += v.nbytes if isinstance(v, np.ndarray) else _nbytes(v) if dataclasses.is_dataclass(v) else 0
    return out


def type_options(
    settings: Settings,
    ctx: Context,
    planner: Planner,
    layouts: Mapping[str, tuple[tuple[int, ...], ...]] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> tuple[list[TypeOptions], np.ndarray | None]:
    """The reference's data: every GPU type's candidate islands with their benchmarks, and the KV
    GB of one request per range (None without the KV-transfer constraint). `stop()` is asked between
    two benchmarks: True ends the work early (the caller then raises)."""
    types = []
    for g, n in settings.inventory:
        sizes = np.array(ctx.space.sizes(g.name), dtype=int)  # node-aligned shapes unless search.shapes=any
        rates = []
        for s in sizes:  # at the load the SLOs allow, as the inner solve
            if stop():
                return types, None
            rates.append(planner.rates(g.name, int(s)))
        types.append(
            TypeOptions(
                g.name,
                n,
                g.price_per_hour,
                sizes,
                np.array([r[0] for r in rates]),
                np.array([r[1] for r in rates]),
                float(kv_link_gb_s(g, planner.profile)),
                None if layouts is None else layouts.get(g.name),
                np.array([planner.benchmark(g.name, int(s)).aggregated_req_s for s in sizes])
                if planner.cost.engine.aggregated
                else None,
                g.node_gpus,
            )
        )
    kv = (
        planner.kv_gb_per_range(Layout.of([(g.name, 1) for g in settings.inventory.gpus]))
        if planner.kv_transfer
        else None
    )
    return types, kv


def interruptible(fn: Callable[..., T], *args: Any, tick: Callable[[], None] | None = None, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a forked child process, so Ctrl-C stops it at once.

    A MILP solve runs in C++ for minutes and sees no Python signal until it returns; in a child
    the parent stays responsive, and on Ctrl-C kills the child and raises KeyboardInterrupt.
    Where fork is unavailable (or inside a Ray worker, whose process should not fork) it runs here.
    A process that has loaded JAX (the saasbo sampler's NUTS fits), or runs a Ray driver, must not
    fork either: their threads do not survive it. The child then starts from a fork server, a clean
    process, and is handed `fn` and its arguments pickled. `tick` is called while the parent waits (a progress display).
    """
    if "fork" not in mp.get_all_start_methods() or in_ray_worker():
        return fn(*args, **kwargs)
    method = "forkserver" if "jax" in sys.modules or ray_up() else "fork"
    return Forked(fn, *args, method=method, **kwargs).result(tick, "the exact reference's process")


def exact_layout(ref: ExactResult) -> Layout | None:
    """The layout of the exact optimum (None if the MILP found none)."""
    return Layout.of([(g, n) for g, n, _ in ref.islands]) if ref.islands else None


def available_memory() -> float:
    """Bytes of memory this machine has free for new work (MemAvailable; the total where that is not known)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


BURSTY = " under the workload's own arrivals (search.arrivals=workload; its Poisson rate is stated beside it)"


def sizing_reference(settings: Settings, ctx: Context, backend: str = "HIGHS",
                     tick: Callable[[], None] | None = None) -> SizingOptima:  # fmt: skip
    """objective min_cost: the exact answers for the demand (`solvers.exact.sizing_optima`: the most the inventory
    serves, its cheapest fleet serving the demand, and each GPU type's alone), in the search's model; ConfigError
    where the demand is above what the whole inventory serves. The cheapest fleets keep the demand with one host
    lost under search.reference=spare (a MILP per loss that binds: minutes on the Table 5.1 inventories); else
    they are those with every host up, a lower bound on the cheapest that keeps it with a host lost."""
    demand = settings.search.demand_req_s
    assert demand is not None
    with ctrl_c_noted() if not in_ray_worker() else contextlib.nullcontext([]) as pressed:
        types, kv = type_options(settings, ctx, ctx.planner, stop=lambda: bool(pressed))
        found = None if pressed else interruptible(
            sizing_optima, types, ctx.planner.ranges.p, demand, kv_gb=kv, spare=settings.search.reference_spare,
            time_limit_s=settings.search.reference_time_limit_s, backend=backend, tick=tick)  # fmt: skip
    if pressed or found is None:
        raise KeyboardInterrupt
    if found.cheapest is None and found.most.status in ("optimal", "feasible"):
        most = "at most" if found.most.status == "optimal" else "no more than"
        raise ConfigError(f"search.demand_req_s={demand:g} is more than inventory {settings.inventory.name} serves "
                          f"within the SLOs: {most} {found.most_req_s:.2f} req/s (the exact optimum of every layout, "
                          f"in the search's model): lower the demand, or add GPUs to the inventory "
                          "(+inventory=market: every GPU type the project knows)")  # fmt: skip
    return found


def run_reference(run: SearchRun, settings: Settings, ctx: Context) -> ExactResult | None:
    """A search's exact reference: reference.json of a resumed run, else solved now (when the search has one),
    and the console's line on what it proves. objective min_cost: the sizing reference, always (it checks the
    demand), solved again on resume (a few MILPs)."""
    if settings.search.demand_req_s is not None:
        return _run_sizing(run, settings, ctx)
    path = run.dir / "reference.json"
    saved = read_json(path, "the exact reference (it is solved again)")
    if saved is not None:
        try:
            return ExactResult(**{**saved, "islands": tuple(tuple(t) for t in saved["islands"])})
        except (TypeError, KeyError) as err:
            print(f"[search] warning: {path} is not a reference this version wrote ({err}): solving it again",
                  file=sys.stderr, flush=True)  # fmt: skip
    if not (settings.search.reference or settings.mode in ("exact", "replan")):  # a re-plan is judged against it
        return None
    if sum(len(ctx.space.sizes(g.name)) for g in settings.inventory.gpus) > ESTIMATE_ABOVE:
        cost = reference_cost(settings, ctx, ctx.planner)
        free = available_memory()
        print(f"[search] {settings.inventory.total_gpus:,} GPUs: {cost.describe()} ({free / 1e9:,.1f} GB free)",
              flush=True)  # fmt: skip
        fixes = ("set search.reference=false (the search alone, without a gap), raise search.min_island (fewer "
                 "island sizes)")  # fmt: skip
        if cost.bytes > 0.8 * free:
            raise ConfigError(f"{cost.describe()}, more than the {free / 1e9:,.1f} GB this machine has free: "
                              f"{fixes}, or plan on a machine with more memory")  # fmt: skip
        if cost.seconds > PREPARE_MAX_S:
            raise ConfigError(f"{cost.describe()}, past the {PREPARE_MAX_S:,.0f} s a search waits for its "
                              f"reference's data: {fixes}, or plan fewer GPUs")  # fmt: skip
    limit = settings.search.reference_time_limit_s
    print(f"[search] solving the exact reference MILP (at most {limit:g} s; Ctrl-C stops the search) ...", flush=True)
    bar = Progress("search", "exact reference MILP", limit, "s", every_s=15.0)
    ref = reference(settings, ctx, ctx.planner, tick=lambda: bar.update(
        bar.elapsed, f"exact reference: {bar.elapsed:.0f} s of at most {limit:g} s"))  # fmt: skip
    bar.close()
    run.ref = ref
    print(f"[search] {_proves(ref, settings, ctx)}", flush=True)
    write_json(path, {**ref.__dict__, "islands": [list(t) for t in ref.islands]})
    return ref


def _proves(ref: ExactResult, settings: Settings, ctx: Context) -> str:
    """What the exact reference proves, in the console's words."""
    spare, took = settings.search.spare_hosts, f"{ref.solve_ms / 1e3:.1f} s"
    if ref.lost_hosts and ref.status == "feasible":
        return (f"exact reference with the worst host lost stopped at its time limit ({took}): the optimum is between "
                f"{ref.rate_req_s:.2f} and {ref.bound:.2f} req/s; gaps below are against the upper end")
    if ref.lost_hosts:
        return (f"exact optimum {ref.rate_req_s:.2f} req/s with the worst host lost ({ref.status}, {took}, "
                f"{ref.iterations} MILPs) in the search's model")
    if spare:
        bound = ref.bound if ref.status == "feasible" else ref.rate_req_s
        return (f"exact optimum {bound:.2f} req/s with every host up ({ref.status}, {took}): no layout keeps more "
                f"with {spare} host{'s' if spare > 1 else ''} lost, so gaps below are against this bound")
    if ref.status == "feasible" and settings.search.objective == "max_rate":  # stopped by its time limit: a layout
        return (f"exact reference stopped at its time limit ({took}): the optimum is between {ref.rate_req_s:.2f} "
                f"and {ref.bound:.2f} req/s in the search's model; gaps below are against the upper end (raise "
                "search.reference_time_limit_s to close it)")
    return (f"exact optimum {ref.rate_req_s:.2f} req/s at ${ref.cost_per_hour:,.0f}/h ({ref.status}, {took}) in the "
            f"search's model: each island kept at the load whose queue meets the SLOs for the whole workload's "
            f"mix{BURSTY if ctx.planner.arrivals is not None else ''}")


def _run_sizing(run: SearchRun, settings: Settings, ctx: Context) -> ExactResult | None:
    """objective min_cost's reference: the sizing optima (sizing.json), the cheapest fleet as the reference
    (reference.json), and the console's lines."""
    limit = settings.search.reference_time_limit_s
    print(f"[search] sizing: the most the inventory serves and its cheapest fleet for "
          f"{settings.search.demand_req_s:g} req/s, exact MILPs (at most {limit:g} s) ...", flush=True)  # fmt: skip
    bar = Progress("search", "sizing MILPs", limit, "s", every_s=15.0)
    found = sizing_reference(settings, ctx, tick=lambda: bar.update(bar.elapsed, f"sizing: {bar.elapsed:.0f} s"))
    bar.close()
    run.sizing, ref = found, found.cheapest
    write_json(run.dir / "sizing.json", sizing_json(found))
    if ref is not None and ref.status == "infeasible" and found.spare:
        raise ConfigError(f"search.demand_req_s={found.demand_req_s:g}: inventory {settings.inventory.name} serves at "
                          f"most {found.most_req_s:.2f} req/s with every host up, but no fleet of it serves "
                          f"{found.demand_req_s:g} with any one host lost: lower the demand, add GPUs, or plan with "
                          "every host up (search.spare_hosts=0)")  # fmt: skip
    if ref is None or ref.status not in ("optimal", "feasible"):
        print(f"[search] sizing: no exact reference ({(ref or found.most).status} at the time limit): raise "
              "search.reference_time_limit_s for a gap", flush=True)  # fmt: skip
        return None
    run.ref = ref
    write_json(run.dir / "reference.json", {**ref.__dict__, "islands": [list(t) for t in ref.islands]})
    took = f"{(found.most.solve_ms + ref.solve_ms) / 1e3:.1f} s"
    lost = " with any one host lost" if found.spare else ""
    if settings.search.spare_hosts and not found.spare:
        lost = " with every host up (a bound: the search plans for a host lost)"
    cheapest = (f"${ref.cost_per_hour:,.2f}/h" if ref.status == "optimal" else
                f"between ${ref.bound:,.2f}/h and ${ref.cost_per_hour:,.2f}/h (time limit)")  # fmt: skip
    print(f"[search] sizing: the inventory serves at most {found.most_req_s:.2f} req/s; its cheapest fleet for "
          f"{found.demand_req_s:g} req/s{lost} costs {cheapest} of its ${settings.inventory.cost_per_hour:,.2f}/h "
          f"(exact, {took}, in the search's model)", flush=True)  # fmt: skip
    return ref


def sizing_json(found: SizingOptima) -> dict[str, Any]:
    """sizing.json: the demand, the most the inventory serves, and the cheapest fleet per GPU mix ($/h, null where
    the mix cannot serve the demand)."""
    return {
        "demand_req_s": found.demand_req_s,
        "most_req_s": found.most_req_s,
        "cheapest_per_hour": found.cheapest.cost_per_hour if found.cheapest else None,
        "mixes": {k: r.cost_per_hour if r.status in ("optimal", "feasible") else None
                  for k, r in found.mixes.items()},
    }

"""Scoring one trial: parameters -> layout -> inner solve -> full-resolution evaluation -> metrics.

Pure of Ray, MLflow and files: `run_trial` is what a Ray Tune trial calls, what the in-process
`ask_tell` loop of experiments and benchmarks calls, and what tests call directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna

from pipeline.planning.failures import spare_solve
from pipeline.planning.goodput import GoodputCheck, layout_goodput
from pipeline.planning.planner import Layout, Planner
from pipeline.planning.sizing import Sizer, demand_score, short_score
from pipeline.search.space import Space
from solvers.layouts import LayoutRejected

OK = ("optimal", "feasible")  # statuses of a trial with a usable layout


@dataclass(frozen=True)
class Context:
    """What a trial needs, shipped once to every Ray worker."""

    planner: Planner  # shipped with the driver's cache; each worker process keeps the first copy it sees
    space: Space
    objective: str
    inner_time_limit_s: float
    key: str  # identity of the planner inputs (config hash)
    backend: str = "AUTO"  # inner MILP solver
    goodput: GoodputCheck | None = None  # objective goodput: how each layout is simulated
    spare_hosts: int = 0  # score a layout by its lowest rate with any this many hosts lost (0: all up)
    demand_req_s: float | None = None  # objective min_cost: score a layout by the cheapest of its islands serving it
    inventory_cost_per_hour: float = 0.0  # ... and one that cannot serve it by its rate per $/h of the whole inventory


_PLANNERS: dict[str, Planner] = {}  # per process: survives Ray Tune's actor reuse


def planner_for(ctx: Context) -> Planner:
    return _PLANNERS.setdefault(ctx.key, ctx.planner)


METRICS = (
    "score",
    "rate_req_s",
    "evaluated_req_s",
    "prefill_req_s",
    "decode_req_s",
    "deviation",
    "cost_per_hour",
    "rate_per_dollar",
    "solve_ms",
    "trial_ms",
    "n_islands",
)
# objective goodput only: the simulated and analytic rates; search.spare_hosts only: the rate with the worst hosts lost
GOODPUT_METRICS = ("simulated_req_s", "stated_req_s", "spare_req_s")
TrialFn = Callable[[Context, Mapping[str, Any]], dict]  # run_trial, or a test's stand-in for it


def run_trial(ctx: Context, params: Mapping[str, Any]) -> dict[str, Any]:
    """Score one parameter set: layout -> inner solve -> full-resolution evaluation."""
    t0 = time.perf_counter()
    try:
        islands = ctx.space.layout(params)
    except LayoutRejected as err:
        return unscored("rejected", str(err), t0)
    if not islands:
        return unscored("empty", "no island fits", t0)
    return score_layout(ctx, Layout.of(islands), t0)


def layout_key(ctx: Context, params: Mapping[str, Any]) -> str | None:
    """The key of the layout `params` propose (None: rejected or empty, which cost nothing to score)."""
    try:
        islands = ctx.space.layout(params)
    except LayoutRejected:
        return None
    return Layout.of(islands).key if islands else None


REUSED = "the layout of an earlier trial: its result, not scored again"


def unscored(status: str, note: str, t0: float) -> dict[str, Any]:
    """The record of a trial without a usable layout (rejected, empty, failed)."""
    return {**dict.fromkeys(METRICS, 0.0), "status": status, "islands": "", "note": note, "trial_ms": _ms(t0)}


def score_layout(ctx: Context, layout: Layout, t0: float | None = None) -> dict[str, Any]:
    """Inner solve and full-resolution evaluation of one layout; `t0` is when the trial started."""
    t0 = time.perf_counter() if t0 is None else t0
    planner = planner_for(ctx)
    if ctx.demand_req_s is not None:
        return _sized(ctx, planner, layout, t0)
    inner = "thesis" if ctx.objective == "thesis" else "max_rate"
    prob, sol = planner.solve(layout, inner, ctx.inner_time_limit_s, backend=ctx.backend)
    shape = {"islands": layout.key, "solve_ms": sol.solve_ms, "n_islands": float(len(layout.islands))}
    if sol.status not in OK:  # e.g. the inner solve ran out of time with no solution
        return {**unscored(sol.status, f"inner {inner} solve: {sol.status} after {sol.solve_ms:.0f} ms", t0), **shape}
    ev, _ = planner.evaluate(layout, prob, sol)
    in_use = _in_use(sol)
    cost = float(planner.cost_per_hour(layout)[in_use].sum())
    per_dollar = sol.rate_req_s / cost if cost > 0 else 0.0
    score = per_dollar if ctx.objective == "rate_per_dollar" else sol.rate_req_s
    extra = {}
    if ctx.spare_hosts:  # the lowest rate with any `spare_hosts` hosts lost replaces the rate with all up
        spare = spare_solve(planner, layout, ctx.spare_hosts, ctx.inner_time_limit_s, ctx.backend)
        if spare.status == "time_limit":  # no roles found in time: not scored as keeping nothing, and said so
            out = unscored("time_limit", f"roles with {ctx.spare_hosts} host(s) lost: time_limit after "
                           f"{spare.solve_ms:.0f} ms, no solution (search.inner_time_limit_s)", t0)  # fmt: skip
            return {**out, **shape, "rate_req_s": sol.rate_req_s, "cost_per_hour": cost}
        score = spare.rate_req_s / cost if ctx.objective == "rate_per_dollar" and cost > 0 else spare.rate_req_s
        extra = {"spare_req_s": spare.rate_req_s}
    if ctx.objective == "goodput":  # the simulator's verdict replaces the analytic rate as the score
        check = ctx.goodput or GoodputCheck()
        score, plan = layout_goodput(planner, layout, check, ctx.inner_time_limit_s, ctx.backend)
        extra = {"simulated_req_s": score, "stated_req_s": plan.rate_req_s}
    return {
        "status": sol.status,
        "score": score,
        "rate_req_s": sol.rate_req_s,
        "evaluated_req_s": ev.rate_req_s,
        "prefill_req_s": sol.prefill_req_s,
        "decode_req_s": sol.decode_req_s,
        "deviation": sol.deviation,
        "cost_per_hour": cost,
        "rate_per_dollar": per_dollar,
        "solve_ms": sol.solve_ms,
        "trial_ms": _ms(t0),
        "n_islands": float(len(layout.islands)),
        "islands": layout.key,
        "note": "",
        **extra,
    }


def _sized(ctx: Context, planner: Planner, layout: Layout, t0: float) -> dict[str, Any]:
    """objective min_cost: the cheapest of the layout's islands serving the demand (`pipeline.planning.sizing`),
    scored by the demand per $/h they cost; a layout that cannot serve it is `short`, scored by how close it
    comes (below every layout that serves it) and never the plan."""
    assert ctx.demand_req_s is not None
    fleet = Sizer(planner, ctx.demand_req_s, ctx.inner_time_limit_s, ctx.backend, ctx.spare_hosts).cheapest(layout)
    status, note, rate, cost = fleet.status, "", ctx.demand_req_s, fleet.cost_per_hour
    if status == "infeasible":  # how much it serves (with its worst hosts lost, where it plans for them): the score
        if ctx.spare_hosts:
            rate = spare_solve(planner, layout, ctx.spare_hosts, ctx.inner_time_limit_s, ctx.backend).rate_req_s
        else:
            rate = planner.solve(layout, "max_rate", ctx.inner_time_limit_s, backend=ctx.backend)[1].rate_req_s
        lost = f" with its worst {ctx.spare_hosts} host{'s' if ctx.spare_hosts > 1 else ''} lost" \
            if ctx.spare_hosts else ""  # fmt: skip
        status, note = "short", f"serves {rate:.2f} req/s{lost} of the {ctx.demand_req_s:g} demanded"
    if status not in OK and status != "short":
        out = unscored(status, f"inner min_cost solve: {status} after {fleet.solve_ms:.0f} ms", t0)
        return {**out, "islands": layout.key, "solve_ms": fleet.solve_ms, "n_islands": float(len(layout.islands))}
    score = (short_score(rate, ctx.inventory_cost_per_hour) if status == "short"
             else demand_score(ctx.demand_req_s, cost))  # fmt: skip
    return {
        "status": status,
        "score": score,
        "rate_req_s": rate,
        "evaluated_req_s": rate,
        "prefill_req_s": rate,
        "decode_req_s": rate,
        "deviation": 0.0,
        "cost_per_hour": cost,
        "rate_per_dollar": rate / cost if cost > 0 else 0.0,
        "solve_ms": fleet.solve_ms,
        "trial_ms": _ms(t0),
        "n_islands": float(len(layout.islands)),
        "islands": layout.key,
        "note": note,
    }


def _in_use(sol: Any) -> np.ndarray:
    """Islands that serve traffic (an island that cannot hold the model, or is left idle, costs nothing)."""
    return (sol.x_prefill.sum(axis=1) + sol.x_decode.sum(axis=1)) > 1e-9


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def guarded(ctx: Context, params: Mapping[str, Any], trial_fn: TrialFn | None = None) -> dict[str, Any]:
    """`run_trial` (or `trial_fn`), with an exception recorded as a failed trial: one layout's
    failure, not the worker's, so it is recorded and never retried."""
    t0 = time.perf_counter()
    try:
        return (trial_fn or run_trial)(ctx, params)
    except Exception as err:  # one layout's failure must not end the search
        return unscored("error", f"{type(err).__name__}: {err}"[:500], t0)


def ask_tell(ctx: Context, sampler: Any, evals: int, batch: int) -> list[dict[str, Any]]:
    """`evals` trials in one process, `batch` proposals asked and told back together.

    The sampler sees exactly what it sees under Ray Tune (`pipeline.search.tune.batch.BatchSearcher`);
    experiments that repeat whole searches run one of these per Ray task.
    """
    study = optuna.create_study(direction="maximize", sampler=sampler)
    dists = ctx.space.distributions()
    results: list[dict[str, Any]] = []
    while len(results) < evals:
        trials = [study.ask(dists) for _ in range(min(batch, evals - len(results)))]
        outs = [{**guarded(ctx, t.params), "params": dict(t.params)} for t in trials]
        for t, out in zip(trials, outs, strict=True):
            if out["status"] == "error":
                study.tell(t, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(t, out["score"])
        results += outs
    return results

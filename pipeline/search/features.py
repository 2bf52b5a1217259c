"""The ways of planning a search can turn on, each declared once with what it needs and what it cannot go with.

A `Feature` is a setting as a user writes it (`search.spare_hosts=K`), when it is on, what it does, what must
hold beside it (`needs`: a condition and how to meet it) and the other features it cannot go with (`excludes`,
by their settings). `check_features` refuses the first conflict in one line, naming both settings and why; a new
feature is one entry of `FEATURES`, its conflicts declared on it, not a refusal written for every pair.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.errors import ConfigError


@dataclass(frozen=True)
class Choices:
    """What the features are decided by: the search's settings as read, before anything is benchmarked."""

    objective: str
    sampler: str
    workload: str
    budget: bool  # search.budget_per_hour is set
    kv_transfer: bool
    aggregated: bool  # costmodel.aggregated
    arrivals: str
    trace: bool  # the workload has its trace's arrival model
    slo: bool  # latency targets are set
    spare_hosts: int
    from_plan: bool
    robust: bool
    calibrated: bool  # the cost model has a calibration with an uncertainty


@dataclass(frozen=True)
class Feature:
    setting: str  # as a user writes it, `{field}` of the Choices in its value (search.spare_hosts={spare_hosts})
    on: Callable[[Choices], bool]
    does: str = ""  # what it does, after its setting ("search.spare_hosts=K plans ...")
    needs: tuple[tuple[Callable[[Choices], bool], str], ...] = ()  # (what must hold, how to make it hold)
    excludes: tuple[str, ...] = ()  # settings of the features it cannot go with


FEATURES: tuple[Feature, ...] = (
    Feature("search.objective=thesis", lambda c: c.objective == "thesis",
            "maximises the thesis's objective, which has no budget or KV-transfer constraint",
            excludes=("search.budget_per_hour", "search.kv_transfer=true")),
    Feature("search.objective=goodput", lambda c: c.objective == "goodput",
            "scores each layout by the requests the simulator serves within the SLOs, under Poisson arrivals",
            needs=((lambda c: c.slo, "set the slo block (slo=null plans for throughput only; use "
                                      "objective=max_rate there)"),)),
    Feature("search.arrivals=workload", lambda c: c.arrivals == "workload",
            "plans disaggregated islands by the queueing model under the workload's bursts",
            needs=((lambda c: c.trace, "workload {workload} has no trace's arrival model (a synthetic one): use "
                                       "search.arrivals=poisson"),),
            excludes=("costmodel.aggregated=true", "search.objective=goodput")),
    Feature("search.spare_hosts={spare_hosts}", lambda c: c.spare_hosts > 0,
            "scores each trial's layout by its rate with its worst hosts lost, with prefill and decode roles for every "
            "island",
            excludes=("search.from_plan", "costmodel.aggregated=true", "search.budget_per_hour",
                      "search.kv_transfer=true", "search.sampler=exact", "search.objective=thesis",
                      "search.objective=goodput")),
    Feature("search.robust=true", lambda c: c.robust,
            "plans for the pessimistic end of the calibration's range",
            needs=((lambda c: c.calibrated, "add costmodel.calibration=published (or a file of yours from python -m "
                                            "costmodel.calibrate): this cost model has no range"),)),
    Feature("search.from_plan", lambda c: c.from_plan, "re-plans a running plan with few moves, scored by its rate",
            excludes=("search.objective=rate_per_dollar", "search.objective=goodput", "search.objective=thesis",
                      "search.objective=min_cost")),
    Feature("search.objective=rate_per_dollar", lambda c: c.objective == "rate_per_dollar",
            "scores each layout by its rate per $/h"),
    Feature("search.objective=min_cost", lambda c: c.objective == "min_cost",
            "finds the cheapest fleet of the inventory that serves a demand",
            excludes=("search.budget_per_hour",)),
    Feature("search.sampler=exact", lambda c: c.sampler == "exact", "plans with the exact MILP, every host up"),
    Feature("search.budget_per_hour", lambda c: c.budget),
    Feature("search.kv_transfer=true", lambda c: c.kv_transfer),
    Feature("costmodel.aggregated=true", lambda c: c.aggregated,
            "lets islands run aggregated engines, whose SLO model is Poisson's"),
)  # fmt: skip
BY_SETTING = {f.setting: f for f in FEATURES}


def excluded_by(f: Feature, c: Choices) -> str:
    """The first setting that is on among those `f` cannot go with ("" if none)."""
    values = dataclasses.asdict(c)
    return next((other.format(**values) for other in f.excludes if BY_SETTING[other].on(c)), "")


def check_features(c: Choices, features: tuple[Feature, ...] = FEATURES) -> None:
    """ConfigError for the first feature that is on without what it needs, or with one it excludes."""
    by_setting = {f.setting: f for f in features}
    values = dataclasses.asdict(c)
    for f in features:
        if not f.on(c):
            continue
        setting = f.setting.format(**values)
        for holds, fix in f.needs:
            if not holds(c):
                raise ConfigError(f"{setting} {f.does}: {fix.format(**values)}")
        for other in f.excludes:
            g = by_setting[other]
            if g.on(c):
                with_it = f"{other.format(**values)} {g.does}" if g.does else f"it cannot go with {other}"
                raise ConfigError(f"{setting} {f.does}; {with_it}: drop one of the two")

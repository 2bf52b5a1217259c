"""How far to trust a plan's rate: its layout re-planned under draws of the cost model's calibration.

A calibration (costmodel/calibration.py) gives each component factor a lognormal uncertainty: the
fit's where the component was measured on that GPU, the prior's where it was not. `rate_band`
draws `n` calibrations from it, solves the plan's layout under each (same workload, SLOs and
ranges; roles and routing re-optimised, as a team would re-tune the router after measuring), and
reports the 10th, 50th and 90th percentile of those rates, scaled onto the plan's headline (the
draws use the search's whole-mix model; the headline routes each island its own mix, and the
ratio of the two carries over).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from costmodel.calibration import Calibration
from pipeline.forking import Forked, forkable
from pipeline.planning.planner import Layout, Planner
from plan import Band


def redrawn(planner: Planner, cal: Calibration) -> Planner:
    """`planner` with its cost model under calibration `cal` (fresh caches)."""
    cost = dataclasses.replace(planner.cost, profile=planner.profile.calibrated(cal))
    return planner.with_cost(cost)


def rate_band(
    planner: Planner,
    layout: Layout,
    headline_req_s: float,
    searched_req_s: float,
    cal: Calibration | None,
    draws: int,
    *,
    time_limit_s: float,
    backend: str = "AUTO",
    seed: int = 0,
) -> Band | None:
    """The 10th, 50th and 90th percentile rate; None without an uncertain calibration or draws."""
    if cal is None or not cal.uncertain or draws < 1 or searched_req_s <= 0:
        return None
    cals = cal.draws(draws, seed)
    half = len(cals) // 2
    # the second half of the draws in a child process beside this one where this process may fork (each draw
    # benchmarks the layout's islands afresh: seconds); the rates in the draws' order either way
    other = Forked(_rates, planner, layout, cals[half:], time_limit_s, backend) if forkable() and half else None
    rates = _rates(planner, layout, cals if other is None else cals[:half], time_limit_s, backend)
    if other is not None:
        rates += other.result(what="the rate band's second half")
    scale = headline_req_s / searched_req_s
    q = np.quantile(np.asarray(rates), [0.1, 0.5, 0.9]) * scale
    return Band(float(q[0]), float(q[1]), float(q[2]), draws, cal.name)


def _rates(planner: Planner, layout: Layout, cals: list[Calibration], time_limit_s: float, backend: str) -> list[float]:
    """The layout's max_rate under each calibration in `cals`."""
    return [redrawn(planner, c).solve(layout, "max_rate", time_limit_s, backend=backend)[1].rate_req_s for c in cals]

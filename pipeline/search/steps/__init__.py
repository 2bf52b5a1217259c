"""What a search does with its plan after the trials: one module a step, one line a step in `STEPS`.

`STEPS` is in report order: report.md's rows under the rate, the MLflow metrics and the console's closing lines
follow it; `run_steps` (runner.py) runs them by stage, then in this order. A new step: a module with a `PlanStep`
(base.py) and a line here; tests/test_steps.py runs it through the family's contract.
"""

from typing import Any

from pipeline.search.steps.band import RateBand
from pipeline.search.steps.base import PlanStep, StepContext
from pipeline.search.steps.bursts import WorkloadBursts
from pipeline.search.steps.check import Check
from pipeline.search.steps.losses import Losses
from pipeline.search.steps.replan import Replanned

STEPS: tuple[PlanStep, ...] = (Check(), RateBand(), Losses(), WorkloadBursts(), Replanned())  # the headline's order


def read_steps(search: Any) -> dict[str, Any]:
    """Every step's own settings from the config's `search` group (`Settings.steps`), each checked."""
    return {s.name: s.read(search) for s in STEPS}


def step(name: str) -> PlanStep:
    """The step called `name`."""
    for s in STEPS:
        if s.name == name:
            return s
    raise ValueError(f"unknown post-search step {name!r}; choose from {sorted(s.name for s in STEPS)}")


__all__ = ["STEPS", "PlanStep", "StepContext", "read_steps", "step"]

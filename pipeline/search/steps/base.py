"""The base of a post-search step: what a search does with its plan after the trials.

A step is one module of this folder and one line of `STEPS` (pipeline/search/steps/__init__.py). It reads its own
settings from the config's `search` group (`read`; conf/search/divider.yaml lists them), computes one record of
the plan (`field`: the rate band, the host losses, the simulated check, ...) and says what it found in
every place a reader looks: the console (`announce`, `lines`, `summary`, `scored`), MLflow (`metrics`) and
report.md (`rows`, `sections`). Every hook but `compute` has a default that does nothing, so a step overrides only
what it has to say; `run_steps` (pipeline/search/steps/runner.py) never changes when a step is added.

`tests/test_steps.py` holds every step of `STEPS` to one contract: its record round-trips through plan.json, its
metrics are finite numbers, its rows render, and the setting it names in `off` turns it off.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from plan import Plan

if TYPE_CHECKING:
    from pipeline.planning.planner import Layout
    from pipeline.planning.simulation import RequestMix
    from pipeline.search.settings import Settings
    from pipeline.search.trial import Context
    from pipeline.search.trials import SearchRun


@dataclass(frozen=True)
class StepContext:
    """What a step reads besides the plan: the search's settings, its trial context (whose planner scored the
    trials), the context of the plan's own rates (Poisson arrivals: what the steps re-plan and simulate with), the
    plan's layout and the run (its exact reference, and a re-plan's result)."""

    settings: Settings
    ctx: Context
    rates: Context
    layout: Layout
    run: SearchRun

    @property
    def mix(self) -> RequestMix:
        """The workload's requests, as the simulator draws them."""
        from pipeline.planning.simulation import RequestMix

        return RequestMix.of(self.ctx.planner.workload)


class PlanStep:
    """One step after the trials; its record is the plan's `field`."""

    name: ClassVar[str]  # its name in STEPS and in messages
    field: ClassVar[str]  # the Plan field its record fills
    what: ClassVar[str]  # what it computes, in the console's words ("the rate band")
    off: ClassVar[str]  # the override that turns it off, as a user writes it ("search.band_draws=0")
    # the overrides that turn it on, for the contract suite ("{plan}": a plan.json it may start from)
    on: ClassVar[tuple[str, ...]] = ()
    # steps run by stage (0: reshape the plan; 1: judge it; 2: after those), then in STEPS order
    stage: ClassVar[int] = 1
    forks: ClassVar[bool] = False  # may run in a forked process beside the other steps of its stage
    # Ctrl-C while it runs keeps the plan without its record and the steps after it (False: it ends the search)
    interruptible: ClassVar[bool] = True

    def read(self, search: Any) -> Any:
        """Its own settings from the config's `search` group, each checked (ConfigError names the key): read once,
        at the edge, with every other setting (`Settings.steps[name]`). None: it has none."""
        return None

    def options(self, sc: StepContext) -> Any:
        """What `read` gave for this search."""
        return sc.settings.steps[self.name]

    def wanted(self, plan: Plan, sc: StepContext) -> bool:
        """Does this search run the step on this plan?"""
        return True

    def announce(self, plan: Plan, sc: StepContext) -> str | None:
        """A console line before it runs (a long step says what it does)."""
        return None

    def compute(self, plan: Plan, sc: StepContext) -> Any:
        """Its record for `plan` (None: nothing to add). Where `forks`, this runs in a child process."""
        raise NotImplementedError

    def attach(self, plan: Plan, record: Any) -> Plan:
        """`plan` with its record in place."""
        return dataclasses.replace(plan, **{self.field: record})

    def lines(self, plan: Plan, sc: StepContext, seconds: float) -> list[str]:
        """Console lines once it ran (`seconds` it took); a line starting `warning:` goes to stderr."""
        return []

    def scored(self, plan: Plan, sc: StepContext) -> str | None:
        """Where this step changed what the trials scored, the closing line that says so (the search otherwise
        closes with its model's score and the gap)."""
        return None

    def summary(self, plan: Plan, sc: StepContext) -> list[str]:
        """Lines the search closes with, after the plan's own."""
        return []

    def metrics(self, plan: Plan) -> dict[str, float]:
        """MLflow metrics of the search's parent run."""
        return {}

    def rows(self, plan: Plan) -> list[str]:
        """report.md rows under the plan's rate (`| what | value |`)."""
        return []

    def sections(self, plan: Plan) -> list[str]:
        """report.md lines after the node map (a section of its own)."""
        return []

    def record(self, plan: Plan) -> Any:
        """Its record in `plan` (None where it did not run)."""
        return getattr(plan, self.field)

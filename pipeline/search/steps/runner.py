"""Running the post-search steps on a plan: `run_steps`, and what the search's records take from them.

Steps run by stage, then in their order in `STEPS`, those that may fork (`forks`) after the others. Such a
step runs in a child process beside the others of its stage where this process may fork (no thread beside the
main one: not after Ray or JAX started theirs); its record, and what it prints, are those of running them in
turn. Ctrl-C during an `interruptible` step (every step but the re-plan's) stops it and the steps after it: the
plan keeps the records that finished and the console names those it is written without. During any other step it
ends the search (the trials kept, a KILLED run).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.forking import Forked, forkable
from pipeline.search.steps.base import PlanStep, StepContext
from plan import Plan


def say(line: str) -> None:
    """One console line of the search (`warning:` lines to stderr)."""
    out = sys.stderr if line.startswith("warning:") else sys.stdout
    print(f"[search] {line}", file=out, flush=True)


class Stopped(Exception):
    """Ctrl-C in an interruptible step: the plan so far, without the records of the steps not finished."""

    def __init__(self, plan: Plan) -> None:
        super().__init__("stopped by Ctrl-C")
        self.plan = plan


def run_steps(steps: Sequence[PlanStep], plan: Plan, sc: StepContext) -> Plan:
    """`plan` with the record of every step it wants, each step's lines printed as it finishes. Ctrl-C in an
    interruptible step stops it and every step after it: `Stopped` carries the plan with what finished, the console
    has said what did not."""
    for stage in sorted({s.stage for s in steps}):
        try:
            plan = _stage(plan, sc, [s for s in steps if s.stage == stage and s.wanted(plan, sc)])
        except Stopped as stop:
            missing = [s.what for s in steps if s.stage >= stage and s.wanted(stop.plan, sc) and
                       s.record(stop.plan) is None]  # fmt: skip
            print(f"[search] stopped by Ctrl-C: plan.json is written without {', '.join(missing)}", file=sys.stderr,
                  flush=True)  # fmt: skip
            raise
    return plan


def _stage(plan: Plan, sc: StepContext, now: list[PlanStep]) -> Plan:
    """The steps of one stage: those that may fork beside the others (where this process may fork), then the
    others in order, then the forked ones collected, in order, as if run in turn."""
    alone, forks = [s for s in now if not s.forks], [s for s in now if s.forks]
    beside = forks if alone and forkable() else []
    pending: dict[str, tuple[Forked, float]] = {}
    try:
        for s in beside:
            _announce(s, plan, sc)
            pending[s.name] = (Forked(s.compute, plan, sc), time.perf_counter())
        for s in alone:
            plan = _run(s, plan, sc)
        for s in forks:  # after the others, forked or not: the same lines in the same order
            if s.name in pending:
                job, t0 = pending.pop(s.name)
                plan = _finish(s, plan, sc, job.result, t0)
            else:
                plan = _run(s, plan, sc)
    finally:
        for job, _ in pending.values():
            job.kill()
    return plan


def _announce(s: PlanStep, plan: Plan, sc: StepContext) -> None:
    line = s.announce(plan, sc)
    if line:
        say(line)


def _run(s: PlanStep, plan: Plan, sc: StepContext) -> Plan:
    _announce(s, plan, sc)
    return _finish(s, plan, sc, lambda: s.compute(plan, sc), time.perf_counter())


def _finish(s: PlanStep, plan: Plan, sc: StepContext, record_of: Callable[[], Any], t0: float) -> Plan:
    try:
        record = record_of()
    except KeyboardInterrupt:
        if not s.interruptible:
            raise
        print(f"[search] Ctrl-C: {s.what} stopped", file=sys.stderr, flush=True)
        raise Stopped(plan) from None
    if record is not None:
        plan = s.attach(plan, record)
    for line in s.lines(plan, sc, time.perf_counter() - t0):
        say(line)
    return plan


def step_metrics(steps: Sequence[PlanStep], plan: Plan) -> dict[str, float]:
    """Every step's MLflow metrics of `plan`."""
    return {k: v for s in steps for k, v in s.metrics(plan).items()}


def step_rows(steps: Sequence[PlanStep], plan: Plan) -> tuple[list[str], list[str]]:
    """(report.md rows under the rate, report.md sections after the node map) of every step."""
    return [r for s in steps for r in s.rows(plan)], [line for s in steps for line in s.sections(plan)]

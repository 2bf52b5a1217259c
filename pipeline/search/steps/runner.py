"""Running the post-search steps on a plan: `run_steps`, and what the search's records take from them.

Steps run by stage, then in their order in `STEPS`, those that may fork (`forks`) after the others. Such a
step runs in a child process beside the others of its stage where this process may fork (no thread beside the
main one: not after Ray or JAX started theirs); its record, and what it prints, are those of running them in
turn. Ctrl-C during an `interruptible` step keeps the plan without its record; during any other, it ends the
search (kept trials, a KILLED run).
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


def run_steps(steps: Sequence[PlanStep], plan: Plan, sc: StepContext) -> Plan:
    """`plan` with the record of every step it wants, each step's lines printed as it finishes."""
    for stage in sorted({s.stage for s in steps}):
        now = [s for s in steps if s.stage == stage and s.wanted(plan, sc)]
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
        except BaseException:
            for job, _ in pending.values():
                job.kill()
            raise
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
        print(f"[search] {s.what} was interrupted: plan.json is written without it", file=sys.stderr, flush=True)
        return plan
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

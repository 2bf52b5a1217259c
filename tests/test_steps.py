"""The post-search steps' family contract (pipeline/search/steps): every step of `STEPS` runs in a real search
with the settings that turn it on, fills its record, which round-trips through plan.json, logs finite metrics,
renders its report.md rows, and is turned off by the setting it names. A new step inherits these tests."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import plan as plans
from pipeline.search.steps import STEPS, PlanStep, step

pytestmark = pytest.mark.xdist_group("step_searches")  # one test process runs the searches they share


def _plans(step_searches: dict[str, Path], s: PlanStep) -> tuple[Any, Any]:
    """(the plan of the search that turned `s` on, the plan of the one that turned it off)."""
    (first,) = (step_searches["first"] / "out").glob("*/*/plan.json")
    (second,) = (step_searches["second"] / "out").glob("*/*/plan.json")
    replans = any("{plan}" in o for o in s.on)
    on, off = (second, first) if replans else (first, second)
    return plans.load(on), plans.load(off)


@pytest.mark.parametrize("s", STEPS, ids=lambda s: s.name)
def test_the_step_fills_its_record_and_it_reads_back_from_plan_json(step_searches: dict[str, Path],
                                                                   s: PlanStep) -> None:  # fmt: skip
    plan, _ = _plans(step_searches, s)
    assert s.record(plan) is not None, f"{s.name}: no {s.field} with {s.on}"
    back = plans.from_json(json.loads(json.dumps(plans.to_json(plan))))
    assert s.record(back) == s.record(plan)


@pytest.mark.parametrize("s", STEPS, ids=lambda s: s.name)
def test_the_steps_metrics_are_finite_numbers(step_searches: dict[str, Path], s: PlanStep) -> None:
    on, off = _plans(step_searches, s)
    metrics = s.metrics(on)
    assert metrics, f"{s.name}: no metrics"
    for key, value in (*metrics.items(), *s.metrics(off).items()):
        assert isinstance(value, float) and math.isfinite(value), (key, value)


@pytest.mark.parametrize("s", STEPS, ids=lambda s: s.name)
def test_the_steps_report_rows_render_with_its_record_and_without(step_searches: dict[str, Path],
                                                                  s: PlanStep) -> None:  # fmt: skip
    on, off = _plans(step_searches, s)
    rows = s.rows(on)
    assert rows and all(r.startswith("| ") and r.endswith(" |") for r in rows), rows
    for r in s.rows(off):
        assert r.startswith("| ") and r.endswith(" |")
    assert all(isinstance(line, str) for line in s.sections(on) + s.sections(off))


@pytest.mark.parametrize("s", STEPS, ids=lambda s: s.name)
def test_the_setting_it_names_turns_the_step_off(step_searches: dict[str, Path], s: PlanStep) -> None:
    _, off = _plans(step_searches, s)
    assert s.record(off) is None, f"{s.name}: {s.off} left its {s.field}"


@pytest.mark.parametrize("s", STEPS, ids=lambda s: s.name)
def test_the_settings_a_step_names_are_the_configs_own(s: PlanStep) -> None:
    """What turns a step on or off is a setting conf/search/ documents (a typo there would be refused)."""
    from pipeline.search.settings import SEARCH_KEYS

    for override in (s.off, *s.on):
        key, _, _ = override.partition("=")
        group, _, name = key.partition(".")
        assert group != "search" or name in SEARCH_KEYS, override


def test_the_registry_names_every_step_once_and_refuses_an_unknown_one() -> None:
    assert len({s.name for s in STEPS}) == len({s.field for s in STEPS}) == len(STEPS)
    assert all(step(s.name) is s for s in STEPS)
    with pytest.raises(ValueError, match=r"unknown post-search step 'nope'; choose from \['band'"):
        step("nope")


def test_a_forked_step_prints_and_records_what_it_would_in_turn(step_searches: dict[str, Path]) -> None:
    """The check runs after the band and the host losses (forked beside them where the process may fork): its
    lines come after theirs, as run in turn."""
    out = (step_searches["first"] / "console.txt").read_text()
    assert out.index("[search] rate band:") < out.index("[search] one host lost:") < out.index("[search] simulated:")

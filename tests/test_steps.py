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
from helpers import SMALL, in_process
from pipeline.search.steps import STEPS, PlanStep, step

FAST = ["search.sampler=exact", "search.band_draws=4"]  # the layout from the exact MILP: no trials


def _search(tmp: Path, *args: str) -> tuple[Any, Any]:
    """(the plan a search wrote, its console)."""
    from pipeline.search.run import execute

    out = tmp / f"out{len(list(tmp.glob('out*')))}"
    r = in_process(execute, "search", *SMALL, *FAST, *args, f"out_root={out}",
                   f"mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db")  # fmt: skip
    assert r.returncode == 0, r.stderr
    (folder,) = {p.parent for p in out.glob("*/*/plan.json")}
    return plans.load(folder / "plan.json"), r


@pytest.fixture(scope="module")
def searches(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Any]:
    """A plan with every step on (a re-plan, so the steps that start from a running plan run too), and one with
    every step off. The running plan comes from a first search with every step off. The first test process to ask
    runs both searches; the other reads what it left."""
    import fcntl

    root = tmp_path_factory.getbasetemp()
    tmp = (root.parent if worker_id != "master" else root) / "steps"
    tmp.mkdir(exist_ok=True)
    with (tmp / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (tmp / "console.txt").exists():
            first, _ = _search(tmp, *(s.off for s in STEPS))
            (tmp / "running.json").write_text(json.dumps(plans.to_json(first)))
            on = [o.replace("{plan}", str(tmp / "running.json")) for s in STEPS for o in s.on]
            every, r = _search(tmp, *on)
            (tmp / "every.json").write_text(json.dumps(plans.to_json(every)))
            (tmp / "console.txt").write_text(r.stdout)
    return {"on": plans.load(tmp / "every.json"), "off": plans.load(tmp / "running.json"),
            "console": (tmp / "console.txt").read_text()}  # fmt: skip


@pytest.mark.parametrize("s", STEPS, ids=lambda s: s.name)
def test_the_step_fills_its_record_and_it_reads_back_from_plan_json(searches: dict[str, Any], s: PlanStep) -> None:
    plan = searches["on"]
    assert s.record(plan) is not None, f"{s.name}: no {s.field} with {s.on}"
    back = plans.from_json(json.loads(json.dumps(plans.to_json(plan))))
    assert s.record(back) == s.record(plan)


@pytest.mark.parametrize("s", STEPS, ids=lambda s: s.name)
def test_the_steps_metrics_are_finite_numbers(searches: dict[str, Any], s: PlanStep) -> None:
    metrics = s.metrics(searches["on"])
    assert metrics, f"{s.name}: no metrics"
    for key, value in metrics.items():
        assert isinstance(value, float) and math.isfinite(value), (key, value)
    assert all(isinstance(v, float) and math.isfinite(v) for v in s.metrics(searches["off"]).values())


@pytest.mark.parametrize("s", STEPS, ids=lambda s: s.name)
def test_the_steps_report_rows_render_with_its_record_and_without(searches: dict[str, Any], s: PlanStep) -> None:
    rows = s.rows(searches["on"])
    assert rows and all(r.startswith("| ") and r.endswith(" |") for r in rows), rows
    for r in s.rows(searches["off"]):
        assert r.startswith("| ") and r.endswith(" |")
    assert all(isinstance(line, str) for line in s.sections(searches["on"]) + s.sections(searches["off"]))


@pytest.mark.parametrize("s", STEPS, ids=lambda s: s.name)
def test_the_setting_it_names_turns_the_step_off(searches: dict[str, Any], s: PlanStep) -> None:
    assert s.record(searches["off"]) is None, f"{s.name}: {s.off} left its {s.field}"


def test_the_registry_names_every_step_once_and_refuses_an_unknown_one() -> None:
    assert len({s.name for s in STEPS}) == len({s.field for s in STEPS}) == len(STEPS)
    assert all(step(s.name) is s for s in STEPS)
    with pytest.raises(ValueError, match=r"unknown post-search step 'nope'; choose from \['band'"):
        step("nope")


def test_a_forked_step_prints_and_records_what_it_would_in_turn(searches: dict[str, Any]) -> None:
    """The check ran beside the band (forked): its lines come after the band's, as run in turn."""
    out = searches["console"]
    assert out.index("[search] rate band:") < out.index("[search] simulated:")


@pytest.mark.parametrize("s", STEPS, ids=lambda s: s.name)
def test_the_settings_a_step_names_are_the_configs_own(s: PlanStep) -> None:
    """What turns a step on or off is a setting conf/search/ documents (a typo there would be refused)."""
    from pipeline.search.settings import SEARCH_KEYS

    for override in (s.off, *s.on):
        key, _, _ = override.partition("=")
        group, _, name = key.partition(".")
        assert group != "search" or name in SEARCH_KEYS, override

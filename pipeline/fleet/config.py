"""A fleet's config (`conf/fleet/NAME.yaml`, `+fleet=NAME`): its models, each with its workload, SLOs, cost model and
a demand in req/s or a weight, every value checked before anything is benchmarked.

    models:
      - {model: deepseek_v3, workload: azure_code, demand_req_s: 200}
      - {model: qwen3_235b_a22b, workload: azure_conv, slo: default, demand_req_s: 300}
    time_limit_s: 35     # the joint MILP's: at it, the best layout found is planned and its gap is stated

A member's `slo` and `costmodel` default to the command's; where the command's cost model was fitted to another
model's measured serving (`costmodel=serving`, DeepSeek-V3's), a member of another model is priced with the kernel
tables (`calibrated`), as that model's own search would have to be, and its plan says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costmodel.catalog import model_names, priced_model_names
from pipeline.errors import ConfigError

MEMBER_KEYS = ("model", "workload", "slo", "costmodel", "demand_req_s", "weight")
FLEET_KEYS = ("models", "time_limit_s")
# the joint MILP's time limit: at it, the best layout found is planned and its gap stated against HiGHS's proven
# bound (three models on hetero_a: within 0.2 % of the optimum at 35 s, the optimum proven at 48 s; docs/search.md)
TIME_LIMIT_S = 35.0
FLEET_FILE = "fleet.json"  # a fleet plan's record (pipeline/fleet/run.py), a plan.json per model beside it


@dataclass(frozen=True)
class MemberSpec:
    """One model of a fleet, as its config names it."""

    model: str
    workload: str
    slo: str | None  # None: the command's
    costmodel: str | None  # None: the command's, or `calibrated` where that one is another model's fit
    demand: float  # req/s (`demand_req_s`) or a weight
    is_demand: bool

    @property
    def label(self) -> str:
        return self.model


@dataclass(frozen=True)
class FleetSpec:
    name: str
    members: tuple[MemberSpec, ...]
    time_limit_s: float = TIME_LIMIT_S  # the joint MILP's

    @property
    def demands(self) -> bool:
        """Demands in req/s (True) or weights (False)."""
        return self.members[0].is_demand


def fleet_from_cfg(name: str, cfg: Mapping[str, Any]) -> FleetSpec:
    """The fleet `conf/fleet/<name>.yaml` describes; ConfigError names the first bad value and how to fix it."""
    where = f"fleet {name} (conf/fleet/{name}.yaml)"
    unknown = sorted(set(cfg) - set(FLEET_KEYS))
    if unknown:
        raise ConfigError(f"{where}: {unknown[0]!r} is not a fleet setting: a fleet is `models:`, a list of "
                          f"{{{', '.join(MEMBER_KEYS)}}}, and optionally time_limit_s")  # fmt: skip
    limit = cfg.get("time_limit_s", TIME_LIMIT_S)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not (math.isfinite(limit) and limit > 0):
        raise ConfigError(f"{where}: time_limit_s={limit!r}: the joint MILP's time limit must be a number of seconds "
                          f"> 0 (fleet.time_limit_s={TIME_LIMIT_S:g})")  # fmt: skip
    items = cfg.get("models")
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{where}: `models:` must list at least one model, each {{model: NAME, workload: NAME, "
                          "demand_req_s: RATE}} (or weight: W instead of the demand)")  # fmt: skip
    members: list[MemberSpec] = []
    for k, item in enumerate(items):
        at = f"{where}, models[{k}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{at}: {item!r} is not a mapping of {list(MEMBER_KEYS)}")
        bad = sorted(set(item) - set(MEMBER_KEYS))
        if bad:
            raise ConfigError(f"{at}: {bad[0]!r} is not a member setting; choose from {list(MEMBER_KEYS)}")
        model = item.get("model")
        if model not in model_names():
            raise ConfigError(f"{at}: model {model!r} is not in the catalogue (conf/model/); choose from "
                              f"{priced_model_names()}")  # fmt: skip
        if model not in priced_model_names():
            from costmodel.catalog import load_model

            load_model(str(model))  # says in one line what the cost model does not price in it
        if any(m.model == model for m in members):
            raise ConfigError(f"{at}: {model} is in the fleet twice: one entry per model (its islands serve all of "
                              "its traffic; give the sum of its demands)")  # fmt: skip
        if item.get("workload") is None:
            raise ConfigError(f"{at}: {model} has no workload: name one of conf/workload/ (workload: azure_code)")
        demand, weight = item.get("demand_req_s"), item.get("weight")
        if demand is not None and weight is not None:
            raise ConfigError(f"{at}: {model} gives both demand_req_s and weight: give one")
        if demand is None and weight is None:
            raise ConfigError(f"{at}: {model} has neither demand_req_s (req/s) nor weight: give one")
        key, value = ("demand_req_s", demand) if demand is not None else ("weight", weight)
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0
        if not ok:
            raise ConfigError(f"{at}: {key}={value!r} for {model}: it must be a finite number > 0")
        members.append(MemberSpec(str(model), str(item["workload"]), _name(item.get("slo")),
                                  _name(item.get("costmodel")), float(value), demand is not None))  # fmt: skip
    kinds = {m.is_demand for m in members}
    if len(kinds) > 1:
        first = next(m for m in members if not m.is_demand)
        raise ConfigError(f"{where}: {first.model} gives a weight where the other models give demands in req/s: a "
                          "weight has no demand to be a share of; give every model a demand_req_s, or every model "
                          "a weight")  # fmt: skip
    return FleetSpec(name, tuple(members), float(limit))


def _name(value: Any) -> str | None:
    return None if value is None else str(value)


def is_fleet(plan: Any) -> bool:
    """Does a command's `plan=PATH` name a fleet plan's record (fleet.json) rather than one plan.json?"""
    return Path(str(plan)).name == FLEET_FILE


def read_fleet(path: Path) -> dict[str, Any]:
    """A fleet plan's record, read for `pipeline.simulate` and `pipeline.deploy`; ConfigError where it is not one."""
    from pipeline.records.journal import read_json

    record = read_json(path, "a fleet.json is written by `python -m pipeline.search +fleet=NAME`")
    if not isinstance(record, dict) or not isinstance(record.get("models"), list):
        raise ConfigError(f"plan={path}: not a fleet.json (no `models` list): give the fleet.json of a fleet plan")
    return record

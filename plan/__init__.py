"""The typed plan at the centre of Archipelago: `Plan` (plan/record.py) and plan.json (plan/schema.py).

The search builds a Plan (`pipeline.planning.build`); the post-search check, `pipeline.simulate`, the
simulator (`simulator.build`), the report and the launch files (`deployment`) read it. Nothing else
reads plan.json by key.
"""

from plan.engines import Engine, Placement, engines_of, island_engines
from plan.record import (
    MAX_DECODE_BATCH,
    RATES,
    REFERENCE_AHEAD,
    ROLES,
    Band,
    Bursts,
    HostLoss,
    HostLosses,
    Hosts,
    InventoryInfo,
    Island,
    Plan,
    PlanError,
    Precision,
    RangeShare,
    Rates,
    Reference,
    Replan,
    Role,
    SearchInfo,
    Sizing,
    Verification,
    Window,
    node_spans,
)
from plan.schema import READS, SCHEMA, from_json, load, to_json

__all__ = [
    "MAX_DECODE_BATCH",
    "RATES",
    "READS",
    "REFERENCE_AHEAD",
    "ROLES",
    "SCHEMA",
    "Band",
    "Bursts",
    "Engine",
    "HostLoss",
    "HostLosses",
    "Hosts",
    "InventoryInfo",
    "Island",
    "Placement",
    "Plan",
    "PlanError",
    "Precision",
    "RangeShare",
    "Rates",
    "Reference",
    "Replan",
    "Role",
    "SearchInfo",
    "Sizing",
    "Verification",
    "Window",
    "engines_of",
    "from_json",
    "island_engines",
    "load",
    "node_spans",
    "to_json",
]

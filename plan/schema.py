"""plan.json: the versioned JSON form of a `Plan`, written by `to_json` and read back by `from_json`.

Schema 3 is the record tree as it is (`costmodel.codec`: every record an object, nested as the records nest),
with the model's dimensions and the cost settings whole, so a later command rebuilds exactly the model the plan
was made with, and a few figures a reader wants without the record (cost, rate per dollar, island counts, each
rate's meaning, an island's EP group and placement, the worst host lost) written beside it and not read back.

Earlier schemas still load: each is first brought to the next one's form (`_from_v1`: the flat plan.json of the
first releases, each value moved to its place and the precision and host size it did not record taken from the
GPU catalogue; `_from_v2`: its flat cost settings, read by `CostSettings.from_json`, and the inventory as a
mapping), then read as schema 3. A file of a newer schema is refused with the versions this release reads.

Every error is a `PlanError` naming the file and the field (`plan.json: islands[3]: tp must be ...`), which
every command prints as one `error:` line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from costmodel.catalog import CatalogError, load_gpu
from costmodel.codec import RecordError, from_data, to_data
from costmodel.formulas import priced_precision
from costmodel.settings import CostSettings
from costmodel.specs import SpecError
from plan.record import RATES, Plan, PlanError

SCHEMA = 3  # what `to_json` writes
READS = (1, 2, 3)  # what `from_json` reads


def to_json(plan: Plan) -> dict[str, Any]:
    """The plan as plan.json holds it (schema `SCHEMA`), with the figures a reader wants without the record
    (cost, rate per dollar, island counts, each rate's meaning) written beside it."""
    data = to_data(plan)
    for d, isl in zip(data["islands"], plan.islands, strict=True):
        if isl.serving:
            d["ep_group"] = isl.ep_group
        if isl.hosts is not None:
            d["hosts"]["placement"] = isl.placement
    if plan.host_losses is not None:
        data["host_losses"]["worst"] = {"gpu": plan.host_losses.worst.gpu, "node": plan.host_losses.worst.node}
    data["workload_spec"] = plan.spec_of_workload
    head = {
        "schema": SCHEMA,
        "status": plan.status,
        "rates": data.pop("rates"),
        "rate_meanings": RATES,
        "cost_per_hour": plan.cost_per_hour,
        "rate_per_dollar": plan.rate_per_dollar,
        "prefill_islands": plan.count("prefill"),
        "decode_islands": plan.count("decode"),
    }
    return {**head, **data}


def load(path: str | Path, what: str = "plan") -> Plan:
    """The plan in the file at `path`; `what` is the setting that named it (`plan=PATH`)."""
    p = Path(str(path)).expanduser()
    where = f"{what}={path}"
    if not p.is_file():
        raise PlanError(f"{where}: no such file (the plan.json a search wrote: outputs/search/<run>/<time>/plan.json)")
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PlanError(f"{where}: not a plan.json: not valid JSON text ({str(err)[:120]})") from None
    except OSError as err:
        raise PlanError(f"{where}: cannot read it ({err.strerror or err})") from None
    return from_json(data, where)


def from_json(data: Any, where: str = "plan") -> Plan:
    """The `Plan` of a plan.json's content (any schema in `READS`); `where` prefixes every error."""
    if not isinstance(data, Mapping):
        raise PlanError(f"{where}: not a plan.json (expected a JSON object, got {type(data).__name__})")
    version = data.get("schema", 1)
    if version not in READS or isinstance(version, bool):
        raise PlanError(
            f"{where}: plan schema {version!r} is not one this version of Archipelago reads ({list(READS)}): "
            "a newer release wrote it; update Archipelago, or plan again with this one"
        )
    for older, upgrade in UPGRADES:
        if version <= older:
            data = upgrade(data, where)
    return _from_v3(data, where)


# --- schema 3 -------------------------------------------------------------------------------------


def _from_v3(d: Mapping[str, Any], where: str) -> Plan:
    d = {k: v for k, v in d.items() if k != "schema"}
    if "workload_spec" in d:
        d["workload_spec"] = _workload_spec(d["workload_spec"], where)
    islands = d.get("islands")
    if isinstance(islands, list) and not islands:
        raise PlanError(f"{where}: `islands` is empty: a plan has at least one island")
    if islands is not None and not isinstance(islands, list):
        raise PlanError(f"{where}: `islands` must be a list of islands, got {type(islands).__name__}")
    try:
        plan = from_data(Plan, d, where)
    except (RecordError, SpecError, CatalogError) as err:
        raise PlanError(str(err)) from None
    for k, (x, isl) in enumerate(zip(d["islands"], plan.islands, strict=True)):
        if isinstance(x, Mapping) and "ep_group" in x and isl.serving and x["ep_group"] != isl.ep_group:
            raise PlanError(f"{where}: islands[{k}]: ep_group {x['ep_group']!r} is not its EP group of {isl.ep_group} "
                            f"GPUs ({'ep' if isl.role.decodes else 'tp x dp'}): was the file edited?")  # fmt: skip
    return plan


def _workload_spec(v: Any, where: str) -> str:
    """The recorded workload definition as canonical JSON ("" when the plan has none)."""
    if v is None:
        return ""
    if not isinstance(v, Mapping):
        raise PlanError(f"{where}: workload_spec must be the workload's conf mapping (an object), got {v!r:.80}")
    return json.dumps(v, sort_keys=True, default=str)


# --- earlier schemas, each brought to the next one's form -----------------------------------------


def _mapping(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise PlanError(f"{where} must be a JSON object, got {type(v).__name__}")
    return v


def _need(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise PlanError(f"{where}: no `{key}`: is this a plan.json written by pipeline.search?")
    return d[key]


def _from_v2(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Schema 2 as schema 3: its flat cost settings nested (`CostSettings.from_json` reads either), the inventory's
    GPUs as (type, count) pairs, and a verification of before its every field at the values it meant."""
    out = dict(d)
    try:
        out["cost"] = CostSettings.from_json(_need(d, "cost", where), where).to_json()
    except SpecError as err:
        raise PlanError(str(err)) from None
    inv = d.get("inventory")
    if isinstance(inv, Mapping) and isinstance(inv.get("gpus"), Mapping):
        out["inventory"] = {**inv, "gpus": [[g, n] for g, n in inv["gpus"].items()]}
    v = d.get("verification")
    if isinstance(v, Mapping):
        nan = float("nan")
        defaults = {"ttft_ms_at_slo": nan, "tpot_ms_at_slo": nan, "ttft_ms_p50": nan, "ttft_ms_p99": nan,
                    "tpot_ms_p99": nan, "steady_state": "", "why_not": "", "requests": 0, "sim_wall_s": 0.0,
                    "slo": "", "sustained_req_s": 0.0, "sustained_over_stated": 0.0, "slo_attainment": nan}  # fmt: skip
        out["verification"] = {**defaults, **v}
    return out


def _from_v1(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The flat plan.json of the first releases as schema 2: every value moved to its place, the precision and the
    host size it did not record taken from the GPU catalogue."""
    if "islands" in d and not isinstance(d["islands"], list):
        raise PlanError(f"{where}: `islands` must be a list of islands, got {type(d['islands']).__name__}")
    name = _need(d, "model", where)
    if "cost" not in d:
        raise PlanError(f"{where}: no `cost` record (the cost-model settings the plan was made with): re-run the "
                        "search that wrote it with this version")  # fmt: skip
    spec = _mapping(_need(d, "model_spec", where), f"{where}: model_spec")
    if spec.get("name") != name:
        raise PlanError(f"{where}: model {name!r} disagrees with its model_spec {spec.get('name')!r}: was the file "
                        "edited?")  # fmt: skip
    try:
        cost = CostSettings.from_json(d["cost"], where)
    except SpecError as err:
        raise PlanError(str(err)) from None
    if d.get("cost_profile", cost.profile.name) != cost.profile.name:
        raise PlanError(f"{where}: cost_profile {d['cost_profile']!r} disagrees with cost.profile "
                        f"{cost.profile.name!r}: was the file edited?")  # fmt: skip
    islands = [_v1_island(x, f"{where}: islands[{k}]", cost) for k, x in enumerate(_need(d, "islands", where))]
    rates = {k: d[k] for k in V1_RATES if k in d}
    out: dict[str, Any] = {
        "islands": islands, "rates": rates, "model": spec, "cost": d["cost"], "workload": str(d.get("workload", "")),
        "status": str(d.get("status", "optimal")),
    }  # fmt: skip
    if isinstance(d.get("inventory"), Mapping):
        inv = d["inventory"]
        out["inventory"] = {"name": str(inv.get("name", "")), "gpus": _mapping(inv.get("gpus", {}),
                            f"{where}: inventory.gpus"), "cost_per_hour": inv.get("cost_per_hour", 0.0)}  # fmt: skip
    if "sampler" in d:
        out["search"] = {
            "objective": d.get("objective", "max_rate"), "sampler": d["sampler"], "generator": d.get("generator", ""),
            "trials": d.get("trials", 0), "failed": d.get("failed", 0), "rejected": d.get("rejected", 0),
            "complete": bool(d.get("complete", True)), "wall_s": d.get("wall_s", 0.0),
            "robust": bool(d.get("robust", False)),
        }  # fmt: skip
    if "gap" in d or "reference_optimum_req_s" in d:
        gap = d.get("gap")
        out["reference"] = {
            "optimum_req_s": d.get("reference_optimum_req_s"), "rate_per_dollar": d.get("reference_rate_per_dollar"),
            "bound_req_s": d.get("reference_bound_req_s"),
            "gap": None if gap is None or (isinstance(gap, float) and math.isnan(gap)) else gap,
            "gap_is_bound": bool(d.get("gap_is_bound", False)), "layout_ahead": d.get("reference_layout_ahead"),
        }  # fmt: skip
    for key in ("band", "verification", "host_losses", "replan", "bursts", "notes"):
        if key in d:
            out[key] = d[key]
    return out


V1_RATES = ("rate_req_s", "fluid_req_s", "searched_req_s", "evaluated_req_s", "output_tok_s", "simulated_req_s",
            "disaggregated_req_s", "with_aggregated_req_s")  # fmt: skip
V1_ISLAND = ("gpu", "size", "role", "tp", "dp", "ep", "batch", "cost_per_hour", "experts_per_gpu", "redundant_experts",
             "traffic_share", "utilisation", "ttft_ms_expected", "tpot_ms_expected", "overlap", "chunk_tokens",
             "ranges")  # fmt: skip


def _v1_island(x: Any, where: str, cost: CostSettings) -> dict[str, Any]:
    """A schema-1 island: its hosts as a record of the GPU's host size, its precision as the cost model priced it."""
    x = _mapping(x, where)
    try:
        g = load_gpu(str(_need(x, "gpu", where)))
    except CatalogError as err:
        raise PlanError(f"{where}: {err}") from None
    dense, experts = priced_precision(g, cost.profile)
    out = {k: x[k] for k in (*V1_ISLAND, "ep_group") if k in x}
    out["precision"] = {"dense": dense, "experts": experts}
    out.setdefault("cost_per_hour", 0.0)
    if x.get("role") != "idle":
        for key in ("tp", "dp", "ep", "batch", "ranges"):
            _need(x, key, where)
    else:
        for key in ("tp", "dp", "ep", "batch"):
            out.setdefault(key, 0)
    if "nodes" in x:
        out["hosts"] = {"node_gpus": g.node_gpus, "nodes": x["nodes"], "first_gpu": x.get("first_gpu", 0)}
    return out


UPGRADES: tuple[tuple[int, Callable[[Any, str], dict[str, Any]]], ...] = ((1, _from_v1), (2, _from_v2))

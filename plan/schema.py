"""plan.json: the versioned JSON form of a `Plan`, written by `to_json` and read back by `from_json`.

Schema 2 nests what the record nests (`rates`, `search`, `reference`, ...) and carries the model's
dimensions and the cost settings whole, so a later command rebuilds exactly the model the plan was made
with. Schema 1 is the flat plan.json of earlier versions (no `schema` key): it still loads, each value
moved to its place, and the precision and host size it did not record taken from the GPU catalogue.
A file of a newer schema is refused with the versions this release reads.

Every error is a `PlanError` naming the file and the field (`plan.json: islands[3].tp must be ...`),
which every command prints as one `error:` line.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from costmodel.catalog import CatalogError, build, load_gpu
from costmodel.formulas import priced_precision
from costmodel.settings import CostSettings
from costmodel.specs import Model, SpecError
from plan.record import (
    RATES,
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
    SearchInfo,
    Verification,
    Window,
    checked_notes,
)

SCHEMA = 2  # what `to_json` writes
READS = (1, 2)  # what `from_json` reads
T = TypeVar("T")


def to_json(plan: Plan) -> dict[str, Any]:
    """The plan as plan.json holds it (schema `SCHEMA`), with the figures a reader wants without the record
    (cost, rate per dollar, island counts, each rate's meaning) written beside it."""

    def record(x: Any) -> Any:
        return None if x is None else dataclasses.asdict(x)

    islands = []
    for isl in plan.islands:
        d = dataclasses.asdict(isl)
        d["ranges"] = [dataclasses.asdict(r) for r in isl.ranges]
        d["hosts"] = None if isl.hosts is None else {**dataclasses.asdict(isl.hosts), "nodes": list(isl.hosts.nodes),
                                                    "placement": isl.placement}  # fmt: skip
        if isl.serving:
            d["ep_group"] = isl.ep_group
        islands.append(d)
    inventory = None
    if plan.inventory is not None:
        inventory = {"name": plan.inventory.name, "gpus": dict(plan.inventory.gpus),
                     "cost_per_hour": plan.inventory.cost_per_hour}  # fmt: skip
    return {
        "schema": SCHEMA,
        "status": plan.status,
        "rates": dataclasses.asdict(plan.rates),
        "rate_meanings": RATES,
        "cost_per_hour": plan.cost_per_hour,
        "rate_per_dollar": plan.rate_per_dollar,
        "prefill_islands": plan.count("prefill"),
        "decode_islands": plan.count("decode"),
        "islands": islands,
        "model": dataclasses.asdict(plan.model),
        "cost": plan.cost.to_json(),
        "workload": plan.workload,
        "workload_spec": plan.spec_of_workload,
        "inventory": inventory,
        "search": record(plan.search),
        "reference": record(plan.reference),
        "band": record(plan.band),
        "verification": record(plan.verification),
        "host_losses": _losses_record(plan.host_losses),
        "replan": record(plan.replan),
        "bursts": record(plan.bursts),
        "notes": list(plan.notes),
    }


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
    """The `Plan` of a plan.json's content (schema 1 or 2); `where` prefixes every error."""
    if not isinstance(data, Mapping):
        raise PlanError(f"{where}: not a plan.json (expected a JSON object, got {type(data).__name__})")
    version = data.get("schema", 1)
    if version not in READS or isinstance(version, bool):
        raise PlanError(
            f"{where}: plan schema {version!r} is not one this version of Archipelago reads ({list(READS)}): "
            "a newer release wrote it; update Archipelago, or plan again with this one"
        )
    return (_from_v2 if version == 2 else _from_v1)(data, where)


# --- reading ---------------------------------------------------------------------------------------


def _need(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise PlanError(f"{where}: no `{key}`: is this a plan.json written by pipeline.search?")
    return d[key]


def _mapping(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise PlanError(f"{where} must be a JSON object, got {type(v).__name__}")
    return v


def _make(cls: Callable[..., T], where: str, **kw: Any) -> T:
    """`cls(**kw)`, its invariant errors prefixed by `where`."""
    try:
        return cls(**kw)
    except (PlanError, SpecError) as err:
        raise PlanError(f"{where}: {err}") from None


def _of(cls: Any, d: Any, where: str, defaults: Mapping[str, Any] | None = None) -> Any:
    """A flat record from a JSON object with exactly its fields (those with defaults optional)."""
    d = _mapping(d, where)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    given = {**(defaults or {}), **{k: v for k, v in d.items() if k in fields}}
    required = [n for n, f in fields.items() if f.default is dataclasses.MISSING and
                f.default_factory is dataclasses.MISSING]  # fmt: skip
    missing = [n for n in required if n not in given]
    if missing:
        raise PlanError(f"{where}: no `{missing[0]}` (a {cls.__name__} has {sorted(fields)})")
    return _make(cls, where, **given)


def _model(d: Any, where: str) -> Model:
    try:
        return build(Model, _mapping(d, where), where)
    except (CatalogError, SpecError) as err:
        raise PlanError(str(err)) from None


def _cost(d: Any, where: str) -> CostSettings:
    try:
        return CostSettings.from_json(d, where)
    except SpecError as err:
        raise PlanError(str(err)) from None


def _ranges(v: Any, where: str) -> tuple[RangeShare, ...]:
    if not isinstance(v, list):
        raise PlanError(f"{where} must be a list of {{start, end, fraction, capacity}}, got {type(v).__name__}")
    return tuple(_of(RangeShare, r, f"{where}[{j}]") for j, r in enumerate(v))


ISLAND_KEYS = ("gpu", "size", "role")


def _island(d: Any, where: str, hosts: Hosts | None, precision: Precision | None) -> Island:
    d = _mapping(d, where)
    for key in ISLAND_KEYS:
        _need(d, key, where)
    serving = d["role"] != "idle"
    if serving:
        for key in ("tp", "dp", "ep", "batch", "ranges"):
            _need(d, key, where)
    if precision is None:
        precision = _of(Precision, _need(d, "precision", where), f"{where}.precision")
    kw = {k: d[k] for k in ("gpu", "size", "role", "tp", "dp", "ep", "batch", "cost_per_hour", "experts_per_gpu",
                            "redundant_experts", "traffic_share", "utilisation", "ttft_ms_expected",
                            "tpot_ms_expected", "overlap", "chunk_tokens") if k in d}  # fmt: skip
    kw.setdefault("cost_per_hour", 0.0)
    for key in ("tp", "dp", "ep", "batch"):
        kw.setdefault(key, 0)
    isl = _make(Island, where, **kw, precision=precision, hosts=hosts,
                ranges=_ranges(d.get("ranges", []), f"{where}.ranges"))  # fmt: skip
    if "ep_group" in d and serving and d["ep_group"] != isl.ep_group:
        raise PlanError(f"{where}: ep_group {d['ep_group']!r} is not its EP group of {isl.ep_group} GPUs "
                        f"({'ep' if isl.role == 'decode' else 'tp x dp'}): was the file edited?")  # fmt: skip
    return isl


def _islands(v: Any, where: str, island: Callable[[Any, str], Island]) -> tuple[Island, ...]:
    if not isinstance(v, list):
        raise PlanError(f"{where}: `islands` must be a list of islands, got {type(v).__name__}")
    if not v:
        raise PlanError(f"{where}: `islands` is empty: a plan has at least one island")
    return tuple(island(d, f"{where}: islands[{k}]") for k, d in enumerate(v))


def _hosts(d: Any, where: str) -> Hosts | None:
    if d is None:
        return None
    d = _mapping(d, where)
    return _of(Hosts, {**d, "nodes": tuple(_list(d.get("nodes"), f"{where}.nodes"))}, where)


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise PlanError(f"{where} must be a list, got {v!r}")
    return v


def _optional(cls: Any, d: Any, where: str) -> Any:
    return None if d is None else _of(cls, d, where)


def _verification(d: Any, where: str) -> Verification | None:
    if d is None:
        return None
    d = _mapping(d, where)
    listed = _list(d.get("windows", []), f"{where}.windows")
    windows = tuple(_of(Window, w, f"{where}.windows[{k}]") for k, w in enumerate(listed))
    nan = float("nan")
    defaults = {"ttft_ms_at_slo": nan, "tpot_ms_at_slo": nan, "ttft_ms_p50": nan, "ttft_ms_p99": nan,
                "tpot_ms_p99": nan, "steady_state": "", "why_not": "", "requests": 0, "sim_wall_s": 0.0, "slo": "",
                "sustained_req_s": 0.0, "sustained_over_stated": 0.0, "slo_attainment": nan}  # fmt: skip
    return _of(Verification, {**d, "windows": windows}, where, defaults)


def _replan(d: Any, where: str) -> Replan | None:
    if d is None:
        return None
    d = _mapping(d, where)
    moves = tuple(str(m) for m in _list(d.get("moves", []), f"{where}.moves"))
    kept = tuple(_list(d.get("kept", []), f"{where}.kept"))
    return _of(Replan, {**d, "moves": moves, "kept": kept}, where)


def _losses_record(losses: HostLosses | None) -> dict[str, Any] | None:
    """plan.json's `host_losses`, with the worst host named beside the list (a reader's shortcut; not read back)."""
    if losses is None:
        return None
    return {**dataclasses.asdict(losses), "worst": {"gpu": losses.worst.gpu, "node": losses.worst.node}}


def _host_losses(d: Any, where: str) -> HostLosses | None:
    if d is None:
        return None
    d = _mapping(d, where)
    listed = _list(_need(d, "losses", where), f"{where}.losses")
    losses = []
    for k, h in enumerate(listed):
        h = _mapping(h, f"{where}.losses[{k}]")
        islands = tuple(_list(h.get("islands", []), f"{where}.losses[{k}].islands"))
        losses.append(_of(HostLoss, {**h, "islands": islands}, f"{where}.losses[{k}]"))
    spare = []
    for k, e in enumerate(_list(d.get("spare_nodes", []), f"{where}.spare_nodes")):
        if not (isinstance(e, (list, tuple)) and len(e) == 2):
            raise PlanError(f"{where}.spare_nodes[{k}]: expected [GPU, node], got {e!r}")
        spare.append((str(e[0]), e[1]))
    return _of(HostLosses, {**d, "losses": tuple(losses), "spare_nodes": tuple(spare)}, where)


def _from_v2(d: Mapping[str, Any], where: str) -> Plan:
    model = _model(_need(d, "model", where), f"{where}: model")
    cost = _cost(_need(d, "cost", where), where)

    def island(x: Any, at: str) -> Island:
        return _island(x, at, _hosts(_mapping(x, at).get("hosts"), f"{at}.hosts"), None)

    inv = d.get("inventory")
    inventory = None
    if inv is not None:
        inv = _mapping(inv, f"{where}: inventory")
        gpus = tuple(_mapping(_need(inv, "gpus", f"{where}: inventory"), f"{where}: inventory.gpus").items())
        inventory = _make(InventoryInfo, f"{where}: inventory", name=str(_need(inv, "name", f"{where}: inventory")),
                          gpus=gpus, cost_per_hour=_need(inv, "cost_per_hour", f"{where}: inventory"))  # fmt: skip
    return _make(
        Plan,
        where,
        islands=_islands(_need(d, "islands", where), where, island),
        rates=_of(Rates, _need(d, "rates", where), f"{where}: rates"),
        model=model,
        cost=cost,
        workload=_need(d, "workload", where),
        workload_spec=_workload_spec(d.get("workload_spec"), where),
        status=str(d.get("status", "optimal")),
        inventory=inventory,
        search=_optional(SearchInfo, d.get("search"), f"{where}: search"),
        reference=_optional(Reference, d.get("reference"), f"{where}: reference"),
        band=_optional(Band, d.get("band"), f"{where}: band"),
        verification=_verification(d.get("verification"), f"{where}: verification"),
        host_losses=_host_losses(d.get("host_losses"), f"{where}: host_losses"),
        replan=_replan(d.get("replan"), f"{where}: replan"),
        bursts=_optional(Bursts, d.get("bursts"), f"{where}: bursts"),
        notes=_notes(d.get("notes", []), where),
    )


def _workload_spec(v: Any, where: str) -> str:
    """The recorded workload definition as canonical JSON ("" when the plan has none)."""
    if v is None:
        return ""
    if not isinstance(v, Mapping):
        raise PlanError(f"{where}: workload_spec must be the workload's conf mapping (an object), got {v!r:.80}")
    return json.dumps(v, sort_keys=True, default=str)


def _notes(v: Any, where: str) -> tuple[str, ...]:
    try:
        return checked_notes(v)
    except PlanError as err:
        raise PlanError(f"{where}: {err}") from None


def _from_v1(d: Mapping[str, Any], where: str) -> Plan:
    """The flat plan.json of earlier versions."""
    if "islands" in d and not isinstance(d["islands"], list):
        raise PlanError(f"{where}: `islands` must be a list of islands, got {type(d['islands']).__name__}")
    name = _need(d, "model", where)
    if "cost" not in d:
        raise PlanError(f"{where}: no `cost` record (the cost-model settings the plan was made with): re-run the "
                        "search that wrote it with this version")  # fmt: skip
    spec = _need(d, "model_spec", where)
    model = _model(spec, f"{where}: model_spec")
    if model.name != name:
        raise PlanError(f"{where}: model {name!r} disagrees with its model_spec {model.name!r}: was the file edited?")
    cost = _cost(d["cost"], where)
    if d.get("cost_profile", cost.profile.name) != cost.profile.name:
        raise PlanError(f"{where}: cost_profile {d['cost_profile']!r} disagrees with cost.profile "
                        f"{cost.profile.name!r}: was the file edited?")  # fmt: skip
    catalogue: dict[str, Any] = {}

    def gpu(name: Any, at: str) -> Any:
        if name not in catalogue:
            try:
                catalogue[name] = load_gpu(str(name))
            except CatalogError as err:
                raise PlanError(f"{at}: {err}") from None
        return catalogue[name]

    def island(x: Any, at: str) -> Island:
        x = _mapping(x, at)
        g = gpu(_need(x, "gpu", at), at)
        hosts = None
        if "nodes" in x:
            hosts = _of(Hosts, {"node_gpus": g.node_gpus, "nodes": tuple(_list(x["nodes"], f"{at}.nodes")),
                                "first_gpu": x.get("first_gpu", 0)}, at)  # fmt: skip
        dense, experts = priced_precision(g, cost.profile)
        return _island(x, at, hosts, Precision(dense, experts))

    rates = _of(Rates, {k: d[k] for k in ("rate_req_s", "fluid_req_s", "searched_req_s", "evaluated_req_s",
                                          "output_tok_s", "simulated_req_s", "disaggregated_req_s",
                                          "with_aggregated_req_s") if k in d}, where)  # fmt: skip
    inventory = None
    if isinstance(d.get("inventory"), Mapping):
        inv = d["inventory"]
        inventory = _make(InventoryInfo, f"{where}: inventory", name=str(inv.get("name", "")),
                          gpus=tuple(_mapping(inv.get("gpus", {}), f"{where}: inventory.gpus").items()),
                          cost_per_hour=inv.get("cost_per_hour", 0.0))  # fmt: skip
    search = None
    if "sampler" in d:
        search = _make(SearchInfo, where, objective=d.get("objective", "max_rate"), sampler=d["sampler"],
                       generator=d.get("generator", ""), trials=d.get("trials", 0), failed=d.get("failed", 0),
                       rejected=d.get("rejected", 0), complete=bool(d.get("complete", True)),
                       wall_s=d.get("wall_s", 0.0), robust=bool(d.get("robust", False)))  # fmt: skip
    reference = None
    if "gap" in d or "reference_optimum_req_s" in d:
        gap = d.get("gap")
        reference = _make(Reference, where, optimum_req_s=d.get("reference_optimum_req_s"),
                          rate_per_dollar=d.get("reference_rate_per_dollar"),
                          bound_req_s=d.get("reference_bound_req_s"),
                          gap=None if gap is None or (isinstance(gap, float) and math.isnan(gap)) else gap,
                          gap_is_bound=bool(d.get("gap_is_bound", False)),
                          layout_ahead=d.get("reference_layout_ahead"))  # fmt: skip
    return _make(
        Plan,
        where,
        islands=_islands(_need(d, "islands", where), where, island),
        rates=rates,
        model=model,
        cost=cost,
        workload=str(d.get("workload", "")),
        status=str(d.get("status", "optimal")),
        inventory=inventory,
        search=search,
        reference=reference,
        band=_optional(Band, d.get("band"), f"{where}: band"),
        verification=_verification(d.get("verification"), f"{where}: verification"),
        host_losses=_host_losses(d.get("host_losses"), f"{where}: host_losses"),
        replan=_replan(d.get("replan"), f"{where}: replan"),
        bursts=_optional(Bursts, d.get("bursts"), f"{where}: bursts"),
        notes=_notes(d.get("notes", []), where),
    )

"""The typed Plan (plan/): one record from the search to every reader, plan.json's versions, and the hand-edited
plan.json each reader must refuse in one line."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import plan as plans
from costmodel.profile import CostProfile
from costmodel.settings import CostSettings, EngineSettings, Slo
from costmodel.specs import SpecError
from helpers import REPO, flat_cost, in_process, one_line, plan_of, tiny_plan
from plan import PlanError

V1 = REPO / "tests" / "data" / "plan_v1_hetero_a.json"  # the main job's plan.json as the previous version wrote it


def test_cost_settings_round_trip_whole() -> None:
    engine = EngineSettings(fp8_combine=True)
    cost = CostSettings(CostProfile.corrected().with_fixes(causal_attention=False), 0.3, Slo(2000.0), engine)
    back = CostSettings.from_json(json.loads(json.dumps(cost.to_json())), "plan.json")
    assert back == cost and back.profile.name == "corrected[-causal_attention]"
    assert set(cost.to_json()) == {"profile", "cache_hit", "slo", "engine", "mtp"}  # nested as the record is
    system = CostSettings(CostProfile.corrected().with_fixes(activated_experts=True), 0.3, Slo(2000.0), engine)
    again = CostSettings.from_json(json.loads(json.dumps(system.to_json())), "plan.json")
    assert again == system and again.profile.activated_experts  # a system switch travels through plan.json
    # the flat record of plan.json schema 2 reads as the same settings; one from before a switch reads it as off
    assert CostSettings.from_json(flat_cost(system), "plan.json") == system
    old = flat_cost(system)
    old["switches"] = {k: v for k, v in old["switches"].items() if k != "activated_experts"}
    assert not CostSettings.from_json(old, "plan.json").profile.activated_experts
    with pytest.raises(SpecError, match=r"plan\.json: `cost\.switches` must give every cost-model fix"):
        CostSettings.from_json({**flat_cost(cost), "switches": {"warp": True}}, "plan.json")
    with pytest.raises(SpecError, match=r"`0 <= cache_hit < 1` must hold"):
        CostSettings.from_json({**cost.to_json(), "cache_hit": 1.5}, "plan.json")
    with pytest.raises(SpecError, match=r"plan\.json: engine\.fp8_combine must be true or false"):
        CostSettings.from_json({**cost.to_json(), "engine": {"fp8_combine": "yes"}}, "plan.json")


def test_a_plan_the_planner_built_round_trips_through_plan_json(tmp_path: Path) -> None:
    path, planner = plan_of(tmp_path, "+costmodel.fixes.causal_attention=false")
    plan = plans.load(path)
    assert plans.from_json(json.loads(json.dumps(plans.to_json(plan)))) == plan
    assert plan.cost == planner.cost and plan.model == planner.model and not plan.cost.profile.causal_attention
    assert json.loads(path.read_text())["schema"] == plans.SCHEMA
    assert plan.spec_of_workload == {"kind": "histogram", "histogram": plan.workload}  # the workload as composed
    assert 0 < plan.rate_req_s < plan.rates.fluid_req_s and plan.cost_per_hour > 0
    for isl in plan.serving:  # every serving island on hosts, its EP group holding every routed expert once
        assert isl.hosts is not None and isl.hosts.aligned(isl.size)
        assert isl.experts_per_gpu * isl.ep_group == plan.model.n_routed_experts + isl.redundant_experts


def test_a_plan_json_of_the_previous_version_loads_with_every_number_in_its_place() -> None:
    old = json.loads(V1.read_text())
    plan = plans.load(V1)
    assert plan.rates.rate_req_s == old["rate_req_s"] and plan.rates.searched_req_s == old["searched_req_s"]
    assert plan.reference is not None and plan.reference.gap == old["gap"]
    assert plan.reference.optimum_req_s == old["reference_optimum_req_s"]
    assert plan.search is not None and plan.search.trials == old["trials"] and plan.search.sampler == old["sampler"]
    assert plan.band is not None and plan.band.p10_req_s == old["band"]["p10_req_s"]
    assert plan.verification is not None and plan.verification.sustained_req_s == old["verification"]["sustained_req_s"]
    assert plan.cost_per_hour == pytest.approx(old["cost_per_hour"]) and plan.count("decode") == old["decode_islands"]
    for isl, was in zip(plan.islands, old["islands"], strict=True):
        assert (isl.gpu, isl.size, isl.role, isl.tp, isl.dp, isl.ep, isl.batch) == tuple(
            was[k] for k in ("gpu", "size", "role", "tp", "dp", "ep", "batch"))  # fmt: skip
        assert isl.hosts is not None and list(isl.hosts.nodes) == was["nodes"] and isl.placement == was["placement"]
        assert [(r.start, r.end, r.fraction) for r in isl.ranges] == [(r["start"], r["end"], r["fraction"])
                                                                     for r in was["ranges"]]  # fmt: skip
    again = plans.from_json(json.loads(json.dumps(plans.to_json(plan))))  # written as schema 3, read back
    assert again == plan


def test_a_plan_of_a_newer_schema_is_refused_with_the_versions_this_one_reads() -> None:
    data = plans.to_json(tiny_plan())
    with pytest.raises(PlanError, match=r"plan schema 4 is not one this version of Archipelago reads \(\[1, 2, 3\]\)"):
        plans.from_json({**data, "schema": 4})


def edited(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """tiny_plan's plan.json (with hosts), changed by hand."""
    data = copy.deepcopy(plans.to_json(tiny_plan(hosts=True)))
    change(data)
    return data


def set_island(key: str, value: Any, k: int = 0) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["islands"][k].__setitem__(key, value)


def del_island(key: str, k: int = 0) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["islands"][k].pop(key)


# every hand edit the issue names, each with the line both commands answer it with
EDITS = [
    ("no tp", del_island("tp"), "islands[0]: no `tp`"),
    ("no gpu", del_island("gpu"), "islands[0]: no `gpu`"),
    ("tp 0", set_island("tp", 0), "islands[0]: tp must be a whole number >= 1, got 0"),
    ("tp eight", set_island("tp", "eight"), "islands[0].tp must be a whole number, got 'eight'"),
    ("another role", set_island("role", "router"),
     "islands[0].role must be one of ['prefill', 'decode', 'aggregated', 'idle'], got 'router'"),
    ("islands a dict", lambda d: d.__setitem__("islands", {"0": d["islands"][0]}),
     "`islands` must be a list of islands, got dict"),
    ("a field no island has", set_island("tensor_parallel", 8),
     "islands[0]: `tensor_parallel` is not a field of Island"),
    ("no rate", lambda d: d["rates"].pop("rate_req_s"), "rates: no `rate_req_s`"),
    ("empty nodes", lambda d: d["islands"][0]["hosts"].__setitem__("nodes", []), "nodes is empty"),
    ("nodes to spare", lambda d: d["islands"][0]["hosts"].__setitem__("nodes", [0, 1]),
     "islands[0]: hosts: 8 GPUs from GPU 0 of 8-GPU hosts take 1 host(s), not the 2 in nodes"),
    ("negative size", set_island("size", -8), "islands[0]: size must be a whole number >= 1, got -8"),
    ("negative batch", set_island("batch", -1, 2), "islands[2]: batch must be a whole number >= 1, got -1"),
    ("negative load", set_island("tokens_per_gpu_s", -5.0, 2),
     "islands[2]: tokens_per_gpu_s must be a finite number >= 0, got -5.0"),
    ("EP group over the size", set_island("ep", 512, 2), "islands[2]: decode ep 512 x dp 1 must be the size 16"),
    ("EP group over the experts", lambda d: d["islands"][2].update(size=512, ep=512, ep_group=512, hosts={
        "node_gpus": 8, "nodes": list(range(64)), "first_gpu": 0}),
     "islands[2]: an EP group of 512 GPUs holds 256 routed experts as 1 per GPU with 256 redundant, not 16 with 0"),
    ("no islands", lambda d: d.__setitem__("islands", []), "`islands` is empty"),
    ("empty ranges", set_island("ranges", []), "islands[0]: a prefill island serves at least one input-length range"),
    ("batch of a billion", set_island("batch", 10**9, 2), "decode batch 1000000000 is over 1024 sequences per rank"),
    ("newer schema", lambda d: d.__setitem__("schema", 99), "plan schema 99 is not one this version"),
    ("two islands on one host", lambda d: d["islands"][1]["hosts"].update(nodes=[0]),
     "islands[1] and islands[0] both run on H200 host 0, GPU 0: a GPU serves one island"),
    ("more GPUs than the inventory", lambda d: d.__setitem__("inventory", {"name": "x", "cost_per_hour": 1.0,
                                                                           "gpus": [["H200", 8], ["H20", 16]]}),
     "its islands take 16 H200, but its inventory has 8"),
    ("workload_spec a list", lambda d: d.__setitem__("workload_spec", [1024]),
     "workload_spec must be the workload's conf mapping (an object), got [1024]"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), [e[1:] for e in EDITS], ids=[e[0] for e in EDITS])
def test_a_hand_edited_plan_is_one_line_from_simulate_and_deploy(
    tmp_path: Path, change: Callable[[dict[str, Any]], Any], message: str
) -> None:
    from pipeline.deploy import execute as deploy
    from pipeline.simulate import execute as simulate

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(edited(change)))
    for task, config, args in ((simulate, "simulate", [f"out_root={tmp_path}/sim"]),
                               (deploy, "deploy", [f"out={tmp_path}/deploy"])):  # fmt: skip
        r = in_process(task, config, f"plan={path}", *args, f"+mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"
                       if config == "deploy" else f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db")  # fmt: skip
        one_line(r, f"error: plan={path}: ")
        assert message in r.stderr, (config, r.stderr)
    assert not (tmp_path / "deploy").exists() and not (tmp_path / "sim").exists()  # refused before any work


def test_an_old_plan_json_edited_by_hand_is_refused_too() -> None:
    old = json.loads(V1.read_text())
    for change, message in [
        (lambda d: d.pop("rate_req_s"), "no `rate_req_s`"),
        (lambda d: d["islands"][3].__setitem__("tp", 0), "islands[3]: tp must be a whole number >= 1, got 0"),
        (lambda d: d.__setitem__("model", "qwen3_235b_a22b"), "model 'qwen3_235b_a22b' disagrees with its model_spec"),
        (lambda d: d.pop("cost"), "no `cost` record"),
    ]:
        data = copy.deepcopy(old)
        change(data)
        with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("(", r"\(")):
            plans.from_json(data, "plan.json")


def test_records_check_their_invariants_whoever_makes_them() -> None:
    plan = tiny_plan()
    with pytest.raises(PlanError, match="a rate of 4 req/s needs a prefill and a decode island"):
        dataclasses.replace(plan, islands=plan.islands[:2])
    with pytest.raises(PlanError, match="ranges overlap or are out of order"):
        dataclasses.replace(plan.islands[0], ranges=plan.islands[0].ranges[::-1])
    assert plan.count("prefill") == 2 and plan.count("decode") == 1 and plan.serves
    assert plan.cost_per_hour == pytest.approx(sum(isl.cost_per_hour for isl in plan.islands))


DATA = REPO / "tests" / "data"
OLD_PLANS = sorted({*DATA.glob("plan_v*.json"), *(DATA / "plans").glob("*.json")})


@pytest.mark.parametrize("path", OLD_PLANS, ids=lambda p: p.name)
def test_every_plan_json_of_an_earlier_schema_loads_and_reads_back_the_same_as_schema_3(path: Path) -> None:
    data = json.loads(path.read_text())
    assert data.get("schema", 1) in (1, 2)  # what earlier releases wrote
    plan = plans.load(path)
    written = plans.to_json(plan)
    assert written["schema"] == plans.SCHEMA == 3
    assert plans.from_json(json.loads(json.dumps(written))) == plan
    assert plan.rates.rate_req_s == (data["rates"] if "schema" in data else data)["rate_req_s"]

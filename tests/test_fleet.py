"""Several models on one inventory (`+fleet=NAME`): the joint MILP against brute force over every split of the
inventory, the command end to end, and its bad input."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import plan as plans
from helpers import compose, in_process, one_line
from pipeline.errors import USER_ERRORS
from pipeline.fleet.config import TIME_LIMIT_S, fleet_from_cfg
from pipeline.fleet.run import planned_layout, spread
from pipeline.planning.build import place
from solvers.exact import exact_optimum, island_classes, solve_counts
from solvers.fleet import FleetResult, Member, Split, fleet_optimum, spare_fleet_optimum, split_cheapest, split_optimum
from solvers.type_options import TypeOptions


def _types(rng: np.random.Generator, counts: dict[str, int], ranges: int) -> list[TypeOptions]:
    """Random islands: per type sizes 1, 2, 4 (4 only where it fits), throughput growing with size, some sizes
    unable to prefill or decode (memory)."""
    out = []
    for gpu, count in counts.items():
        sizes = np.array([s for s in (1, 2, 4) if s <= count])
        pre = rng.uniform(1, 10, (len(sizes), ranges)) * sizes[:, None]
        dec = rng.uniform(1, 10, (len(sizes), ranges)) * sizes[:, None]
        pre[0] *= rng.random() < 0.5  # the smallest island holds no prefill engine half the time
        out.append(TypeOptions(gpu, count, 1.0, sizes, pre, dec))
    return out


def _brute(members: list[Member]) -> float:
    """The best common fraction over every split of every GPU type between two members, each member's rate its
    own exact optimum on its part."""
    a, b = members
    counts = [t.count for t in a.types]
    best = 0.0
    for split in itertools.product(*(range(c + 1) for c in counts)):
        mine = [dataclasses.replace(t, count=k) for t, k in zip(a.types, split, strict=True)]
        theirs = [dataclasses.replace(t, count=t.count - k) for t, k in zip(b.types, split, strict=True)]
        ra = exact_optimum(mine, a.p, time_limit_s=30).rate_req_s if any(split) else 0.0
        rb = exact_optimum(theirs, b.p, time_limit_s=30).rate_req_s if split != tuple(counts) else 0.0
        best = max(best, min(ra / a.demand, rb / b.demand))
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_joint_optimum_of_two_models_is_the_best_of_every_split_of_the_inventory(seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = {"A": 4, "B": 3}
    members = [Member(f"m{k}", _types(rng, counts, 3), rng.dirichlet(np.ones(3)), float(rng.uniform(1, 5)))
               for k in range(2)]  # fmt: skip
    joint = fleet_optimum(members)
    assert joint.status == "optimal"
    assert joint.fraction == pytest.approx(_brute(members), rel=1e-6)
    for g, count in counts.items():  # one inventory: each GPU serves one model at most
        assert sum(size for isl in joint.islands for t, size, _ in isl if t == g) <= count
    # each model's islands alone serve its share of the common fraction
    for m, isl in zip(members, joint.islands, strict=True):
        have = [dataclasses.replace(t, count=sum(s for g, s, _ in isl if g == t.gpu)) for t in m.types]
        assert exact_optimum(have, m.p).rate_req_s >= joint.fraction * m.demand * (1 - 1e-6)
    split = split_optimum(members, steps=6)
    assert 0 < split.fraction <= joint.fraction + 1e-9
    assert sum(split.shares) <= 1 + 1e-9


def _cheapest(types: list[TypeOptions], p: np.ndarray, demand: float) -> float:
    """The least $/h of islands of `types` serving `demand` (inf where none does)."""
    if not any(t.count for t in types):
        return math.inf
    res = exact_optimum(types, p, objective="min_cost", demand_req_s=demand, time_limit_s=30)
    return res.cost_per_hour if res.status == "optimal" and res.islands else math.inf


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_cheapest_fleet_of_two_models_is_the_cheapest_of_every_split_of_the_inventory(seed: int) -> None:
    """`cheapest`: the least $/h of islands serving both demands equals the least sum, over every split of every GPU
    type, of each model's cheapest islands on its part; the best k/6 split of `split_cheapest` costs no less."""
    rng = np.random.default_rng(seed)
    counts, prices = {"A": 4, "B": 3}, {"A": 2.5, "B": 1.0}
    members = []
    for k in range(2):
        types = [dataclasses.replace(t, price_per_gpu_hour=prices[t.gpu]) for t in _types(rng, counts, 3)]
        members.append(Member(f"m{k}", types, rng.dirichlet(np.ones(3)), float(rng.uniform(1, 5))))
    most = fleet_optimum(members).fraction  # the demands at 60 % of what the inventory serves at most
    members = [dataclasses.replace(m, demand=0.6 * most * m.demand) for m in members]
    joint = fleet_optimum(members, cheapest=True)
    assert joint.status == "optimal" and joint.fraction == 1.0
    a, b = members
    brute = min(_cheapest([dataclasses.replace(t, count=k) for t, k in zip(a.types, split, strict=True)], a.p,
                          a.demand)
                + _cheapest([dataclasses.replace(t, count=t.count - k) for t, k in zip(b.types, split, strict=True)],
                            b.p, b.demand)
                for split in itertools.product(*(range(c + 1) for c in counts.values())))  # fmt: skip
    assert joint.cost_per_hour == pytest.approx(brute, rel=1e-6) and joint.bound <= joint.cost_per_hour + 1e-6
    for m, isl in zip(members, joint.islands, strict=True):  # each model's islands serve its demand
        have = [dataclasses.replace(t, count=sum(s for g, s, _ in isl if g == t.gpu)) for t in m.types]
        assert exact_optimum(have, m.p).rate_req_s >= m.demand * (1 - 1e-6)
    split = split_cheapest(members, steps=6)
    assert split is None or split.cost_per_hour >= joint.cost_per_hour - 1e-9


def _rate_without(m: Member, islands: tuple[tuple[str, int, str], ...], lost: set[int]) -> float:
    """Member `m`'s rate on its islands with those at the indices `lost` gone, each other island in its role and the
    routing re-solved (an LP over the class model)."""
    classes = island_classes(m.types)
    index = {(m.types[ti].gpu, int(m.types[ti].sizes[si])): c for c, (ti, si) in enumerate(classes)}
    counts = [[0.0, 0.0] for _ in classes]
    for k, (g, size, role) in enumerate(islands):
        if k not in lost:
            counts[index[(g, size)]][0 if role == "prefill" else 1] += 1
    return solve_counts(m.types, m.p, time_limit_s=30, fix=[(a, b) for a, b in counts])[0].rate_req_s


@pytest.mark.parametrize("seed", [0, 1])
def test_a_fleet_planned_for_a_host_lost_keeps_its_fraction_with_any_host_of_its_placement_gone(seed: int) -> None:
    """`spare`: the islands placed on hosts as a plan places them (islands below a host packed together, some of two
    models on one host), every host lost in turn, each model's islands left re-routed in their roles: every model
    keeps at least α of its demand; and α is no more than the optimum with every host up."""
    rng = np.random.default_rng(seed)
    node, sizes = {"A": 4, "B": 2}, np.array([1, 2, 4])
    members = [Member(f"m{k}", [TypeOptions(g, count, 1.0, sizes, rng.uniform(1, 10, (3, 3)) * sizes[:, None],
                                            rng.uniform(1, 10, (3, 3)) * sizes[:, None], node_gpus=node[g])
                                for g, count in (("A", 12), ("B", 8))],
                      rng.dirichlet(np.ones(3)), float(rng.uniform(1, 5))) for k in range(2)]  # fmt: skip
    joint = fleet_optimum(members, spare=True)
    assert joint.status == "optimal" and joint.lost_hosts == 1 and joint.fraction > 0
    assert joint.fraction <= fleet_optimum(members).fraction + 1e-9
    flat = [(m, k, isl) for m, isls in zip(members, joint.islands, strict=True) for k, isl in enumerate(isls)]
    hosts = place([(g, size) for _, _, (g, size, _) in flat], node)
    on: dict[tuple[str, int], list[int]] = {}
    for i, h in enumerate(hosts):
        for n in h.nodes:
            on.setdefault((flat[i][2][0], n), []).append(i)
    for ids in on.values():
        for m, isls in zip(members, joint.islands, strict=True):
            lost = {flat[i][1] for i in ids if flat[i][0] is m}
            assert _rate_without(m, isls, lost) >= joint.fraction * m.demand * (1 - 1e-6), (m.name, ids)


@pytest.mark.parametrize("seed", [3])
def test_the_reserve_keeps_no_more_than_the_exact_optimum_with_an_island_lost(seed: int) -> None:
    """Islands of whole hosts (a host per GPU): the exact joint optimum with any one island lost (a routing per loss,
    the losses joining as they bind) keeps its fraction with each of its islands lost, and lies between the reserve's
    (whose layouts keep theirs) and the optimum with every host up."""
    rng = np.random.default_rng(seed)
    sizes = np.array([1, 2, 4])
    members = [Member(f"m{k}", [TypeOptions(g, count, 1.0, sizes, rng.uniform(1, 10, (3, 3)) * sizes[:, None],
                                            rng.uniform(1, 10, (3, 3)) * sizes[:, None], node_gpus=1)
                                for g, count in (("A", 6), ("B", 4))],
                      rng.dirichlet(np.ones(3)), float(rng.uniform(1, 5))) for k in range(2)]  # fmt: skip
    exact = spare_fleet_optimum(members, time_limit_s=120)
    reserve = fleet_optimum(members, spare=True)
    assert exact.status == "optimal" and reserve.status == "optimal"
    assert reserve.fraction <= exact.fraction + 1e-6 <= fleet_optimum(members).fraction + 2e-6
    for m, isls in zip(members, exact.islands, strict=True):
        for i in range(len(isls)):
            assert _rate_without(m, isls, {i}) >= exact.fraction * m.demand * (1 - 1e-6)
    print(f"reserve {reserve.fraction:.4f}, exact with an island lost {exact.fraction:.4f}")


def test_the_reserve_is_exact_where_every_island_is_alike_and_serves_one_range() -> None:
    """One range, islands of one GPU each at 1 req/s in either role: with every host up 4 GPUs serve 2 (2 + 2), and
    with one lost 1; on hosts of two GPUs, 6 GPUs keep 1 with a host (two islands) lost, as the placement shows."""
    one = np.array([[1.0]])
    for count, node, up, lost in ((4, 1, 2.0, 1.0), (6, 2, 3.0, 1.0)):
        m = Member("m", [TypeOptions("A", count, 1.0, np.array([1]), one, one, node_gpus=node)], np.array([1.0]), 1.0)
        assert fleet_optimum([m]).fraction == pytest.approx(up)
        spare = fleet_optimum([m], spare=True)
        assert spare.fraction == pytest.approx(lost)
        isls = spare.islands[0]
        hosts = place([(g, size) for g, size, _ in isls], {"A": node})
        worst = min(_rate_without(m, isls, {i for i, h in enumerate(hosts) if h.nodes == (n,)})
                    for n in {h.nodes[0] for h in hosts})  # fmt: skip
        assert worst == pytest.approx(lost)
        if node == 1:  # a host an island: the exact optimum with an island lost is the reserve's
            assert spare_fleet_optimum([m]).fraction == pytest.approx(lost)


def test_the_fleet_of_two_real_models_on_a_small_inventory_is_the_best_split_by_brute_force() -> None:
    """DeepSeek-V3 on code and Qwen3-30B-A3B on conversation, islands of whole hosts of tiny_hetero: the joint MILP
    over the cost model's own benchmarks equals the best of every split of its 16 H200, 16 H800 and 32 H20 by host."""
    from pipeline.fleet.config import MemberSpec
    from pipeline.fleet.run import compose_member
    from pipeline.search.reference import type_options
    from pipeline.search.settings import inventory_of

    cfg = compose(["+inventory=tiny_hetero", "ranges.width=1000", "search.min_island=8"])
    name, inv_cfg = inventory_of(cfg)
    members = []
    for spec in (MemberSpec("deepseek_v3", "azure_code", None, None, 40.0, True),
                 MemberSpec("qwen3_30b_a3b", "azure_conv", None, None, 200.0, True)):  # fmt: skip
        c = compose_member(spec, name, inv_cfg, "serving")
        types, kv = type_options(c.settings, c.ctx, c.ctx.planner)
        assert all(int(s) % 8 == 0 for t in types for s in t.sizes)  # whole hosts: a split by host is every split
        members.append(Member(spec.model, types, c.ctx.planner.ranges.p, spec.demand, kv))
    assert members[1].types[0].count == 16 and [t.gpu for t in members[0].types] == ["H200", "H800", "H20"]
    joint = fleet_optimum(members)
    best = 0.0
    a, b = members
    for split in itertools.product(*(range(0, t.count + 1, 8) for t in a.types)):
        mine = [dataclasses.replace(t, count=k) for t, k in zip(a.types, split, strict=True)]
        theirs = [dataclasses.replace(t, count=t.count - k) for t, k in zip(b.types, split, strict=True)]
        ra = exact_optimum(mine, a.p, kv_gb=a.kv_gb).rate_req_s if any(t.count for t in mine) else 0.0
        rb = exact_optimum(theirs, b.p, kv_gb=b.kv_gb).rate_req_s if any(t.count for t in theirs) else 0.0
        best = max(best, min(ra / a.demand, rb / b.demand))
    assert joint.status == "optimal" and best > 0
    assert joint.fraction == pytest.approx(best, rel=1e-6)
    print(f"joint {joint.fraction:.4f} = best split by host {best:.4f}: {joint.islands}")


def test_a_fleet_plans_every_model_on_one_inventory_with_its_records(tmp_path: Path) -> None:
    """`+fleet=two_models` on tiny_hetero: a plan per model on hosts no other model uses, each simulated; fleet.json
    and report.md with the gap and the best split; MLflow's parent run with a child per model."""
    from pipeline.search.run import execute

    db = tmp_path / "m.db"
    r = in_process(execute, "search", "+fleet=two_models", "+inventory=tiny_hetero", "ranges.width=1000",
                   f"out_root={tmp_path}/search", f"mlflow.tracking_uri=sqlite:///{db}")  # fmt: skip
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    run = next((tmp_path / "fleet").glob("two_models-tiny_hetero-*/*/fleet.json")).parent
    record = json.loads((run / "fleet.json").read_text())
    assert [m["model"] for m in record["models"]] == ["deepseek_v3", "qwen3_235b_a22b"]
    used: dict[str, set[int]] = {}
    rates = []
    for m in record["models"]:
        p = plans.load(run / m["plan"])
        assert p.model.name == m["model"] and p.rate_req_s == pytest.approx(m["rate_req_s"])
        assert p.verification is not None and m["simulated_over_stated"] == pytest.approx(
            p.verification.simulated_over_stated)
        rates.append(p.rate_req_s / m["demand_req_s"])
        for isl in p.islands:
            if isl.serving:
                start = isl.hosts.nodes[0] * isl.hosts.node_gpus + isl.hosts.first_gpu  # GPUs numbered over hosts
                slots = set(range(start, start + isl.size))
                assert not slots & used.setdefault(isl.gpu, set()), (isl.gpu, isl.hosts)
                used[isl.gpu] |= slots
    assert sum(isl.size for m in record["models"] for isl in plans.load(run / m["plan"]).islands
               if isl.serving and isl.gpu == "H20") <= 32  # fmt: skip
    assert record["served"] == pytest.approx(min(rates))
    # each model's range as its own search draws it; the model no measurement is of, widened on every GPU
    ranges = {m["model"]: m for m in record["models"]}
    for m in record["models"]:
        p = plans.load(run / m["plan"])
        assert p.band is not None and m["range_req_s"] == pytest.approx([p.band.p10_req_s, p.band.p90_req_s])
        assert m["range_req_s"][0] < m["rate_req_s"] < m["range_req_s"][1]
    assert ranges["deepseek_v3"]["range_calibration"] == "serving"
    assert ranges["qwen3_235b_a22b"]["range_calibration"] == "published, widened: no fit to measured serving of " \
                                                             "qwen3_235b_a22b"  # fmt: skip
    worst = record["worst_host"]  # the host whose loss costs the fleet most: what it serves then, by each plan's own
    assert worst["served"] < record["served"] and worst["models"]
    for m in record["models"]:
        p = plans.load(run / m["plan"])
        lost = {(x.gpu, x.node): x.rate_req_s for x in p.host_losses.losses}
        assert worst["rates_req_s"][m["model"]] == pytest.approx(lost.get((worst["gpu"], worst["node"]), p.rate_req_s))
        assert min(x.rate_req_s for x in p.host_losses.losses) / m["demand_req_s"] >= worst["served"] - 1e-9
    ref, split = record["reference"], record["split"]
    assert ref["status"] == "optimal" and ref["gap"] >= 0 and split["fraction"] <= ref["fraction"] + 1e-9
    # planned for one host lost (the default): what the joint layout keeps by its reserve, the plans' own losses keep
    # too, and the optimum with every host up bounds it
    assert ref["lost_hosts"] == 1 and 0 < ref["fraction"] <= worst["served"] + 1e-6 and ref["fraction"] <= ref["bound"]
    print(f"fleet: {record['served']:.3f} every host up, {worst['served']:.3f} with the worst host lost, reserve "
          f"{ref['fraction']:.3f}, bound {ref['bound']:.3f}")
    report = (run / "report.md").read_text()
    assert "## The joint plan against the best split" in report and "## deepseek_v3" in report
    assert "## qwen3_235b_a22b" in report and "priced with calibration 'published' (costmodel.fallback)" in report

    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("archipelago")
    runs = client.search_runs([exp.experiment_id])
    parent = next(x for x in runs if x.info.run_name.startswith("fleet-two_models"))
    children = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(x.info.run_name for x in children) == ["deepseek_v3", "qwen3_235b_a22b"]
    assert parent.data.metrics["served"] == pytest.approx(record["served"])

    # simulated as one: each model's plan on its own requests (the router splits the mixed stream by model)
    from pipeline.simulate import execute as simulate

    r = in_process(simulate, "simulate", f"plan={run / 'fleet.json'}", "requests=400", f"out_root={tmp_path}/sim",
                   f"mlflow.tracking_uri=sqlite:///{db}")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "# Fleet two_models: every model simulated on its own requests" in r.stdout
    assert "| deepseek_v3 |" in r.stdout and "| qwen3_235b_a22b |" in r.stdout

    # its launch files: a folder per model, engines named after their model, one routing.json that routes by model
    from deployment.router.table import Fleet, read
    from pipeline.deploy import execute as deploy

    out = tmp_path / "deploy"
    r = in_process(deploy, "deploy", f"plan={run / 'fleet.json'}", f"out={out}", "target=k8s")
    one_line(r, "error: conf/deploy.yaml (or its overrides): the fleet serves qwen3_235b_a22b, whose weights' folder "
                "is not given: add model_paths.qwen3_235b_a22b=")  # fmt: skip
    r = in_process(deploy, "deploy", f"plan={run / 'fleet.json'}", f"out={out}", "target=k8s",
                   "model_paths.qwen3_235b_a22b=/models/Qwen3-235B-A22B")  # fmt: skip
    assert r.returncode == 0, r.stderr
    fleet = read(out / "routing.json")
    assert isinstance(fleet, Fleet) and sorted(fleet.tables) == ["deepseek_v3", "qwen3_235b_a22b"]
    assert fleet.aliases == {"/models/DeepSeek-V3": "deepseek_v3", "/models/Qwen3-235B-A22B": "qwen3_235b_a22b"}
    for model, t in fleet.tables.items():
        assert t.engines and all(e.startswith(f"http://{model.replace('_', '-')}-i") for e in t.engines)
        assert (out / model / "manifests.yaml").exists()
    r = in_process(deploy, "deploy", f"plan={run / 'fleet.json'}", f"out={out}", "target=k8s",
                   "model_paths.qwen3_235b_a22b=/models/Qwen3-235B-A22B")  # fmt: skip
    one_line(r, f"error: out={out}: holds an earlier fleet deploy; give replace=true")

    # the worst host lost, the fleet re-planned with few moves: the models with an island on it re-planned on hosts no
    # other model runs on, the others as they run
    lost, node_gpus = (worst["gpu"], worst["node"]), 8
    count = {"H200": 16, "H800": 16, "H20": 32}[lost[0]] - node_gpus
    again = ["+fleet=two_models", "+inventory=tiny_hetero", "ranges.width=1000",
             f"search.from_plan={run / 'fleet.json'}", f"out_root={tmp_path}/search",
             f"mlflow.tracking_uri=sqlite:///{db}"]  # fmt: skip
    r = in_process(execute, "search", *again, f"inventory.gpus.{lost[0]}={count}",
                   f"search.lost_hosts=[{lost[0]}:{lost[1]}]", "search.max_moves=2")  # fmt: skip
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    new = max((tmp_path / "fleet").glob("two_models-tiny_hetero-*/*/fleet.json"), key=lambda f: f.stat().st_mtime)
    replanned = json.loads(new.read_text())
    assert replanned["replan"]["lost_hosts"] == [f"{lost[0]}:{lost[1]}"]
    assert replanned["reference"]["status"] == "replan"
    assert sorted(replanned["replan"]["models"]) == sorted(worst["models"])
    slots: dict[str, set[int]] = {}
    for m in replanned["models"]:
        p, was = plans.load(new.parent / m["plan"]), plans.load(run / m["plan"])
        for isl in p.islands:
            if isl.serving:  # no GPU of two models, none on the host lost
                assert not (isl.gpu == lost[0] and lost[1] in isl.hosts.nodes), isl.hosts
                start = isl.hosts.nodes[0] * isl.hosts.node_gpus + isl.hosts.first_gpu
                assert not set(range(start, start + isl.size)) & slots.setdefault(isl.gpu, set())
                slots[isl.gpu] |= set(range(start, start + isl.size))
        if m["model"] not in worst["models"]:
            assert p.islands == was.islands and p.replan is None
            continue
        moved = replanned["replan"]["models"][m["model"]]
        assert p.replan is not None and len(p.replan.moves) == len(moved["moves"]) and 1 <= len(moved["moves"])
        assert moved["with_the_loss_req_s"] == pytest.approx(worst["rates_req_s"][m["model"]])
        assert p.rate_req_s >= 0.98 * moved["with_the_loss_req_s"] and p.verification is not None
    assert "## Re-planned from a running fleet" in (new.parent / "report.md").read_text()
    one_line(in_process(execute, "search", *again, "search.lost_hosts=[H20:99]"),
             "error: search.lost_hosts: 'H20:99' is not a host of the running fleet")  # fmt: skip
    one_line(in_process(execute, "search", *again[:3], f"search.from_plan={run / 'deepseek_v3' / 'plan.json'}",
                        *again[4:]),
             "error: search.from_plan=")  # fmt: skip


BAD = [  # (the fleet's `models`, the error's words)
    ([{"model": "gpt9", "workload": "azure_code", "demand_req_s": 1}], "model 'gpt9' is not in the catalogue"),
    ([{"model": "deepseek_v3", "workload": "azure_code", "demand_req_s": 1},
      {"model": "deepseek_v3", "workload": "azure_conv", "demand_req_s": 1}], "deepseek_v3 is in the fleet twice"),
    ([{"model": "deepseek_v3", "workload": "azure_code", "demand_req_s": 0}], "demand_req_s=0 for deepseek_v3: it "
     "must be a finite number > 0"),
    ([{"model": "deepseek_v3", "workload": "azure_code", "demand_req_s": -5}], "demand_req_s=-5 for deepseek_v3"),
    ([{"model": "deepseek_v3", "workload": "azure_code", "demand_req_s": 10},
      {"model": "qwen3_30b_a3b", "workload": "azure_conv", "weight": 1}], "qwen3_30b_a3b gives a weight where the "
     "other models give demands in req/s"),
    ([{"model": "deepseek_v3", "workload": "azure_code"}], "deepseek_v3 has neither demand_req_s (req/s) nor weight"),
    ([{"model": "deepseek_v3", "demand_req_s": 1}], "deepseek_v3 has no workload"),
]  # fmt: skip


@pytest.mark.parametrize(("models", "words"), BAD)
def test_a_bad_fleet_is_refused_naming_the_model_and_the_fix(models: list[Any], words: str) -> None:
    with pytest.raises(USER_ERRORS) as err:
        fleet_from_cfg("f", {"models": models})
    assert words in str(err.value), str(err.value)


@pytest.mark.parametrize("limit", [0, -1, "soon", True, float("inf")])
def test_a_joint_milp_time_limit_that_is_not_a_positive_number_is_refused(limit: Any) -> None:
    one = [{"model": "deepseek_v3", "workload": "azure_code", "demand_req_s": 1}]
    assert fleet_from_cfg("f", {"models": one}).time_limit_s == TIME_LIMIT_S
    assert fleet_from_cfg("f", {"models": one, "time_limit_s": 7}).time_limit_s == 7.0
    with pytest.raises(USER_ERRORS) as err:
        fleet_from_cfg("f", {"models": one, "time_limit_s": limit})
    assert f"time_limit_s={limit!r}: the joint MILP's time limit must be a number of seconds > 0" in str(err.value)


def test_the_models_plans_are_spread_over_the_cores_the_most_requests_first() -> None:
    assert spread([250, 250, 1000], 2) == [[2], [0, 1]]
    assert spread([3, 1, 1, 1], 2) == [[0], [1, 2, 3]]
    assert spread([5, 4, 3], 8) == [[0], [1], [2]] and spread([5, 4, 3], 1) == [[0, 1, 2]]


def test_a_joint_milp_cut_short_plans_its_best_layout_or_the_best_splits_whichever_serves_more() -> None:
    """At its time limit the joint MILP's best layout is planned where it serves at least the best split's fraction,
    with the MILP's proven bound; else the best split's islands with that bound; with no layout, the LP's bound."""
    isl_joint, isl_split = ((("H20", 8, "decode"),),), ((("H200", 8, "decode"),),)
    split = Split((0.5,), 1.2, (120.0,), isl_split, True)
    lp = {"calls": 0}

    def lp_bound() -> float:
        lp["calls"] += 1
        return 1.6

    ahead = FleetResult("feasible", 1.3, 1.5, isl_joint, 10.0, 40e3)
    assert planned_layout(ahead, split, lp_bound) is ahead
    behind = FleetResult("feasible", 1.1, 1.5, isl_joint, 10.0, 40e3)
    took = planned_layout(behind, split, lp_bound)
    assert (took.status, took.fraction, took.bound, took.islands) == ("split", 1.2, 1.5, isl_split)
    none = FleetResult("time_limit", 0.0, float("nan"), (), 0.0, 40e3)
    took = planned_layout(none, split, lp_bound)
    assert (took.status, took.fraction, took.bound, took.islands, lp["calls"]) == ("split", 1.2, 1.6, isl_split, 1)


def test_a_bad_fleet_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    from pipeline.search.run import execute

    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "twice.yaml").write_text(
        "models:\n  - {model: deepseek_v3, workload: azure_code, demand_req_s: 10}\n"
        "  - {model: deepseek_v3, workload: azure_conv, demand_req_s: 10}\n")
    r = in_process(execute, "search", f"hydra.searchpath=[file://{tmp_path}]", "+fleet=twice")
    one_line(r, "error: fleet twice (conf/fleet/twice.yaml), models[1]: deepseek_v3 is in the fleet twice")


def test_the_cheapest_fleet_serves_every_demand_with_the_islands_the_milp_priced(tmp_path: Path) -> None:
    """`search.objective=min_cost`: the cheapest islands of tiny_hetero serving both demands with any one host lost
    (the default), each model's plan holding its demand with each of its hosts gone, its $/h above the cheapest with
    every host up, which bounds it; with every host up (search.spare_hosts=0) the $/h the MILP proved least; demands
    the inventory cannot serve: exit 1 naming the most it serves; a fleet of weights or another objective, or more
    than one host lost: one error line, exit 2."""
    from pipeline.search.run import execute

    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "small.yaml").write_text(
        "models:\n  - {model: deepseek_v3, workload: azure_code, demand_req_s: 10}\n"
        "  - {model: qwen3_235b_a22b, workload: azure_conv, demand_req_s: 10}\n")
    (tmp_path / "fleet" / "weights.yaml").write_text(
        "models:\n  - {model: deepseek_v3, workload: azure_code, weight: 1}\n"
        "  - {model: qwen3_235b_a22b, workload: azure_conv, weight: 2}\n")
    common = [f"hydra.searchpath=[file://{tmp_path}]", "+inventory=tiny_hetero", "ranges.width=1000",
              "search.objective=min_cost", "search.host_losses=false", f"out_root={tmp_path}/search",
              f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"]  # fmt: skip

    def record(*extra: str) -> tuple[Path, dict[str, Any], str]:
        r = in_process(execute, "search", *common, "+fleet=small", *extra)
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
        run = sorted((tmp_path / "fleet").glob("small-tiny_hetero-*/*/fleet.json"), key=lambda f: f.stat().st_mtime)
        return run[-1].parent, json.loads(run[-1].read_text()), r.stdout

    run, spare, out = record()
    ref = spare["reference"]
    assert spare["objective"] == "min_cost" and ref["lost_hosts"] == 1 and ref["status"] == "optimal"
    assert spare["cost_per_hour"] == pytest.approx(ref["cost_per_hour"])
    assert ref["cost_per_hour"] < spare["inventory_cost_per_hour"]
    for m in spare["models"]:  # each model holds its demand with each of its hosts lost (the plan's own losses)
        p = plans.load(run / m["plan"])
        assert p.host_losses is not None and p.host_losses.losses
        assert min(x.rate_req_s for x in p.host_losses.losses) >= m["demand_req_s"] * (1 - 1e-6)
        assert abs(m["simulated_over_stated"] - 1) <= 0.05
    assert "every demand served with any one host lost" in out
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db")
    runs = client.search_runs([client.get_experiment_by_name("archipelago").experiment_id])
    parent = next(x for x in runs if x.info.run_name.startswith("fleet-small"))
    assert parent.data.params["objective"] == "min_cost"
    assert parent.data.metrics["cheapest_cost_per_hour"] == pytest.approx(ref["cost_per_hour"])
    assert parent.data.metrics["cost_bound_per_hour"] == pytest.approx(ref["bound"])

    _, up, out = record("search.spare_hosts=0")  # every host up: the exact cheapest, which bounds the one above
    ref = up["reference"]
    assert ref["lost_hosts"] == 0 and ref["status"] == "optimal" and ref["gap"] == pytest.approx(0, abs=1e-6)
    assert ref["bound"] <= ref["cost_per_hour"] + 1e-6 and up["cost_per_hour"] == pytest.approx(ref["cost_per_hour"])
    assert spare["reference"]["bound"] <= ref["cost_per_hour"] + 1e-6 <= spare["cost_per_hour"] + 2e-6
    for m in up["models"]:  # each model's plan on its islands serves its demand, and the simulator agrees
        assert m["rate_req_s"] >= m["demand_req_s"] * (1 - 1e-6) and abs(m["simulated_over_stated"] - 1) <= 0.05
    assert "the cheapest (optimal)" in out and "| cheapest islands | $" in next(
        (tmp_path / "fleet").glob("small-*/*/report.md")).read_text()
    r = in_process(execute, "search", *common, "+fleet=two_models")  # 300 req/s each: more than tiny_hetero serves
    assert r.returncode == 1 and "[fleet] error: no layout of tiny_hetero" in r.stdout
    assert "serves every model's demand with any one host lost: it serves at most 0.0" in r.stdout
    one_line(in_process(execute, "search", *common, "+fleet=weights"),
             "error: search.objective=min_cost: fleet weights gives weights")  # fmt: skip
    one_line(in_process(execute, "search", *common, "+fleet=small", "search.objective=rate_per_dollar"),
             "error: search.objective=rate_per_dollar: a fleet maximises the common fraction")  # fmt: skip
    one_line(in_process(execute, "search", *common, "+fleet=small", "search.spare_hosts=2"),
             "error: search.spare_hosts=2: a fleet is planned for one host lost at most")  # fmt: skip


def test_a_model_no_gpu_type_of_the_inventory_holds_or_whose_slo_none_meets_is_named(tmp_path: Path) -> None:
    from pipeline.search.run import execute

    for group in ("fleet", "inventory"):
        (tmp_path / group).mkdir()
    (tmp_path / "fleet" / "big.yaml").write_text(
        "models:\n  - {model: qwen3_30b_a3b, workload: azure_conv, demand_req_s: 10}\n"
        "  - {model: kimi_k2, workload: azure_code, demand_req_s: 10}\n")
    (tmp_path / "inventory" / "h20_8.yaml").write_text("gpus:\n  H20: 8\nprices: {}\n")
    r = in_process(execute, "search", f"hydra.searchpath=[file://{tmp_path}]", "+fleet=big", "+inventory=h20_8",
                   "ranges.width=1000")  # fmt: skip
    one_line(r, "error: fleet member kimi_k2 (workload azure_code): kimi_k2's weights alone take 1,029 GB, more "
                "than all the GPUs of any type of the inventory hold (8 H20 hold 768 GB)")  # fmt: skip
    r = in_process(execute, "search", "+fleet=two_models", "+inventory=tiny_hetero", "ranges.width=1000",
                   "slo.tpot_ms=2")  # fmt: skip
    one_line(r, "error: fleet member deepseek_v3 (workload azure_code): inventory tiny_hetero")
    assert "no decode configuration of 16 x H200 meets the TPOT cap of 2.0 ms" in r.stderr


def test_a_joint_milp_cut_short_plans_the_best_split_and_bounds_the_gap(tmp_path: Path) -> None:
    """fleet.time_limit_s too short for the joint MILP to find a layout: the fleet is planned on the best
    split's islands (a joint layout too), and the LP relaxation's bound gives the most it can be short of the
    optimum; said in fleet.json and on the console, exit 0."""
    from pipeline.search.run import execute

    r = in_process(execute, "search", "+fleet=two_models", "+inventory=tiny_hetero", "ranges.width=1000",
                   "fleet.time_limit_s=0.001", "search.verify=false", f"out_root={tmp_path}/search",
                   f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(next((tmp_path / "fleet").glob("*/*/fleet.json")).read_text())
    ref = record["reference"]
    assert ref["status"] == "split" and ref["fraction"] == pytest.approx(record["split"]["fraction"])
    # planned for one host lost (the default): the split's fraction with a host lost, by the same reserve
    assert ref["lost_hosts"] == 1 and ref["bound"] >= record["served"]
    assert ref["gap"] == pytest.approx(1 - ref["fraction"] / ref["bound"])
    assert record["worst_host"]["served"] >= ref["fraction"] - 1e-9
    assert "the joint MILP found no layout within fleet.time_limit_s=0.001" in r.stdout

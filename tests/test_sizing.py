"""Sizing (search.objective=min_cost): the cheapest fleet for a demand, checked against brute force at every level
(the inner MILP's min_cost, the host-lost model of solvers/spare.py, the exact reference), against the max-rate
answer asked back as a demand, and end to end as a user runs it: a Hydra multirun over demands through Ray Tune,
Optuna, OR-Tools and MLflow, with the cost curve drawn in the sweep's folder."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from helpers import SMALL, cli, in_process, one_line
from solvers.exact import exact_optimum, solve_counts, spare_cheapest
from solvers.inner import InnerProblem, solve
from solvers.spare import cheapest_roles, spare_roles
from solvers.type_options import TypeOptions


def _random_layout(rng: np.random.Generator) -> tuple[tuple[tuple[str, int], ...], np.ndarray, np.ndarray, np.ndarray,
                                                      np.ndarray]:  # fmt: skip
    n_i, n_j = int(rng.integers(2, 6)), int(rng.integers(1, 4))
    kinds = rng.integers(0, 2, size=n_i)  # two kinds of island: identical islands form classes
    bp, bd = rng.random((2, n_j)) * 10, rng.random((2, n_j)) * 10
    p = rng.random(n_j)
    islands = tuple((f"G{k}", 8) for k in kinds)
    return islands, p / p.sum(), bp[kinds], bd[kinds], 1.0 + 2.0 * kinds


def test_the_inner_min_cost_keeps_the_cheapest_islands_that_serve_the_demand() -> None:
    rng = np.random.default_rng(1)
    for _ in range(15):
        islands, p, bp, bd, cost = _random_layout(rng)
        most = solve(InnerProblem(islands, p, bp, bd)).rate_req_s
        demand = most * rng.uniform(0.1, 1.1)
        sol = solve(InnerProblem(islands, p, bp, bd, cost_per_hour=cost, demand_req_s=demand))
        best = np.inf  # brute force: every subset of the islands, its max rate
        for mask in itertools.product((0, 1), repeat=len(islands)):
            idx = [i for i, on in enumerate(mask) if on]
            if idx and solve(InnerProblem(tuple(islands[i] for i in idx), p, bp[idx], bd[idx])).rate_req_s >= \
                    demand * (1 - 1e-9):  # fmt: skip
                best = min(best, float(cost[idx].sum()))
        if best == np.inf:
            assert sol.status == "infeasible"
            continue
        assert sol.status == "optimal"
        assert cost[[r != "idle" for r in sol.roles]].sum() == pytest.approx(best)
        assert sol.rate_req_s == pytest.approx(demand, rel=1e-6)


def _held(bp: np.ndarray, bd: np.ndarray, p: np.ndarray, scen: list[set[int]], roles: list[str]) -> float:
    """The lowest rate over `scen` of the islands not idle in `roles`, each kept in its role."""
    idx = [i for i, r in enumerate(roles) if r != "idle"]
    at = {i: k for k, i in enumerate(idx)}
    lost = [{at[i] for i in s if i in at} for s in scen]
    return spare_roles(bp[idx], bd[idx], p, lost, fixed=[roles[i] for i in idx]).rate_req_s


@pytest.mark.parametrize("per_host", [1, 2])
def test_the_cheapest_fleet_with_a_host_lost_against_brute_force(per_host: int) -> None:
    """One island a host: exactly the cheapest subset whose roles keep the demand with any host lost. Two a host:
    a fleet that keeps it (each role's routing takes the host's islands from its own count: the safe side), never
    cheaper than the brute force's."""
    rng = np.random.default_rng(2 + per_host)
    for _ in range(12):
        _, p, bp, bd, cost = _random_layout(rng)
        n_i = len(cost)
        scen = [set(range(k, min(k + per_host, n_i))) for k in range(0, n_i, per_host)]
        demand = max(spare_roles(bp, bd, p, scen).rate_req_s, 0.1) * rng.uniform(0.2, 1.05)
        got = cheapest_roles(bp, bd, p, scen, cost, demand)
        best = np.inf
        for mask in itertools.product((0, 1), repeat=n_i):
            idx = [i for i, on in enumerate(mask) if on]
            if len(idx) < 2:
                continue
            at = {i: k for k, i in enumerate(idx)}
            if spare_roles(bp[idx], bd[idx], p, [{at[i] for i in s if i in at} for s in scen]).rate_req_s >= \
                    demand * (1 - 1e-7):  # fmt: skip
                best = min(best, float(cost[idx].sum()))
        if got.status != "optimal":
            assert got.status == "infeasible"
            assert per_host > 1 or best == np.inf
            continue
        paid = float(cost[[r != "idle" for r in got.roles]].sum())
        assert _held(bp, bd, p, scen, list(got.roles)) >= demand * (1 - 1e-6)
        assert paid == pytest.approx(best) if per_host == 1 else paid >= best - 1e-9


def _types(rng: np.random.Generator) -> list[TypeOptions]:
    """Two GPU types of 4 GPUs in hosts of 2, islands of 2 or 4 GPUs, random rates over 2 ranges."""
    return [TypeOptions(g, 4, price, np.array([2, 4]), rng.random((2, 2)) * s, rng.random((2, 2)) * s)
            for g, price, s in (("A", 1.0, 4.0), ("B", 3.0, 12.0))]  # fmt: skip


def _layouts(types: list[TypeOptions]) -> list[list[tuple[float, float]]]:
    """Every layout of `types` as (n^P, n^D) per class (`solvers.exact.island_classes` order)."""
    from solvers.exact import island_classes

    classes = island_classes(types)
    ranges = [range(types[ti].count // int(types[ti].sizes[si]) + 1) for ti, si in classes]
    out = []
    for counts in itertools.product(*[list(itertools.product(r, r)) for r in ranges]):
        used = {ti: 0 for ti in range(len(types))}
        for (ti, si), (a, b) in zip(classes, counts, strict=True):
            used[ti] += int(types[ti].sizes[si]) * (a + b)
        if all(used[ti] <= t.count for ti, t in enumerate(types)):
            out.append([(float(a), float(b)) for a, b in counts])
    return out


def test_the_exact_cheapest_fleet_against_brute_force_every_host_up_and_with_one_lost() -> None:
    from solvers.exact import _loss_rates, island_classes

    rng = np.random.default_rng(7)
    p = np.array([0.6, 0.4])
    for _ in range(3):
        types = _types(rng)
        classes = island_classes(types)
        price = [int(types[ti].sizes[si]) * types[ti].price_per_gpu_hour for ti, si in classes]
        layouts = _layouts(types)
        rates = [solve_counts(types, p, time_limit_s=60.0, fix=c)[0].rate_req_s for c in layouts]
        kept = [min(_loss_rates(types, p, c).values(), default=r) for c, r in zip(layouts, rates, strict=True)]
        most = exact_optimum(types, p).rate_req_s
        assert most == pytest.approx(max(rates), rel=1e-6)
        for share in (0.3, 0.7):
            demand = share * most

            paid = [sum(n * (a + b) for n, (a, b) in zip(price, c, strict=True)) for c in layouts]
            cheapest_up = min((x for x, r in zip(paid, rates, strict=True) if r >= demand * (1 - 1e-7)),
                              default=np.inf)  # fmt: skip
            cheapest_lost = min((x for x, r in zip(paid, kept, strict=True) if r >= demand * (1 - 1e-7)),
                                default=np.inf)  # fmt: skip
            up = exact_optimum(types, p, objective="min_cost", demand_req_s=demand)
            assert up.status == "optimal" and up.cost_per_hour == pytest.approx(cheapest_up)
            lost = spare_cheapest(types, p, demand)
            if cheapest_lost == np.inf:
                assert lost.status == "infeasible"
            else:
                assert lost.status == "optimal" and lost.cost_per_hour == pytest.approx(cheapest_lost)
                assert lost.cost_per_hour >= up.cost_per_hour


def test_the_max_rate_optimum_asked_back_as_a_demand_costs_at_most_the_inventory() -> None:
    """The sizing question inverts the max-rate one: the most the inventory serves, asked as a demand, is served
    by a fleet of at most the inventory's $/h; a little more is served by none."""
    types = _types(np.random.default_rng(11))
    p = np.array([0.5, 0.5])
    most = exact_optimum(types, p)
    whole = sum(t.count * t.price_per_gpu_hour for t in types)
    back = exact_optimum(types, p, objective="min_cost", demand_req_s=most.rate_req_s * (1 - 1e-7))
    assert back.status == "optimal" and back.cost_per_hour <= whole + 1e-9
    assert exact_optimum(types, p, objective="min_cost", demand_req_s=most.rate_req_s * 1.001).status == "infeasible"


SIZING_BAD = [
    (["search.objective=min_cost"], "error: search.objective=min_cost finds the cheapest fleet for a demand: set "
                                    "search.demand_req_s"),
    (["search.demand_req_s=30"], "error: search.demand_req_s=30 is the demand of the sizing objective: add "
                                 "search.objective=min_cost"),
    (["search.objective=min_cost", "search.demand_req_s=0"], "error: search.demand_req_s=0: the demand must be a "
                                                             "finite number of requests/s > 0"),
    (["search.objective=min_cost", "search.demand_req_s=-5"], "error: search.demand_req_s=-5: the demand must be"),
    (["search.objective=min_cost", "search.demand_req_s=nan"], "error: search.demand_req_s=nan: the demand must be"),
    (["search.objective=min_cost", "search.demand_req_s=1e9"],
     "error: search.demand_req_s=1e+09 is more than inventory tiny_hetero serves within the SLOs: at most "),
    (["search.objective=min_cost", "search.demand_req_s=30", "+inventory.gpus.MI355X=8"],
     "error: search.objective=min_cost prices every GPU, and MI355X has none in inventory tiny_hetero "
     "(price_per_hour 0 in conf/gpu/MI355X.yaml): set prices: {MI355X: <USD per GPU-hour>} in the inventory"),
    (["search.objective=min_cost", "search.demand_req_s=30", "search.budget_per_hour=100"],
     "error: search.objective=min_cost finds the cheapest fleet of the inventory that serves a demand; it cannot go "
     "with search.budget_per_hour"),
    (["search.objective=min_cost", "search.demand_req_s=30", "search.spare_hosts=8"],
     "error: search.spare_hosts=8: the inventory has 8 hosts; losing 8 leaves nothing to serve with"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "start"), SIZING_BAD, ids=[" ".join(a) for a, _ in SIZING_BAD])
def test_a_sizing_search_refuses_bad_input_in_one_line(tmp_path: Path, args: list[str], start: str) -> None:
    from pipeline.search.run import execute

    r = in_process(execute, "search", *SMALL, f"out_root={tmp_path}/out",
                   f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db", *args)  # fmt: skip
    one_line(r, start)
    assert not list((tmp_path / "out").glob("*/*/trials.jsonl"))  # refused before any trial


def test_a_multirun_over_demands_plans_the_cheapest_fleets_and_draws_the_cost_curve(tmp_path: Path) -> None:
    """`python -m pipeline.search -m search.demand_req_s=A,B` as a user runs it (a Hydra multirun, each job in its
    own folder and MLflow run): each job's fleet keeps its demand with any host lost, costs what the exact cheapest
    does (search.reference=spare) and no more than the inventory, and the sweep's folder holds both points and the
    picture."""
    r = cli("pipeline.search", *SMALL, "search.iterations=2", "search.band_draws=0", "search.objective=min_cost",
            "search.reference=spare",
            f"out_root={tmp_path}/out", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            "-m", "search.demand_req_s=12,30", timeout=400)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    # each job says what it sweeps, runs in its own folder and MLflow parent run; Hydra's record goes beside out_root
    assert "[multirun] job 0: " in r.stdout and "search.demand_req_s=30" in r.stdout
    (sweep,) = (tmp_path / "multirun").glob("*")
    assert (sweep / "multirun.yaml").exists()
    dirs = sorted(p.parent for p in (tmp_path / "out").glob("*/*/plan.json"))
    assert len(dirs) == 2 and len({d.parent for d in dirs}) == 2
    assert len({json.loads((d / "state.json").read_text())["parent_run_id"] for d in dirs}) == 2
    plans = sorted((json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/*/plan.json")),
                   key=lambda d: d["sizing"]["demand_req_s"])  # fmt: skip
    assert [d["sizing"]["demand_req_s"] for d in plans] == [12.0, 30.0]
    for d in plans:
        z = d["sizing"]
        assert z["hosts_lost"] == 1 and z["reference_hosts_lost"] == 1
        assert z["searched_per_hour"] == pytest.approx(z["cheapest_per_hour"], rel=0.01)  # gap <= 1 %
        assert d["reference"]["gap"] == pytest.approx(1 - z["cheapest_per_hour"] / z["searched_per_hour"], abs=1e-9)
        assert z["searched_per_hour"] <= d["cost_per_hour"] <= z["inventory_cost_per_hour"]
        assert min(loss["rate_req_s"] for loss in d["host_losses"]["losses"]) >= z["demand_req_s"] * 0.999
    assert plans[0]["cost_per_hour"] <= plans[1]["cost_per_hour"]
    from plan import load  # plan.json reads back whole, its sizing record with it (deploy and simulate read it so)

    assert all(load(d / "plan.json").sizing is not None for d in dirs)
    points = [json.loads(line) for line in (sweep / "cost_curve.jsonl").read_text().splitlines()]
    assert sorted(p["demand_req_s"] for p in points) == [12.0, 30.0]
    assert (sweep / "cost_curve.png").stat().st_size > 10_000
    report = next((tmp_path / "out").glob("*/*/report.md")).read_text()
    assert "## Sizing (search.objective=min_cost)" in report and "Cheapest fleet found for" in report


def test_the_best_layouts_fleet_is_trimmed_an_island_at_a_time() -> None:
    """A layout of whole islands holds more than a small demand needs: trimming its fleet island by island (one
    size smaller, or dropped) costs less than its cheapest subset of islands, each island a size the search allows,
    and the trimmed fleet still serves the demand (its own cheapest subset is itself)."""
    from helpers import compose
    from pipeline.planning.planner import Layout
    from pipeline.planning.sizing import Sizer
    from pipeline.search.settings import inventory_of, settings_from_cfg

    cfg = compose(["+inventory=tiny_hetero", "ranges.width=1000", "search.objective=min_cost",
                   "search.demand_req_s=10"])  # fmt: skip
    _, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    layout = Layout.of([("H20", 32), ("H200", 16), ("H800", 16)])
    sizes = {g: ctx.space.sizes(g) for g, _ in ctx.space.inventory}
    sizer = Sizer(ctx.planner, 10.0)
    whole = sizer.cheapest(layout)
    trim = sizer.trimmed(layout, sizes)
    assert whole.layout is not None and trim.layout is not None
    assert trim.cost_per_hour < whole.cost_per_hour
    assert all(n in sizes[g] for g, n in trim.layout.islands)
    again = sizer.cheapest(trim.layout)
    assert again.cost_per_hour == pytest.approx(trim.cost_per_hour)

"""Aggregated islands (`costmodel.aggregated`): engines prefilling and decoding their own requests in mixed steps,
priced by hand, chosen by the inner solve and the exact reference, carried by plan.json and simulated as such."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import plan as plans
from costmodel.catalog import load_gpu, load_model
from costmodel.formulas import prefill_parts
from costmodel.island_bench import benchmark_island, decode_tokens_ms
from costmodel.settings import CostSettings, EngineSettings, Slo
from helpers import compose, flat_cost, in_process, one_line
from solvers.exact import exact_optimum
from solvers.inner import InnerProblem, solve
from solvers.type_options import TypeOptions

DSV3 = load_model("deepseek_v3")
H200 = load_gpu("H200")
ONE = np.array([1.0])


def problem(n: int, **kw: object) -> InnerProblem:
    """n identical islands of one range: 10 req/s prefilling or decoding alone, 5 req/s as aggregated engines."""
    kw.setdefault("aggregated_req_s", np.full((n, 1), 5.0))
    return InnerProblem((("H200", 8),) * n, ONE, np.full((n, 1), 10.0), np.full((n, 1), 10.0), **kw)  # type: ignore[arg-type]


def test_one_island_serves_as_an_aggregated_engine_where_disaggregation_needs_two() -> None:
    sol = solve(problem(1))
    assert sol.roles == ("aggregated",) and sol.rate_req_s == pytest.approx(5.0)
    # an aggregated island's share is in both phases, each at its aggregated rate
    assert sol.x_prefill[0, 0] == sol.x_decode[0, 0] == pytest.approx(1.0)
    assert sol.prefill_req_s == sol.decode_req_s == pytest.approx(5.0)
    assert solve(problem(1, aggregated_req_s=None)).rate_req_s == 0.0  # (the same island without the role)


def test_an_odd_island_aggregates_rather_than_stay_unbalanced() -> None:
    """Three islands: prefill + two decode serve 10 req/s (prefill-bound); three aggregated 3 x 5 = 15."""
    sol = solve(problem(3))
    assert sol.rate_req_s == pytest.approx(15.0) and sol.roles.count("aggregated") == 3
    fixed = solve(problem(3, roles=("prefill", "decode", "aggregated")))
    assert fixed.rate_req_s == pytest.approx(15.0)  # 10 + 5 in each phase


def test_a_budget_counts_aggregated_islands() -> None:
    sol = solve(problem(3, cost_per_hour=np.ones(3), budget_per_hour=1.0))
    assert sol.rate_req_s == pytest.approx(5.0) and sorted(sol.roles) == ["aggregated", "idle", "idle"]


def test_aggregated_islands_hand_no_kv_over_the_network() -> None:
    """A link too slow for any hand-off: prefill and decode islands serve nothing; aggregated ones all of it."""
    sol = solve(problem(2, kv_gb=np.array([1.0]), link_gb_s=np.full(2, 1e-6)))
    assert sol.rate_req_s == pytest.approx(10.0) and sol.roles == ("aggregated", "aggregated")


def test_the_exact_reference_chooses_aggregated_islands_as_the_inner_solve_does() -> None:
    """One type with room for one island of 8: only an aggregated island serves; with 24 GPUs three aggregate."""
    for count, rate in ((8, 5.0), (24, 15.0)):
        t = TypeOptions("H200", count, 1.0, np.array([8]), np.array([[10.0]]), np.array([[10.0]]),
                        aggregated_req_s=np.array([[5.0]]))  # fmt: skip
        res = exact_optimum([t], ONE)
        assert res.rate_req_s == pytest.approx(rate)
        assert [r for _, _, r in res.islands] == ["aggregated"] * (count // 8)
        assert res.cost_per_hour == pytest.approx(count)


def test_without_slos_an_aggregated_engine_runs_at_its_steady_state_by_hand() -> None:
    """Prompts keep the engine busy: each step decodes N sequences and prefills E prompt tokens, so prompts of s
    tokens finish at E / (T s) per engine, N = E x d / s by Little's law and T = t_decode(N) + the chunk's forward,
    the decode step at a request's mean context: the chunk one forward of E / ranks tokens a rank (its attention
    taken out) plus each prompt's attention, E / s prompts' worth over the ranks. Re-derived here from the cost
    model's formulas for the chosen configuration."""
    lengths, w = np.array([512.0, 2048.0, 8192.0]), np.array([0.5, 0.3, 0.2])
    cost, d = CostSettings(engine=EngineSettings(aggregated=True)), 300
    bench = benchmark_island(H200, 16, DSV3, lengths, w, d, 1000, cost=cost)
    a = bench.aggregated
    assert a is not None and a.chosen >= 0 and a.chunk is not None
    k = a.chosen
    tp, dp = float(a.tp[k]), float(a.dp[k])
    ep, ranks = 16 / dp, 16 / dp / tp
    e = a.chunk[k][0] * ranks  # prompt tokens an engine prefills a step
    assert (a.chunk[k] == a.chunk[k][0]).all()  # one chunk for every length
    for j, s in enumerate(lengths):
        n = max(np.ceil(e * d / (s * ranks)), 1.0)  # sequences per attention rank
        # one decode step at the mean context of a request's d steps (the step is linear in context)
        step = decode_tokens_ms(H200, DSV3, np.array([[s + (d - 1) / 2]]), 1, np.array([[n]]), np.array([[tp]]),
                                np.array([[ep]]), cost=cost)[0, 0]  # fmt: skip
        by_sum = decode_tokens_ms(H200, DSV3, np.array([[s]]), d, np.array([[n]]), np.array([[tp]]),
                                  np.array([[ep]]), cost=cost)[0, 0] / d  # fmt: skip
        assert step == pytest.approx(by_sum, rel=1e-3)
        chunk = prefill_parts(H200, DSV3, e / ranks, tp, ranks, profile=cost.profile)
        prompt = prefill_parts(H200, DSV3, s, tp, ranks, profile=cost.profile)
        period = step + chunk["Sum"] - chunk["Attention"] + e / s * prompt["Attention"] / ranks
        assert bench.aggregated_req_s[j] == pytest.approx(dp * e * 1000.0 / (period * s), rel=1e-9)
        assert a.time_ms[k, j] == pytest.approx(period, rel=1e-9)  # TPOT: one mixed step a token
    assert CostSettings().engine.aggregated is False
    assert benchmark_island(H200, 16, DSV3, lengths, w, 300, 1000).aggregated is None


def test_with_a_tpot_target_no_mixed_step_passes_it() -> None:
    """Prompts stretch the decode steps: the chunk is sized so a step beside it, where it costs most, stays within
    the cap, and the engine admits no more sequences than such a step allows."""
    lengths, w = np.array([512.0, 2048.0, 8192.0]), np.array([0.5, 0.3, 0.2])
    cost = CostSettings(slo=Slo(2000.0, 50.0), engine=EngineSettings(aggregated=True))
    bench = benchmark_island(H200, 16, DSV3, lengths, w, 300, 1000, cost=cost)
    a = bench.aggregated
    assert a is not None and a.chosen >= 0 and a.chunk is not None
    served = bench.aggregated_req_s > 0
    assert served.all()
    assert (a.time_ms[a.chosen] <= 50.0 + 1e-6).all()
    assert (a.chunk[a.chosen] >= 1).all() and (a.chunk[a.chosen] < cost.engine.prefill_batch_tokens).all()
    assert (a.batch[a.chosen] >= 1).all()
    # the price of the target: below the same GPUs time-shared without it
    free = benchmark_island(H200, 16, DSV3, lengths, w, 300, 1000,
                            cost=CostSettings(engine=EngineSettings(aggregated=True)))  # fmt: skip
    assert (bench.aggregated_req_s < free.aggregated_req_s).all()


def one_island_plan(tmp: Path, *overrides: str) -> Path:
    """The exact layout of 16 H200 with aggregated islands allowed, built as the search builds it: one island of 16
    cannot be split into prefill and decode, so it aggregates."""
    from pipeline.planning.build import build_plan
    from pipeline.search.reference import exact_layout, reference
    from pipeline.search.settings import inventory_of, settings_from_cfg

    cfg = compose(["+inventory=tiny_homo", "inventory.gpus.H200=16", "search.min_island=16",
                   "costmodel.aggregated=true", "ranges.width=1000", f"out_root={tmp}/out", *overrides])  # fmt: skip
    settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    layout = exact_layout(reference(settings, ctx, ctx.planner))
    assert layout is not None
    path = tmp / "plan.json"
    path.write_text(json.dumps(plans.to_json(build_plan(ctx.planner, layout, 10.0))))
    return path


@pytest.fixture(scope="module")
def aggregated_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`one_island_plan` under the default SLOs."""
    return one_island_plan(tmp_path_factory.mktemp("aggregated"))


def test_without_slos_the_simulator_keeps_up_with_the_aggregated_rate_and_no_more(tmp_path: Path) -> None:
    """The steady state the island benchmark prices is the simulator's: at 0.9 x the plan's rate the island keeps
    up, at 1.3 x it falls behind (the azure_code workload: prompts keep the engine busy)."""
    from helpers import kept_at

    plan = plans.load(one_island_plan(tmp_path, "slo.ttft_ms=null", "slo.tpot_ms=null"))
    assert [isl.role for isl in plan.serving] == ["aggregated"]
    kept = kept_at(plan, (0.9, 1.3))
    assert kept[0.9] > 0.95 and kept[1.3] < 0.9, kept


def test_the_report_compares_the_layouts_rate_with_and_without_aggregated_islands(
    aggregated_plan: Path, tmp_path: Path
) -> None:
    """16 H200 in one island: split into prefill and decode it serves nothing, aggregated it serves the plan's rate.
    A plan made without the switch compares the other way (tiny_hetero: its own rate is the split one)."""
    import pandas as pd

    from helpers import plan_of
    from pipeline.records.report import report

    plan = plans.load(aggregated_plan)
    assert plan.rates.disaggregated_req_s == 0.0 and plan.rates.with_aggregated_req_s == plan.rates.rate_req_s
    row = next(line for line in report(plan, pd.DataFrame(), "# p").splitlines() if line.startswith("| roles compared"))
    assert "prefill and decode islands only: 0.00 req/s" in row and "costmodel.aggregated=true" in row
    split = plans.load(plan_of(tmp_path)[0])
    assert split.rates.disaggregated_req_s == split.rates.rate_req_s > 0
    assert split.rates.with_aggregated_req_s is not None and split.rates.with_aggregated_req_s >= 0


def test_a_plan_with_an_aggregated_island_round_trips_and_is_simulated_as_one(aggregated_plan: Path) -> None:
    from pipeline.planning.simulation import RequestMix, Runner
    from pipeline.planning.workload import workload_from_cfg

    plan = plans.load(aggregated_plan)
    (isl,) = plan.serving
    assert isl.role == "aggregated" and isl.ep * isl.dp == 16 and isl.chunk_tokens >= 1
    assert plan.cost.engine.aggregated and plan.rates.rate_req_s > 0
    assert plans.to_json(plans.load(aggregated_plan)) == json.loads(aggregated_plan.read_text())
    mix = RequestMix.of(workload_from_cfg(plan.workload, plan.spec_of_workload))
    sim, m, _ = Runner(plan, plan.slo).simulate(mix.requests(400, plan.rates.rate_req_s * 0.5, seed=1))
    r = sim.r
    assert (r.finish > 0).all() and (r.first_token >= r.arrival).all()
    assert (r.prefill_engine == r.decode_engine).all()  # each request prefilled and decoded by one engine
    assert m["throughput_req_s"] > 0


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_an_aggregated_island_launches_as_priced_by_the_engines_own_settings(
    aggregated_plan: Path, engine: str
) -> None:
    """Its engines prefill and decode without a KV hand-off: SGLang with mixed chunks of the plan's chunk per rank and
    DeepEP by batch, vLLM with the chunk as its tokens per DP rank a step and no KV connector; the running requests
    the plan's batch. Each engine's own settings resolution reads every value back as priced."""
    from deployment.commands import DeployOptions, engine_argv
    from deployment.deployable import engines

    plan = plans.load(aggregated_plan)
    (e,) = engines(plan)
    isl = plan.islands[e.island]
    assert e.role == "aggregated" and e.chunk == isl.chunk_tokens and e.max_running == isl.batch * e.attn_dp
    argv = engine_argv(e, 0, plan, DeployOptions(engine=engine))
    if engine == "sglang":
        from deployment.engines.sglang import check

        rows = check.settings(plan, e, argv[3:])
        assert "--disaggregation-mode" not in argv and "--enable-mixed-chunk" in argv
    else:
        from deployment.engines.vllm import check

        try:
            check._vllm()
        except check.EngineArgsMissing as err:  # type: ignore[attr-defined]
            pytest.fail(f"vLLM's source is needed to check the command: {err}")
        rows = check.settings(plan, e, argv[2:], check.launch_env(e, 0, plan, DeployOptions(engine="vllm")))
        assert "--kv-transfer-config" not in argv
    wrong = [f"{r.name}: {r.resolved} != {r.plan}" for r in rows if not r.holds]
    assert not wrong, wrong
    names = {r.name for r in rows}
    assert {"prefill tokens per rank per forward", "mixed chunks", "disaggregation"} <= names or engine == "vllm"
    assert "tokens per DP rank per step" in names or engine == "sglang"


def test_an_aggregated_plan_deploys_with_its_routing_and_not_on_llm_d(aggregated_plan: Path, tmp_path: Path) -> None:
    from pipeline.deploy import execute

    r = in_process(execute, "deploy", f"plan={aggregated_plan}", f"out={tmp_path}/d")
    assert r.returncode == 0, r.stderr
    route = json.loads((tmp_path / "d" / "routing.json").read_text())
    assert list(route["islands"]["aggregated"]) == ["0"] and not route["islands"]["prefill"]
    readme = (tmp_path / "d" / "README.md").read_text()
    assert "Aggregated islands (they prefill and decode their own requests)" in readme
    r = in_process(execute, "deploy", f"plan={aggregated_plan}", f"out={tmp_path}/l", "target=llmd")
    one_line(r, "error: plan island 0 runs aggregated engines")
    assert not (tmp_path / "l").exists()


def test_the_router_sends_an_aggregated_islands_share_to_it_and_the_rest_through_prefill_and_decode() -> None:
    """Half of every range to an aggregated island, half through a prefill and a decode island: about half the
    requests come back from the aggregated engine; with it down, all through the others."""
    import asyncio

    from aiohttp import ClientSession
    from test_router import BIG, Engines, post, run, running, table

    async def main() -> None:
        engines = Engines()
        p, d, a = (await engines.start(0.005), await engines.start(0.005), await engines.start(0.005))
        config = table("sglang", {"0": [p]}, {"1": [d]}, ranges={k: [[0, BIG, 0.5]] for k in "01"})
        config["islands"]["aggregated"] = {"2": {"engines": [f"http://127.0.0.1:{a}"], "ranges": [[0, BIG, 0.5]]}}
        async with running(config, health_interval_s=60) as url, ClientSession() as s:
            got = await asyncio.gather(*(post(s, url, {"prompt": "hi", "max_tokens": 4}) for _ in range(200)))
            assert {g[0] for g in got} == {200}
            together = sum("X-Archipelago-Aggregated" in g[2] for g in got)
            # (the stand-ins count the router's first health check too)
            assert 70 < together < 130 and together <= engines.seen[a][0] <= together + 1
            assert 200 - together <= engines.seen[p][0] <= 201 - together
            engines.kill(a)  # refused connections mark it down: the next requests go through prefill and decode
            got = await asyncio.gather(*(post(s, url, {"prompt": "hi", "max_tokens": 4}) for _ in range(50)))
            assert {g[0] for g in got} == {200} and not any("X-Archipelago-Aggregated" in g[2] for g in got)

    run(main())


def test_a_routing_table_with_only_aggregated_islands_loads_and_their_fractions_count_in_both_phases() -> None:
    from deployment.router.table import RoutingError, load

    engine = {"engines": ["http://127.0.0.1:30000"], "ranges": [[0, 1000, 1.0]]}
    t = load({"protocol": "sglang", "islands": {"prefill": {}, "decode": {}, "aggregated": {"0": engine}}})
    assert [i.name for i, _ in t.range_of(10).islands["aggregated"]] == ["0"]
    half = {"engines": ["http://127.0.0.1:30001"], "ranges": [[0, 1000, 0.5]]}
    with pytest.raises(RoutingError, match=r"its prefill fractions \(aggregated islands' included\) sum to 1.5"):
        load({"protocol": "sglang", "islands": {"prefill": {"1": half}, "decode": {"2": half},
                                                "aggregated": {"0": engine}}})  # fmt: skip


def test_requests_split_between_aggregated_and_other_islands_by_the_plans_shares() -> None:
    """A range half served by an aggregated island: about half its requests go there, the rest to the others; a
    range it does not serve sends it none."""
    from helpers import island
    from simulator.mixed import split

    agg = island("H200", 16, "aggregated", 1, 1, 16, 8, [(0, 1000, 0.5)])
    pre = island("H200", 8, "prefill", 1, 8, 8, 1, [(0, 1000, 0.5), (1000, 2000, 1.0)])
    dec = island("H200", 16, "decode", 1, 1, 16, 8, [(0, 1000, 0.5), (1000, 2000, 1.0)])
    plan = type("P", (), {"serving": (pre, agg, dec)})()
    lengths = np.r_[np.full(20_000, 500), np.full(1000, 1500)]
    where = split(plan, lengths, seed=3)  # type: ignore[arg-type]
    assert set(where.tolist()) == {-1, 1}
    assert abs((where[:20_000] == 1).mean() - 0.5) < 0.02 and (where[20_000:] == -1).all()


def test_settings_carry_the_switch_and_older_plans_read_it_as_off() -> None:
    on = CostSettings(engine=EngineSettings(aggregated=True))
    assert CostSettings.from_json(on.to_json(), "p").engine.aggregated is True
    old = {k: v for k, v in flat_cost(CostSettings()).items() if k != "aggregated"}  # plan.json schema 2, before it
    assert CostSettings.from_json(old, "p").engine.aggregated is False
    with pytest.raises(Exception, match="aggregated"):
        CostSettings.from_json({**on.to_json(), "engine": {"aggregated": "yes"}}, "p")

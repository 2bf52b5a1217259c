"""Island benchmark (thesis 4.6.1-4.6.2): configuration choice, batch, memory, SLOs, rates."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.catalog import load_gpu, load_model
from costmodel.formulas import decode_steps_sum_ms, max_batch, prefill_time_ms
from costmodel.island_bench import aligned_batch, benchmark_island, decode_configs, prefill_configs
from costmodel.profile import CostProfile
from costmodel.settings import CostSettings, Slo
from costmodel.specs import SpecError
from pipeline.planning.workload import make_ranges, synthetic_normal

WL = synthetic_normal("fig4_2", 500, 2000, 0, 8000, 100, 1000)
RANGES = make_ranges(WL, 125)
DSV3 = load_model("deepseek_v3")


def bench(gpu: str, n: int, **kw: object):
    return benchmark_island(load_gpu(gpu), n, DSV3, RANGES.mid, RANGES.p, WL.mean_decode, WL.max_decode, **kw)


def test_config_enumeration() -> None:
    assert prefill_configs(8) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    dec = decode_configs(4)
    # dp | 4 and tp | 4/dp
    assert sorted(dec) == sorted([(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4)])


def test_aligned_batch_rule() -> None:
    mb = np.array([-3.0, 0.5, 5.9, 8.0, 15.9, 16.0, 700.2, 5000.0])
    assert aligned_batch(mb).tolist() == [0, 0, 5, 8, 8, 16, 696, 1024]


@pytest.mark.parametrize("profile", [CostProfile.corrected(), CostProfile.shallowsim()])
def test_chosen_configs_minimise_weighted_deviation(profile: CostProfile) -> None:
    b = bench("H200", 16, cost=CostSettings(profile))
    for table in (b.prefill, b.decode):
        assert table.chosen >= 0 and table.reason == ""
        best = table.req_s.max(axis=0)
        dev = np.where(best > 0, (best - table.req_s) / np.where(best > 0, best, 1), 0) @ (RANGES.p / RANGES.p.sum())
        np.testing.assert_allclose(table.deviation, dev)
        assert table.deviation[table.chosen] == table.deviation.min()


def test_rates_are_consistent_with_times_and_memory() -> None:
    gpu = load_gpu("H800")
    b = bench("H800", 32)
    p, d = b.prefill, b.decode
    cp, cd = p.chosen, d.chosen
    # prefill: dp replicas, each one request per prefill time
    t = prefill_time_ms(gpu, DSV3, RANGES.mid, p.tp[cp], p.dp[cp])
    np.testing.assert_allclose(b.prefill_req_s, p.dp[cp] * 1000 / t)
    # decode: batch is a multiple of 8 (or < 8), at most 1024, and fits memory at s + max decode
    tp, ep = d.tp[cd], d.ep[cd]
    batch = d.batch[cd]
    mb = max_batch(gpu, DSV3, RANGES.mid, WL.max_decode, tp, np.ceil(256 / ep))
    assert (batch <= mb).all() and (batch <= 1024).all()
    assert ((batch % 8 == 0) | (batch < 8)).all()
    # sequences in flight = batch per attention-DP rank x (n / tp) ranks
    total = decode_steps_sum_ms(gpu, DSV3, RANGES.mid, 100, batch, tp, ep)
    np.testing.assert_allclose(b.decode_req_s, batch * (32 / tp) * 1000 / total)


def test_memory_infeasible_island_has_zero_throughput_and_a_reason() -> None:
    b = bench("H20", 4)  # 4 x 96 GiB cannot hold 671B FP8 parameters (8 x H20 can)
    assert b.prefill.chosen == -1 and b.decode.chosen == -1
    assert (b.prefill_req_s == 0).all() and (b.decode_req_s == 0).all()
    assert "cannot hold deepseek_v3's weights" in b.decode.reason
    assert b.config("decode") is None


def test_long_lengths_can_be_infeasible_while_short_ones_fit() -> None:
    wl = synthetic_normal("long", 300_000, 200_000, 0, 600_000, 100, 1000)
    r = make_ranges(wl, 20_000)
    gpu = load_gpu("H800")
    b = benchmark_island(gpu, 16, DSV3, r.mid, r.p, 100, 1000)
    d = b.decode
    # zero exactly where even one sequence of s + max decode no longer fits the chosen config
    fits = max_batch(gpu, DSV3, r.mid, 1000, d.tp[d.chosen], np.ceil(256 / d.ep[d.chosen])) >= 1
    assert fits[0] and not fits[-1]
    np.testing.assert_array_equal(b.decode_req_s > 0, fits)


def test_ttft_cap_zeroes_slow_lengths() -> None:
    free = bench("H20", 32)
    capped = bench("H20", 32, cost=CostSettings(slo=Slo(ttft_ms=200.0)))
    t = capped.prefill.time_ms[capped.prefill.chosen]
    assert (capped.prefill_req_s[t > 200] == 0).all()
    assert (capped.prefill_req_s[t <= 200] > 0).any()
    assert (free.prefill_req_s > 0).all()


def test_tpot_cap_shrinks_the_batch_until_it_holds() -> None:
    free = bench("H200", 16)
    capped = bench("H200", 16, cost=CostSettings(slo=Slo(tpot_ms=40.0)))
    d = capped.decode
    ok = d.batch[d.chosen] > 0
    assert ok.any()
    assert (d.time_ms[d.chosen][ok] <= 40.0 + 1e-9).all()
    # the uncapped batch is larger where the cap binds, and throughput can only fall
    assert (free.decode.time_ms[free.decode.chosen] > 40).any()
    assert capped.decode_req_s.sum() < free.decode_req_s.sum()


@pytest.mark.parametrize("gpu, n, cap", [("H200", 16, 40.0), ("H20", 8, 60.0), ("MI300X", 32, 60.0)])
def test_the_capped_batch_is_the_largest_that_meets_the_cap(gpu: str, n: int, cap: float) -> None:
    """Every batch from 1 to the memory batch priced at once: the batch chosen per configuration and length is
    the largest whose mean step meets the cap, whatever the search that found it."""
    capped = bench(gpu, n, cost=CostSettings(slo=Slo(tpot_ms=cap))).decode
    free = bench(gpu, n).decode
    g, m = load_gpu(gpu), DSV3
    tp, dp = capped.tp[:, None, None], capped.dp[:, None, None]
    ep = n / dp
    b = np.arange(1.0, free.batch.max() + 1)[None, None, :]
    d = round(WL.mean_decode)  # a request's decode steps, as the benchmark prices them
    step = decode_steps_sum_ms(g, m, RANGES.mid[None, :, None], d, b, tp, ep, profile=CostProfile.corrected()) / d
    meets = (step <= cap) & (b <= free.batch[:, :, None])
    largest = np.where(meets.any(-1), (meets * b).max(-1), 0.0)
    fits = free.batch >= 1
    assert (capped.batch[fits] == largest[fits]).all()
    assert (largest[fits] > 0).any() and (largest[fits] < free.batch[fits]).any()  # the cap binds somewhere


def test_an_engine_runs_at_most_the_requests_its_launch_admits() -> None:
    """`costmodel.max_running_requests` caps the requests one decode engine runs at once, its attention ranks
    together: on 16 H200 at 24, a configuration of tp 2 and one engine (8 ranks) runs 3 a rank where memory alone
    would hold more, tp 8 and two engines (1 rank each) 24, and every configuration and length runs
    min(memory's batch, floor(24 / its ranks)) a rank."""
    from costmodel.settings import EngineSettings

    free = bench("H200", 16).decode
    capped = bench("H200", 16, cost=CostSettings(engine=EngineSettings(max_running_requests=24))).decode
    ranks = (free.ep / free.tp)[:, None]  # attention ranks of one engine
    np.testing.assert_array_equal(capped.batch, np.minimum(free.batch, np.floor(24 / ranks)))
    row = {(int(t), int(d)): i for i, (t, d) in enumerate(zip(capped.tp, capped.dp, strict=True))}
    assert (capped.batch[row[(2, 1)]] == 3).all() and (free.batch[row[(2, 1)]] > 3).all()
    assert (capped.batch[row[(8, 2)]] == 24).all()
    assert (capped.batch * ranks <= 24).all() and capped.req_s.sum() < free.req_s.sum()
    with pytest.raises(SpecError, match="max_running_requests >= 1"):
        EngineSettings(max_running_requests=0)


def test_bad_island_inputs() -> None:
    with pytest.raises(SpecError, match="size >= 1"):
        bench("H200", 0)
    with pytest.raises(SpecError, match="no FP8"):
        bench("A100-80GB", 64, cost=CostSettings(CostProfile.shallowsim()))
    with pytest.raises(SpecError, match="GQA attention; profile 'shallowsim'"):
        benchmark_island(
            load_gpu("H200"),
            8,
            load_model("qwen3_30b_a3b"),
            RANGES.mid,
            RANGES.p,
            100,
            1000,
            cost=CostSettings(CostProfile.shallowsim()),
        )


def test_gqa_model_island() -> None:
    m = load_model("qwen3_30b_a3b")
    b = benchmark_island(load_gpu("L40S"), 2, m, RANGES.mid, RANGES.p, 100, 1000)
    assert b.prefill.chosen >= 0 and b.decode.chosen >= 0
    assert (b.decode_req_s > 0).all() and (b.prefill_req_s > 0).all()


@pytest.mark.parametrize("slo", [{}, {"ttft_ms": 2000.0, "tpot_ms": 50.0}])
@pytest.mark.parametrize(("gpu", "n"), [("H200", 8), ("H800", 16), ("H20", 32), ("H20", 8)])
def test_one_configuration_benchmarked_alone_is_its_row_of_the_whole_benchmark(gpu: str, n: int, slo: dict) -> None:
    # the plan is re-scored at every length with only its chosen configurations (pipeline.planning.planner.exact_rates)
    lengths = np.arange(1, 8001, 7)
    weights = WL.pmf[lengths] if len(WL.pmf) > lengths.max() else np.ones(len(lengths))
    cost = CostSettings(slo=Slo(**slo))
    args = (load_gpu(gpu), n, DSV3, lengths, weights, WL.mean_decode, WL.max_decode)
    whole = benchmark_island(*args, cost=cost, output_pmf=WL.output_pmf)
    for k in range(len(whole.prefill.tp)):
        for m in range(0, len(whole.decode.tp), 3):
            pre = (int(whole.prefill.tp[k]), int(whole.prefill.dp[k]))
            dec = (int(whole.decode.tp[m]), int(whole.decode.dp[m]))
            one = benchmark_island(*args, cost=cost, output_pmf=WL.output_pmf, only=(pre, dec))
            assert np.array_equal(one.prefill.req_s[0], whole.prefill.req_s[k])
            assert np.array_equal(one.decode.req_s[0], whole.decode.req_s[m])
            assert np.array_equal(one.decode.batch[0], whole.decode.batch[m])


def test_the_island_command_reports_both_phases_and_every_range_it_is_asked_for() -> None:
    import re

    from helpers import in_process
    from pipeline.island import execute

    r = in_process(execute, "island", "gpu=H200", "size=16", "model=deepseek_v3")
    assert r.returncode == 0, r.stderr
    assert "Island: 16 x H200 serving deepseek_v3 (cost profile corrected+serving)" in r.stdout  # the default
    assert re.search(r"Prefill  tp=\d+ dp=\d+ ep=16 ", r.stdout) and "Decode   tp=" in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if ln.strip() and ln.strip()[0].isdigit()]) == 16
    r = in_process(execute, "island", "gpu=H20", "size=32", "costmodel=shallowsim", "slo.tpot_ms=50", "rows=0")
    assert r.returncode == 0, r.stderr
    assert "cost profile shallowsim" in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if ln.strip() and ln.strip()[0].isdigit()]) == 64

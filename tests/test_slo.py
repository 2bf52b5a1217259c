"""SLO-true planning: utilisation caps from the queueing model in the inner model and the exact
reference alike, slo=null as the thesis's throughput-only planning, one verdict in every simulate mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_glue import cli, compose, plan_of


def settings_of(*overrides: str, inventory: str = "tiny_hetero") -> tuple[Any, Any]:
    from pipeline.settings import inventory_of, settings_from_cfg

    cfg = compose([f"+inventory={inventory}", *overrides])
    return settings_from_cfg(cfg, *inventory_of(cfg))


def test_slo_null_reproduces_the_throughput_only_optimum_exactly() -> None:
    from pipeline.reference import reference

    settings, ctx = settings_of("slo=null", inventory="hetero_a")
    assert not ctx.planner.cost.slo
    for g, n in (("H200", 8), ("H20", 16)):  # no caps: the benchmark's own rates
        raw = ctx.planner.benchmark(g, n)
        capped = ctx.planner.rates(g, n)
        assert np.array_equal(capped[0], raw.prefill_req_s) and np.array_equal(capped[1], raw.decode_req_s)
    # the exact optimum of hetero_a / Azure code as the throughput-only planner has always stated it
    assert reference(settings, ctx, ctx.planner).rate_req_s == pytest.approx(736.85, abs=0.01)


def test_caps_lower_every_rate_and_the_reference_still_bounds_every_layout(tmp_path: Path) -> None:
    import optuna

    from pipeline.reference import reference
    from pipeline.trial import run_trial

    settings, ctx = settings_of(f"out_root={tmp_path}", "ranges.width=1000")
    planner = ctx.planner
    assert planner.cost.slo and planner.cost.ttft_ms == 2000 and planner.cost.tpot_ms == 50
    assert planner.benchmark("H200", 16).decode.chosen >= 0  # (8 x H200 cannot decode within TPOT)
    u_pre, u_dec = planner.caps("H200", 16)
    assert ((0 <= u_pre) & (u_pre < 1)).all() and ((0 < u_dec) & (u_dec < 1)).all()
    assert (u_pre == u_pre[0]).all()  # one cap for the island: its queue is shared by every length it serves
    ref = reference(settings, ctx, planner)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2), direction="maximize")
    for _ in range(12):
        t = study.ask(ctx.space.distributions())
        out = run_trial(ctx, t.params)
        study.tell(t, out["score"])
        assert out["score"] <= ref.rate_req_s * (1 + 1e-6)  # same model: the gap keeps its meaning


def test_the_plan_states_the_rate_within_the_slos_and_the_fluid_bound_beside_it(tmp_path: Path) -> None:
    path, _ = plan_of(tmp_path)
    plan = json.loads(path.read_text())
    assert 0 < plan["rate_req_s"] < plan["fluid_req_s"]
    assert set(plan["rates"]) >= {"rate_req_s", "fluid_req_s", "evaluated_req_s"}
    assert plan["cost"]["ttft_ms"] == 2000 and plan["cost"]["tpot_percentile"] == 99


def test_run_and_saturate_judge_a_rate_alike(tmp_path: Path) -> None:
    path, _ = plan_of(tmp_path)
    common = [f"plan={path}", "requests=3000", f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"]
    for scale in (0.5, 1.3):
        run = cli("pipeline.simulate", *common, f"rate_scale={scale}", f"out_root={tmp_path}/run{scale}")
        sat = cli("pipeline.simulate", *common, "mode=saturate", f"saturate.scales=[{scale}]",
                  "saturate.duration_s=30", f"out_root={tmp_path}/sat{scale}")  # fmt: skip
        assert run.returncode == 0 and sat.returncode == 0, (run.stderr, sat.stderr)
        run_ok = "\nSustained at" in run.stdout
        (m,) = [json.loads(p.read_text()) for p in (tmp_path / f"sat{scale}").glob("*/*/metrics.json")]
        pngs = [*(tmp_path / f"sat{scale}").glob("*/*/throughput.png"), *(tmp_path / f"run{scale}").glob("*/*/cdf.png")]
        assert len(pngs) == 2 and all(p.stat().st_size > 10_000 for p in pngs)  # throughput plot, CDFs with SLOs
        assert run_ok == bool(m["rows"][0]["sustained"]), (scale, run.stdout[-600:], m["rows"][0])


def test_short_answers_make_the_decode_batch_leave_room_for_the_step_boundary_wait() -> None:
    from costmodel.catalog import load_gpu, load_model
    from costmodel.island_bench import benchmark_island
    from costmodel.queueing import tpot_step_cap_ms
    from costmodel.settings import CostSettings
    from pipeline.workload import make_ranges, synthetic_normal

    wl = synthetic_normal("n", 500, 2000, 0, 8000, 20, 200)
    r = make_ranges(wl, 1000)
    cost = CostSettings(tpot_ms=50.0)
    short = np.zeros(201)
    short[[4, 6, 200]] = [0.3, 0.3, 0.4]  # many short answers, as in the Azure code trace
    args = (load_gpu("H200"), 16, load_model("deepseek_v3"), r.mid, r.p, 20, 200, cost)
    mean_only, with_short = benchmark_island(*args), benchmark_island(*args, short)
    cap = tpot_step_cap_ms(50.0, 0.99, short)
    assert cap < 40.0
    assert (with_short.decode.time_ms[with_short.decode.chosen] <= cap + 1e-9).all()
    assert with_short.decode_req_s.sum() < mean_only.decode_req_s.sum()

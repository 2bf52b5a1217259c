"""Calibration: the fit recovers factors it is given, files round-trip, bad rows are one clear error,
a calibration of ones changes nothing, and a plan carries its calibration."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from costmodel.calibrate import default_base, fit, leave_one_out, predict, write_calibration
from costmodel.calibration import KNOBS, Calibration, Factor, load_calibration
from costmodel.catalog import load_gpu, load_model
from costmodel.formulas import (
    GEMM_FIXED_MS,
    MLA_DISCOUNT,
    Rates,
    _attn_decode_gflop,
    _attn_gemms,
    _attn_prefill_gflop,
    _gemm_ms,
    _kv_down_gflop,
    decode_parts,
    decode_step_ms,
    kv_link_gb_s,
    max_batch,
    prefill_chunk_ms,
    prefill_time_ms,
)
from costmodel.measurements import COMPONENTS, Measurement, MeasurementError, load_measurements
from costmodel.profile import CostProfile
from costmodel.settings import CostSettings, Slo
from costmodel.specs import GPUArray, SpecError
from helpers import flat_cost

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "conf" / "calibration" / "published.csv"
DSV3 = load_model("deepseek_v3")


def synthetic_rows(gpu: str, truth: Calibration) -> list[Measurement]:
    """Measurements the cost model itself produces under `truth` (on the fit's default structure)."""
    prof = default_base().calibrated(truth)
    shapes: list[tuple[str, dict, str]] = []
    for m, n, k in itertools.product((64, 512, 4096), (2112, 7168), (2048, 7168)):
        shapes.append(("dense_gemm", {"m": m, "n": n, "k": k}, "TFLOPS"))
    for g, m in ((4, 4096), (8, 2048), (2, 8192)):
        shapes.append(("grouped_gemm", {"groups": g, "m": m, "n": 4096, "k": 7168, "layout": "contiguous"}, "ms"))
    for g, m in ((1, 1024), (4, 256), (8, 64)):
        shapes.append(("grouped_gemm", {"groups": g, "m": m, "n": 7168, "k": 2048, "layout": "masked"}, "us"))
    shapes += [
        ("attention_decode", {}, "TFLOPS"),
        ("attention_decode", {}, "GB/s"),
        ("attention_prefill", {}, "TFLOPS"),
    ]
    for ep in (8, 16, 64):
        shapes.append(("a2a_normal", {"ep": ep}, "GB/s"))
        for op in ("dispatch", "combine"):
            for links in ("nic", "nvlink+nic"):
                ll = {"tokens": 128, "hidden": 7168, "topk": 8, "ep": ep, "op": op, "links": links}
                shapes.append(("a2a_low_latency", ll, "us"))
    shapes += [("kv_transfer", {"bytes": 2e8}, "ms"), ("kv_transfer", {"bytes": 1e9}, "GB/s")]
    for b, s in ((1, 1024), (4, 4096)):
        shapes.append(("prefill_step", {"batch": b, "input_len": s, "tp": 8}, "ms"))
        shapes.append(("decode_step", {"batch": 16 * b, "context": s, "tp": 8}, "ms"))
    rows = []
    for comp, params, unit in shapes:
        shape = tuple(sorted((k, v if isinstance(v, str) else float(v)) for k, v in params.items()))
        probe = Measurement(comp, gpu, shape, 1.0, unit, "synthetic", "test")
        rows.append(Measurement(comp, gpu, shape, predict(probe, prof), unit, "synthetic: the cost model", "test"))
    return rows


def test_the_fit_recovers_the_factors_that_generated_its_data() -> None:
    true = {"dense_gemm": 0.8, "grouped_gemm_prefill": 0.85, "grouped_gemm_decode": 1.3, "hbm": 0.9,
            "attention_prefill": 1.15, "attention_decode": 1.1, "kv_read": 0.92, "a2a_normal": 0.95,
            "a2a_low_latency": 0.7, "gemm_fixed": 1.25, "kv_transfer": 0.8}  # fmt: skip
    truth = Calibration("truth", tuple(sorted(("H20", k, Factor(v, 0.0, "fit")) for k, v in true.items())),
                        switches=(("gemm_roofline", True),))  # fmt: skip
    f = fit(synthetic_rows("H20", truth), prior_sigma=2.0)  # a weak prior: the data decide
    got = f.calibration
    for knob, v in true.items():
        assert got.get("H20", knob).factor == pytest.approx(v, rel=0.01), knob
        assert got.get("H20", knob).origin == "fit"
    assert got.get("H20", "allreduce").factor == pytest.approx(1.0, rel=0.01)  # left alone by the truth, found so
    assert got.get("H800", "dense_gemm").origin == "prior"  # no H800 rows: its prior, said so
    assert np.max(np.abs(f.after)) < 0.01 < np.max(np.abs(f.before))


def test_a_calibration_of_ones_changes_no_number() -> None:
    factors = tuple(("H800", k, Factor(1.0, 0.2, "fit")) for k in sorted(KNOBS))
    for base in (CostProfile.shallowsim(), CostProfile.corrected(), default_base()):
        ones = Calibration("ones", factors, switches=(("gemm_roofline", base.gemm_roofline),))
        cal = base.calibrated(ones)
        gpu = load_gpu("H800")
        s, b, tp = np.array([512.0, 4096.0, 16384.0]), np.array([1.0, 32.0, 128.0]), np.array([1.0, 4.0, 8.0])
        assert np.array_equal(
            prefill_time_ms(gpu, DSV3, s, tp, 4, cache_hit=0.3, profile=base),
            prefill_time_ms(gpu, DSV3, s, tp, 4, cache_hit=0.3, profile=cal),
        )
        assert np.array_equal(decode_step_ms(gpu, DSV3, 4096, b, 1, 32, profile=base),
                              decode_step_ms(gpu, DSV3, 4096, b, 1, 32, profile=cal))  # fmt: skip
        assert np.array_equal(
            max_batch(gpu, DSV3, 4096, 1024, 1, 9, profile=base), max_batch(gpu, DSV3, 4096, 1024, 1, 9, profile=cal)
        )


def test_a_factor_moves_its_own_gpu_and_component_only() -> None:
    fast = Calibration("fast", (("H800", "a2a_low_latency", Factor(2.0, 0.0, "fit")),))
    base = CostProfile.corrected()
    h800, h20 = load_gpu("H800"), load_gpu("H20")
    args = (DSV3, 4096, 64, 1, 64)
    fast_h800 = decode_parts(h800, *args, profile=base.calibrated(fast))["Dispatch"]
    assert fast_h800 < decode_parts(h800, *args, profile=base)["Dispatch"]
    assert decode_step_ms(h20, *args, profile=base.calibrated(fast)) == decode_step_ms(h20, *args, profile=base)
    # prefill all-to-all is the normal kernels' knob, not this one
    assert prefill_time_ms(h800, DSV3, 4096, 4, 16, cache_hit=0.0, profile=base.calibrated(fast)) == prefill_time_ms(
        h800, DSV3, 4096, 4, 16, cache_hit=0.0, profile=base
    )


def test_the_kv_transfer_factor_moves_the_planners_and_the_simulators_link() -> None:
    from simulator.timing import prefill_timing

    slow = Calibration("slow", (("H800", "kv_transfer", Factor(0.5, 0.0, "fit")),))
    h800, base = load_gpu("H800"), CostProfile.corrected()
    assert float(kv_link_gb_s(h800, base.calibrated(slow))) == pytest.approx(0.5 * float(kv_link_gb_s(h800, base)))
    t = [
        prefill_timing(h800, DSV3, 8, 1, 4096, CostSettings(p)).transfer_ms(4096) for p in (base, base.calibrated(slow))
    ]
    assert t[1] == pytest.approx(2.0 * t[0])


def test_a_calibration_file_and_a_plans_cost_record_round_trip(tmp_path: Path) -> None:
    f = fit(load_measurements([PUBLISHED]), name="published")
    write_calibration(f.calibration, tmp_path / "c.yaml")
    back = load_calibration(tmp_path / "c.yaml")
    assert back == f.calibration
    # the calibration brings the structure it was fitted on: its factors mean nothing under another
    assert dict(back.switches) == {"gemm_roofline": True}
    settings = CostSettings(CostProfile.corrected().calibrated(back), slo=Slo(ttft_ms=2000.0))
    assert settings.profile.gemm_roofline and not CostProfile.corrected().gemm_roofline
    assert CostSettings.from_json(json.loads(json.dumps(settings.to_json())), "plan.json") == settings
    old = {k: v for k, v in flat_cost(settings).items() if k != "calibration"}  # a plan from before calibrations
    old["switches"] = {k: v for k, v in old["switches"].items() if k != "gemm_roofline"}  # ... and refinements
    again = CostSettings.from_json(old, "plan.json").profile
    assert again.calibration is None and not again.gemm_roofline
    with pytest.raises(SpecError, match="gemm_roofline"):
        Calibration("bad", switches=(("gemm_roofline", "yes"),))


def test_the_roofline_gemms_are_the_attention_flops_the_model_counts() -> None:
    """`_attn_gemms` lists the projections whose FLOPs `_attn_*_gflop` sums, for MLA and GQA."""
    q, c = np.array([1.0, 700.0, 4096.0]), np.array([1.0, 3000.0, 4096.0])
    p = CostProfile.corrected()
    for name in ("deepseek_v3", "qwen3_30b_a3b"):
        model = load_model(name)
        kv = q if model.attention == "mla" else np.zeros_like(q)
        gemm, _ = _attn_prefill_gflop(model, q, c, p)
        listed = sum(2.0 * gr * m * n * k / 1e9 for m, n, k, gr in _attn_gemms(model, q, c, kv, decode=False))
        assert np.allclose(gemm + _kv_down_gflop(model, kv), listed, rtol=1e-12)
        gemm1, _ = _attn_decode_gflop(model, c, p)
        ones = np.ones_like(c)
        listed = sum(2.0 * gr * m * n * k / 1e9 for m, n, k, gr in _attn_gemms(model, ones, c, ones, decode=True))
        assert np.allclose(gemm1, listed, rtol=1e-12)


def test_a_small_gemm_pays_the_fixed_cost_and_a_large_one_its_flops() -> None:
    """Under gemm_roofline a GEMM is max(compute, bytes) + the kernel's fixed cost."""
    r = Rates(GPUArray.of(load_gpu("H800")), "decode", default_base())
    tiny = float(_gemm_ms(np.asarray(1.0), 16.0, 16.0, r, default_base()))
    assert tiny == pytest.approx(GEMM_FIXED_MS, rel=1e-3)  # nothing to move or compute: the fixed cost alone
    m, n, k = 8192.0, 7168.0, 7168.0
    big = float(_gemm_ms(np.asarray(m), n, k, r, default_base()))
    assert big == pytest.approx(2 * m * n * k / 1e9 / r.gemm / MLA_DISCOUNT + GEMM_FIXED_MS, rel=1e-9)


def test_the_shipped_calibration_is_the_fit_of_the_shipped_measurements() -> None:
    """conf/calibration/published.yaml is what its header's command fits: the kernel tables, and (--residuals) the
    kernel-only model's own error on every InferenceX row, none of which it was fitted to."""
    from costmodel.calibrate import model_error
    from costmodel.calibration import RESIDUAL_KNOBS

    shipped = load_calibration(ROOT / "conf" / "calibration" / "published.yaml")
    refit = fit(load_measurements([PUBLISHED]), name=shipped.name, source=shipped.source).calibration
    spreads = tuple(f for f in shipped.factors if f[1] in RESIDUAL_KNOBS)
    dump = ROOT / "conf" / "calibration" / "published_residuals.csv"
    assert spreads == tuple(sorted(model_error(dump, every_row=True)))
    assert sorted(k for _, k, f in spreads) == sorted(RESIDUAL_KNOBS) and all(0.05 < f.sigma < 2 for *_, f in spreads)
    fitted = tuple(f for f in shipped.factors if f[1] not in RESIDUAL_KNOBS)
    for (g, k, a), (g2, k2, b) in zip(fitted, refit.factors, strict=True):
        assert (g, k, a.origin, a.rows) == (g2, k2, b.origin, b.rows)
        assert a.factor == pytest.approx(b.factor, rel=1e-6) and a.sigma == pytest.approx(b.sigma, rel=1e-6)


def test_every_published_row_names_its_source_and_the_loo_error_is_finite() -> None:
    rows = load_measurements([PUBLISHED])
    assert len(rows) >= 40 and {r.component for r in rows} >= {"dense_gemm", "grouped_gemm", "a2a_low_latency"}
    assert all(r.source and ("README at" in r.source) for r in rows)  # each cites a commit of the table
    sub = [r for r in rows if r.component in ("a2a_normal", "attention_decode")]
    loo = leave_one_out(sub)
    assert loo.shape == (len(sub),) and np.all(np.isfinite(loo))


BAD = {
    "component,gpu,shape,value,unit\n": "header must be",
    "component,gpu,shape,value,unit,source\nflash_gemm,H800,m=1 n=1 k=1,5,TFLOPS,x\n": "unknown component",
    "component,gpu,shape,value,unit,source\ndense_gemm,H900,m=1 n=1 k=1,5,TFLOPS,x\n": "unknown GPU",
    "component,gpu,shape,value,unit,source\ndense_gemm,H800,m=1 n=1 k=1,5,GB/s,x\n": "is measured in",
    "component,gpu,shape,value,unit,source\ndense_gemm,H800,m=1 n=1,5,TFLOPS,x\n": "missing ['k']",
    "component,gpu,shape,value,unit,source\ndense_gemm,H800,m=1 n=1 k=1,-5,TFLOPS,x\n": "positive number",
    "component,gpu,shape,value,unit,source\ndense_gemm,H800,m=1 n=1 k=1,5,TFLOPS,\n": "names its source",
    "component,gpu,shape,value,unit,source\ndense_gemm,H800,m=a n=1 k=1,5,TFLOPS,x\n": "not a number",
    "component,gpu,shape,value,unit,source\ndense_gemm,H800,m=1 n=1 k=1,5,TFLOPS\n": "5 fields",
    "component,gpu,shape,value,unit,source\ndecode_step,H20,batch=8 context=1024 tp=3,0.05,s,x\n": "shape tp=3 does "
    "not divide deepseek_v3's 128 attention heads",
    "component,gpu,shape,value,unit,source\ndecode_step,H20,batch=8.5 context=1024 tp=8,0.05,s,x\n": "shape "
    "batch='8.5' must be a whole number",
    "component,gpu,shape,value,unit,source\nserving_tpot,H200,batch=8 context=1024 tp=8 ep=8 users=8,0.02,s,x\n":
        "users, output_len and prefill_len together",
    "component,gpu,shape,value,unit,source\nserving_tpot,H200,batch=8 context=1024 tp=8 ep=12,0.02,s,x\n":
        "tp dividing ep",
    "component,gpu,shape,value,unit,source\nserving_ttft,H200,input=1024 tp=3 dp=1,0.2,s,x\n": "shape tp=3 does not",
    "component,gpu,shape,value,unit,source\nserving_ttft,H200,input=1024 tp=8 dp=1 engine=both,0.2,s,x\n":
        "engine='both' must be one of",
}


@pytest.mark.parametrize("text", list(BAD))
def test_a_malformed_measurement_is_one_clear_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "m.csv"
    path.write_text("# a comment line\n" + text)
    with pytest.raises(MeasurementError, match=re.escape(BAD[text])) as err:
        load_measurements([path])
    if "header" not in BAD[text]:
        assert f"{path}:3" in str(err.value)  # file and line


def test_the_command_fits_writes_and_fails_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "cal.yaml"
    r = subprocess.run([sys.executable, "-m", "costmodel.calibrate", str(PUBLISHED), "--out", str(out), "--no-loo"],
                       capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "| dense_gemm |" in r.stdout and "prior" in r.stdout and load_calibration(out).name == "cal"
    bad = tmp_path / "bad.csv"
    bad.write_text("component,gpu,shape,value,unit,source\ndense_gemm,H900,m=1 n=1 k=1,5,TFLOPS,x\n")
    r = subprocess.run(
        [sys.executable, "-m", "costmodel.calibrate", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown GPU 'H900'" in r.stderr
    # 1,020 rows: one fit takes seconds, a refit per row hours; the command says so before it starts
    lines = PUBLISHED.read_text().splitlines()
    body = [ln for ln in lines if ln and not ln.startswith("#")][1:]
    many = tmp_path / "many.csv"
    many.write_text("\n".join([*lines[: lines.index(body[0])], *body * 20]) + "\n")
    r = subprocess.run([sys.executable, "-m", "costmodel.calibrate", str(many)], capture_output=True, text=True,
                       cwd=ROOT)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert re.fullmatch(r"error: fitting 1,020 rows takes about [\d,]+ (s|min) and its leave-one-out refits "
                        r"[\d,]+ min, over the 30 min this command starts: add --no-loo \(the leave-one-out refits, "
                        r"one per row, take the rest\), or fit fewer rows\n", r.stderr), r.stderr  # fmt: skip


def test_sglang_one_batch_results_become_measurements_the_fit_takes(tmp_path: Path) -> None:
    # lines in the layout sglang.benchmark.one_batch writes (its measurement_results dict); the
    # numbers are the cost model's own under a known calibration, so the fit must find it again
    truth = Calibration("truth", (("H20", "dense_gemm", Factor(0.7, 0.0, "fit")),
                                  ("H20", "grouped_gemm_decode", Factor(1.2, 0.0, "fit"))))  # fmt: skip
    prof = CostProfile.corrected().calibrated(truth)
    h20 = load_gpu("H20")
    lines = []
    for b, s in itertools.product((1, 8, 64), (512, 2048, 8192)):
        # the batch's prompts prefilled in one forward, as the engine runs them
        one = np.array([1.0])
        pre = float(prefill_chunk_ms(h20, DSV3, b * s * one, s * one, 8 * one, one, profile=prof)[0]) / 1e3
        dec = float(decode_step_ms(h20, DSV3, s + 8, b, 8, 8, profile=prof)) / 1e3
        lines.append(json.dumps({"run_name": "t", "batch_size": b, "input_len": s, "output_len": 16,
                                 "prefill_latency": pre, "prefill_throughput": b * s / pre,
                                 "median_decode_latency": dec, "median_decode_throughput": b / dec}))  # fmt: skip
    (tmp_path / "result.jsonl").write_text("\n".join(lines) + "\n")
    r = subprocess.run([sys.executable, "-m", "costmodel.readers", "sglang-one-batch", str(tmp_path / "result.jsonl"),
                        "--gpu", "H20", "--tp", "8"], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr
    (tmp_path / "mine.csv").write_text(r.stdout)
    rows = load_measurements([tmp_path / "mine.csv"])
    assert len(rows) == 18 and {r.component for r in rows} == {"prefill_step", "decode_step"}
    f = fit(rows)
    assert np.median(np.abs(f.after)) < 0.25 * np.median(np.abs(f.before))
    assert math.log(f.calibration.get("H20", "dense_gemm").factor) < 0  # it finds the slow GEMMs
    (tmp_path / "broken.jsonl").write_text('{"batch_size": 1}\n')
    r = subprocess.run([sys.executable, "-m", "costmodel.readers", "sglang-one-batch", str(tmp_path / "broken.jsonl"),
                        "--gpu", "H20", "--tp", "8"], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert r.returncode == 2 and "lacks" in r.stderr and "broken.jsonl:1" in r.stderr


def test_every_component_names_knobs_the_model_has() -> None:
    for comp in COMPONENTS.values():
        assert set(comp.knobs) <= set(KNOBS)


def test_robust_plans_at_the_pessimistic_factors_and_needs_a_calibration() -> None:
    from costmodel.calibration import Z10
    from helpers import compose
    from pipeline.errors import ConfigError
    from pipeline.search.settings import inventory_of, settings_from_cfg

    base = ["+inventory=tiny_hetero", "ranges.width=1000"]
    cfg = compose([*base, "search.robust=true"])
    settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    central = settings.calibration  # the band draws from this; the search plans with the shifted one
    shifted = ctx.planner.profile.calibration
    assert settings.search.robust and central.name == "serving" and not shifted.uncertain
    for (_, _, f), (_, _, s) in zip(central.factors, shifted.factors, strict=True):
        assert s.factor == pytest.approx(f.factor * math.exp(-Z10 * f.sigma))
    plain = compose(base)
    _, pctx = settings_from_cfg(plain, *inventory_of(plain))
    assert ctx.planner.benchmark("H200", 8).prefill_req_s.max() < pctx.planner.benchmark("H200", 8).prefill_req_s.max()
    cfg = compose([*base, "search.robust=true", "costmodel=corrected"])
    with pytest.raises(ConfigError, match=r"costmodel\.calibration=published"):
        settings_from_cfg(cfg, *inventory_of(cfg))


def test_the_band_spans_the_draws_and_vanishes_without_uncertainty() -> None:
    from helpers import compose
    from pipeline.planning.band import rate_band
    from pipeline.search.reference import exact_layout, reference
    from pipeline.search.settings import inventory_of, settings_from_cfg

    cfg = compose(["+inventory=tiny_hetero", "ranges.width=1000", "search.shapes=any", "slo=null"])
    settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    layout = exact_layout(reference(settings, ctx, ctx.planner))
    _, sol = ctx.planner.solve(layout, "max_rate", 10.0)
    band = rate_band(ctx.planner, layout, sol.rate_req_s, sol.rate_req_s, settings.calibration, 16, time_limit_s=10.0)
    assert band is not None and band.p10_req_s < sol.rate_req_s < band.p90_req_s
    assert rate_band(ctx.planner, layout, 1.0, 1.0, settings.calibration.shifted(0.0), 16, time_limit_s=10.0) is None
    assert rate_band(ctx.planner, layout, 1.0, 1.0, None, 16, time_limit_s=10.0) is None


def test_a_plan_of_a_model_no_measurement_is_of_carries_the_wider_range_of_an_unmeasured_model(tmp_path: Path) -> None:
    """A Qwen3-30B plan (no measured serving of it ships) draws its range with the model's own error spread once
    more on every GPU it runs on (`band_calibration`): a wider 10th-90th percentile than the same layout drawn as a
    measured model's would be, and the range names why; a DeepSeek-V3 plan under the same kernel tables is not
    widened where nothing extrapolates. The default cost model (`serving`, fitted to DeepSeek's measured serving
    only) prices it with the kernel tables, as `costmodel=calibrated` does, and the plan says so."""
    import plan as plans
    from helpers import compose, plan_of
    from pipeline.planning.band import rate_band
    from pipeline.planning.config import fallback_note
    from pipeline.planning.planner import Layout
    from pipeline.search.settings import inventory_of, read_settings, settings_from_cfg
    from pipeline.search.steps.band import band_calibration

    overrides = ("model=qwen3_30b_a3b",)  # the default cost model
    path, planner = plan_of(tmp_path, *overrides)
    qwen = plans.load(path)
    cfg = compose(["+inventory=tiny_hetero", "ranges.width=1000", *overrides])
    said = fallback_note(cfg.costmodel, "qwen3_30b_a3b")  # what the search prints and puts in report.md
    assert said.startswith("qwen3_30b_a3b is priced with calibration 'published' (costmodel.fallback)"), said
    assert fallback_note(cfg.costmodel, "deepseek_v3") == ""
    cal = settings_from_cfg(cfg, *inventory_of(cfg))[0].calibration
    assert cal.name == "published" and cal.get("H20", "model_decode").sigma > 0  # the kernel tables' own error
    kernel = compose(["+inventory=tiny_hetero", "ranges.width=1000", *overrides, "costmodel=calibrated"])
    assert read_settings(kernel, *inventory_of(kernel)).planning.cost == planner.cost
    wide = band_calibration(cal, qwen)
    assert wide.name == "published, widened: no fit to measured serving of qwen3_30b_a3b"
    for gpu in {isl.gpu for isl in qwen.serving}:
        for knob in ("model_prefill", "model_decode"):
            assert wide.get(gpu, knob).sigma == pytest.approx(math.sqrt(2) * cal.get(gpu, knob).sigma)
    layout = Layout.of([(isl.gpu, isl.size) for isl in qwen.islands])
    rate = qwen.rates.searched_req_s
    narrow_band = rate_band(planner, layout, rate, rate, cal, 16, time_limit_s=10.0)
    wide_band = rate_band(planner, layout, rate, rate, wide, 16, time_limit_s=10.0)
    assert narrow_band is not None and wide_band is not None
    assert wide_band.p90_req_s - wide_band.p10_req_s > narrow_band.p90_req_s - narrow_band.p10_req_s
    (tmp_path / "d").mkdir()
    deepseek = plans.load(plan_of(tmp_path / "d", "costmodel=calibrated")[0])
    assert deepseek.model.name == "deepseek_v3" and band_calibration(cal, deepseek) is cal


def _command(module: str, *args: str) -> Any:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT)


def _refused(r: Any, *words: str) -> None:
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert all(w in r.stderr for w in words), r.stderr


BINARY = bytes(range(256)) * 4  # not UTF-8 (a gzip, a parquet, an image)


def test_calibration_and_its_readers_answer_bad_files_and_outputs_in_one_line(tmp_path: Path) -> None:
    blob = tmp_path / "blob.csv"
    blob.write_bytes(BINARY)
    _refused(_command("costmodel.calibrate", str(blob)), f"{blob}: not a text file", "not UTF-8")
    _refused(_command("costmodel.calibrate", str(PUBLISHED), "--no-loo", "--out", "/proc/x/cal.yaml"),
             "--out /proc/x/cal.yaml: cannot write the calibration there")  # fmt: skip
    _refused(_command("costmodel.readers", "sglang-one-batch", str(blob), "--gpu", "H20", "--tp", "8"),
             f"{blob}: not a text file")  # fmt: skip
    result = tmp_path / "result.jsonl"
    result.write_text(json.dumps({"batch_size": 2.5, "input_len": 512, "output_len": 16, "prefill_latency": 0.1}))
    _refused(_command("costmodel.readers", "sglang-one-batch", str(result), "--gpu", "H20", "--tp", "8"),
             f"{result}:1: batch_size=2.5 must be a whole number")  # fmt: skip
    result.write_text(json.dumps({"batch_size": 2, "input_len": 512, "output_len": 16, "prefill_latency": 0.1}))
    _refused(_command("costmodel.readers", "sglang-one-batch", str(result), "--gpu", "H20", "--tp", "3"),
             "--tp 3 does not divide deepseek_v3's 128 attention heads")  # fmt: skip


def test_a_calibration_file_of_an_unknown_gpu_or_not_text_is_refused(tmp_path: Path) -> None:
    import yaml

    good = load_calibration(ROOT / "conf" / "calibration" / "published.yaml").to_json()
    other = {**good, "factors": {**good["factors"], "H900": good["factors"]["H20"]}}
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    with pytest.raises(SpecError, match=r"factors: unknown GPU 'H900'; the catalogue has \["):
        load_calibration(tmp_path / "other.yaml")
    (tmp_path / "blob.yaml").write_bytes(BINARY)
    with pytest.raises(SpecError, match="not a text file"):
        load_calibration(tmp_path / "blob.yaml")
    # and the search says so in one line, before any work
    for name in ("other.yaml", "blob.yaml"):
        r = _command("pipeline.search", "+inventory=tiny_hetero", f"costmodel.calibration={tmp_path / name}",
                     f"out_root={tmp_path / 'out'}")  # fmt: skip
        _refused(r, "costmodel.calibration:", str(tmp_path / name))
        assert not (tmp_path / "out").exists()


def test_a_gpus_factor_is_its_own_times_its_stacks_times_every_gpus() -> None:
    """Kernel fits are per GPU, end-to-end fits per kernel stack and for every GPU (`*`): a GPU's factor is their
    product, the sigmas in quadrature; a GPU of another stack does not take them; the cost model applies them."""
    gpu = load_gpu("H200")
    cal = Calibration("t", (("*", "hbm", Factor(1.1, 0.1, "fit", 3)), ("H200", "hbm", Factor(0.8, 0.2, "fit", 5)),
                            ("cuda", "hbm", Factor(0.5, 0.2, "fit", 7))))  # fmt: skip
    f = cal.get("H200", "hbm", "cuda")
    assert f.factor == pytest.approx(0.8 * 0.5 * 1.1) and f.sigma == pytest.approx(0.3) and f.rows == 15
    assert cal.get("MI300X", "hbm", "rocm").factor == pytest.approx(1.1)  # every GPU's only
    assert cal.get("H100-SXM", "dense_gemm", "cuda") == Factor(1.0, 0.0, "prior")
    base = CostProfile.corrected()
    r = Rates(GPUArray.of(gpu), "decode", base.calibrated(cal))
    assert float(r.bw) == pytest.approx(gpu.mem_bw_gb_s * 0.85 * 0.44)
    with pytest.raises(SpecError, match="unknown GPU 'cudaa'"):
        Calibration.from_json({"factors": {"cudaa": {"hbm": {"factor": 1, "sigma": 0, "origin": "fit"}}}}, "x.yaml")


def test_serving_rows_fit_their_stack_and_every_gpu_and_a_gpu_never_measured_takes_them() -> None:
    """End-to-end rows generated by a known calibration (CUDA's weights stream at 0.8, experts split by TP at 0.85,
    the step overhead 1 / 0.7, the time per sequence 1 / 0.4) are fitted back: the residuals vanish, the factors sit
    under `cuda` and `*`, none under the measured GPU's own name, and a CUDA GPU no row measured (H100) is predicted
    as the truth predicts it."""
    from costmodel.calibrate import serving_base

    factors = (("*", "moe_tp", Factor(0.85, 0.0, "fit")), ("*", "step_overhead", Factor(0.7, 0.0, "fit")),
               ("*", "sequence_overhead", Factor(0.4, 0.0, "fit")),
               ("cuda", "hbm", Factor(0.8, 0.0, "fit")))  # fmt: skip
    engine = ("activated_experts", "dp_imbalance", "draft_passes", "gemm_roofline", "lm_head", "net_allreduce",
              "node_dispatch", "overlap_chosen", "request_overhead", "sequence_overhead", "step_overhead")  # fmt: skip
    truth = Calibration("truth", factors, switches=tuple((k, True) for k in engine))
    true_profile = CostProfile.corrected().calibrated(truth)

    def row(gpu: str, i: int, **shape: Any) -> Measurement:
        m = Measurement("serving_tpot", gpu, tuple(sorted(shape.items())), 1.0, "ms", "synthetic", f"row {i}")
        return Measurement(m.component, gpu, m.shape, predict(m, true_profile), "ms", "synthetic", m.where)

    shapes = [dict(batch=b, context=c, tp=tp, ep=8, moe=moe) for b in (1, 8, 64, 256) for c in (1500, 9000)
              for tp, moe in ((8, "tp"), (1, "ep"), (8, "ep"))]  # fmt: skip
    rows = [row(g, i, **s) for g in ("H200", "DGX-B200") for i, s in enumerate(shapes)]
    f = fit(rows, serving_sigma=2.0)  # a weak prior: the data decide
    assert np.max(np.abs(f.after)) < 0.02 < np.max(np.abs(f.before))
    assert dict(f.calibration.switches) == dict(truth.switches)
    fitted = {(g, k) for g, k, x in f.calibration.factors if x.origin == "fit"}
    assert {g for g, _ in fitted} == {"cuda", "*"} and ("*", "moe_tp") in fitted
    held = [row("H100-SXM", i, **s) for i, s in enumerate(shapes)]
    got = np.array([predict(r, serving_base(default_base()).calibrated(f.calibration)) / r.value for r in held])
    assert np.max(np.abs(np.log(got))) < 0.05


def test_the_shipped_serving_calibration_is_the_fit_of_the_shipped_measurements() -> None:
    """conf/calibration/serving.yaml is what its header's command fits: the kernel tables and InferenceX's rows of
    the fitting GPUs. The fit is searched from the shipped factors (from the prior's it takes about a minute): at
    the optimum it stays there, anywhere else it moves to the optimum and the factors differ."""
    from costmodel.calibrate import model_error
    from costmodel.calibration import RESIDUAL_KNOBS
    from costmodel.measured import INFERENCEX, serving_rows

    shipped = load_calibration(ROOT / "conf" / "calibration" / "serving.yaml")
    rows = load_measurements([PUBLISHED]) + serving_rows(INFERENCEX)
    refit = fit(rows, name=shipped.name, source=shipped.source, start=shipped).calibration
    assert refit.switches == shipped.switches and refit.models == shipped.models == ("deepseek_v3",)
    # the model's error (--residuals): the held-out errors of its leave-one-GPU-out predictions, not fitted
    spreads = tuple(f for f in shipped.factors if f[1] in RESIDUAL_KNOBS)
    assert spreads == tuple(sorted(model_error(ROOT / "conf" / "calibration" / "serving_residuals.csv")))
    assert sorted(k for _, k, f in spreads) == sorted(RESIDUAL_KNOBS) and all(0.05 < f.sigma < 1 for *_, f in spreads)
    fitted = tuple(f for f in shipped.factors if f[1] not in RESIDUAL_KNOBS)
    for (g, k, a), (g2, k2, b) in zip(fitted, refit.factors, strict=True):
        assert (g, k, a.origin, a.rows) == (g2, k2, b.origin, b.rows)
        # (least_squares stops where a step gains under 1e-8 of the cost: the optimum is that flat, ~2e-4 in a factor)
        assert a.factor == pytest.approx(b.factor, rel=1e-3) and a.sigma == pytest.approx(b.sigma, rel=1e-2)


def _log_predictions(rows: list[Measurement], pairs: list[tuple[str, str]], base: CostProfile) -> Any:
    """The fit's residuals, less its weights: each row's log prediction at log factors theta of `pairs`, then theta."""
    from costmodel.calibrate import structure

    def residuals(theta: np.ndarray) -> np.ndarray:
        fs = [(g, k, Factor(math.exp(t), 0.0, "fit")) for (g, k), t in zip(pairs, theta, strict=True)]
        prof = base.calibrated(Calibration("t", tuple(sorted(fs, key=lambda f: f[:2])), switches=structure(base)))
        return np.concatenate([np.log([predict(r, prof) for r in rows]), theta])

    return residuals


def test_the_fits_grouped_jacobian_is_the_column_by_column_one() -> None:
    """The fit differences its factors in groups no residual reads two of (`sparsity`: each row's knobs, `knobs_of`),
    so a knob a row's prediction reads but `knobs_of` leaves out would zero its derivative there. Against the factors
    differenced one at a time on every row, at the shipped factors, on one row of each kind the fit takes (component,
    engine, experts' split, GPU, TP or not): the same Jacobian, bit for bit, in fewer evaluations."""
    from costmodel.calibrate import _params, column_groups, forward_differences, serving_base, sparsity
    from costmodel.measured import INFERENCEX, serving_rows

    shipped = load_calibration(ROOT / "conf" / "calibration" / "serving.yaml")
    at = {(g, k): math.log(f.factor) for g, k, f in shipped.factors}
    base = serving_base(default_base())
    kinds: dict[tuple[object, ...], Measurement] = {}
    for r in load_measurements([PUBLISHED]) + serving_rows(INFERENCEX):
        p = r.params
        kinds.setdefault((r.component, p.get("engine"), p.get("moe"), r.gpu, p.get("tp", 1) > 1, "users" in p), r)
    for keyed in ("gpu", "stack"):  # the fit's two stages
        rows = [r for r in kinds.values() if COMPONENTS[r.component].keyed == keyed]
        pairs = _params(rows, base)
        x = np.array([at.get(pair, 0.0) for pair in pairs])
        residuals = _log_predictions(rows, pairs, base)
        reads, f0 = sparsity(rows, pairs, base), residuals(x)
        groups = column_groups(reads)
        assert len(groups) < len(pairs)
        for g in groups:  # no residual reads two factors of a group
            assert (reads[:, g].sum(axis=1) <= 1).all()
        one_by_one = forward_differences(residuals, x, f0, np.ones_like(reads), [np.array([j]) for j in range(len(x))])
        assert np.array_equal(forward_differences(residuals, x, f0, reads, groups), one_by_one), keyed


def test_a_factor_added_to_a_calibration_leaves_the_others_draws_as_they_were() -> None:
    """The rate band's draws (`Calibration.draws`): each factor has a stream of its own, so adding a knob (a new
    prior entry, as a new switch adds) moves no other factor's draws; each factor's draws spread by its sigma."""
    base = Calibration("t", (("H200", "hbm", Factor(1.1, 0.2, "fit")), ("cuda", "kv_read", Factor(0.9, 0.1, "fit"))))
    more = Calibration("t", (*base.factors, ("*", "sequence_overhead", Factor(1.0, 0.3, "prior"))))
    a, b = base.draws(200, seed=7), more.draws(200, seed=7)
    for k in range(2):
        assert [d.factors[k][2].factor for d in a] == [d.factors[k][2].factor for d in b]
    logs = np.log([d.factors[0][2].factor for d in a])
    assert abs(logs.mean() - np.log(1.1)) < 0.05 and 0.15 < logs.std() < 0.25
    assert [d.factors[0][2].factor for d in base.draws(5, seed=8)] != [d.factors[0][2].factor for d in a[:5]]


def test_a_calibration_applies_only_under_the_fixes_it_was_fitted_under(tmp_path: Path) -> None:
    """A calibration records the named profile it was fitted under (`--base`); applied under a profile nearer
    another named one's fixes it is refused in one line, because its factors correct other components. A fix or
    two switched for a comparison keep it; a file that does not record a profile (older files) applies under any."""
    from pipeline.errors import ConfigError
    from pipeline.planning.config import profile_from_cfg

    rows = [Measurement("dense_gemm", "H800", (("k", 7168), ("m", 4096), ("n", 2048)), 1.0, "ms",
                        "test", "t:1")]  # fmt: skip
    cal = fit(rows, CostProfile.shallowsim(), name="under_shallowsim").calibration
    assert cal.profile == "shallowsim" and fit(rows, name="c").calibration.profile == "corrected"
    path = tmp_path / "s.yaml"
    write_calibration(cal, path)
    assert load_calibration(path).profile == "shallowsim"
    assert CostProfile.shallowsim().calibrated(cal).calibration is cal
    message = ("calibration 'under_shallowsim' was fitted under costmodel.profile=shallowsim, and this profile "
               "(corrected) differs from it in 16 fix(es) (fp8_dispatch, gemm_table_by_field, fp4_consistent, ...): "
               "its factors correct other components; use costmodel.profile=shallowsim, or a calibration fitted with "
               "--base corrected")  # fmt: skip
    with pytest.raises(SpecError) as err:
        CostProfile.corrected().calibrated(cal)
    assert str(err.value) == message
    with pytest.raises(ConfigError) as cfg_err:
        profile_from_cfg({"profile": "corrected", "calibration": str(path)})
    assert str(cfg_err.value) == f"costmodel.calibration: {message}"
    # a fix switched to see what it does keeps the calibration (the plan's cost record names both)
    assert CostProfile.shallowsim().with_fixes(fp8_dispatch=True).calibrated(cal).calibration is cal
    nearer = CostProfile.shallowsim().with_fixes(fp8_dispatch=True)  # 1 fix from shallowsim, 15 from corrected
    with pytest.raises(SpecError, match=r"calibration 'c' was fitted under costmodel.profile=corrected, and this "
                                        r"profile \(shallowsim\[\+fp8_dispatch\]\) differs from it in 15 fix\(es\) "
                                        r".*--base shallowsim$"):  # fmt: skip
        nearer.calibrated(fit(rows, name="c").calibration)
    unrecorded = Calibration("old", cal.factors, switches=cal.switches)
    assert CostProfile.corrected().calibrated(unrecorded).calibration is unrecorded
    assert fit(rows, name="kernels").calibration.models == ()  # kernel rows: any model's
    path.write_text(path.read_text().replace("profile: shallowsim", "models: 5\nprofile: shallowsim"))
    with pytest.raises(SpecError, match=r"`models` must list the models whose serving it was fitted to, got 5"):
        load_calibration(path)
    path.write_text(path.read_text().replace("models: 5\n", "").replace("profile: shallowsim", "profile: tuned"))
    with pytest.raises(SpecError, match=r"profile 'tuned': the named profile it was fitted under, one of"):
        load_calibration(path)


def test_a_refitted_calibration_under_the_same_name_is_a_new_run_not_a_resume(tmp_path: Path) -> None:
    """A search's identity (its folder's hash, what search.resume=true continues) holds the calibration's content:
    the same file with one factor refitted is another run; written back as it was, the first run again."""
    import dataclasses

    from helpers import compose
    from pipeline.search.settings import inventory_of, settings_from_cfg

    shipped = ROOT / "conf" / "calibration" / "serving.yaml"
    path = tmp_path / "serving.yaml"
    cal = load_calibration(shipped)
    (g, k, f), *rest = cal.factors
    moved = dataclasses.replace(cal, factors=((g, k, dataclasses.replace(f, factor=f.factor * 1.01)), *rest))
    keys = []
    for text in (shipped.read_text(), None, shipped.read_text()):
        if text is None:
            write_calibration(moved, path, "# one factor moved")
        else:
            path.write_text(text)
        cfg = compose(["+inventory=tiny_hetero", f"costmodel.calibration={path}"])
        keys.append(settings_from_cfg(cfg, *inventory_of(cfg))[0].key)
    assert keys[0] == keys[2] != keys[1]


def test_the_kernels_measured_here_load_name_their_run_and_stay_out_of_the_shipped_fit() -> None:
    """conf/calibration/measured.csv (benchmarks/device_kernels.py on an H200 and an H100) is valid measurement data,
    every row naming the card, the software and the script, the two cards measured at the same shapes; the shipped
    calibrations are fitted to the published tables alone
    (costmodel.calibrate.KERNEL_TABLES; docs/costmodel.md says why)."""
    from costmodel.calibrate import KERNEL_TABLES

    measured = ROOT / "conf" / "calibration" / "measured.csv"
    rows = load_measurements([measured])
    prefix = [r for r in rows if "context" in r.params]  # attention behind a prefix-cache hit, H200 only
    assert len(prefix) == 4 and {r.gpu for r in prefix} == {"H200"}
    rows = [r for r in rows if r not in prefix]
    plain = [r.value for r in rows if r.component == "attention_prefill" and r.gpu == "H200"]
    # docs/costmodel.md: a hit's attention runs below every plain prefill rate the same card reached
    assert all(r.value < min(plain) and "bottom-right causal mask" in r.source for r in prefix)
    assert len(rows) == 70 and {r.gpu for r in rows} == {"H200", "H100-SXM"}
    assert {r.component for r in rows} == {"dense_gemm", "grouped_gemm", "attention_prefill"}
    card = {"H200": "NVIDIA H200 (", "H100-SXM": "NVIDIA H100 80GB HBM3 ("}
    assert all(card[r.gpu] in r.source and "torch 2.11" in r.source and "device_kernels.py" in r.source
               for r in rows)
    shapes = {gpu: sorted((r.component, r.shape, re.findall(r"\d+ prompts? x \d+ tokens", r.source))
                          for r in rows if r.gpu == gpu)
              for gpu in card}  # attention's prompts and lengths are in its source
    assert shapes["H200"] == shapes["H100-SXM"]
    assert KERNEL_TABLES == (PUBLISHED,)
    for name in ("published.yaml", "serving.yaml"):
        assert "measured.csv" not in load_calibration(ROOT / "conf" / "calibration" / name).source


def test_the_kernel_measurement_script_refuses_a_machine_without_a_gpu_in_one_line(tmp_path: Path) -> None:
    """benchmarks/device_kernels.py measures the GPU it runs on; without one (CUDA hidden) it says so and writes
    nothing."""
    out = tmp_path / "rows.csv"
    script = ROOT / "benchmarks" / "device_kernels.py"
    r = subprocess.run([sys.executable, str(script), "--gpu", "H200", "--out", str(out)], capture_output=True,
                       text=True, cwd=ROOT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    _refused(r, "no CUDA GPU")
    assert not out.exists()

"""Properties of the cost model on random GPUs, models, lengths, batches and degrees."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.catalog import gpu_names, load_gpu, load_model, priced_model_names
from costmodel.formulas import DecodeRun, decode_step_ms, decode_steps_sum_ms, max_batch, prefill_time_ms
from costmodel.profile import CostProfile

CORRECTED = CostProfile.corrected()
ROOFLINE = CORRECTED.with_fixes(gemm_roofline=True)  # the structure the shipped calibration is fitted on
FP8_GPUS = [g for g in gpu_names() if load_gpu(g).has_fp8]  # shallowsim assumes FP8

gpus = st.sampled_from(gpu_names())
models = st.sampled_from(priced_model_names())
degrees = st.sampled_from([1, 2, 4, 8, 16, 32, 64])


@settings(max_examples=60, deadline=None)
@given(gpus, models, degrees, degrees, st.integers(1, 32000), st.integers(1, 32000), st.floats(0.0, 0.9))
def test_prefill_time_grows_with_length(g: str, m: str, tp: int, dp: int, s1: int, s2: int, rho: float) -> None:
    lo, hi = sorted((s1, s2))
    for profile in (CORRECTED, ROOFLINE):
        t = prefill_time_ms(load_gpu(g), load_model(m), np.array([lo, hi]), tp, dp, cache_hit=rho, profile=profile)
        assert np.isfinite(t).all() and (t > 0).all()
        assert t[0] <= t[1] * (1 + 1e-12)  # flat where comm dominates: allow rounding


@settings(max_examples=60, deadline=None)
@given(
    gpus,
    models,
    degrees,
    st.sampled_from([4, 8, 16, 32, 64, 128, 256]),
    st.integers(1, 32000),
    st.integers(1, 2048),
    st.integers(1, 2048),
)
def test_decode_step_grows_with_batch(g: str, m: str, tp: int, ep: int, ctx: int, b1: int, b2: int) -> None:
    lo, hi = sorted((b1, b2))
    for profile in (CORRECTED, ROOFLINE):
        t = decode_step_ms(load_gpu(g), load_model(m), ctx, np.array([lo, hi]), tp, ep, profile=profile)
        assert np.isfinite(t).all() and (t > 0).all()
        assert t[0] <= t[1] * (1 + 1e-12)  # flat where comm dominates: allow rounding


@settings(max_examples=60, deadline=None)
@given(
    gpus,
    models,
    degrees,
    st.sampled_from([4, 8, 16, 32, 64, 128, 256]),
    st.integers(1, 1024),
    st.integers(1, 64000),
    st.integers(1, 64000),
)
def test_decode_step_grows_with_context(g: str, m: str, tp: int, ep: int, bs: int, c1: int, c2: int) -> None:
    lo, hi = sorted((c1, c2))
    for profile in (CORRECTED, CostProfile.shallowsim()):
        if profile.name == "shallowsim" and (g not in FP8_GPUS or m != "deepseek_v3"):
            continue
        t = decode_step_ms(load_gpu(g), load_model(m), np.array([lo, hi]), bs, tp, ep, profile=profile)
        assert np.isfinite(t).all() and (t > 0).all()
        assert t[0] <= t[1] * (1 + 1e-12)  # flat where comm dominates: allow rounding


@settings(max_examples=60, deadline=None)
@given(gpus, models, degrees, st.integers(1, 256), st.integers(0, 64000), st.integers(0, 64000), st.integers(0, 4000))
def test_max_batch_falls_with_context(g: str, m: str, tp: int, experts: int, c1: int, c2: int, dl: int) -> None:
    lo, hi = sorted((c1, c2))
    mb = max_batch(load_gpu(g), load_model(m), np.array([lo, hi]), dl + 1, tp, experts, profile=CORRECTED)
    assert np.isfinite(mb).all() and (mb >= 0).all()
    assert (mb == np.floor(mb)).all()
    assert mb[0] >= mb[1]


@settings(max_examples=40, deadline=None)
@given(
    gpus,
    models,
    degrees,
    st.sampled_from([8, 16, 64, 256]),
    st.integers(1, 1024),
    st.integers(0, 16000),
    st.integers(1, 400),
)
def test_decode_steps_sum_is_the_sum_of_steps(g: str, m: str, tp: int, ep: int, bs: int, s: int, d: int) -> None:
    gpu, model = load_gpu(g), load_model(m)
    mtp = CORRECTED.with_fixes(step_overhead=True, lm_head=True, draft_passes=True)  # drafts as forwards of their own
    for profile, run in ((CORRECTED, DecodeRun()), (CostProfile.shallowsim(), DecodeRun()),
                         (mtp, DecodeRun(draft_tokens=2))):  # fmt: skip
        if profile.name == "shallowsim" and g not in FP8_GPUS:
            continue  # shallowsim divides by the FP8 rate: infinite on GPUs without FP8
        steps = decode_step_ms(gpu, model, s + np.arange(1, d + 1), bs, tp, ep, profile=profile, run=run)
        fast = decode_steps_sum_ms(gpu, model, s, d, bs, tp, ep, profile=profile, run=run)
        assert np.isfinite(fast) and abs(fast - steps.sum()) <= 1e-9 * steps.sum()


def test_one_call_evaluates_a_grid() -> None:
    """GPUs x lengths x batches x degrees in one broadcast call, equal to point-by-point calls."""
    from costmodel.specs import GPUArray

    names = ["H200", "H800", "H20", "A100-80GB"]
    ga = GPUArray.of([load_gpu(n) for n in names], ndim=4, axis=0)
    ctx = np.array([512, 4096])[None, :, None, None]
    bs = np.array([8, 64, 512])[None, None, :, None]
    tp = np.array([1, 4])[None, None, None, :]
    model = load_model("deepseek_v3")
    grid = decode_step_ms(ga, model, ctx, bs, tp, 32)
    assert grid.shape == (4, 2, 3, 2)
    for i, n in enumerate(names):
        for j, c in enumerate([512, 4096]):
            for k, b in enumerate([8, 64, 512]):
                for m, t in enumerate([1, 4]):
                    assert grid[i, j, k, m] == decode_step_ms(load_gpu(n), model, c, b, t, 32)


def test_shallowsim_step_time_is_not_monotone_in_batch() -> None:
    """The quirk `monotone_gemm_time` fixes: past a power of two the efficiency table jumps."""
    t = decode_step_ms(
        load_gpu("H20"),
        load_model("deepseek_v3"),
        4383,
        np.array([31.0, 32.0]),
        1,
        16,
        profile=CostProfile.shallowsim(),
    )
    assert t[1] < t[0] * 0.9
    fixed = CostProfile.shallowsim().with_fixes(monotone_gemm_time=True)
    t = decode_step_ms(load_gpu("H20"), load_model("deepseek_v3"), 4383, np.array([31.0, 32.0]), 1, 16, profile=fixed)
    assert t[1] >= t[0]

"""The four rows worked by hand in reference/shallowsim_spec.md section 6, term by term."""

from __future__ import annotations

import pytest

from costmodel.catalog import load_gpu, load_model
from costmodel.formulas import (
    DecodeRun,
    decode_parts,
    max_batch,
    prefill_chunk_ms,
    prefill_parts,
    prefill_time_ms,
    request_overheads_ms,
)
from costmodel.profile import CostProfile

SS = CostProfile.shallowsim()
DSV3 = load_model("deepseek_v3")


def test_row_a_prefill_h800() -> None:
    p = prefill_parts(load_gpu("H800"), DSV3, 4096, 4, 8, cache_hit=0.563, profile=SS)
    assert p["MLA"] == pytest.approx(5.284154, abs=1e-6)
    assert p["TP_MLA"] == pytest.approx(1.715450, abs=1e-6)
    assert p["DenseMLP"] == pytest.approx(2.386132, abs=1e-6)
    assert p["Shared_Expert"] == pytest.approx(0.075546, abs=1e-6)
    assert p["Routed_Expert"] == pytest.approx(0.604369, abs=1e-6)
    assert p["Dispatch"] == pytest.approx(0.297059, abs=1e-6)
    assert p["Combine"] == pytest.approx(1.038235, abs=1e-6)
    assert p["Comm"] == pytest.approx(77.447059, abs=1e-6)
    assert p["Sum"] == pytest.approx(161.94205531865137, rel=1e-12)


def test_row_b_decode_h800() -> None:
    p = decode_parts(load_gpu("H800"), DSV3, 4383, 64, 1, 144, profile=SS)
    assert p["DenseMLA"] == pytest.approx(0.263094, abs=1e-6)
    assert p["SparseMLA"] == pytest.approx(0.313094, abs=1e-6)
    assert p["DenseMLP"] == pytest.approx(0.141337, abs=1e-6)
    assert p["SharedExpert"] == pytest.approx(0.033084, abs=1e-6)
    assert p["RoutedExpert"] == pytest.approx(0.116435, abs=1e-6)
    assert p["Dispatch"] == pytest.approx(0.092353, abs=1e-6)
    assert p["Combine"] == pytest.approx(0.174706, abs=1e-6)
    assert p["Delta"] == pytest.approx(-0.079119, abs=1e-6)
    assert p["TPOT"] == pytest.approx(28.044855019375003, rel=1e-12)
    # the memory filter keeps this point: max_bs(tp=1, 2 routed + 1 shared) = 275.68
    assert max_batch(load_gpu("H800"), DSV3, 4383, 1210, 1, 2, profile=SS) == pytest.approx(275.68, abs=0.01)


def test_row_c_max_batch_h800() -> None:
    assert max_batch(load_gpu("H800"), DSV3, 4383, 1210, 1, 4, profile=SS) == pytest.approx(
        248.41690135047165, rel=1e-12
    )


def test_the_memory_fraction_by_hand() -> None:
    """costmodel.mem_fraction: the engine's share of the GPU's memory. Row C's point (H800, 4,383 + 1,210 tokens,
    TP 1) at 0.95 instead of 0.9 holds 0.05 x 80 GiB more of KV: under shallowsim a sequence's cache is 5,593 tokens
    x 576 elements (MLA's 512 + 64) x 61 layers x 1 byte, so 4,294,967,296 / 196,515,648 = 21.856 sequences more."""
    h800 = load_gpu("H800")
    assert (h800.mem_gb, DSV3.kv_elems_per_token_layer, DSV3.n_layers) == (80, 576, 61)
    at = {f: float(max_batch(h800, DSV3, 4383, 1210, 1, 4, profile=SS, mem_fraction=f)) for f in (0.9, 0.95)}
    assert at[0.9] == pytest.approx(248.41690135047165, rel=1e-12)  # the default: row C
    assert at[0.95] - at[0.9] == pytest.approx(0.05 * 80 * 2**30 / (5593 * 576 * 61), rel=1e-9)
    assert 0.05 * 80 * 2**30 / (5593 * 576 * 61) == pytest.approx(21.856, abs=1e-3)


def test_the_kv_cache_format_by_hand() -> None:
    """costmodel.kv_dtype: on an H20 (FP8 compute) "auto" keeps the KV cache in FP8, 1 byte an element, "bf16" in 2.
    A 1,000-token sequence of DeepSeek-V3's MLA cache is 1,000 x 576 x 61 elements on each attention rank, so BF16
    doubles it, halves (about) the sequences that fit, and doubles the bytes a decode step's attention reads."""
    from costmodel.formulas import kv_bytes_per_seq

    h20, corrected = load_gpu("H20"), CostProfile.corrected()
    one = {d: float(kv_bytes_per_seq(h20, DSV3, 1000, 1, corrected, kv_dtype=d)) for d in ("auto", "fp8", "bf16")}
    assert one == {"auto": 1000 * 576 * 61.0, "fp8": 1000 * 576 * 61.0, "bf16": 2 * 1000 * 576 * 61.0}
    fits = {d: float(max_batch(h20, DSV3, 4383, 1210, 8, 32, profile=corrected, kv_dtype=d)) for d in ("fp8", "bf16")}
    assert fits["bf16"] == float(int(fits["fp8"] / 2))  # the same free memory over twice the bytes (floored)
    parts = {d: decode_parts(h20, DSV3, 4383, 64, 1, 16, profile=corrected, run=DecodeRun(kv_dtype=d))
             for d in ("fp8", "bf16")}  # fmt: skip
    grew = {k for k in parts["fp8"] if float(parts["bf16"][k]) != float(parts["fp8"][k])}
    assert grew == {"DenseMLA", "SparseMLA", "Delta", "TPOT_O", "TPOT"}  # attention's KV reads, and the sums
    assert float(parts["bf16"]["DenseMLA"]) > float(parts["fp8"]["DenseMLA"])


def test_row_d_fp4_decode_gb200() -> None:
    p = decode_parts(load_gpu("GB200-NVL72"), DSV3, 4383, 128, 4, 72, profile=SS, run=DecodeRun(fp8_combine=True))
    assert p["SparseMLA"] == pytest.approx(0.143652, abs=1e-6)
    assert p["DenseMLA"] == pytest.approx(0.172684, abs=1e-6)
    assert p["SharedExpert"] == pytest.approx(0.009492, abs=1e-6)
    assert p["RoutedExpert"] == pytest.approx(0.051234, abs=1e-6)
    assert p["Dispatch"] == pytest.approx(0.019150, abs=1e-6)
    assert p["DenseMLP"] == pytest.approx(0.067526, abs=1e-6)
    assert p["TPOT"] == pytest.approx(12.574578, abs=1e-6)
    assert 1000 / p["TPOT"] * 128 == pytest.approx(10179.27, abs=0.01)


def test_tp_has_no_effect_when_comm_dominates() -> None:
    """Spec 4.11: with Delta > 0 SparseMLA cancels, e.g. DGX-B200, EP 72, bs 128."""
    g = load_gpu("DGX-B200")
    t1 = decode_parts(g, DSV3, 4383, 128, 1, 72, profile=SS)
    t4 = decode_parts(g, DSV3, 4383, 128, 4, 72, profile=SS)
    assert t1["Delta"] > 0 and t4["Delta"] > 0
    assert t1["TPOT"] == pytest.approx(19.3993, abs=1e-4)
    assert t4["TPOT"] == pytest.approx(t1["TPOT"], rel=1e-12)


def test_activated_experts_by_hand() -> None:
    """`activated_experts`: one token (top 8 of 256) over an EP group of 8 GPUs with 32 experts each activates an
    expert with q = 1/32, so a GPU streams Binomial(32, 1/32): mean 1, spread sqrt(31/32) = 0.98425; the busiest of
    8 GPUs is taken as 1 + 0.98425 x sqrt(2 ln 8) = 1 + 0.98425 x 2.03933 = 3.0072 experts, not 32. Thousands of
    tokens activate every expert: all 32."""
    import numpy as np

    from costmodel.formulas import MICRO_BATCHES, Rates, _expert_bytes, _xfer_ms, activated_experts
    from costmodel.specs import GPUArray

    assert float(activated_experts(np.array(32.0), np.array(1.0), 8, 256, np.array(8.0))) == pytest.approx(
        3.00722, abs=1e-4
    )
    assert float(activated_experts(np.array(32.0), np.array(5000.0), 8, 256, np.array(8.0))) == 32.0
    assert float(activated_experts(np.array(32.0), np.array(1.0), 8, 256, np.array(1.0))) == pytest.approx(1.0)
    # in a decode step the switch changes only the routed experts' weight stream: 2 micro-batches x (32 - 3.0072)
    # experts' bytes at this GPU's bandwidth, per MoE layer; at batch 2 on attention TP 1 (8 ranks) a micro-batch
    # carries one token per GPU: 8 tokens over the group
    gpu = load_gpu("H200")
    base = CostProfile.corrected()
    on = base.with_fixes(activated_experts=True)
    off_p = decode_parts(gpu, DSV3, 2048, 2, 1, 8, profile=base)
    on_p = decode_parts(gpu, DSV3, 2048, 2, 1, 8, profile=on)
    r = Rates(GPUArray.of(gpu), "decode", base)
    t_w = float(_xfer_ms(_expert_bytes(DSV3, r, "decode", base), r.bw, base))
    busiest = float(activated_experts(np.array(32.0), np.array(8.0), 8, 256, np.array(8.0)))
    assert off_p["RoutedExpert"] - on_p["RoutedExpert"] == pytest.approx(MICRO_BATCHES * t_w * (32 - busiest), rel=1e-9)
    for key in ("SparseMLA", "SharedExpert", "Dispatch", "Combine"):
        assert on_p[key] == pytest.approx(off_p[key], rel=1e-12)
    big_off, big_on = (decode_parts(gpu, DSV3, 2048, 512, 1, 8, profile=p)["TPOT"] for p in (base, on))
    assert big_on == pytest.approx(big_off, rel=1e-12)  # 2,048 tokens a micro-batch activate every expert
    assert on.name == "corrected[+activated_experts]"


def test_overlap_chosen_by_hand() -> None:
    """`overlap_chosen`: one micro-batch is the whole batch with its all-to-all in the open. With every expert
    streamed (activated_experts off) two micro-batches read each expert twice, so at a small batch one micro-batch
    is faster by about one read of the experts minus the exposed dispatch and combine, and the switch takes it; at a
    batch where two overlapped micro-batches hide their communication behind more work than one read of weights,
    they stay. The step is the smaller of the two, and `Overlap` says which ran."""
    from costmodel.formulas import Rates, _expert_bytes, _xfer_ms
    from costmodel.specs import GPUArray

    gpu, base = load_gpu("H200"), CostProfile.corrected()
    r = Rates(GPUArray.of(gpu), "decode", base)
    t_w = float(_xfer_ms(_expert_bytes(DSV3, r, "decode", base), r.bw, base))
    chosen = base.with_fixes(overlap_chosen=True)
    two = decode_parts(gpu, DSV3, 2048, 2, 1, 8, profile=base)
    one = decode_parts(gpu, DSV3, 2048, 2, 1, 8, profile=chosen)
    assert float(one["Overlap"]) == 0.0 and float(two["Overlap"]) == 1.0
    # by hand, per MoE layer: one micro-batch streams each resident expert (and the shared one) once, computes
    # the same FLOPs, and adds its whole dispatch and combine
    assert float(two["RoutedExpert"] - one["RoutedExpert"]) == pytest.approx(32 * t_w, rel=0.02)  # GEMMs aside
    assert float(two["SharedExpert"] - one["SharedExpert"]) == pytest.approx(t_w, rel=0.05)
    layers_d, layers_s = DSV3.n_dense_layers, DSV3.n_moe_layers
    by_hand = layers_d * (one["DenseMLA"] + one["DenseMLP"]) + layers_s * (
        one["SparseMLA"] + one["SharedExpert"] + one["RoutedExpert"] + one["Dispatch"] + one["Combine"]
    )
    assert float(one["TPOT"]) == pytest.approx(float(by_hand), rel=1e-12) and one["TPOT"] < two["TPOT"]
    assert float(one["Delta"]) == pytest.approx(float(one["Dispatch"] + one["Combine"]), rel=1e-12)
    # a large batch on a group over the NIC (EP 32: 4 hosts): the all-to-all is worth hiding, two micro-batches stay
    big_two = decode_parts(gpu, DSV3, 2048, 256, 1, 32, profile=base)
    big = decode_parts(gpu, DSV3, 2048, 256, 1, 32, profile=chosen)
    assert float(big["Overlap"]) == 1.0 and float(big["TPOT"]) == pytest.approx(float(big_two["TPOT"]), rel=1e-12)
    assert chosen.name == "corrected[+overlap_chosen]"


def test_experts_split_by_tp_by_hand() -> None:
    """`moe_tp` (InferenceX's `ep 1`): each of 8 GPUs holds 1/8 of all 256 experts. 8 tokens of top-8 activate
    256 (1 - (1 - 8/256)^8) = 57.42 experts, the same on every GPU, so each GPU streams 57.42 / 8 = 7.18 experts'
    bytes a micro-batch (no busiest GPU), against 32 resident experts placed whole; the MoE output is all-reduced
    (no dispatch) and the FLOPs per GPU are the same."""
    import numpy as np

    from costmodel.formulas import MICRO_BATCHES, Rates, _allreduce_ms, _expert_bytes, _xfer_ms
    from costmodel.specs import GPUArray

    gpu = load_gpu("H200")
    p = CostProfile.corrected().with_fixes(activated_experts=True)
    r = Rates(GPUArray.of(gpu), "decode", p)
    t_w = float(_xfer_ms(_expert_bytes(DSV3, r, "decode", p), r.bw, p))
    # batch 16 on attention TP 8: 2 tokens per GPU, 1 per micro-batch, 8 over the group
    sliced = decode_parts(gpu, DSV3, 2048, 16, 8, 8, profile=p, run=DecodeRun(moe_tp=True))
    whole = decode_parts(gpu, DSV3, 2048, 16, 8, 8, profile=p)
    active = 256 * (1 - (1 - 8 / 256) ** 8)
    assert active == pytest.approx(57.421, abs=1e-3)
    weights = MICRO_BATCHES * t_w * active / 8
    gemms = float(sliced["RoutedExpert"]) - weights  # what is left is the (small, memory-bound) GEMMs' compute
    assert 0 < gemms < 0.15 * weights and float(sliced["Dispatch"]) == 0.0
    assert whole["RoutedExpert"] > sliced["RoutedExpert"]  # placed whole, the busiest GPU streams more
    g = GPUArray.of(gpu)
    reduce = MICRO_BATCHES * _allreduce_ms(np.asarray(16.0 / MICRO_BATCHES), DSV3, np.asarray(8.0), g, r, p)
    assert float(sliced["Combine"]) == pytest.approx(float(reduce), rel=1e-12)
    # the shared expert is sliced too: 1/8 of its weights per GPU
    assert float(sliced["SharedExpert"]) < float(whole["SharedExpert"]) / 4


def test_step_overhead_by_hand() -> None:
    """`step_overhead`: every decode step pays STEP_OVERHEAD_MS over the calibration's `step_overhead` factor, once
    per step (not per layer), at any batch; nothing else moves."""
    from costmodel.calibration import Calibration, Factor
    from costmodel.formulas import STEP_OVERHEAD_MS

    gpu, base = load_gpu("H200"), CostProfile.corrected()
    on = base.with_fixes(step_overhead=True)
    for batch in (1, 64):
        off_p, on_p = (decode_parts(gpu, DSV3, 2048, batch, 1, 8, profile=p) for p in (base, on))
        assert float(on_p["TPOT"] - off_p["TPOT"]) == pytest.approx(STEP_OVERHEAD_MS, rel=1e-12)
        assert float(on_p["SparseMLA"]) == float(off_p["SparseMLA"])
    half = Calibration("t", (("cuda", "step_overhead", Factor(0.5, 0.0, "fit")),))
    twice = decode_parts(gpu, DSV3, 2048, 1, 1, 8, profile=on.calibrated(half))["TPOT"]
    alone = decode_parts(gpu, DSV3, 2048, 1, 1, 8, profile=base.calibrated(half))["TPOT"]
    assert float(twice - alone) == pytest.approx(2 * STEP_OVERHEAD_MS, rel=1e-12)  # 1 / 0.5: twice the time


def test_sequence_overhead_by_hand() -> None:
    """`sequence_overhead`: a decode step pays SEQUENCE_OVERHEAD_MS over the calibration's `sequence_overhead`
    factor for every sequence of the rank it waits for: 64 sequences a rank, 0.64 ms before calibration; with
    `dp_imbalance` over EP 16 at attention TP 1 the busiest rank's 64 + sqrt(2 x 64 x ln 16) = 82.84; MTP drafts
    add none (a sequence's bookkeeping, not its tokens); nothing else moves."""
    import math

    from costmodel.calibration import Calibration, Factor
    from costmodel.formulas import SEQUENCE_OVERHEAD_MS

    gpu, base = load_gpu("H200"), CostProfile.corrected()
    on = base.with_fixes(sequence_overhead=True)
    for batch, drafts in ((1, 0), (64, 0), (64, 2)):
        off_p, on_p = (
            decode_parts(gpu, DSV3, 2048, batch, 1, 8, profile=p, run=DecodeRun(draft_tokens=drafts))
            for p in (base, on)
        )
        assert float(on_p["TPOT"] - off_p["TPOT"]) == pytest.approx(batch * SEQUENCE_OVERHEAD_MS, rel=1e-12)
        assert float(on_p["SparseMLA"]) == float(off_p["SparseMLA"])
    both, imbalanced = on.with_fixes(dp_imbalance=True), base.with_fixes(dp_imbalance=True)
    extra = decode_parts(gpu, DSV3, 2048, 64, 1, 16, profile=both)["TPOT"] - decode_parts(
        gpu, DSV3, 2048, 64, 1, 16, profile=imbalanced
    )["TPOT"]
    assert float(extra) == pytest.approx((64 + math.sqrt(2 * 64 * math.log(16))) * SEQUENCE_OVERHEAD_MS, rel=1e-12)
    quarter = Calibration("t", (("*", "sequence_overhead", Factor(0.25, 0.0, "fit")),))
    more = decode_parts(gpu, DSV3, 2048, 10, 1, 8, profile=on.calibrated(quarter))["TPOT"]
    alone = decode_parts(gpu, DSV3, 2048, 10, 1, 8, profile=base.calibrated(quarter))["TPOT"]
    assert float(more - alone) == pytest.approx(10 * 4 * SEQUENCE_OVERHEAD_MS, rel=1e-12)  # 1 / 0.25: four times


def test_dp_imbalance_by_hand() -> None:
    """`dp_imbalance`: 64 sequences per rank over EP 16 with attention TP 1 (16 ranks): the busiest rank holds
    64 + sqrt(2 x 64 x ln 16) = 64 + 18.84 = 82.84 sequences, so its attention is that of 82.84 sequences (to the
    step: the same as 82.84 evenly); the experts' load stays the mean's. One rank (attention TP = EP) has no
    spread."""
    import math

    gpu, base = load_gpu("H200"), CostProfile.corrected()
    on = base.with_fixes(dp_imbalance=True)
    busiest = 64 + math.sqrt(2 * 64 * math.log(16))
    assert busiest == pytest.approx(82.84, abs=0.01)
    skewed = decode_parts(gpu, DSV3, 4096, 64, 1, 16, profile=on)
    as_if = decode_parts(gpu, DSV3, 4096, busiest, 1, 16, profile=base)
    mean = decode_parts(gpu, DSV3, 4096, 64, 1, 16, profile=base)
    for key in ("SparseMLA", "DenseMLA", "DenseMLP"):
        assert float(skewed[key]) == pytest.approx(float(as_if[key]), rel=1e-12), key
    for key in ("RoutedExpert", "SharedExpert", "Dispatch"):
        assert float(skewed[key]) == pytest.approx(float(mean[key]), rel=1e-12), key
    one_rank = (decode_parts(gpu, DSV3, 4096, 64, 8, 8, profile=p)["TPOT"] for p in (base, on))
    assert float(next(one_rank)) == pytest.approx(float(next(one_rank)), rel=1e-12)


def test_experts_fp8_by_hand() -> None:
    """`experts_fp8`: on a GPU with an FP4 rate (B200) the routed experts stream at 1 byte a weight instead of 0.5
    and compute at the FP8 rate: the decode step's routed-expert weight time doubles exactly; nothing changes on a
    GPU without FP4 (H200), and the plan records the experts' format."""
    import numpy as np

    from costmodel.formulas import Rates, _expert_bytes, priced_precision
    from costmodel.specs import GPUArray

    base = CostProfile.corrected()
    fp8 = base.with_fixes(experts_fp8=True)
    b200, h200 = load_gpu("DGX-B200"), load_gpu("H200")
    r4, r8 = (Rates(GPUArray.of(b200), "decode", p) for p in (base, fp8))
    assert float(_expert_bytes(DSV3, r8, "decode", fp8)) == 2 * float(_expert_bytes(DSV3, r4, "decode", base))
    assert float(np.asarray(r8.expert)) < float(np.asarray(r4.expert))  # the FP8 rate, not FP4's
    assert priced_precision(b200, base) == ("fp8", "fp4") and priced_precision(b200, fp8) == ("fp8", "fp8")
    for gpu in (b200, h200):
        off, on = (decode_parts(gpu, DSV3, 2048, 64, 1, 8, profile=p) for p in (base, fp8))
        assert on["SparseMLA"] == pytest.approx(off["SparseMLA"], rel=1e-12)
        assert (on["RoutedExpert"] > off["RoutedExpert"]) == (gpu is b200)
        if gpu is h200:
            assert on["TPOT"] == pytest.approx(off["TPOT"], rel=1e-12)


def test_an_mtp_step_by_hand() -> None:
    """One draft token (DeepSeek's MTP): each sequence verifies 2 tokens, so the expert, projection and all-to-all
    terms are those of twice the sequences, the KV cache is read once per sequence, and the step runs one more MoE
    layer (the draft module). The simulator's timing divides the step by the tokens it yields (1 + 0.85)."""
    import numpy as np

    from costmodel.settings import CostSettings
    from simulator.timing import decode_timing

    gpu, p = load_gpu("H200"), CostProfile.corrected()
    mtp = decode_parts(gpu, DSV3, 2048, 16, 1, 8, profile=p, run=DecodeRun(draft_tokens=1))
    twice = decode_parts(gpu, DSV3, 2048, 32, 1, 8, profile=p)
    once = decode_parts(gpu, DSV3, 2048, 16, 1, 8, profile=p)
    for key in ("RoutedExpert", "SharedExpert", "Dispatch", "Combine", "DenseMLP"):
        assert mtp[key] == pytest.approx(twice[key], rel=1e-12), key
    assert once["SparseMLA"] < mtp["SparseMLA"] < twice["SparseMLA"]  # 32 tokens' compute, 16 sequences' KV reads
    layers_d, layers_s = DSV3.n_dense_layers, DSV3.n_moe_layers + 1
    by_hand = layers_d * (mtp["DenseMLA"] + mtp["DenseMLP"]) + layers_s * (
        mtp["SparseMLA"] + mtp["SharedExpert"] + mtp["RoutedExpert"] + max(float(mtp["Delta"]), 0.0)
    )
    assert float(mtp["TPOT"]) == pytest.approx(float(by_hand), rel=1e-12)
    cost = CostSettings(p)
    plain = decode_timing(gpu, DSV3, 1, 8, 16, 4096, cost)
    spec = decode_timing(gpu, DSV3, 1, 8, 16, 4096, cost, draft_tokens=1, accepted=0.85)
    step = float(decode_parts(gpu, DSV3, 2048, 16, 1, 8, profile=p, run=DecodeRun(draft_tokens=1))["TPOT"])
    assert spec.step_ms(16 * 8, 2048) == pytest.approx(step / 1.85, rel=0.02)  # interpolated on its grid
    assert spec.step_ms(16 * 8, 2048) < plain.step_ms(16 * 8, 2048)
    with pytest.raises(ValueError, match="accepted <= draft_tokens"):
        decode_timing(gpu, DSV3, 1, 8, 16, 4096, cost, draft_tokens=1, accepted=1.5)
    assert np.isfinite(step)


def test_the_prefill_pass_by_hand() -> None:
    """`prefill_pass` (an end-to-end factor, `*`): a factor f divides a prefill forward's whole time and its
    attention's share by f, a prompt alone or a chunk of several, with the fixed front-end time left as it was and a
    decode step untouched; it multiplies with the range's `model_prefill` draw."""
    import numpy as np

    from costmodel.calibration import Calibration, Factor

    gpu, base = load_gpu("H200"), CostProfile.corrected().with_fixes(step_overhead=True)
    pass_ = Calibration("t", (("*", "prefill_pass", Factor(0.5, 0.0, "fit")),))
    both = Calibration("t", (("*", "prefill_pass", Factor(0.5, 0.0, "fit")),
                             ("*", "model_prefill", Factor(0.8, 0.0, "residual"))))  # fmt: skip
    plain, slow, drawn = (prefill_parts(gpu, DSV3, 4096, 8, 1, profile=p)
                          for p in (base, base.calibrated(pass_), base.calibrated(both)))  # fmt: skip
    assert float(slow["Sum"]) == pytest.approx(2.0 * float(plain["Sum"]), rel=1e-12)  # 1 / 0.5
    assert float(slow["Attention"]) == pytest.approx(2.0 * float(plain["Attention"]), rel=1e-12)
    assert [k for k in plain if not np.allclose(plain[k], slow[k])] == ["Sum", "Attention"]
    assert float(drawn["Sum"]) == pytest.approx(float(plain["Sum"]) / (0.5 * 0.8), rel=1e-12)
    tokens, s = np.array([4 * 1024.0]), np.array([1024.0])
    chunk = (prefill_chunk_ms(gpu, DSV3, tokens, s, np.array([1.0]), np.array([8.0]), profile=p)[0]
             for p in (base, base.calibrated(pass_)))  # fmt: skip
    assert next(chunk) * 2.0 == pytest.approx(next(chunk), rel=1e-12)
    step = (decode_parts(gpu, DSV3, 2048, 32, 1, 8, profile=p)["TPOT"] for p in (base, base.calibrated(pass_)))
    assert float(next(step)) == float(next(step))
    on = base.with_fixes(request_overhead=True)
    assert request_overheads_ms(on.calibrated(pass_)) == request_overheads_ms(on)


def test_the_models_own_error_by_hand() -> None:
    """`model_prefill` and `model_decode` (the range's model error, costmodel.calibration.RESIDUAL_KNOBS): a draw of
    factor f divides the whole prefill pass (and the attention's share of it) and the whole decode step by f, and
    nothing else; `widened` spreads them once more on the GPUs named, independently (twice the variance there), and
    leaves a calibration without them as it was."""
    import math

    import numpy as np

    from costmodel.calibration import Calibration, Factor

    gpu, base = load_gpu("H200"), CostProfile.corrected().with_fixes(step_overhead=True)
    half = Calibration("t", (("*", "model_prefill", Factor(0.5, 0.0, "residual")),
                             ("*", "model_decode", Factor(0.8, 0.0, "residual"))))  # fmt: skip
    for key, parts, f in (("Sum", lambda p: prefill_parts(gpu, DSV3, 4096, 8, 1, profile=p), 0.5),
                          ("TPOT", lambda p: decode_parts(gpu, DSV3, 2048, 32, 1, 8, profile=p), 0.8)):  # fmt: skip
        plain, drawn = parts(base), parts(base.calibrated(half))
        assert float(drawn[key]) == pytest.approx(float(plain[key]) / f, rel=1e-12)
        moved = [k for k in plain if not np.allclose(plain[k], drawn[k])]
        assert moved == (["Sum", "Attention"] if key == "Sum" else ["TPOT_O", "TPOT"])
        if key == "Sum":  # the attention's share of the pass moves with it
            assert float(drawn["Attention"]) == pytest.approx(float(plain["Attention"]) / f, rel=1e-12)
    spread = Calibration("s", (("*", "model_decode", Factor(1.0, 0.2, "residual", 100)),))
    wide = spread.widened(["H20", "H20"])
    assert wide.factors == (("*", "model_decode", Factor(1.0, 0.2, "residual", 100)),
                            ("H20", "model_decode", Factor(1.0, 0.2, "residual", 0)))  # fmt: skip
    assert wide.get("H20", "model_decode").sigma == pytest.approx(0.2 * math.sqrt(2))
    assert wide.get("H200", "model_decode").sigma == 0.2 and wide.widened(["H20"]) == wide
    plain = Calibration("p", (("H200", "hbm", Factor(1.1, 0.1, "fit")),))
    assert plain.widened(["H20"]) is plain
    # a model no shipped measurement is of: widened on every GPU it runs on, and its name says why
    never = spread.unmeasured("gpt_oss_120b", ["H20", "H200"])
    assert never.name == "s, widened: no fit to measured serving of gpt_oss_120b"
    assert never.get("H20", "model_decode").sigma == never.get("H200", "model_decode").sigma == pytest.approx(
        0.2 * math.sqrt(2))
    assert plain.unmeasured("gpt_oss_120b", ["H20"]) is plain


def test_the_model_error_spread_from_held_out_errors_by_hand(tmp_path: object) -> None:
    """`costmodel.calibrate.model_error`: the sigma that puts 80 % of the held-out errors inside the lognormal's
    10th-90th percentile, |log error| at the 80th percentile over 1.2816; decode from every held-out fitting row's
    TPOT, prefill from the TTFT of rows with at most 16 users; rows not held out are not read."""
    import csv
    import math
    from pathlib import Path

    import numpy as np

    from costmodel.calibrate import model_error
    from costmodel.measured import load_inferencex

    rows = [r for r in load_inferencex() if r.fitting][:40]
    few = [r for r in rows if r.conc <= 16]
    assert len(few) >= 10
    path = Path(str(tmp_path)) / "dump.csv"
    ratios = np.linspace(0.7, 1.3, len(rows))  # predicted / measured, row by row
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["line", "held_out", "median_tpot_pred", "median_tpot_meas", "median_ttft_pred", "median_ttft_meas"])
        for r, x in zip(rows, ratios, strict=True):
            w.writerow([r.line, 1, 0.02 * x, 0.02, 0.5 * x, 0.5])
        w.writerow([rows[0].line, 0, 99.0, 0.02, 99.0, 0.5])  # not held out: not read
    prefill, decode = model_error(path)
    z10 = 1.2815515655446004
    want_decode = np.quantile(np.abs(np.log(ratios)), 0.8) / z10
    want_prefill = np.quantile(np.abs(np.log([x for r, x in zip(rows, ratios, strict=True) if r.conc <= 16])), 0.8)
    assert decode[1] == "model_decode" and decode[2].sigma == pytest.approx(want_decode, rel=1e-9)
    assert prefill[1] == "model_prefill" and prefill[2].sigma == pytest.approx(want_prefill / z10, rel=1e-9)
    assert (decode[2].factor, decode[2].origin, decode[2].rows) == (1.0, "residual", len(rows))
    assert prefill[2].rows == len(few) and math.isfinite(prefill[2].sigma)
    # a model fitted to no end-to-end row (the kernel tables alone): every fitting GPU's row is one it never saw,
    # held out or not; a check GPU's row sets nothing (it judges the range)
    check = [r for r in load_inferencex() if not r.fitting][:10]
    with path.open("a", newline="") as f:
        for r in check:
            csv.writer(f).writerow([r.line, 1, 0.04, 0.02, 0.5, 0.5])  # 2x too slow on decode
    with pytest.raises(Exception, match="is not a fitting GPU's row"):
        model_error(path)
    _, every = model_error(path, every_row=True)
    errors = [*np.log(ratios), np.log(99.0 / 0.02)]
    assert every[2].rows == len(rows) + 1
    assert every[2].sigma == pytest.approx(np.quantile(np.abs(errors), 0.8) / z10, rel=1e-9)


def test_node_dispatch_by_hand() -> None:
    """`node_dispatch` (DeepEP's normal kernels): prefill's dispatch on 16 H800 (two hosts of 8) sends each of a
    GPU's 4,096 tokens (TP 1, FP8: 7,168 bytes) over the NIC once to the other host if any of its 8 experts is there
    (1 - 0.5^8), and over NVLink 8 x 7/16 copies to its own host's GPUs plus 8 x 8/16 x 7/8 forwarded: 7 copies.
    NIC 50 GB/s and NVLink 200 GB/s a direction, both at 0.85; the slower of the two links decides, plus 0.05 ms.
    On one host it is the per-copy all-to-all, exactly."""
    gpu, on = load_gpu("H800"), CostProfile.corrected().with_fixes(node_dispatch=True)
    tokens = 4096 * 7168.0
    nic = tokens * (1 - 0.5**8) / 1e6 / (50 * 0.85)
    nvlink = tokens * 7 / 1e6 / (200 * 0.85)
    got = prefill_parts(gpu, DSV3, 4096, 1, 16, profile=on)["Dispatch"]
    assert float(got) == pytest.approx(max(nic, nvlink) + 0.05, rel=1e-12)
    per_copy = prefill_parts(gpu, DSV3, 4096, 1, 16, profile=CostProfile.corrected())["Dispatch"]
    assert float(per_copy) == pytest.approx(tokens * 8 * 8 / 16 / 1e6 / (50 * 0.85) + 0.05, rel=1e-12)  # 4 copies
    for profile in (on, CostProfile.corrected()):  # one host: nothing crosses the NIC either way
        assert float(prefill_parts(gpu, DSV3, 4096, 1, 8, profile=profile)["Dispatch"]) == pytest.approx(
            float(prefill_parts(gpu, DSV3, 4096, 1, 8, profile=CostProfile.corrected())["Dispatch"]), rel=1e-12)


def test_an_all_reduce_across_hosts_by_hand() -> None:
    """`net_allreduce`: an all-reduce over 16 H100 (two hosts of 8) pays NCCL's latency between hosts, 44 us, beside
    its ring's bytes over the NIC. One token's 7,168 BF16 values (14,336 bytes) move 2 x 15/16 of that, 26,880 bytes,
    at 50 GB/s x 0.85: 0.000633 ms, so 0.044633 ms; off, 15 us beside the same bytes. Inside one host (TP 8) it is
    15 us beside 2 x 7/8 of the bytes over NVLink (450 GB/s x 0.85), on or off. Against the published two-host
    NCCL times the constant comes from (mscclpp's figure, formulas.NET_ALLREDUCE_LATENCY_MS), 1 KiB to 1 MiB: 6 %
    off at the median on; off, 2.6x too fast (159 %)."""
    import numpy as np

    from costmodel.formulas import Rates, _allreduce_ms
    from costmodel.specs import GPUArray

    g, off = GPUArray.of(load_gpu("H100-SXM")), CostProfile.corrected()
    on = off.with_fixes(net_allreduce=True)
    byte = 14336 * 2 * 15 / 16 / 1e6 / (50 * 0.85)
    one = np.asarray(1.0)
    assert float(_allreduce_ms(one, DSV3, np.asarray(16.0), g, Rates(g, "decode", on), on)) == pytest.approx(
        0.044 + byte, rel=1e-12)
    assert float(_allreduce_ms(one, DSV3, np.asarray(16.0), g, Rates(g, "decode", off), off)) == pytest.approx(
        0.015 + byte, rel=1e-12)
    for p in (on, off):
        assert float(_allreduce_ms(one, DSV3, np.asarray(8.0), g, Rates(g, "decode", p), p)) == pytest.approx(
            0.015 + 14336 * 2 * 7 / 8 / 1e6 / (450 * 0.85), rel=1e-12)
    nccl_us = {1024: 35.3, 2048: 37.5, 4096: 39.3, 8192: 42.0, 16384: 45.5, 32768: 46.4, 65536: 49.0,
               131072: 50.3, 262144: 126.8, 524288: 87.6, 1048576: 89.0}  # fmt: skip
    tokens = np.array(list(nccl_us)) / (DSV3.hidden * 2.0)
    for p, bound in ((on, 0.056), (off, 1.59)):
        model_us = 1e3 * _allreduce_ms(tokens, DSV3, np.full(len(tokens), 16.0), g, Rates(g, "decode", p), p)
        err = np.exp(np.median(np.abs(np.log(model_us / np.array(list(nccl_us.values())))))) - 1
        assert err == pytest.approx(bound, abs=0.01)


def test_lm_head_by_hand() -> None:
    """`lm_head`: a decode forward runs the vocabulary projection (129,280 x 7,168, BF16) over its tokens, split
    by vocabulary over the TP group. H200 (989 BF16 TFLOPS, 4,800 GB/s, both at 0.85): 64 tokens a rank at TP 8
    stream 16,160 x 7,168 x 2 bytes in 0.0568 ms, longer than their 14.8 GFLOP take (memory-bound); 1,024 tokens at
    TP 1 take 1,898 GFLOP in 2.26 ms, longer than the 1.85 GB stream (compute-bound). Off, the step is the same
    without it."""
    gpu, off = load_gpu("H200"), CostProfile.corrected()
    on = off.with_fixes(lm_head=True)
    cases = ((64, 8, 16160 * 7168 * 2 / 1e6 / (4800 * 0.85)), (1024, 1, 2 * 1024 * 7168 * 129280 / 1e9 / (989 * 0.85)))
    for batch, tp, want in cases:
        got = decode_parts(gpu, DSV3, 2048, batch, tp, 32, profile=on)["TPOT"]
        base = decode_parts(gpu, DSV3, 2048, batch, tp, 32, profile=off)["TPOT"]
        assert float(got - base) == pytest.approx(want, rel=1e-9)
    assert cases[0][2] == pytest.approx(0.05679, rel=1e-3) and cases[1][2] == pytest.approx(2.2576, rel=1e-3)


def test_draft_passes_by_hand() -> None:
    """`draft_passes`: an MTP step of 3 drafts is the verify pass (4 tokens a sequence through the model's layers)
    plus 3 forwards of the draft module over the sequences alone, each one MoE layer at the batch of plain decode
    (its attention, shared and routed experts and exposed all-to-all: the per-layer terms of a step without drafts)
    and, with `lm_head`, the LM head again; the engine's fixed time (`step_overhead`) once a step, the drafts
    replaying inside its CUDA graph. Without the switch the draft module is 3 more MoE layers of the verify pass, at
    its 4 tokens a sequence."""
    gpu, base = load_gpu("H200"), CostProfile.corrected().with_fixes(step_overhead=True, lm_head=True)
    on = base.with_fixes(draft_passes=True)
    batch, tp, ep, drafts = 16, 1, 16, 3

    def layer(parts: dict) -> float:
        return float(parts["SparseMLA"] + parts["SharedExpert"] + parts["RoutedExpert"] + max(parts["Delta"], 0.0))

    verify = decode_parts(gpu, DSV3, 2048, batch, tp, ep, profile=base, run=DecodeRun(draft_tokens=drafts))
    plain = decode_parts(gpu, DSV3, 2048, batch, tp, ep, profile=base)
    got = decode_parts(gpu, DSV3, 2048, batch, tp, ep, profile=on, run=DecodeRun(draft_tokens=drafts))["TPOT"]
    head = DSV3.vocab_size * DSV3.hidden * 2 / 1e6 / (4800 * 0.85)  # 16 tokens at TP 1: memory-bound, 0.454 ms
    want = float(verify["TPOT"]) - drafts * layer(verify) + drafts * (layer(plain) + head)
    assert float(got) == pytest.approx(want, rel=1e-9)
    assert float(got) > float(verify["TPOT"])  # three forwards' weights and heads outweigh three layers' tokens


def test_a_sliding_window_and_mxfp4_experts_by_hand() -> None:
    """GPT-OSS-120B: 18 of its 36 layers attend to (and cache) the last 128 tokens only; 8 KV heads of 64 dims.

    A 1,000-token sequence keeps (18 x 1,000 + 18 x 128) / 36 = 564 tokens per layer on average: at FP8 on an H200
    with TP 1 that is 564 x 2 x 8 x 64 x 36 bytes. A query at context 100 sees all 100 tokens on every layer.
    Prefill of 300 new tokens after 100 cached: full layers see 100 x 300 + 300 x 301 / 2 pairs; a sliding layer's
    query at position x sees min(x + 1, 128): Σ_{y=101..400} min(y, 128) = (101+...+128) + 272 x 128. Its experts
    stay 4.25 bits a weight on every GPU (2,880 x 2,880 x 3 weights an expert), where DeepSeek-V3's are a byte (FP8)
    on an H200; on Hopper they are computed in BF16, on Blackwell against MXFP8 activations at the FP8 rate."""
    from costmodel.formulas import Rates, _expert_bytes, kv_bytes_per_seq
    from costmodel.specs import GPUArray

    gpt = load_model("gpt_oss_120b")
    h200, b200, corrected = load_gpu("H200"), load_gpu("DGX-B200"), CostProfile.corrected()
    assert float(gpt.attended(1000.0)) == (18 * 1000 + 18 * 128) / 36 == 564.0
    assert float(gpt.attended(100.0)) == 100.0
    assert float(kv_bytes_per_seq(h200, gpt, 1000.0, 1, corrected)) == pytest.approx(564 * 2 * 8 * 64 * 36)
    full = 100 * 300 + 300 * 301 / 2
    window = sum(range(101, 129)) + 272 * 128
    assert float(gpt.attended_pairs(300.0, 400.0, True)) == pytest.approx((18 * full + 18 * window) / 36)
    assert float(DSV3.attended_pairs(300.0, 400.0, True)) == full  # no window: the causal triangle alone
    r = Rates(GPUArray.of(h200), "decode", corrected)
    assert float(_expert_bytes(gpt, r, "decode", corrected)) == pytest.approx(2880 * 2880 * 3 * 4.25 / 8)
    assert float(_expert_bytes(DSV3, r, "decode", corrected)) == DSV3.expert_params * 1.0
    assert float(r.expert_rate(gpt)) == pytest.approx(float(r.f16 * r.grouped))
    assert float(r.expert_rate(DSV3)) == pytest.approx(float(r.expert))
    rb = Rates(GPUArray.of(b200), "decode", corrected)
    assert float(rb.expert_rate(gpt)) == pytest.approx(float(rb.f8 * rb.grouped))
    assert float(rb.expert_rate(DSV3)) == pytest.approx(float(rb.f4 * rb.grouped))  # (its experts requantised: FP4)


def test_deepseek_sparse_attention_by_hand() -> None:
    """DeepSeek-V3.2: DeepSeek-V3's MLA with an indexer of 64 heads of 128 picking the top 2,048 cached tokens.

    Its weights: V3's plus the indexer's 64 x 128 x 1,536 (queries from the query latent) + 7,168 x (128 + 64) (keys,
    head weights) a layer. A token adds to a layer's cache the FP8 latent with a scale per 128 and the BF16 rope key
    (512 + 16 + 128 bytes) and the indexer's FP8 key with its scale (128 + 4): 788 bytes, every cached token kept.
    A decode step at context 10,000 attends to 2,048 tokens: 128 heads x (64 + 2 x 512) MACs each, where V3 attends
    to all 10,000; the indexer scores all 10,000 (64 x 128 MACs each, FP8: half counted at the BF16 rate) and reads
    their 132-byte keys. A prefill of 1,000 tokens (within 2,048) is V3's MHA form plus the indexer's keys; one of
    4,000 runs the absorbed form over Σ_{x=1..4000} min(x, 2048) pairs, the indexer scoring all 4,000 x 4,001 / 2."""
    from costmodel.formulas import _attn_decode_gflop, _attn_prefill_gflop, kv_bytes_per_seq

    v32, h200, corrected = load_model("deepseek_v32"), load_gpu("H200"), CostProfile.corrected()
    assert v32.attn_params_per_layer - DSV3.attn_params_per_layer == 64 * 128 * 1536 + 7168 * (128 + 64)
    assert float(kv_bytes_per_seq(h200, v32, 1000.0, 1, corrected)) == pytest.approx(1000 * 61 * (656 + 132))
    assert float(kv_bytes_per_seq(h200, DSV3, 1000.0, 1, corrected)) == pytest.approx(1000 * 61 * 576)
    assert float(v32.attended(10_000.0)) == 2048 and float(v32.held(10_000.0)) == 10_000
    gemm, attn = (float(x) for x in _attn_decode_gflop(v32, 10_000.0, corrected))
    gemm3, attn3 = (float(x) for x in _attn_decode_gflop(DSV3, 10_000.0, corrected))
    assert gemm - gemm3 == pytest.approx(2 * (64 * 128 * 1536 + 7168 * (128 + 64)) / 1e9)
    sparse_pair, index_pair = 128 * (64 + 2 * 512), 64 * 128
    assert attn == pytest.approx(attn3 - 2 * (10_000 - 2048) * sparse_pair / 1e9 + 0.5 * 2 * 10_000 * index_pair / 1e9)
    short = [float(x) for x in _attn_prefill_gflop(v32, 1000.0, 1000.0, corrected)]
    short3 = [float(x) for x in _attn_prefill_gflop(DSV3, 1000.0, 1000.0, corrected)]
    assert short == pytest.approx([short3[0] + 2 * 1000 * 7168 * 128 / 1e9, short3[1]])
    _, attn_long = (float(x) for x in _attn_prefill_gflop(v32, 4000.0, 4000.0, corrected))
    picked = 2048 * 2049 / 2 + (4000 - 2048) * 2048
    out = 4000 * 128 * 128 * (512 + 7168)  # the absorbed output: latent to value heads, then the output projection
    assert attn_long == pytest.approx((2 * (picked * sparse_pair + out) + 0.5 * 2 * 4000 * 4001 / 2 * index_pair) / 1e9)
    # a decode's steps summed in closed form on either side of the top-k, where attention stops growing
    import numpy as np

    from costmodel.formulas import decode_step_ms, decode_steps_sum_ms

    steps = decode_step_ms(h200, v32, 1900 + np.arange(1, 301), 64, 1, 16, profile=corrected)
    assert float(decode_steps_sum_ms(h200, v32, 1900, 300, 64, 1, 16, profile=corrected)) == pytest.approx(
        float(steps.sum()), rel=1e-12)


def test_a_dense_model_by_hand() -> None:
    """Llama-3.3-70B: 80 dense layers, GQA with 8 KV heads of 128, no experts. A decode step of its TP group is its
    80 layers' attention and MLP (each split over TP, with their all-reduces) and the engine's fixed costs: nothing
    routed, dispatched or overlapped, and the same whatever the EP group is said to be (its replicas decode apart).
    One GPU of a TP-4 replica holds a quarter of its attention and MLP weights (FP8 on an H200) and of its BF16
    embedding and LM head; its KV cache is 2 x 8 x 128 elements a token and layer, split over min(TP, 8)."""
    import numpy as np

    from costmodel.formulas import kv_bytes_per_seq, weight_bytes_per_gpu

    llama, h200, corrected = load_model("llama_3_3_70b"), load_gpu("H200"), CostProfile.corrected()
    parts = decode_parts(h200, llama, 2000.0, 64, 4, 4, profile=corrected)
    for k in ("SharedExpert", "RoutedExpert", "Dispatch", "Combine", "Delta", "Overlap"):
        assert float(parts[k]) == 0.0, k
    assert float(parts["DenseMLA"]) == float(parts["SparseMLA"])  # every layer's attention split by TP
    apart = decode_parts(h200, llama, 2000.0, 64, 4, 64, profile=corrected)  # "EP 64": still replicas of TP 4
    assert float(apart["TPOT"]) == pytest.approx(float(parts["TPOT"]))
    layers = 80 * float(parts["DenseMLA"] + parts["DenseMLP"])
    plain = decode_parts(h200, llama, 2000.0, 64, 4, 4, profile=corrected.with_fixes(
        step_overhead=False, sequence_overhead=False, lm_head=False))  # fmt: skip
    assert float(plain["TPOT"]) == pytest.approx(layers)
    attn = 8192 * 128 * (2 * 64 + 2 * 8)
    mlp = 3 * 8192 * 28672
    embed = 2 * 128256 * 8192 * 2  # embedding and LM head in BF16, split over the TP group like the rest
    assert float(weight_bytes_per_gpu(h200, llama, np.array(4.0), np.array(0.0), corrected)) == pytest.approx(
        (80 * (attn + mlp) + embed) / 4)
    assert float(kv_bytes_per_seq(h200, llama, 1000.0, 4, corrected)) == pytest.approx(1000 * 80 * 2 * 8 * 128 / 4)
    # a prefill pays its dense layers only: no all-to-all, nothing overlapped
    pre = prefill_parts(h200, llama, 3000.0, 4, 2, profile=corrected)
    assert float(pre["Comm"]) == 0.0 and float(pre["Sum"]) == pytest.approx(float(pre["Compute"]))
    assert float(pre["Compute"]) == pytest.approx(80 * float(pre["TP_MLA"] + pre["DenseMLP"]))


def test_a_chunk_of_prompts_is_one_forward_by_hand() -> None:
    """`prefill_chunk_ms`: an engine runs a chunk of prompts as one forward. 64 prompts of 128 tokens on 8 H200
    (Qwen3-235B, TP 8) are one forward of 8,192 tokens less its attention over 8,192 x 8,192 pairs plus 64 prompts'
    own attention, several times below 64 separate prefills (their fixed times and weight streaming each); one whole
    prompt is its own prefill, with a cache hit too; a long prompt's chunks add up to its attention once and a
    forward per chunk; spread over 4 ranks, the forward is at a quarter of the tokens a rank."""
    import numpy as np

    gpu, qwen, p = load_gpu("H200"), load_model("qwen3_235b_a22b"), CostProfile.corrected()
    one = [np.array([x]) for x in (1.0, 8.0)]

    def parts(s: float, dp: float = 1.0) -> dict:
        return prefill_parts(gpu, qwen, np.array([s]), one[1], np.array([dp]), profile=p)

    chunk = float(prefill_chunk_ms(gpu, qwen, np.array([8192.0]), np.array([128.0]), one[1], one[0], profile=p)[0])
    by_hand = parts(8192)["Sum"] - parts(8192)["Attention"] + 64 * parts(128)["Attention"]
    assert chunk == pytest.approx(float(by_hand[0]), rel=1e-12)
    assert chunk < 64 * float(parts(128)["Sum"][0]) / 5
    for hit in (0.0, 0.5):
        whole = prefill_chunk_ms(gpu, qwen, np.array([4096.0 * (1 - hit)]), np.array([4096.0]), one[1], one[0],
                                 cache_hit=hit, profile=p)  # fmt: skip
        assert float(whole[0]) == pytest.approx(float(prefill_time_ms(gpu, qwen, 4096.0, 8, 1, cache_hit=hit,
                                                                      profile=p)), rel=1e-12)  # fmt: skip
    pieces = 4 * float(prefill_chunk_ms(gpu, qwen, np.array([2048.0]), np.array([8192.0]), one[1], one[0],
                                        profile=p)[0])  # fmt: skip
    assert pieces == pytest.approx(float((4 * (parts(2048)["Sum"] - parts(2048)["Attention"])
                                          + parts(8192)["Attention"])[0]), rel=1e-12)  # fmt: skip
    spread = prefill_chunk_ms(gpu, qwen, np.array([8192.0]), np.array([128.0]), one[1], np.array([4.0]), profile=p)
    by_hand = parts(2048, 4)["Sum"] - parts(2048, 4)["Attention"] + 64 * parts(128, 4)["Attention"] / 4
    assert float(spread[0]) == pytest.approx(float(by_hand[0]), rel=1e-12)
    # the attention's share: 2 x 2 x heads x head dim FLOPs a causal (query, key) pair, at the attention kernel's
    # rate, over TP 8, through every layer
    from costmodel.formulas import MLA_DISCOUNT, Rates
    from costmodel.specs import GPUArray

    r = Rates(GPUArray.of(gpu), "prefill", p)
    pairs = 8192 * 8193 / 2
    flops = 4.0 * qwen.n_heads * qwen.head_dim * pairs / 1e9
    kernel = float(np.asarray(flops / r.attn / MLA_DISCOUNT / 8 * qwen.n_layers / r.model).ravel()[0])
    assert float(parts(8192)["Attention"][0]) == pytest.approx(kernel, rel=1e-9)

"""The cost model's switches by name, each with what it does: the fixes of the original program's errors
(`FIX_DOCS`, spec section 5), the refinements of its structure (`MODEL_DOCS`) and how the serving engine runs
the model (`SYSTEM_DOCS`). A profile (costmodel/profile.py) sets each on or off; a calibration
(costmodel/calibration.py) records the structure (MODEL_DOCS) it was fitted with."""

from __future__ import annotations

# The named profiles (costmodel/profile.py PROFILES): `shallowsim` with every fix off, `corrected` with every fix on.
PROFILE_NAMES = ("shallowsim", "corrected")

# What each fix does, keyed by switch name (the spec's bug numbers in brackets).
FIX_DOCS: dict[str, str] = {
    "fp8_dispatch": ("[B1] prefill dispatch is FP8 (1 byte/element), not halved to 4 bits on every GPU"),
    "gemm_table_by_field": (
        "[B2] grouped-GEMM efficiency table from the GPU's own field, not the substring 'H20' (which also matches H200)"
    ),
    "fp4_consistent": (
        "[B3] FP4 GPUs keep the 0.7 MLA kernel factor and the MLA weight load; FP4 expert weights "
        "load at half size in prefill too"
    ),
    "whole_experts_per_gpu": ("[B4] prefill routed experts per GPU = ceil(E / GPUs), a whole number"),
    "topology_comm": (
        "[B4,B9,B13] all-to-all sends only copies that leave the GPU, over NVLink inside the scale-"
        "up domain and the NIC beyond it, sized by the real EP group; all-reduce beyond one node "
        "uses the NIC"
    ),
    "tp_dense_layers": ("[B5] dense layers' attention and MLP are split by TP like the MoE layers"),
    "batch_per_attention_rank": (
        "[B6] decode batch counts sequences per attention-DP rank (TP group): MLA, MoE, all-to-all "
        "and KV memory all use that one meaning"
    ),
    "new_tokens_only": (
        "[B7] a prefix-cache hit skips the cached tokens' work entirely; KV down-projection runs on"
        " new tokens only (decode included)"
    ),
    "causal_attention": ("[B8] prefill attention counts the causal triangle, not the full q x c square"),
    "ring_allreduce": ("[B9] all-reduce moves 2(tp-1)/tp of the message (ring)"),
    "si_units": (
        "[B9] transfer time = bytes / (GB/s) with GB = 1e9 bytes, not MiB / (GB/s); GPU memory stays "
        "in GiB, which is what HBM capacities are"
    ),
    "shared_expert_own_efficiency": ("[B10] the shared expert's GEMM efficiency is looked up from its own token count"),
    "integer_batch": ("[B11] max batch is a whole, non-negative number of sequences"),
    "weights_from_config": (
        "[B12] attention, expert and embedding weights from the model config at the GPU's "
        "precision, not the 187.17 M / 44.05 M / 2.91 GB constants"
    ),
    "monotone_gemm_time": (
        "a grouped GEMM on more tokens never finishes sooner than on fewer (the step-function "
        "efficiency table made decode steps 7-20 % faster just past each power of two)"
    ),
    "precision_per_gpu": ("GPUs without FP8 (A100, ...) hold weights and KV in BF16 (2 bytes) and compute in BF16"),
}

# Refinements of the model's structure (off in `shallowsim` and `corrected`).
MODEL_DOCS: dict[str, str] = {
    "gemm_roofline": (
        "a dense GEMM takes max(FLOPs / rate, bytes / bandwidth) plus a fixed cost per kernel, the bytes being its "
        "weights, inputs and BF16 outputs (not FLOPs / rate + weights / bandwidth), one kernel per projection"
    ),
}

# How the serving engine runs the model (off in every named profile and not part of a calibration's fitted
# structure; set per run with `costmodel.fixes.<name>=true`, recorded in plan.json like every switch).
SYSTEM_DOCS: dict[str, str] = {
    "experts_fp8": (
        "routed experts are held and computed in FP8 on every GPU (an FP8 checkpoint), not in FP4 wherever the "
        "GPU has an FP4 rate"
    ),
    "activated_experts": (
        "a decode micro-batch streams only the routed experts its tokens activate: of g experts on a GPU, "
        "g (1 - (1 - k/E)^T) for T tokens over the EP group (top-k of E), the busiest GPU of the group (mean + "
        "its spread x sqrt(2 ln GPUs), at most g) deciding; not every resident expert"
    ),
    "overlap_chosen": (
        "a decode step runs two overlapped micro-batches (all-to-all behind attention and the shared expert, each "
        "micro-batch streaming its own experts) only where that is faster than one micro-batch with its "
        "communication exposed: the engine's two-batch-overlap setting chosen per batch size; not always two"
    ),
    "request_overhead": (
        "a request spends a fixed time in the serving front end before its prefill (HTTP, tokenisation, routing, "
        "scheduling: REQUEST_OVERHEAD_MS before calibration) and, disaggregated, a fixed time from prefill to decode "
        "beside its KV bytes (bootstrap, transfer set-up, the decode engine's admission: HANDOFF_MS); not zero"
    ),
    "dp_imbalance": (
        "under attention data parallelism the step waits for the busiest of the group's ep / tp ranks: each holds "
        "a random share of the sequences, the busiest b + sqrt(2 b ln ranks) of a mean b (its attention, KV reads "
        "and dense layers); not a perfectly even split"
    ),
    "step_overhead": (
        "every decode step pays the engine's fixed time beside its kernels (scheduling, launches, sampling, "
        "the CPU's share), STEP_OVERHEAD_MS before calibration; not zero"
    ),
    "node_dispatch": (
        "prefill's expert-parallel dispatch and combine across hosts send each token once to every other host its "
        "routed experts are on, which forwards it to those GPUs over NVLink (DeepEP's normal kernels); not one "
        "copy over the NIC per routed expert"
    ),
    "lm_head": (
        "every decode forward runs the LM head over its tokens: the vocabulary x hidden projection in BF16, split "
        "over the attention TP group, its weights streamed once; not free"
    ),
    "draft_passes": (
        "an MTP step's drafts are each a forward of their own over the running sequences: the draft module's layer "
        "(attention and MoE at the sequences' batch) and the LM head (under `lm_head`), inside the step's CUDA graph "
        "(no fixed engine time of their own); not one more MoE layer of the verify pass at its tokens"
    ),
    "net_allreduce": (
        "an all-reduce whose TP group spans hosts pays NCCL's latency between hosts (NET_ALLREDUCE_LATENCY_MS, "
        "44 us, from NCCL's published two-host all-reduce on H100) beside its bytes over the NIC; not the 15 us of "
        "an all-reduce inside one host's NVLink"
    ),
    "sequence_overhead": (
        "every decode step also pays the engine's time per running sequence outside the kernels (its scheduling, "
        "sampling and output bookkeeping on the CPU) for the sequences of the busiest attention rank, "
        "SEQUENCE_OVERHEAD_MS each before calibration; not zero"
    ),
}

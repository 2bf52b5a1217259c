"""The analytical MoE cost model: prefill time, decode step time and maximum batch.

Vectorised: every numeric argument (and every GPU field, through `GPUArray`) may be an array;
all broadcast together, so one call evaluates a whole GPUs x lengths x batches x degrees grid.
Units are in the names: `_ms` milliseconds, `_gflop` 1e9 FLOP, `_bytes` bytes.

The formulas are those of `reference/shallowsim_spec.md` (sections 2-4). Under
`CostProfile.shallowsim()` they are reproduced to the letter, quirks included (checked against
the reference CSV by `python -m costmodel.reference`). Each switch of `CostProfile` replaces one
quirk by its fix; `docs/costmodel.md` explains each and measures its effect.

Per layer and per GPU, in both phases:
    attention  T_attn = g / R_gemm / 0.7 + a / F16 / 0.7 + W_attn / BW          (ms)
    TP split   T_attn_tp = T_attn (+0.05) if tp = 1 else T_attn / tp + T_allreduce + 0.05
    expert     T_e(n) = 3·n·d·I_e·2 / 1e9 / R_e + W_e / BW
Prefill (one sequence of S tokens per DP replica, experts spread over tp·dp GPUs):
    Sum = L_d (T_dense_attn + T_dense_mlp) + L_moe (T_attn_tp + T_shared + T_routed)
          + L_moe (max(Combine − T_attn_tp − T_shared, 0) + max(Dispatch − T_routed, 0))
Decode step (two micro-batches, EP group of N GPUs holding ceil(E/N) routed experts each):
    TPOT = L_d (DenseMLA + DenseMLP) + L_moe (SparseMLA + Shared + Routed)
           + L_moe max(Dispatch + Combine − SparseMLA − Shared, 0)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from costmodel.calibration import knobs_for
from costmodel.profile import CostProfile
from costmodel.settings import KV_BYTES, MEM_FRACTION, CostSettings
from costmodel.specs import FP8_SCALE_BLOCK, GPU, GPUArray, Model

# Constants of the original program (spec section 3, "Hard-coded constants").
DERATE = 0.85  # every peak figure is multiplied by this
MLA_DISCOUNT = 0.7  # attention kernels reach 70 % of the derated peak
ALLREDUCE_LATENCY_MS = 0.015
# An all-reduce whose group spans hosts (`net_allreduce`): NCCL's over two hosts of 8 H100 takes 35-50 us from 1 to
# 128 KiB and 88-127 us from 256 KiB to 1 MiB (microsoft/mscclpp docs/dsl/results.md, "Two-Node AllReduce on H100",
# figure docs/dsl/figs/2node_all_reduce_results.png at 8d998820, read off the plot to +-1 us; 11 sizes). 44 us is
# the median over those sizes of the time less the bytes term `_allreduce_ms` gives them (ring over the NIC).
NET_ALLREDUCE_LATENCY_MS = 0.044
ATTN_STATIC_MS = 0.05
PREFILL_A2A_LATENCY_MS = 0.05
DECODE_A2A_LATENCY_MS = 0.005  # per micro-batch
MICRO_BATCHES = 2
# Fixed cost of one dense GEMM kernel under `gemm_roofline` (pipeline fill, epilogue, the last
# wave's tail), before calibration. A modelling prior of a few microseconds, not a measured
# figure: the `gemm_fixed` knob scales it per GPU (H800: fitted to DeepGEMM's published small-M
# GEMMs, conf/calibration/published.csv).
GEMM_FIXED_MS = 0.002
# An engine's fixed time per decode step beside its kernels (`step_overhead`), before calibration: the order of
# SGLang's and TensorRT-LLM's per-iteration scheduling and sampling with CUDA graphs (their profiles show 0.5-2 ms);
# the end-to-end fit (costmodel.calibrate, knob `step_overhead`) sets it from measured serving
STEP_OVERHEAD_MS = 1.0
# An engine's time per running sequence a decode step beside its kernels (`sequence_overhead`: the scheduler's,
# sampler's and output bookkeeping per request, on the CPU), before calibration: a modelling prior, not a measured
# figure; the end-to-end fit (knob `sequence_overhead`) sets it from measured serving
SEQUENCE_OVERHEAD_MS = 0.01
# A request's fixed times outside the GPUs (`request_overhead`), before calibration: the front end's (HTTP,
# tokenisation, routing, scheduling) and, disaggregated, the hand-off's beside its KV bytes (bootstrap, transfer
# set-up, admission); the end-to-end fit (knobs `request_overhead`, `handoff`) sets both from measured TTFT
REQUEST_OVERHEAD_MS = 50.0
HANDOFF_MS = 50.0
SS_OTHER_PARAMS_GB = 2.91  # shallowsim's embedding / head / misc constant
SS_MLA_PARAMS_M = 187.17  # shallowsim's per-layer MLA constant (decimal M, used as MiB)
SS_EXPERT_PARAMS_M = 44.05  # shallowsim's per-expert constant
SS_DISPATCH_NODES = 4  # shallowsim's prefill a2a assumes 4 nodes
SS_RACK_DOMAINS = (72, 144, 576)

# Grouped-GEMM efficiency eta(P), P = 1, 2, 4, ..., 512, >=1024 (spec 4.11, author's profiling).
ETA_DEFAULT = np.array([0.05, 0.05, 0.05, 0.05, 0.08, 0.10, 0.20, 0.35, 0.40, 0.60, 0.70])
ETA_H20 = np.array([0.06, 0.06, 0.06, 0.12, 0.25, 0.45, 0.80, 0.90, 1.0, 1.0, 1.0])

MIB = 2.0**20
GIB = 2.0**30


class Rates:
    """Derated throughputs of a GPU array in one phase (prefill reserves `comm_sm` SMs), each
    multiplied by its calibration factor (1 without a calibration: costmodel/calibration.py)."""

    def __init__(self, g: GPUArray, phase: str, profile: CostProfile) -> None:
        self.knobs = k = knobs_for(profile.calibration, g.names, np.shape(g.sm), g.software)
        sm_frac = (g.sm - g.comm_sm) / g.sm if phase == "prefill" else 1.0
        self.f16 = g.tflops_bf16 * DERATE * sm_frac
        self.f8 = g.tflops_fp8 * DERATE * sm_frac
        self.f4 = g.tflops_fp4 * DERATE * sm_frac
        self.bw = g.mem_bw_gb_s * DERATE * k["hbm"]  # weights streaming
        self.kv_bw = g.mem_bw_gb_s * DERATE * k["kv_read"]  # the attention kernel's KV reads
        self.attn = self.f16 * k[f"attention_{phase}"]  # the attention kernel's FLOP rate
        self.nvl = g.nvlink_bw_gb_s * DERATE
        self.net = g.scaleout_bw_gb_s * DERATE
        self.a2a = k["a2a_normal" if phase == "prefill" else "a2a_low_latency"]  # link efficiency
        self.allreduce = k["allreduce"]
        self.moe_tp = k["moe_tp"]  # sliced experts' kernels, over whole experts'
        self.step_overhead_ms = STEP_OVERHEAD_MS / k["step_overhead"]
        self.sequence_overhead_ms = SEQUENCE_OVERHEAD_MS / k["sequence_overhead"]
        self.gemm_fixed_ms = GEMM_FIXED_MS / k["gemm_fixed"]
        self.kv_link = g.scaleout_bw_gb_s * DERATE * k["kv_transfer"]  # prefill -> decode KV, per GPU
        self.model = k[f"model_{phase}"]  # the whole pass's time over this: the model's own error (1 but in a draw)
        if phase == "prefill":  # and a serving engine's prefill forward over its kernels'
            self.model = self.model * k["prefill_pass"]
        self.has_fp4 = g.tflops_fp4 > 0
        self.experts_fp4 = self.has_fp4 & (not profile.experts_fp8)  # routed experts in FP4 (the checkpoint's)
        has_fp8 = g.tflops_fp8 > 0
        # Dense GEMM rate and bytes per weight / KV element: FP8 where the GPU has it.
        if profile.precision_per_gpu:
            gemm = np.where(has_fp8, self.f8, self.f16)
            self.wbytes = np.where(has_fp8, 1.0, 2.0)
        else:
            gemm = self.f8
            self.wbytes = np.ones_like(self.f8)
        self.gemm = gemm * k["dense_gemm"]
        self.grouped = k[f"grouped_gemm_{phase}"]
        self.expert = np.where(self.experts_fp4, self.f4, gemm) * self.grouped

    def expert_rate(self, model: Model) -> np.ndarray:
        """The routed and shared experts' GEMM rate for `model`: a checkpoint's own 4-bit experts (MXFP4) multiply
        MXFP8 activations where the GPU has an FP4 rate (Blackwell: the tensor cores' mixed 8/6/4-bit products, at
        the FP8 rate; FP4's rate needs both operands in FP4, and no engine's MXFP4 MoE path quantises its activations
        so: TensorRT-LLM's GPT-OSS support matrix, examples/models/core/gpt_oss/README.md), else are dequantised to
        BF16 in the kernel (Hopper's MXFP4 MoE kernels: 4-bit weights, BF16 math); the GPU's format otherwise
        (`expert`)."""
        if not model.expert_bits:
            return self.expert
        return np.where(self.has_fp4, self.f8, self.f16) * self.grouped


def priced_precision(gpu: GPU, profile: CostProfile, model: Model | None = None) -> tuple[str, str]:
    """(dense layers and KV cache, routed experts): the formats `Rates` prices an island of `gpu` in.

    FP8 where the GPU has it (BF16 where it does not, unless the profile prices FP8 everywhere as
    shallowsim does), and routed experts in FP4 on GPUs with an FP4 rate unless `experts_fp8`; a `model` whose
    checkpoint ships its experts in MXFP4 (`Model.expert_bits`) keeps them so on every GPU."""
    dense = "fp8" if gpu.tflops_fp8 > 0 or not profile.precision_per_gpu else "bf16"
    if model is not None and model.expert_bits:
        return dense, "mxfp4"
    return dense, "fp4" if gpu.tflops_fp4 > 0 and not profile.experts_fp8 else dense


def _xfer_ms(nbytes: np.ndarray, bw_gb_s: np.ndarray, p: CostProfile) -> np.ndarray:
    """Transfer time. shallowsim divides MiB by GB/s and calls the result ms (2.4 % off)."""
    return nbytes / 1e6 / bw_gb_s if p.si_units else nbytes / MIB / bw_gb_s


def _gemm_ms(m: np.ndarray, n: float, k: float, r: Rates, p: CostProfile, rate: np.ndarray | None = None,
             groups: float = 1.0) -> np.ndarray:  # fmt: skip
    """One dense GEMM kernel, `groups` x (m x k by k x n), weights n x k streamed once per group.

    Under `gemm_roofline`: max(FLOPs / (rate x 0.7), bytes / bandwidth) + the kernel's fixed
    cost, the bytes being weights and inputs at the weight precision and BF16 outputs. Else the
    original's form, FLOPs / rate + weights / bandwidth.
    """
    rate = r.gemm if rate is None else rate
    gflop = 2.0 * groups * m * n * k / 1e9
    weights = groups * n * k * r.wbytes
    if not p.gemm_roofline:
        return gflop / rate + _xfer_ms(weights, r.bw, p)
    io = groups * (m * k * r.wbytes + 2.0 * m * n)
    fixed = np.where(np.asarray(groups) > 0, r.gemm_fixed_ms, 0.0)  # groups 0: a GEMM not run
    return np.maximum(gflop / rate / MLA_DISCOUNT, _xfer_ms(weights + io, r.bw, p)) + fixed


def _expert_gflop(model: Model, tokens: np.ndarray) -> np.ndarray:
    return 3.0 * tokens * model.hidden * model.moe_inter * 2.0 / 1e9


def _eta_index(m_tokens: np.ndarray) -> np.ndarray:
    """log2 of P, the smallest power of two strictly above floor(m) (P = 1 for 0), capped at 1024."""
    fm = np.floor(m_tokens)
    _, exp = np.frexp(np.maximum(fm, 1.0))  # fm = mant * 2**exp, mant in [0.5, 1)
    idx = np.where(fm >= 1.0, exp, 0)
    return np.minimum(idx, len(ETA_DEFAULT) - 1)  # P >= 1024 share the last entry


def _eta(m_tokens: np.ndarray, use_h20: np.ndarray) -> np.ndarray:
    idx = _eta_index(m_tokens)
    return np.where(use_h20, ETA_H20[idx], ETA_DEFAULT[idx])


def _octave_start_suffix_min(eta: np.ndarray) -> np.ndarray:
    """SUF[i] = min over j >= i of 2^j / eta(2^j): cost per token-unit of the cheapest larger kernel.

    m = 2^j is the first token count looked up at table index j + 1; beyond the table's end
    eta is constant, so 2^j / eta only grows and the minimum lies inside the table.
    """
    n = len(eta)
    start_cost = np.array([2.0**j / eta[min(j + 1, n - 1)] for j in range(n)])
    return np.minimum.accumulate(start_cost[::-1])[::-1]


SUF_DEFAULT = _octave_start_suffix_min(ETA_DEFAULT)
SUF_H20 = _octave_start_suffix_min(ETA_H20)


def _grouped_gemm_ms(
    gflop: np.ndarray, m: np.ndarray, rate: np.ndarray, use_h20: np.ndarray, p: CostProfile
) -> np.ndarray:
    """Expert GEMM time for `gflop` GFLOP (proportional to m) whose efficiency is looked up at m.

    eta(P) is a step function, so FLOPs / eta drops when m crosses a power of two: more tokens
    would finish sooner. Under `monotone_gemm_time` the time is the lower envelope over larger
    m (a smaller GEMM can always run padded to the larger kernel's shape).
    """
    eta = _eta(m, use_h20)
    if not p.monotone_gemm_time:
        return gflop / (rate * eta)
    idx = _eta_index(m)
    suf = np.where(use_h20, SUF_H20[idx], SUF_DEFAULT[idx])
    safe_m = np.where(m > 0, m, 1.0)
    per_unit = gflop / safe_m
    return np.where(m > 0, per_unit * np.minimum(m / eta, suf) / rate, 0.0)


def _h20_table(g: GPUArray, p: CostProfile) -> np.ndarray:
    return g.gemm_table_h20 if p.gemm_table_by_field else g.gemm_table_h20_by_name


# --- attention ------------------------------------------------------------------------------


def _attn_prefill_gflop(model: Model, q: np.ndarray, c: np.ndarray, p: CostProfile) -> tuple[np.ndarray, np.ndarray]:
    """(GEMM, attention) GFLOP of one layer for q new tokens over c context tokens.

    MLA runs in its MHA form (the latent KV of every context token up-projected); under DSA only where the whole
    sequence is within `index_topk` (SGLang's dense prefill, `SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD`, the
    model's index_topk: the indexer would pick every token), else in its absorbed form over the tokens the indexer
    picks, as decode runs it (`_sparse_prefill_gflop`)."""
    d, h = model.hidden, model.n_heads
    # q new tokens see the c - q cached ones and a causal triangle (or all c); over a window on sliding layers
    pairs = model.attended_pairs(q, c, p.causal_attention)
    if model.attention == "mla":
        rq, rkv, dn, dr, dv = (
            model.q_lora_rank,
            model.kv_lora_rank,
            model.qk_nope_head_dim,
            model.qk_rope_head_dim,
            model.v_head_dim,
        )
        gemm = q * d * rq + q * rq * h * (dn + dr) + c * rkv * h * dn + c * rkv * h * dv
        attn = h * pairs * (dr + dn + dv) + q * h * dv * d
        if not model.index_topk:
            return 2.0 * gemm / 1e9, 2.0 * attn / 1e9
        sparse_gemm, sparse_attn = _sparse_prefill_gflop(model, q, c, pairs, p)
        dense = c <= model.index_topk
        key = 2.0 * q * d * model.index_head_dim / 1e9  # the indexer's keys are cached either way
        return np.where(dense, 2.0 * gemm / 1e9 + key, sparse_gemm), np.where(dense, 2.0 * attn / 1e9, sparse_attn)
    hd = model.head_dim
    gemm = q * d * hd * (h + 2 * model.n_kv_heads) + q * h * hd * d
    attn = 2.0 * h * hd * pairs
    return 2.0 * gemm / 1e9, 2.0 * attn / 1e9


def _sparse_prefill_gflop(model: Model, q: np.ndarray, c: np.ndarray, pairs: np.ndarray, p: CostProfile,
                          ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(GEMM, attention) GFLOP of one DSA layer's prefill past `index_topk` tokens: every new token's projections and
    the indexer's as a decode step has them (`_attn_decode_gflop`), the absorbed MLA over its `pairs` picked tokens,
    and the indexer scoring every (query, earlier token) pair."""
    d, h, rq, rkv = model.hidden, model.n_heads, model.q_lora_rank, model.kv_lora_rank
    dn, dr, dv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    gemm = q * (d * rq + rq * h * dr + h * (rq * dn + dn * rkv) + model.indexer_params_per_layer)
    scored = q * (c - q) + q * (q + 1) / 2.0 if p.causal_attention else q * c
    attn = h * pairs * (dr + 2.0 * rkv) + q * h * dv * (rkv + d)
    return 2.0 * gemm / 1e9, 2.0 * attn / 1e9 + _index_gflop(model, scored)


def _index_gflop(model: Model, scored: np.ndarray) -> np.ndarray:
    """DSA's indexer scoring `scored` (query, cached token) pairs, as attention-kernel GFLOP: 2 x heads x head dim a
    pair in FP8 (DeepGEMM's fp8_mqa_logits), which runs at twice the BF16 rate the attention kernels are priced at
    (every GPU with FP8 has twice its BF16 rate: conf/gpu), so half its FLOPs count."""
    return 0.5 * 2.0 * model.index_n_heads * model.index_head_dim * scored / 1e9


def _kv_down_gflop(model: Model, tokens: np.ndarray) -> np.ndarray:
    """MLA KV down-projection (wkv_a) for `tokens` tokens; 0 for GQA (inside the QKV GEMM)."""
    if model.attention != "mla":
        return np.zeros_like(tokens, dtype=float)
    return 2.0 * tokens * model.hidden * (model.kv_lora_rank + model.qk_rope_head_dim) / 1e9


def _attn_decode_gflop(model: Model, c: np.ndarray, p: CostProfile) -> tuple[np.ndarray, np.ndarray]:
    """(GEMM, attention) GFLOP for one new token over c context tokens (MLA weight-absorbed; under DSA over the
    `index_topk` tokens its indexer picks, the indexer's projections and its scoring of every cached token beside)."""
    d, h = model.hidden, model.n_heads
    if model.attention == "mla":
        rq, rkv, dn, dr, dv = (
            model.q_lora_rank,
            model.kv_lora_rank,
            model.qk_nope_head_dim,
            model.qk_rope_head_dim,
            model.v_head_dim,
        )
        a = model.attended(c)
        gemm = d * rq + rq * h * dr + h * (rq * dn + dn * rkv) + model.indexer_params_per_layer + 0.0 * c
        attn = h * (a * dr + 2.0 * a * rkv) + h * dv * rkv + h * dv * d
        g = 2.0 * gemm / 1e9
        if p.new_tokens_only:  # the new token's own latent KV must still be projected
            g = g + _kv_down_gflop(model, np.ones_like(c, dtype=float))
        return g, 2.0 * attn / 1e9 + (_index_gflop(model, c) if model.index_topk else 0.0)
    hd = model.head_dim
    gemm = d * hd * (h + 2 * model.n_kv_heads) + h * hd * d + 0.0 * c
    attn = 2.0 * h * hd * model.attended(c)
    return 2.0 * gemm / 1e9, 2.0 * attn / 1e9


def _attn_gemms(model: Model, q: np.ndarray, c: np.ndarray, kv: np.ndarray, decode: bool) -> list[tuple]:
    """The projection GEMMs of one layer's attention as (m, n, k, groups): q new tokens over c
    context tokens, kv of them needing the KV down-projection (MLA). Their FLOPs are the `gemm`
    part of `_attn_prefill_gflop` / `_attn_decode_gflop` (the output projection of MLA is in the
    attention part there, and here in the remaining weights `_attn_ms` streams). Under DSA a prefill runs the
    absorbed form where the sequence is past `index_topk` and the MHA form within it (the other's GEMM has groups 0:
    not run), and the indexer's projections (its keys always, its queries and head weights where it scores)."""
    d, h = model.hidden, model.n_heads
    if model.attention != "mla":
        hd = model.head_dim
        return [(q, hd * (h + 2 * model.n_kv_heads), d, 1.0), (q, d, h * hd, 1.0)]
    rq, rkv = model.q_lora_rank, model.kv_lora_rank
    dn, dr, dv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    gemms = [(q, rq, d, 1.0), (q, h * (dn + dr), rq, 1.0)]  # wq_a, wq_b
    if decode:  # weight-absorbed: the query's nope part into the latent space, per head
        gemms.append((q, rkv, dn, float(h)))
        runs = 1.0
    elif not model.index_topk:  # wkv_b up-projects the latent KV of every context token
        gemms.append((c, h * (dn + dv), rkv, 1.0))
    else:  # DSA: absorbed past index_topk, up-projected within it (groups 0: the GEMM is not run)
        runs = np.where(c > model.index_topk, 1.0, 0.0)
        gemms += [(q, rkv, dn, h * runs), (c, h * (dn + dv), rkv, 1.0 - runs)]
    if model.index_topk:  # the indexer's wq_b and weights_proj where it scores, its wk always
        hi, di = model.index_n_heads, model.index_head_dim
        gemms += [(q, hi * di, rq, runs), (q, di, d, 1.0), (q, hi, d, runs)]
    return [*gemms, (kv, rkv + dr, d, 1.0)]  # wkv_a


def _kernels(gemms: list[tuple]) -> np.ndarray | int:
    """GEMM kernels `gemms` runs (`_attn_gemms`: groups 0 is one not run)."""
    return sum(np.asarray(gr) > 0 for *_, gr in gemms)


def _attn_weight_bytes(model: Model, r: Rates, p: CostProfile) -> np.ndarray:
    if p.weights_from_config:
        return model.attn_params_per_layer * r.wbytes
    return model.attn_params_per_layer * np.ones_like(r.wbytes)  # 1 byte/param (FP8)


def _attn_ms(gemm: np.ndarray, attn: np.ndarray, wbytes: np.ndarray, r: Rates, p: CostProfile,
             gemms: list[tuple]) -> np.ndarray:  # fmt: skip
    """Attention time of one layer without TP (the 'dense MLA' figure); `gemms` are its
    projections (`_attn_gemms`), timed one by one under `gemm_roofline`."""
    if p.gemm_roofline:
        projections = sum(_gemm_ms(m, n, k, r, p, groups=gr) for m, n, k, gr in gemms)
        rest = np.maximum(wbytes - sum(gr * n * k for _, n, k, gr in gemms) * r.wbytes, 0.0)
        full = projections + attn / r.attn / MLA_DISCOUNT + _xfer_ms(rest, r.bw, p)
    else:
        full = gemm / r.gemm / MLA_DISCOUNT + attn / r.attn / MLA_DISCOUNT + _xfer_ms(wbytes, r.bw, p)
    if p.fp4_consistent:
        return full
    # shallowsim: the FP4 branch drops the 0.7 factor on GEMMs and the weight load [B3]
    fp4 = gemm / np.where(r.has_fp4, r.f4, 1.0) + attn / r.attn / MLA_DISCOUNT
    return np.where(r.has_fp4, fp4, full)


def _allreduce_ms(
    tokens: np.ndarray, model: Model, tp: np.ndarray, g: GPUArray, r: Rates, p: CostProfile
) -> np.ndarray:
    nbytes = tokens * model.hidden * 2.0  # BF16 activations
    if p.ring_allreduce:
        nbytes = nbytes * 2.0 * (tp - 1) / tp
    across = p.topology_comm & (tp > g.gpus_per_node)  # the group spans hosts
    link = np.where(across, r.net, r.nvl)
    latency = np.where(across & p.net_allreduce, NET_ALLREDUCE_LATENCY_MS, ALLREDUCE_LATENCY_MS)
    return _xfer_ms(nbytes, link * r.allreduce, p) + latency


def _tp_split_ms(
    t: np.ndarray,
    tokens: np.ndarray,
    model: Model,
    tp: np.ndarray,
    g: GPUArray,
    r: Rates,
    p: CostProfile,
    *,
    kernels: int | np.ndarray = 0,
) -> np.ndarray:
    """`t` split over tp GPUs, plus the all-reduce; the fixed cost of `kernels` GEMM kernels
    (`gemm_roofline`) is paid whole on every GPU."""
    ar = _allreduce_ms(tokens, model, tp, g, r, p)
    fixed = kernels * r.gemm_fixed_ms if p.gemm_roofline else 0.0
    return np.where(tp > 1, (t - fixed) / tp + fixed + ar, t) + ATTN_STATIC_MS


def _dense_mlp_ms(
    tokens: np.ndarray, model: Model, tp: np.ndarray, g: GPUArray, r: Rates, p: CostProfile
) -> np.ndarray:
    if model.n_dense_layers == 0:
        return np.zeros(np.broadcast(tokens, tp, r.bw).shape)
    gflop = 3.0 * tokens * model.hidden * model.dense_inter * 2.0 / 1e9
    wbytes = 3.0 * model.hidden * model.dense_inter * (r.wbytes if p.weights_from_config else 1.0)
    rate = r.gemm if p.fp4_consistent else np.where(r.has_fp4, r.f4, r.gemm)
    if p.gemm_roofline:  # gate and up in one GEMM, then down; split by TP (column, then row)
        split = tp if p.tp_dense_layers else 1.0
        i = model.dense_inter
        t = _gemm_ms(tokens, 2.0 * i / split, model.hidden, r, p, rate) + _gemm_ms(
            tokens, model.hidden, i / split, r, p, rate
        )
        return np.where(split > 1, t + _allreduce_ms(tokens, model, tp, g, r, p), t)
    if not p.tp_dense_layers:
        return gflop / rate + _xfer_ms(wbytes, r.bw, p)
    t = gflop / rate / tp + _xfer_ms(wbytes / tp, r.bw, p)
    return np.where(tp > 1, t + _allreduce_ms(tokens, model, tp, g, r, p), t)


# --- expert weights and all-to-all ------------------------------------------------------------


def _expert_bytes(model: Model, r: Rates, phase: str, p: CostProfile) -> np.ndarray:
    """Bytes of one expert's weights: FP4 halves them (decode only, unless fp4_consistent); a checkpoint that ships
    its experts in a format of its own (`Model.expert_bits`, GPT-OSS's MXFP4) keeps it on every GPU."""
    if model.expert_bits:
        return model.expert_params * model.expert_bits / 8.0 * np.ones_like(r.wbytes)
    base = r.wbytes if p.weights_from_config or p.precision_per_gpu else np.ones_like(r.wbytes)
    if phase == "decode" or p.fp4_consistent:
        base = np.where(r.experts_fp4, 0.5, base)
    return model.expert_params * base


def _a2a_split_ms(nbytes: np.ndarray, group: np.ndarray, g: GPUArray, r: Rates, p: CostProfile) -> np.ndarray:
    """Per-GPU all-to-all of `nbytes` of token copies spread evenly over a `group` of GPUs.

    A copy stays on the GPU with probability 1/group; the others go over NVLink to GPUs of
    the same scale-up domain and over the NIC beyond it, both links at once.
    """
    local = np.minimum(group, g.gpus_per_node)
    intra = nbytes * (local - 1) / group
    inter = nbytes * (group - local) / group
    return np.maximum(_xfer_ms(intra, r.nvl * r.a2a, p), _xfer_ms(inter, r.net * r.a2a, p))


def _node_a2a_ms(
    token_bytes: np.ndarray, k: int, group: np.ndarray, g: GPUArray, r: Rates, p: CostProfile
) -> np.ndarray:
    """Per-GPU all-to-all of tokens of `token_bytes` each, every token to `k` experts spread evenly over a `group` of
    GPUs, as DeepEP's normal kernels send them (`node_dispatch`): over the NIC once to each other host one of its
    experts is on (a host of `local` GPUs is hit with probability 1 - (1 - local/group)^k), which forwards it over
    NVLink to its GPUs there; over NVLink the copies for the other GPUs of its own host, and those forwarded.
    On one host this is `_a2a_split_ms` of the k copies."""
    local = np.minimum(group, g.gpus_per_node)
    hosts = group / local
    hit = 1.0 - (1.0 - 1.0 / hosts) ** k  # another host holds at least one of the token's experts
    inter = token_bytes * (hosts - 1.0) * hit
    own = token_bytes * k * (local - 1) / group  # copies to the other GPUs of its host
    forwarded = token_bytes * k * (group - local) / group * (local - 1) / local  # remote copies, inside their host
    return np.maximum(_xfer_ms(own + forwarded, r.nvl * r.a2a, p), _xfer_ms(inter, r.net * r.a2a, p))


# --- prefill -------------------------------------------------------------------------------------


def prefill_parts(
    gpu: GPU | GPUArray,
    model: Model,
    seq_len: np.ndarray,
    tp: np.ndarray,
    dp: np.ndarray,
    *,
    cache_hit: float | np.ndarray = 0.0,
    profile: CostProfile | None = None,
    draft_layers: int = 0,
) -> dict[str, np.ndarray]:
    """Per-layer terms and totals (ms) of one prefill pass: dp sequences of `seq_len` at once.

    Keys: MLA, TP_MLA, DenseMLP, Shared_Expert, Routed_Expert, Dispatch, Combine, Overlap1,
    Overlap2 (per layer) and Compute, Comm, Sum (whole model). `Sum` is the prefill time, `Attention` the attention
    kernel's time in it (its FLOPs over the prompt's token pairs: what is a prompt's own in a forward of several,
    `prefill_chunk_ms`).
    `draft_layers`: an engine decoding with MTP also runs the MTP module over the prompt (its first draft), priced
    as that many more MoE layers.
    """
    p = profile or CostProfile.corrected()
    g = GPUArray.of(gpu)
    r = Rates(g, "prefill", p)
    s = np.asarray(seq_len, dtype=float)
    tp = np.asarray(tp, dtype=float)
    dp = np.asarray(dp, dtype=float)
    rho = np.asarray(cache_hit, dtype=float)
    n_dev = tp * dp
    e_total, k, d = model.n_routed_experts, model.top_k, model.hidden

    q = s * (1.0 - rho) if p.new_tokens_only else s  # tokens computed
    gemm, attn = _attn_prefill_gflop(model, q, s, p)
    kv_tokens = q if p.new_tokens_only else (1.0 - rho) * s
    gemm = gemm + _kv_down_gflop(model, kv_tokens)
    gemms = _attn_gemms(model, q, s, kv_tokens, decode=False)
    mla = _attn_ms(gemm, attn, _attn_weight_bytes(model, r, p), r, p, gemms)
    tp_mla = _tp_split_ms(mla, q, model, tp, g, r, p, kernels=_kernels(gemms))
    dense_attn = tp_mla if p.tp_dense_layers else mla
    dense_mlp = _dense_mlp_ms(q, model, tp, g, r, p)

    t_w = _xfer_ms(_expert_bytes(model, r, "prefill", p), r.bw, p)
    experts_per_gpu = np.maximum(np.ceil(e_total / n_dev), 1.0) if p.whole_experts_per_gpu else e_total / n_dev
    shared = model.n_shared_experts * (_expert_gflop(model, q / tp) / r.expert_rate(model) + t_w)
    routed = _expert_gflop(model, k * q / tp) / r.expert_rate(model) + t_w * experts_per_gpu

    dispatch_elem = 1.0 if p.fp8_dispatch else 0.5  # shallowsim halves it on every GPU [B1]
    if p.topology_comm and p.node_dispatch:
        tokens = (q / tp) * d  # bytes at 1 byte/element, one copy of each token
        dispatch = _node_a2a_ms(tokens * dispatch_elem, k, n_dev, g, r, p) + PREFILL_A2A_LATENCY_MS
        combine = _node_a2a_ms(tokens * 2.0, k, n_dev, g, r, p) + PREFILL_A2A_LATENCY_MS
    elif p.topology_comm:
        copies = (q / tp) * k * d  # bytes at 1 byte/element
        dispatch = _a2a_split_ms(copies * dispatch_elem, n_dev, g, r, p) + PREFILL_A2A_LATENCY_MS
        combine = _a2a_split_ms(copies * 2.0, n_dev, g, r, p) + PREFILL_A2A_LATENCY_MS
    else:
        node8 = g.gpus_per_node == 8
        dp_node = 8.0 / tp  # the 8-GPU rule ignores the dp argument [B4]
        raw_node = (SS_DISPATCH_NODES - 1) * dp_node * q * k / 8.0 * d
        e_loc = np.ceil(e_total / g.gpus_per_node)
        raw_rack = (e_total - e_loc) / e_total * k * (q / tp) * d
        raw = np.where(node8, raw_node, raw_rack)
        link = np.where(node8, r.net * 8.0, r.nvl) * r.a2a
        dispatch = _xfer_ms(raw * dispatch_elem, link, p) + PREFILL_A2A_LATENCY_MS
        combine = _xfer_ms(raw * 2.0, link, p) + PREFILL_A2A_LATENCY_MS

    o1 = combine - (tp_mla + shared)
    o2 = dispatch - routed
    l_d, l_s = model.n_dense_layers, model.n_moe_layers + draft_layers
    compute = l_d * (dense_attn + dense_mlp) + l_s * (tp_mla + shared + routed)
    comm = l_s * (combine + dispatch)
    total = (compute + l_s * np.maximum(o1, 0.0) + l_s * np.maximum(o2, 0.0)) / r.model
    # the attention kernel's time in it (its FLOPs over the token pairs, split over TP as the attention is)
    kernel = attn / r.attn / MLA_DISCOUNT
    split = np.where(tp > 1, kernel / tp, kernel)
    attention = (l_d * (split if p.tp_dense_layers else kernel) + l_s * split) / r.model
    return {
        "MLA": mla,
        "TP_MLA": tp_mla,
        "DenseMLP": dense_mlp,
        "Shared_Expert": shared,
        "Routed_Expert": routed,
        "Dispatch": dispatch,
        "Combine": combine,
        "Overlap1": o1,
        "Overlap2": o2,
        "Compute": compute,
        "Comm": comm,
        "Sum": total,
        "Attention": attention,
    }


def prefill_time_ms(
    gpu: GPU | GPUArray,
    model: Model,
    seq_len: np.ndarray,
    tp: np.ndarray,
    dp: np.ndarray,
    *,
    cache_hit: float | np.ndarray = 0.0,
    profile: CostProfile | None = None,
    draft_layers: int = 0,
) -> np.ndarray:
    """Time (ms) for an island of tp·dp GPUs to prefill dp prompts of `seq_len` tokens (`draft_layers`: MTP's,
    prefill_parts)."""
    return prefill_parts(gpu, model, seq_len, tp, dp, cache_hit=cache_hit, profile=profile, draft_layers=draft_layers)[
        "Sum"
    ]


def prefill_chunk_ms(
    gpu: GPU | GPUArray,
    model: Model,
    tokens: np.ndarray,
    seq_len: np.ndarray,
    tp: np.ndarray,
    ranks: np.ndarray,
    *,
    cache_hit: float | np.ndarray = 0.0,
    profile: CostProfile | None = None,
    draft_layers: int = 0,
) -> np.ndarray:
    """One forward (ms) of an engine whose `ranks` attention ranks of TP `tp` prefill `tokens` prompt tokens together,
    spread evenly over the ranks, cut from prompts of `seq_len` tokens (a share `cache_hit` of each cached): several
    short prompts, or a chunk of a long one. The engines run a chunk as one forward, so the chunk pays what grows
    with its tokens (projections, experts, all-to-all) once at tokens / ranks a rank, and a forward's fixed times and
    weight streaming once; each prompt's attention over its own context (and what a cached prefix costs beside its
    tokens) is its own, for the share of it the chunk holds:

        chunk = P(T / ranks) - A(T / ranks) + (T / t) x (P_hit(s) - P(t) + A(t)) / ranks,    t = s (1 - hit)

    P one prompt's prefill (prefill_parts' Sum), A its attention kernel's share (`Attention`), P_hit with the hit. One
    whole prompt on one rank is P_hit(s), as prefill_time_ms prices it."""
    kw = {"profile": profile, "draft_layers": draft_layers}
    ranks, tokens = np.asarray(ranks, dtype=float), np.asarray(tokens, dtype=float)
    own, t = prefill_own_ms(gpu, model, seq_len, tp, ranks, cache_hit=cache_hit, **kw)
    return prefill_forward_ms(gpu, model, tokens / ranks, tp, ranks, **kw) + tokens / t * own / ranks


def prefill_forward_ms(
    gpu: GPU | GPUArray,
    model: Model,
    tokens: np.ndarray,
    tp: np.ndarray,
    ranks: np.ndarray,
    *,
    profile: CostProfile | None = None,
    draft_layers: int = 0,
) -> np.ndarray:
    """What a forward of `tokens` prompt tokens a rank pays whatever prompts they are cut from (`prefill_chunk_ms`'s
    P(T / ranks) - A(T / ranks)): its projections, experts and all-to-all, its fixed times and weight streaming."""
    parts = prefill_parts(gpu, model, tokens, tp, ranks, profile=profile, draft_layers=draft_layers)
    return parts["Sum"] - parts["Attention"]


def prefill_own_ms(
    gpu: GPU | GPUArray,
    model: Model,
    seq_len: np.ndarray,
    tp: np.ndarray,
    ranks: np.ndarray,
    *,
    cache_hit: float | np.ndarray = 0.0,
    profile: CostProfile | None = None,
    draft_layers: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(What one prompt of `seq_len` tokens adds to a forward beside its tokens' share of it: its attention over its
    context and what its cached prefix costs, P_hit(s) - P(t) + A(t) in `prefill_chunk_ms`; t, its tokens computed)."""
    kw = {"profile": profile, "draft_layers": draft_layers}
    s = np.asarray(seq_len, dtype=float)
    t = np.maximum(s * (1.0 - np.asarray(cache_hit, dtype=float)), 1.0)
    fresh = prefill_parts(gpu, model, t, tp, ranks, **kw)
    hit = prefill_parts(gpu, model, s, tp, ranks, cache_hit=cache_hit, **kw)["Sum"]
    return hit - fresh["Sum"] + fresh["Attention"], t


# --- decode ----------------------------------------------------------------------------------------


def activated_experts(
    per_gpu: np.ndarray, tokens: np.ndarray, top_k: int, experts: int, gpus: np.ndarray
) -> np.ndarray:
    """Routed experts the busiest GPU of an EP group streams for one micro-batch of `tokens` (over the group), each
    token choosing `top_k` of `experts`, `per_gpu` experts on each of `gpus` GPUs. An expert is activated with
    probability q = 1 - (1 - k/E)^T, so a GPU activates Binomial(g, q) of its g experts; the busiest of the group
    is taken as the mean + the spread x sqrt(2 ln GPUs) (the Gaussian approximation of a maximum), at most g."""
    g = np.asarray(per_gpu, dtype=float)
    q = 1.0 - (1.0 - top_k / experts) ** np.asarray(tokens, dtype=float)
    spread = np.sqrt(g * q * (1.0 - q)) * np.sqrt(2.0 * np.log(np.maximum(np.asarray(gpus, dtype=float), 1.0)))
    return np.minimum(g * q + spread, g)


@dataclass(frozen=True)
class DecodeRun:
    """How an engine runs its decode steps, beside the step's shape (context, batch, TP, EP): `decode_parts`."""

    fp8_combine: bool = False  # the combine in FP8 on FP4 GPUs (spec 4.11)
    expert_imbalance: float = 1.0  # the busiest GPU's routed-expert load over the mean (an expert placement's)
    draft_tokens: int = 0  # MTP: draft tokens every step verifies
    moe_tp: bool = False  # routed experts split by tensor parallelism over the EP group, not placed whole
    kv_dtype: str = "auto"  # the KV cache's format (costmodel.settings.KV_DTYPES): the bytes attention reads

    def __post_init__(self) -> None:
        if self.draft_tokens < 0:
            raise ValueError(f"`draft_tokens >= 0` must hold, got {self.draft_tokens}")
        if not self.expert_imbalance >= 1.0:
            raise ValueError(f"`expert_imbalance >= 1` must hold (busiest over mean), got {self.expert_imbalance}")

    @staticmethod
    def of(cost: CostSettings, expert_imbalance: float = 1.0) -> DecodeRun:
        """How the engines of a plan made with `cost` run their decode steps."""
        return DecodeRun(cost.engine.fp8_combine, expert_imbalance, cost.drafts, kv_dtype=cost.engine.kv_dtype)


def decode_parts(
    gpu: GPU | GPUArray,
    model: Model,
    context: np.ndarray,
    batch: np.ndarray,
    tp: np.ndarray,
    ep: np.ndarray,
    *,
    profile: CostProfile | None = None,
    run: DecodeRun = DecodeRun(),
) -> dict[str, np.ndarray]:
    """Per-layer terms and totals (ms) of one decode step of an EP group of `ep` GPUs.

    `batch` is sequences per GPU under shallowsim and per attention-DP rank (TP group) under
    `batch_per_attention_rank`. `run` is how the engine runs the step (`DecodeRun`):
    `expert_imbalance` >= 1 is the busiest GPU's routed-expert load over the mean (an expert
    placement's max/mean, `solvers/expert_placement.py`): that GPU's routed GEMMs and all-to-all
    traffic grow by it, and the step waits for it. Keys: DenseMLA, SparseMLA, DenseMLP,
    SharedExpert, RoutedExpert, Dispatch, Combine, Delta (per layer), TPOT_O and TPOT (whole
    model, ms), Overlap, and DraftDelta (a draft forward's Delta under `draft_passes`, else 0).

    `draft_tokens` > 0: a speculative (MTP) step. Every sequence verifies 1 + `draft_tokens` tokens, so the
    projections, the attention FLOPs, the dense MLP, the experts and the all-to-all carry that many tokens per
    sequence while the KV cache is read once per sequence; the draft module (one MoE layer, DeepSeek's MTP head)
    runs once per draft token, priced as one more MoE layer of the step, or under `draft_passes` as a forward of
    its own over the sequences (its layer at the plain batch and the LM head under `lm_head`; the engines replay the
    drafts in the verify step's CUDA graph, so no fixed time of their own).
    How many tokens a step yields is the caller's (`simulator.timing.decode_timing`'s acceptance).

    `moe_tp`: the routed experts are split by tensor parallelism over the `ep` GPUs (every GPU holds 1/ep of
    every expert: SGLang's and TensorRT-LLM's MoE without expert parallelism, InferenceX's `ep 1`), not placed
    whole. Every GPU then streams its slice of the experts the whole group's tokens activate (the same set on
    every GPU: no busiest GPU), and the MoE output is all-reduced over the group instead of dispatched and
    combined.

    Micro-batches: two overlapped micro-batches, each streaming the experts it activates, with the all-to-all
    hidden behind attention and the shared expert (the `Delta` term). Under the `overlap_chosen` switch the
    engine runs them only where that is faster than one micro-batch with its communication exposed (the two-
    batch-overlap setting, decided per batch size: `Overlap` is 1 where two micro-batches run, else 0).
    """
    draft_tokens, moe_tp = run.draft_tokens, run.moe_tp
    p = profile or CostProfile.corrected()
    g = GPUArray.of(gpu)
    r = Rates(g, "decode", p)
    c = np.asarray(context, dtype=float)
    seqs = np.asarray(batch, dtype=float)
    bs = seqs * (1 + draft_tokens)  # tokens a step runs: each sequence's own and its drafts
    tp = np.asarray(tp, dtype=float)
    n = np.asarray(ep, dtype=float)
    e_total = model.n_routed_experts

    # the attention rank the step waits for: the mean one, or under `dp_imbalance` the busiest of the group's
    # ep / tp ranks, each holding a random share of the sequences (Poisson counts: mean + sqrt(2 mean ln ranks))
    ranks = np.maximum(n / tp, 1.0) if p.batch_per_attention_rank else np.ones_like(n)
    spread = np.sqrt(2.0 * seqs * np.log(ranks)) if p.dp_imbalance else 0.0
    att_seqs = seqs + spread
    att = att_seqs * (1 + draft_tokens)  # the busiest rank's tokens
    layer = _DecodeLayer(model, g, r, p, c, tp, kv_bytes_per_element(r, p, run.kv_dtype),
                         *_attn_decode_gflop(model, c, p))  # fmt: skip
    sparse_mla, dense_mla = layer.attention(att, att_seqs)
    dense_mlp = _dense_mlp_ms(att, model, tp, g, r, p)

    tokens_gpu = bs / tp if p.batch_per_attention_rank else bs  # tokens each GPU feeds its experts
    # routed experts (GEMM groups) per GPU; under moe_tp every expert's slice on every GPU
    gx = np.full_like(n, float(e_total)) if moe_tp else np.ceil(e_total / n)
    t_w = _xfer_ms(_expert_bytes(model, r, "decode", p), r.bw, p)
    f = 1.0 if moe_tp else run.expert_imbalance  # sliced experts load every GPU alike
    moe = _DecodeMoE(model, g, r, p, tokens_gpu, n, gx, t_w, _h20_table(g, p), f, moe_tp, run.fp8_combine)
    l_s = model.n_moe_layers + _draft_layers_in_step(run, p)  # without `draft_passes`: one more MoE layer a draft
    out = _micro_batched(moe, model.n_dense_layers * (dense_mla + dense_mlp), sparse_mla, l_s)
    tpot_o, tpot = out["TPOT_O"], out["TPOT"]
    step = r.step_overhead_ms if p.step_overhead else 0.0  # the engine's own time per forward, outside the layers
    head = _lm_head_ms(att, model, tp, r, p) if p.lm_head else 0.0
    tpot_o, tpot = tpot_o + step + head, tpot + step + head
    draft_delta = np.zeros_like(tpot)
    if p.draft_passes and draft_tokens:  # each draft a forward of its own over the sequences
        one = _draft_forward(layer, replace(moe, tokens_gpu=seqs / tp if p.batch_per_attention_rank else seqs),
                             att_seqs)  # fmt: skip
        tpot_o, tpot = tpot_o + draft_tokens * one["TPOT_O"], tpot + draft_tokens * one["TPOT"]
        draft_delta = one["Delta"] + draft_delta
    if p.sequence_overhead:  # and per sequence of the rank the step waits for (per token it verifies: draft_passes)
        per_seq = (att if p.draft_passes else att_seqs) * r.sequence_overhead_ms
        tpot_o, tpot = tpot_o + per_seq, tpot + per_seq
    tpot_o, tpot = tpot_o / r.model, tpot / r.model
    return {
        "DenseMLA": dense_mla,
        "SparseMLA": sparse_mla,
        "DenseMLP": dense_mlp,
        "SharedExpert": out["SharedExpert"],
        "RoutedExpert": out["RoutedExpert"],
        "Dispatch": out["Dispatch"],
        "Combine": out["Combine"],
        "Delta": out["Delta"],
        "TPOT_O": tpot_o,
        "TPOT": tpot,
        "Overlap": out["Overlap"],
        "DraftDelta": draft_delta,  # a draft forward's exposed all-to-all (`draft_passes`), as Delta is a layer's
    }


@dataclass(frozen=True)
class _DecodeLayer:
    """What a decode step's attention is priced from (`decode_parts`): the GPUs, the context and the TP group."""

    model: Model
    g: GPUArray
    r: Rates
    p: CostProfile
    c: np.ndarray  # context tokens of every sequence
    tp: np.ndarray
    kv_elem_bytes: np.ndarray
    gemm1: np.ndarray  # GEMM and attention GFLOP of one query token over the context (`_attn_decode_gflop`)
    attn1: np.ndarray

    def attention(self, tokens: np.ndarray, seqs_read: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sparse, dense) layers' attention for `tokens` query tokens of `seqs_read` sequences' KV caches."""
        model, r, p, c, tp, gemm1, attn1 = self.model, self.r, self.p, self.c, self.tp, self.gemm1, self.attn1
        new_kv = tokens if p.new_tokens_only or model.attention != "mla" else np.zeros_like(tokens)
        gemms = _attn_gemms(model, tokens, c, new_kv, decode=True)
        mla = _attn_ms(gemm1 * tokens, attn1 * tokens, _attn_weight_bytes(model, r, p), r, p, gemms)
        kv_shard = 1 if model.attention == "mla" else np.minimum(tp, model.n_kv_heads)
        # read once per sequence (a sliding layer's cache: its window; under DSA the picked tokens', and the
        # indexer's keys of every cached token)
        kv_bytes = (model.attended(c) * kv_token_layer_bytes(model, self.kv_elem_bytes, self.g)
                    + model.held(c) * model.index_bytes_per_token_layer) * seqs_read  # fmt: skip
        if p.si_units:
            t_kv = _xfer_ms(kv_bytes / kv_shard, r.kv_bw, p)
        else:  # shallowsim: bytes / 2^30 / (GB/s) * 1000, and not divided by tp
            t_kv = kv_bytes / kv_shard / GIB / r.kv_bw * 1000.0
        sparse = _tp_split_ms(mla, tokens, model, tp, self.g, r, p, kernels=_kernels(gemms)) + t_kv
        return sparse, (sparse if p.tp_dense_layers else mla + t_kv)


def _draft_forward(layer: _DecodeLayer, moe: _DecodeMoE, seqs: np.ndarray) -> dict[str, np.ndarray]:
    """TPOT_O, TPOT and Delta of one MTP draft forward over `seqs` sequences (`draft_passes`): the draft module's
    layer (attention, experts at the sequences' batch `moe`) and the LM head under `lm_head`, replayed inside the
    step's CUDA graph: no fixed engine time of its own."""
    sparse, _ = layer.attention(seqs, seqs)
    out = _micro_batched(moe, np.zeros_like(sparse), sparse, 1)
    head = _lm_head_ms(seqs, layer.model, layer.tp, layer.r, layer.p) if layer.p.lm_head else 0.0
    return {"TPOT_O": out["TPOT_O"] + head, "TPOT": out["TPOT"] + head, "Delta": out["Delta"]}


@dataclass(frozen=True)
class _DecodeMoE:
    """What a decode step's MoE layer is priced from (`decode_parts`): the GPUs, the tokens each feeds its
    experts, the EP group and how the engine runs the experts."""

    model: Model
    g: GPUArray
    r: Rates
    p: CostProfile
    tokens_gpu: np.ndarray  # tokens each GPU feeds its experts in one step
    n: np.ndarray  # GPUs of the EP group
    gx: np.ndarray  # routed experts (GEMM groups) per GPU; under moe_tp every expert's slice
    t_w: np.ndarray  # ms to stream one expert's weights (a slice 1/n of it under moe_tp)
    use_h20: np.ndarray
    f: float  # the busiest GPU's routed-expert load over the mean
    moe_tp: bool
    fp8_combine: bool


def _micro_batched(moe: _DecodeMoE, dense_ms: np.ndarray, sparse_mla: np.ndarray, l_s: int) -> dict[str, np.ndarray]:
    """SharedExpert, RoutedExpert, Dispatch, Combine, Delta, TPOT_O, TPOT (before the engine's overheads) and
    Overlap of a step run as two overlapped micro-batches, or under `overlap_chosen` as one where that is
    faster. `dense_ms`: the dense layers' time, L_d (DenseMLA + DenseMLP); `l_s`: the MoE layers. A dense model
    has none: its step is its dense layers, one batch, nothing to overlap."""
    if moe.model.dense:
        zero = np.zeros_like(dense_ms + sparse_mla)
        return {"SharedExpert": zero, "RoutedExpert": zero, "Dispatch": zero, "Combine": zero, "Delta": zero,
                "TPOT_O": dense_ms + zero, "TPOT": dense_ms + zero, "Overlap": zero}  # fmt: skip
    shared, routed, dispatch, combine = _moe_ms(moe, MICRO_BATCHES)
    delta = dispatch + combine - sparse_mla - shared  # two micro-batches: communication behind the other's work
    tpot_o = dense_ms + l_s * (sparse_mla + shared + routed)
    tpot = tpot_o + l_s * np.maximum(delta, 0.0)
    overlap = np.ones_like(tpot)
    if moe.p.overlap_chosen:  # one micro-batch, its communication in the open, where that is faster
        one = _moe_ms(moe, 1)
        tpot_1 = dense_ms + l_s * (sparse_mla + one[0] + one[1] + one[2] + one[3])
        overlap = (tpot <= tpot_1).astype(float)
        pick = overlap > 0
        shared, routed, dispatch, combine = (np.where(pick, two, once) for two, once in
                                             zip((shared, routed, dispatch, combine), one, strict=True))  # fmt: skip
        delta = np.where(pick, delta, dispatch + combine)  # exposed whole under one micro-batch
        tpot_o = np.where(pick, tpot_o, tpot_1 - l_s * (dispatch + combine))
        tpot = np.minimum(tpot, tpot_1)
    return {"SharedExpert": shared, "RoutedExpert": routed, "Dispatch": dispatch, "Combine": combine,
            "Delta": delta, "TPOT_O": tpot_o, "TPOT": tpot, "Overlap": overlap}  # fmt: skip


def _moe_ms(moe: _DecodeMoE, micro: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(shared, routed, dispatch, combine) per layer with `micro` micro-batches."""
    model, r, p, n, gx, f = moe.model, moe.r, moe.p, moe.n, moe.gx, moe.f
    e_total, k = model.n_routed_experts, model.top_k
    b = moe.tokens_gpu / micro
    # tokens per routed expert: a whole expert's share of b x n x k copies, or under moe_tp every copy of the
    # group through each expert's slice (the same FLOPs per GPU, on slices 1/n as wide)
    m_routed = b * k / gx * (n if moe.moe_tp else 1.0)
    m_shared = (b * n if moe.moe_tp else b) if p.shared_expert_own_efficiency else m_routed
    routed_gemm = _grouped_gemm_ms(_expert_gflop(model, b * k * f), m_routed * f, r.expert_rate(model), moe.use_h20, p)
    if moe.moe_tp:  # a 1/n slice of each of the E experts the group's b x n tokens activate
        active = e_total * (1.0 - (1.0 - k / e_total) ** (b * n)) if p.activated_experts else e_total
        loaded = active / n
    else:
        loaded = activated_experts(gx, b * n, k, e_total, n) if p.activated_experts else gx
    shared_gemm = _grouped_gemm_ms(_expert_gflop(model, b), m_shared, r.expert_rate(model), moe.use_h20, p)
    shared = micro * model.n_shared_experts * (shared_gemm + moe.t_w / (n if moe.moe_tp else 1.0))
    routed = micro * (routed_gemm + moe.t_w * loaded)
    if moe.moe_tp:  # the sliced kernels at their own rate (knob `moe_tp`); the group's MoE output all-reduced
        zero = np.zeros_like(routed)  # once per micro-batch, nothing dispatched
        reduce = micro * _allreduce_ms(moe.tokens_gpu * n / micro, model, n, moe.g, r, p)
        return shared / r.moe_tp, routed / r.moe_tp, zero, reduce
    dispatch, combine = _ep_a2a_ms(moe, micro)
    return shared, routed, dispatch, combine


def _ep_a2a_ms(moe: _DecodeMoE, micro: int) -> tuple[np.ndarray, np.ndarray]:
    """(dispatch, combine) per layer: the busiest GPU's token copies over the EP group, `micro` latencies."""
    model, g, r, p, n = moe.model, moe.g, moe.r, moe.p, moe.n
    fp8_comb = bool(moe.fp8_combine) & r.has_fp4
    comb_elem = np.where(fp8_comb, 1.0, 2.0)
    latency = DECODE_A2A_LATENCY_MS * micro
    copies = moe.tokens_gpu * model.hidden * model.top_k * moe.f  # bytes at 1 byte/element, into the busiest GPU
    if p.topology_comm:
        dispatch = _a2a_split_ms(copies, n, g, r, p) + latency
        combine = _a2a_split_ms(copies * comb_elem, n, g, r, p) + latency
    else:
        node8 = g.gpus_per_node == 8
        single_node = model.n_routed_experts / moe.gx == 8  # only N = 8 counts as one node [B13]
        rack_nvl = np.isin(g.gpus_per_node, SS_RACK_DOMAINS) & (n <= g.gpus_per_node)
        use_nvl = np.where(node8, single_node, rack_nvl)
        link = np.where(use_nvl, r.nvl, r.net) * r.a2a
        dispatch = _xfer_ms(copies, link, p) + latency
        combine = _xfer_ms(copies * comb_elem, link, p) + latency
    return dispatch, combine


def decode_step_ms(
    gpu: GPU | GPUArray,
    model: Model,
    context: np.ndarray,
    batch: np.ndarray,
    tp: np.ndarray,
    ep: np.ndarray,
    *,
    profile: CostProfile | None = None,
    run: DecodeRun = DecodeRun(),
) -> np.ndarray:
    """Time (ms) of one decode step (one token for every sequence in the batch; with `run.draft_tokens`, a
    speculative step verifying that many more; `run.moe_tp`: experts split by TP, decode_parts)."""
    return decode_parts(gpu, model, context, batch, tp, ep, profile=profile, run=run)["TPOT"]


def decode_steps_sum_ms(
    gpu: GPU | GPUArray,
    model: Model,
    context0: np.ndarray,
    n_steps: int,
    batch: np.ndarray,
    tp: np.ndarray,
    ep: np.ndarray,
    *,
    profile: CostProfile | None = None,
    run: DecodeRun = DecodeRun(),
) -> np.ndarray:
    """Σ_{k=1..n_steps} decode_step_ms(context0 + k), exactly, from two evaluations (four across a sliding window or
    DSA's top-k).

    Context enters a step only through KV reads and attention FLOPs, both affine in it, so
    TPOT_O(c) and Delta(c) are affine: the sum is n·TPOT_O(mean context) plus L_moe times the
    sum of the positive part of an arithmetic sequence, done in closed form. `run.draft_tokens`: every step an
    MTP step verifying that many drafts (decode_parts; the draft module's layers are among L_moe).
    """
    if n_steps < 1:
        raise ValueError(f"`n_steps >= 1` must hold, got {n_steps=}")
    p = profile or CostProfile.corrected()
    c0 = np.asarray(context0, dtype=float)
    if model.attention_bend:  # affine on either side of the window (the top-k), where attended tokens stop growing
        inside = np.clip(model.attention_bend - c0, 0.0, float(n_steps))  # steps at a context within it
        if np.any((inside > 0) & (inside < n_steps)):
            return (_affine_steps_ms(gpu, model, c0, inside, batch, tp, ep, p, run)
                    + _affine_steps_ms(gpu, model, c0 + inside, n_steps - inside, batch, tp, ep, p, run))  # fmt: skip
    lo = decode_parts(gpu, model, c0 + 1.0, batch, tp, ep, profile=profile, run=run)
    if n_steps == 1:
        return lo["TPOT"]
    hi = decode_parts(gpu, model, c0 + n_steps, batch, tp, ep, profile=profile, run=run)
    total_o = n_steps * (lo["TPOT_O"] + hi["TPOT_O"]) / 2.0
    l_s = model.n_moe_layers + _draft_layers_in_step(run, p)
    drafts = run.draft_tokens * _sum_positive_arith(lo["DraftDelta"], hi["DraftDelta"], n_steps)
    return total_o + l_s * _sum_positive_arith(lo["Delta"], hi["Delta"], n_steps) + drafts


def _affine_steps_ms(gpu: GPU | GPUArray, model: Model, c0: np.ndarray, n: np.ndarray, batch: np.ndarray,
                     tp: np.ndarray, ep: np.ndarray, p: CostProfile, run: DecodeRun) -> np.ndarray:  # fmt: skip
    """Σ_{k=1..n} decode_step_ms(c0 + k) for `n` >= 0 steps per element, over contexts where the step is affine."""
    lo = decode_parts(gpu, model, c0 + 1.0, batch, tp, ep, profile=p, run=run)
    hi = decode_parts(gpu, model, c0 + np.maximum(n, 1.0), batch, tp, ep, profile=p, run=run)
    total_o = n * (lo["TPOT_O"] + hi["TPOT_O"]) / 2.0
    l_s = model.n_moe_layers + _draft_layers_in_step(run, p)
    drafts = run.draft_tokens * _sum_positive_arith(lo["DraftDelta"], hi["DraftDelta"], n)
    return total_o + l_s * _sum_positive_arith(lo["Delta"], hi["Delta"], n) + drafts


def _draft_layers_in_step(run: DecodeRun, p: CostProfile) -> int:
    """MoE layers an MTP step adds to the verify pass: one a draft token, unless each draft is priced as a forward
    of its own (`draft_passes`)."""
    return 0 if p.draft_passes else run.draft_tokens


def _lm_head_ms(tokens: np.ndarray, model: Model, tp: np.ndarray, r: Rates, p: CostProfile) -> np.ndarray:
    """The LM head over `tokens` tokens of an attention rank (`lm_head`): the vocab x hidden projection in BF16,
    split by vocabulary over the TP group, its weights streamed once; compute- or memory-bound, whichever is
    longer."""
    n = model.vocab_size / tp
    gflop = 2.0 * tokens * model.hidden * n / 1e9
    return np.maximum(gflop / r.f16, _xfer_ms(n * model.hidden * 2.0, r.bw, p))


def _sum_positive_arith(first: np.ndarray, last: np.ndarray, n: int | np.ndarray) -> np.ndarray:
    """Σ_{i=0..n-1} max(a_i, 0) for the arithmetic sequence a_0 = first, a_{n-1} = last (`n` >= 0, per element)."""
    step = (last - first) / np.maximum(n - 1, 1)
    # Count of positive terms: all, none, or a prefix / suffix ending where the sign flips.
    with np.errstate(divide="ignore", invalid="ignore"):
        zero_at = np.where(step != 0, -first / np.where(step != 0, step, 1.0), np.inf)
    falling = step < 0
    m_fall = np.clip(np.floor(np.where(falling, zero_at, 0.0)) + 1, 0, n)  # terms i < zero_at
    start_rise = np.clip(np.floor(np.where(falling, 0.0, zero_at)) + 1, 0, n)  # first i > zero_at
    # falling: positive prefix i = 0..m-1; rising: positive suffix i = start..n-1
    pre_sum = m_fall * first + step * m_fall * (m_fall - 1) / 2.0
    cnt = n - start_rise
    suf_sum = cnt * (first + step * (start_rise + n - 1) / 2.0)
    out = np.where(falling, pre_sum, np.where(step > 0, suf_sum, n * np.maximum(first, 0.0)))
    return np.maximum(out, 0.0)


# --- memory ----------------------------------------------------------------------------------------


def weight_bytes_per_gpu(
    gpu: GPU | GPUArray,
    model: Model,
    tp: np.ndarray,
    routed_per_gpu: np.ndarray,
    profile: CostProfile | None = None,
    draft_layers: int = 0,
) -> np.ndarray:
    """Weight bytes one GPU holds: its attention shard, its experts, dense MLP and embeddings; with `draft_layers`
    (an engine decoding with MTP) the MTP modules too, each one more MoE layer (its embedding and head are the
    model's own, shared)."""
    p = profile or CostProfile.corrected()
    g = GPUArray.of(gpu)
    r = Rates(g, "decode", p)
    tp = np.asarray(tp, dtype=float)
    experts = np.asarray(routed_per_gpu, dtype=float) + model.n_shared_experts
    if not p.weights_from_config:
        gb = (
            SS_OTHER_PARAMS_GB
            + SS_MLA_PARAMS_M * (model.n_layers + draft_layers) / tp / 1024.0
            + SS_EXPERT_PARAMS_M * (model.n_moe_layers + draft_layers) * experts / 1024.0
        )
        return gb * GIB
    dense_tp = tp if p.tp_dense_layers else 1.0
    attn = model.attn_params_per_layer * (model.n_layers + draft_layers) / tp * r.wbytes
    dense = model.n_dense_layers * 3.0 * model.hidden * model.dense_inter / dense_tp * r.wbytes
    expert = experts * (model.n_moe_layers + draft_layers) * _expert_bytes(model, r, "decode", p)
    # embedding + LM head, BF16: whole on every GPU of an MoE engine (its DP-attention ranks each hold the
    # embedding), split over the TP group of a dense model's replica (vocab-parallel, as its engines shard them)
    embed = 2.0 * model.vocab_size * model.hidden * 2.0 / (tp if model.dense else 1.0)
    return attn + dense + expert + embed


def request_overheads_ms(profile: CostProfile | None) -> tuple[float, float]:
    """(front end, hand-off) fixed times of one request, ms (`request_overhead`; both 0 without it). Fitted for every
    GPU (`*`): they are the serving software's, outside the GPUs."""
    p = profile or CostProfile.corrected()
    if not p.request_overhead:
        return 0.0, 0.0
    cal = p.calibration
    front = cal.get("", "request_overhead").factor if cal else 1.0
    handoff = cal.get("", "handoff").factor if cal else 1.0
    return REQUEST_OVERHEAD_MS / front, HANDOFF_MS / handoff


def kv_link_gb_s(gpu: GPU | GPUArray, profile: CostProfile | None = None) -> np.ndarray:
    """GB/s one GPU moves KV cache at from a prefill to a decode island: its NIC, derated (and
    calibrated: the `kv_transfer` knob)."""
    return Rates(GPUArray.of(gpu), "decode", profile or CostProfile.corrected()).kv_link


def kv_bytes_per_element(r: Rates, p: CostProfile, kv_dtype: str = "auto") -> np.ndarray | float:
    """Bytes of one KV-cache element: `kv_dtype`'s, or with "auto" the GPU's dense format (shallowsim: 1 byte)."""
    if kv_dtype in KV_BYTES:
        return KV_BYTES[kv_dtype]
    return r.wbytes if p.precision_per_gpu else 1.0


def kv_token_layer_bytes(model: Model, elem: np.ndarray | float, g: GPUArray) -> np.ndarray | float:
    """Bytes one token adds to one layer's KV cache of elements of `elem` bytes (MLA: latent + rope key; GQA: K and
    V). DSA's FP8 cache on Hopper is FlashMLA's layout, the latent in FP8 with an FP32 scale per 128 and the rope key
    kept in BF16 (512 + 16 + 128 = 656 bytes for DeepSeek-V3.2); Blackwell's TRT-LLM kernels and ROCm's keep the
    plain FP8 row (SGLang's `calculate_mla_kv_cache_dim` under the backends it resolves on each). The indexer's keys
    are `Model.index_bytes_per_token_layer`."""
    plain = model.kv_elems_per_token_layer * np.asarray(elem, dtype=float)
    if not model.index_topk:
        return plain
    rkv = model.kv_lora_rank
    scaled = rkv + rkv / FP8_SCALE_BLOCK * 4.0 + model.qk_rope_head_dim * 2.0
    flashmla = (g.tflops_fp4 <= 0) & np.array([s == "cuda" for s in g.software]).reshape(np.shape(g.sm))
    return np.where((np.asarray(elem) == 1.0) & flashmla, scaled, plain)


def kv_bytes_per_seq(
    gpu: GPU | GPUArray,
    model: Model,
    tokens: np.ndarray,
    tp: np.ndarray,
    profile: CostProfile | None = None,
    draft_layers: int = 0,
    kv_dtype: str = "auto",
) -> np.ndarray:
    """KV-cache bytes one sequence of `tokens` tokens costs each GPU of its TP group (`draft_layers`: the MTP
    modules' attention keeps its own cache; `kv_dtype`: the cache's format)."""
    p = profile or CostProfile.corrected()
    g = GPUArray.of(gpu)
    r = Rates(g, "decode", p)
    tp = np.asarray(tp, dtype=float)
    elem = kv_bytes_per_element(r, p, kv_dtype)
    held = model.held(np.asarray(tokens, dtype=float))  # per layer: a sliding layer keeps its window
    per_token = kv_token_layer_bytes(model, elem, g) + model.index_bytes_per_token_layer  # DSA: the indexer's keys too
    per_seq = held * per_token * (model.n_layers + draft_layers)
    if not p.batch_per_attention_rank:
        return per_seq * tp  # shallowsim: KV counted once per TP rank, batch per GPU
    kv_shard = 1.0 if model.attention == "mla" else np.minimum(tp, model.n_kv_heads)
    return per_seq / kv_shard


def max_batch(
    gpu: GPU | GPUArray,
    model: Model,
    context: np.ndarray,
    decode_len: np.ndarray,
    tp: np.ndarray,
    routed_per_gpu: np.ndarray,
    *,
    profile: CostProfile | None = None,
    draft_layers: int = 0,
    mem_fraction: float = MEM_FRACTION,
    kv_dtype: str = "auto",
) -> np.ndarray:
    """Sequences of context + decode_len tokens that fit beside the weights in `mem_fraction` of the GPU's memory
    (per batch unit; `draft_layers`: the MTP modules' weights and cache too).

    shallowsim returns a float that may be negative [B11]; `integer_batch` floors it at 0.
    """
    p = profile or CostProfile.corrected()
    g = GPUArray.of(gpu)
    # HBM capacities are binary: an "80 GB" H800 holds 80 GiB, so memory stays in GiB.
    free = g.mem_gb * GIB * mem_fraction - weight_bytes_per_gpu(g, model, tp, routed_per_gpu, p, draft_layers)
    tokens = np.maximum(np.asarray(context, dtype=float) + np.asarray(decode_len, dtype=float), 1.0)
    mb = free / kv_bytes_per_seq(g, model, tokens, tp, p, draft_layers, kv_dtype)
    return np.maximum(np.floor(mb), 0.0) if p.integer_batch else mb

"""Seed 001's deployment-configuration estimator (its Section 3, Algorithm 1) as a baseline planner.

Every machine (a node of `gpus_per_node` GPUs of one type) runs u/t instances of t GPUs, each
serving prefill and decode together (no disaggregation). The machine's t is chosen by estimating
throughput with a linear time model fitted to profiling runs:

    T_prefill(b, I)    ≈ p1·b·I + p2·b + p3·I + p4                                 (Eq. 3)
    τ_decode(c, b)     ≈ p5·b·c + p6·b + p7·c + p8,  T_decode = Σ_k τ(I + k, b)     (Eq. 4)

then batching a request sample greedily until the KV cache is full (Algorithm 1, with its
loop bound and return value fixed as `docs/simulator_policies.md` notes) and scoring
TP_system = tokens / time · u / t. Profiling runs are our cost model's times (an instance of
t GPUs is one EP group holding every expert); the fit is ordinary least squares.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.formulas import decode_step_ms, kv_bytes_per_seq, prefill_time_ms, weight_bytes_per_gpu
from costmodel.profile import CostProfile
from costmodel.specs import GPU, Model

PHI_USAGE = 0.9  # seed 001 L229: vLLM gpu_memory_utilization
DELTA_ENGINE_GB = 2.0  # seed 001 L229: memory the engine keeps (CUDA graphs), per instance as Eq. 1 writes it
GIB = 2**30


@dataclass(frozen=True)
class Fit:
    p: np.ndarray  # p1..p8
    prefill_rel_err: float  # worst relative error of the fit on its profiling points
    decode_rel_err: float


@dataclass(frozen=True)
class Choice:
    gpu: str
    tp: int
    instances_per_machine: int
    machines: int
    tokens_per_s: float  # all machines of the type
    fit: Fit


def profile_fit(gpu: GPU, model: Model, tp: int, profile: CostProfile) -> Fit:
    """Fit p1..p8 to cost-model 'profiling runs' at batch 1..64 and contexts 128..8192."""
    b = np.array([1, 2, 4, 8, 16, 32, 64], dtype=float)
    ctx = np.array([128, 512, 1024, 2048, 4096, 8192], dtype=float)
    bb, cc = (x.ravel() for x in np.meshgrid(b, ctx, indexing="ij"))
    one = np.ones_like(bb)
    # prefill of b prompts of length I on one instance: back to back (the cost model prefills one prompt per rank)
    t_pre = bb * prefill_time_ms(gpu, model, cc, one * tp, one, cache_hit=0.0, profile=profile)
    x_pre = np.stack([bb * cc, bb, cc, one], axis=1)
    p_pre, *_ = np.linalg.lstsq(x_pre, t_pre, rcond=None)
    t_dec = decode_step_ms(gpu, model, cc, bb, one * tp, one * tp, profile=profile)
    x_dec = np.stack([bb * cc, bb, cc, one], axis=1)
    p_dec, *_ = np.linalg.lstsq(x_dec, t_dec, rcond=None)
    err_pre = float(np.max(np.abs(x_pre @ p_pre - t_pre) / t_pre))
    err_dec = float(np.max(np.abs(x_dec @ p_dec - t_dec) / t_dec))
    return Fit(np.concatenate([p_pre, p_dec]), err_pre, err_dec)


def kv_capacity_bytes(gpu: GPU, model: Model, tp: int, profile: CostProfile) -> float:
    """Eq. 1: t·d·φ − δ − Φ·b, with Φ·b the instance's weights (every expert on its t GPUs)."""
    routed = np.ceil(model.n_routed_experts / tp)
    weights = float(weight_bytes_per_gpu(gpu, model, np.array([float(tp)]), np.array([routed]), profile)[0]) * tp
    return tp * gpu.mem_gb * GIB * PHI_USAGE - DELTA_ENGINE_GB * GIB - weights


def batch_time_ms(p: np.ndarray, b: int, i_max: float, o_max: float) -> float:
    """Eq. 3 + Eq. 4 in closed form: Σ_{k=1..O} (I + k) = O·I + O(O+1)/2."""
    pre = p[0] * b * i_max + p[1] * b + p[2] * i_max + p[3]
    dec = (p[4] * b + p[6]) * (o_max * i_max + o_max * (o_max + 1) / 2) + (p[5] * b + p[7]) * o_max
    return float(pre + dec)


def estimate(
    gpu: GPU, model: Model, tp: int, u: int, inputs: np.ndarray, outputs: np.ndarray, profile: CostProfile
) -> tuple[float, Fit] | None:
    """Algorithm 1: one machine's estimated tokens/s with instances of `tp` GPUs; None if a request cannot fit."""
    cap = kv_capacity_bytes(gpu, model, tp, profile)
    per_token = float(kv_bytes_per_seq(gpu, model, np.array([1.0]), np.array([1.0]), profile)[0])
    if cap < per_token * float(inputs.max() + outputs.max()):  # Eq. 2 (with its 2·l·h factor)
        return None
    fit = profile_fit(gpu, model, tp, profile)
    total, start, q = 0.0, 0, len(inputs)
    while start < q:  # the paper's `until batchedReqNum > q` never ends; this is its intent
        end = start
        while end < q:
            n = end - start + 1
            kv = per_token * (inputs[start : end + 1].sum() + n * outputs[start : end + 1].max())
            if kv > cap:
                break
            end += 1
        b = end - start
        total += batch_time_ms(fit.p, b, float(inputs[start:end].max()), float(outputs[start:end].max()))
        start = end
    tokens = float(inputs.sum() + outputs.sum())
    return tokens / (total / 1e3) * (u // tp), fit  # TP_s · u / t (the prose; its line 17 says t · TP_s)


def plan(
    inventory: dict[str, int],
    gpus: dict[str, GPU],
    model: Model,
    inputs: np.ndarray,
    outputs: np.ndarray,
    profile: CostProfile,
) -> list[Choice]:
    """Per GPU type, the instance size with the highest estimated throughput.

    The paper's candidates are the divisors of a machine (instances never span machines). A model
    that does not fit one machine (DeepSeek-V3 on 8 x H800) gets instances of 2, 4 or 8 whole
    machines as well: an extension, marked by `instances_per_machine` = 0.
    """
    out = []
    for name, count in inventory.items():
        g = gpus[name]
        node = min(g.gpus_per_node, count)
        sizes = [t for t in range(1, node + 1) if node % t == 0] + [node * k for k in (2, 4, 8) if node * k <= count]
        best: tuple[float, int, Fit] | None = None
        for tp in sizes:
            est = estimate(g, model, tp, tp, inputs, outputs, profile)  # one instance's tokens/s
            if est is not None and (best is None or est[0] * (count // tp) > best[0]):
                best = (est[0] * (count // tp), tp, est[1])
        if best is None:
            raise ValueError(f"no instance of up to {sizes[-1]} x {name} holds {model.name} plus one request's KV")
        tokens, tp, fit = best
        out.append(Choice(name, tp, node // tp if tp <= node else 0, count // node, tokens, fit))
    return out

"""Cost profiles: `shallowsim` reproduces the original program, `corrected` fixes its errors.

Each fix of `reference/shallowsim_spec.md` section 5 is one named switch, so its effect can be
measured alone (`docs/costmodel.md` has the table). `shallowsim` has every switch off;
`corrected` has every fix on; any mix is a valid profile (`CostProfile.with_fixes`).

Besides the fixes, `MODEL_DOCS` lists refinements of the model's structure that go beyond the
original program's formulas. They are off in both named profiles (so `corrected` stays the
spec's model with its errors fixed) and on where a calibration was fitted with them: a
calibration carries the structure its factors belong to (`Calibration.switches`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from costmodel.calibration import Calibration

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
SWITCH_DOCS: dict[str, str] = {**FIX_DOCS, **MODEL_DOCS}


@dataclass(frozen=True)
class CostProfile:
    """One switch per fix or refinement; see FIX_DOCS and MODEL_DOCS for what each does."""

    name: str
    fp8_dispatch: bool
    gemm_table_by_field: bool
    fp4_consistent: bool
    whole_experts_per_gpu: bool
    topology_comm: bool
    tp_dense_layers: bool
    batch_per_attention_rank: bool
    new_tokens_only: bool
    causal_attention: bool
    ring_allreduce: bool
    si_units: bool
    shared_expert_own_efficiency: bool
    integer_batch: bool
    weights_from_config: bool
    monotone_gemm_time: bool
    precision_per_gpu: bool
    gemm_roofline: bool = False
    calibration: Calibration | None = None  # component efficiency factors per GPU (costmodel/calibration.py)

    @staticmethod
    def shallowsim() -> CostProfile:
        return CostProfile(name="shallowsim", **{k: False for k in FIX_DOCS})

    @staticmethod
    def corrected() -> CostProfile:
        return CostProfile(name="corrected", **{k: True for k in FIX_DOCS})

    @staticmethod
    def named(name: str) -> CostProfile:
        if name not in PROFILES:
            raise ValueError(f"unknown cost profile {name!r}; choose from {sorted(PROFILES)}")
        return PROFILES[name]()

    def with_fixes(self, **switches: bool) -> CostProfile:
        """This profile with some switches changed; the name records the change."""
        unknown = sorted(set(switches) - set(SWITCH_DOCS))
        if unknown:
            raise ValueError(f"unknown cost-model switch {unknown}; choose from {sorted(SWITCH_DOCS)}")
        changed = {k: bool(v) for k, v in switches.items() if getattr(self, k) != bool(v)}
        if not changed:
            return self
        tag = ",".join(f"{'+' if v else '-'}{k}" for k, v in sorted(changed.items()))
        return replace(self, name=f"{self.name}[{tag}]", **changed)

    def switches(self) -> dict[str, bool]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("name", "calibration")}

    def calibrated(self, cal: Calibration | None) -> CostProfile:
        """This profile with `cal`'s factors applied to its components (None: none), and the model
        structure `cal` was fitted with (its `switches`): the factors mean nothing under another."""
        base = self.name.split("+")[0]
        if cal is None:
            return replace(self, name=base, calibration=None)
        return replace(self, name=f"{base}+{cal.name}", calibration=cal, **dict(cal.switches))


PROFILES = {"shallowsim": CostProfile.shallowsim, "corrected": CostProfile.corrected}

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
from costmodel.specs import SpecError
from costmodel.switches import FIX_DOCS, MODEL_DOCS, PROFILE_NAMES, SYSTEM_DOCS

SWITCH_DOCS: dict[str, str] = {**FIX_DOCS, **MODEL_DOCS, **SYSTEM_DOCS}


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
    activated_experts: bool = False
    experts_fp8: bool = False
    overlap_chosen: bool = False
    step_overhead: bool = False
    sequence_overhead: bool = False
    dp_imbalance: bool = False
    request_overhead: bool = False
    node_dispatch: bool = False
    lm_head: bool = False
    draft_passes: bool = False
    net_allreduce: bool = False
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
        structure `cal` was fitted with (its `switches`): the factors mean nothing under another. A
        calibration fitted under one named profile's fixes is refused (SpecError) under a profile nearer
        another named one's; a few fixes switched for a comparison keep it."""
        suffix = f"+{self.calibration.name}" if self.calibration is not None else ""
        base = self.name.removesuffix(suffix) if suffix else self.name  # a switch's tag may hold a "+" too
        if cal is None:
            return replace(self, name=base, calibration=None)
        if cal.profile:
            differ = {n: self.fixes_differing(make()) for n, make in PROFILES.items()}
            if any(len(d) < len(differ[cal.profile]) for d in differ.values()):
                near = min(differ, key=lambda n: len(differ[n]))
                own = differ[cal.profile]
                raise SpecError(
                    f"calibration {cal.name!r} was fitted under costmodel.profile={cal.profile}, and this profile "
                    f"({base}) differs from it in {len(own)} fix(es) ({', '.join(own[:3])}"
                    f"{', ...' if len(own) > 3 else ''}): its factors correct other components; use "
                    f"costmodel.profile={cal.profile}, or a calibration fitted with --base {near}"
                )
        return replace(self, name=f"{base}+{cal.name}", calibration=cal, **dict(cal.switches))

    def fixes_differing(self, other: CostProfile) -> list[str]:
        """The fixes this profile and `other` set differently, in FIX_DOCS order."""
        return [k for k in FIX_DOCS if getattr(self, k) != getattr(other, k)]

    def fixes_of(self) -> str:
        """The named profile whose fixes this one has ("" where some were changed: `with_fixes`)."""
        return next((n for n, make in PROFILES.items() if not self.fixes_differing(make())), "")


PROFILES = {"shallowsim": CostProfile.shallowsim, "corrected": CostProfile.corrected}
assert tuple(PROFILES) == PROFILE_NAMES

"""One frozen record of everything besides GPU, model and workload that decides a cost-model number.

`CostSettings` is built once from the config (`pipeline.planning.config.cost_settings_from_cfg`), used by
the island benchmark, the planner, the exact reference and the simulator's step times, and
written whole into plan.json (`to_json`). `from_json` rebuilds exactly that record, so a plan is
simulated with the model it was made with, whatever switches and values it used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from costmodel.calibration import Calibration
from costmodel.profile import CostProfile
from costmodel.specs import SpecError
from costmodel.switches import FIX_DOCS, MODEL_DOCS, SYSTEM_DOCS

# MTP: a draft token is accepted 85 % of the time ("the acceptance rate of the second token prediction ranges between
# 85% and 90%", DeepSeek-V3 Technical Report, arXiv:2412.19437, section 5.4.3)
MTP_ACCEPTANCE = 0.85
MAX_DRAFTS = 4  # draft tokens a step verifies at most (SGLang's --speculative-num-steps for DeepSeek: 1 to 3)


@dataclass(frozen=True)
class Slo:
    """Latency targets: a TTFT and a TPOT bound (ms; None: no target), each met by a percentile of requests."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    ttft_percentile: float = 99.0
    tpot_percentile: float = 99.0

    def __post_init__(self) -> None:
        for key in ("ttft_ms", "tpot_ms"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
                raise SpecError(f"`{key} > 0` must hold (or null for no cap), got {key}={v!r}")
        for key in ("ttft_percentile", "tpot_percentile"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 50.0 <= v < 100.0:
                raise SpecError(f"`50 <= {key} < 100` must hold, got {key}={v!r}")

    @property
    def any(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def text(self) -> str:
        """'SLO TTFT p99 <= 2000 ms, TPOT p99 <= 50 ms', or 'no SLO'."""
        parts = [
            f"{k.upper()} p{getattr(self, f'{k}_percentile'):g} <= {getattr(self, f'{k}_ms'):g} ms"
            for k in ("ttft", "tpot")
            if getattr(self, f"{k}_ms") is not None
        ]
        return "SLO " + ", ".join(parts) if parts else "no SLO"


@dataclass(frozen=True)
class CostSettings:
    profile: CostProfile = field(default_factory=CostProfile.corrected)
    cache_hit: float = 0.0  # prefix-cache hit rate of prompts
    fp8_combine: bool = False  # decode combine in FP8 on FP4 GPUs (spec 4.11)
    ttft_ms: float | None = None  # SLO: time to first token (null: none) ...
    tpot_ms: float | None = None  # SLO: time per output token (null: none) ...
    ttft_percentile: float = 99.0  # ... met by this percentile of requests
    tpot_percentile: float = 99.0
    prefill_batch_tokens: int = 16384  # prompt tokens a prefill engine batches at most (SGLang --max-prefill-tokens)
    engine_configs: bool = True  # only parallel configurations engines run: attention TP divides the head count
    mtp_drafts: int = 0  # MTP: draft tokens every decode step verifies (0: no speculative decoding)
    mtp_acceptance: float = MTP_ACCEPTANCE  # ... each accepted with this chance, given the ones before it were
    aggregated: bool = False  # an island may also run aggregated engines (prefill and decode in mixed steps)

    def __post_init__(self) -> None:
        batch = self.prefill_batch_tokens
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise SpecError(f"`prefill_batch_tokens >= 1` (a whole number) must hold, got {batch!r}")
        drafts = self.mtp_drafts
        if isinstance(drafts, bool) or not isinstance(drafts, int) or not 0 <= drafts <= MAX_DRAFTS:
            raise SpecError(f"`0 <= mtp.drafts <= {MAX_DRAFTS}` (a whole number) must hold, got {drafts!r}")
        a = self.mtp_acceptance
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 < a <= 1.0:
            raise SpecError(f"`0 < mtp.acceptance <= 1` must hold, got {a!r}")
        if not 0.0 <= self.cache_hit < 1.0:
            raise SpecError(f"`0 <= cache_hit < 1` must hold, got cache_hit={self.cache_hit!r}")
        self.targets  # noqa: B018  (the SLO fields, checked)

    @property
    def targets(self) -> Slo:
        """The latency targets a plan made with these settings is judged against."""
        return Slo(self.ttft_ms, self.tpot_ms, self.ttft_percentile, self.tpot_percentile)

    @property
    def mtp_accepted(self) -> float:
        """Draft tokens an MTP step keeps on average: the i-th is kept when it and every one before it is accepted,
        Σ_{i=1..drafts} acceptance^i (0 without MTP). A step yields 1 + this many tokens."""
        return float(sum(self.mtp_acceptance**i for i in range(1, self.mtp_drafts + 1)))

    @property
    def draft_layers(self) -> int:
        """MTP modules an engine runs and holds: one (DeepSeek's MTP head, reused for every draft) with MTP, else 0."""
        return 1 if self.mtp_drafts else 0

    @property
    def slo(self) -> bool:
        """Are latency targets part of the problem (else: throughput only, the thesis's planning)?"""
        return self.ttft_ms is not None or self.tpot_ms is not None

    def to_json(self) -> dict[str, Any]:
        """Every switch and value, as plan.json carries it."""
        return {
            "profile": self.profile.name,
            "switches": self.profile.switches(),
            "cache_hit": self.cache_hit,
            "fp8_combine": self.fp8_combine,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "ttft_percentile": self.ttft_percentile,
            "tpot_percentile": self.tpot_percentile,
            "prefill_batch_tokens": self.prefill_batch_tokens,
            "engine_configs": self.engine_configs,
            "mtp_drafts": self.mtp_drafts,
            "mtp_acceptance": self.mtp_acceptance,
            "aggregated": self.aggregated,
            "calibration": None if self.profile.calibration is None else self.profile.calibration.to_json(),
        }

    @staticmethod
    def from_json(data: Any, where: str) -> CostSettings:
        """The record `to_json` wrote; SpecError names `where` and the field that is off."""
        if not isinstance(data, Mapping):
            raise SpecError(f"{where}: `cost` must be a mapping (profile, switches, cache_hit, ...), got {data!r}")
        expected = {"profile", "switches", "cache_hit", "fp8_combine", "ttft_ms", "tpot_ms", "ttft_percentile",
                    "tpot_percentile", "prefill_batch_tokens", "engine_configs"}  # fmt: skip
        later = {"calibration", "mtp_drafts", "mtp_acceptance", "aggregated"}  # plans written before these lack them
        if not expected <= set(data) <= expected | later:
            raise SpecError(f"{where}: `cost` must have exactly the fields {sorted(expected)} (and {sorted(later)}), "
                            f"got {sorted(data)}")  # fmt: skip
        cal = data.get("calibration")
        calibration = None if cal is None else Calibration.from_json(cal, f"{where}: cost.calibration")
        switches = data["switches"]
        # every fix; the refinements and system switches are absent from plans written before them (false)
        optional = set(MODEL_DOCS) | set(SYSTEM_DOCS)
        if not isinstance(switches, Mapping) or not set(FIX_DOCS) <= set(switches) <= set(FIX_DOCS) | optional:
            raise SpecError(
                f"{where}: `cost.switches` must give every cost-model fix {sorted(FIX_DOCS)} true or false "
                f"(and may give {sorted(optional)})"
            )
        if not all(isinstance(v, bool) for v in switches.values()):
            raise SpecError(f"{where}: every `cost.switches` value must be true or false")
        for key in ("cache_hit", "ttft_ms", "tpot_ms", "ttft_percentile", "tpot_percentile"):
            v, nullable = data[key], key in ("ttft_ms", "tpot_ms")
            if not (v is None and nullable) and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise SpecError(f"{where}: `cost.{key}` must be a number{' or null' if nullable else ''}")
        batch = data["prefill_batch_tokens"]
        if isinstance(batch, bool) or not isinstance(batch, int):
            raise SpecError(f"{where}: `cost.prefill_batch_tokens` must be a whole number")
        if not isinstance(data["engine_configs"], bool):
            raise SpecError(f"{where}: `cost.engine_configs` must be true or false")
        if not isinstance(data["fp8_combine"], bool):
            raise SpecError(f"{where}: `cost.fp8_combine` must be true or false")
        acceptance = data.get("mtp_acceptance", MTP_ACCEPTANCE)
        if not isinstance(data.get("aggregated", False), bool):
            raise SpecError(f"{where}: `cost.aggregated` must be true or false")
        if isinstance(acceptance, bool) or not isinstance(acceptance, (int, float)):
            raise SpecError(f"{where}: `cost.mtp_acceptance` must be a number")
        try:
            return CostSettings(
                CostProfile(name=str(data["profile"]), **switches, calibration=calibration),
                float(data["cache_hit"]),
                data["fp8_combine"],
                None if data["ttft_ms"] is None else float(data["ttft_ms"]),
                None if data["tpot_ms"] is None else float(data["tpot_ms"]),
                float(data["ttft_percentile"]),
                float(data["tpot_percentile"]),
                batch,
                data["engine_configs"],
                data.get("mtp_drafts", 0),
                float(acceptance),
                data.get("aggregated", False),
            )
        except SpecError as err:
            raise SpecError(f"{where}: cost: {err}") from None

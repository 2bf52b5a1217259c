"""One frozen record of everything besides GPU, model and workload that decides a cost-model number.

    CostSettings
    ├── profile: CostProfile     the cost model's switches and its calibration
    ├── cache_hit                the prompts' prefix-cache hit rate
    ├── slo: Slo                 the latency targets (none: throughput only)
    ├── engine: EngineSettings   how the engines run: prefill batch, FP8 combine, aggregated islands allowed, ...
    └── mtp: Mtp | None          speculative decoding (None: one token a step)

`CostSettings` is built once from the config (`pipeline.planning.config.cost_settings_from_cfg`), used by
the island benchmark, the planner, the exact reference and the simulator's step times, and
written whole into plan.json (`to_json`, nested as the record is, by the generic `costmodel.codec`).
`from_json` rebuilds exactly that record, so a plan is simulated with the model it was made with,
whatever switches and values it used; it reads the flat record of earlier plan.json schemas too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from costmodel.codec import RecordError, fields_data, from_fields
from costmodel.profile import CostProfile
from costmodel.specs import SpecError
from costmodel.switches import FIX_DOCS, MODEL_DOCS, SYSTEM_DOCS

# The share of a GPU's memory an engine holds weights and KV cache in, by default (the launch files set it; left
# to itself SGLang 0.5.23 picks 0.80-0.89 on H800, H20, H200 and B200 at TP 8, as its own resolution reads; the
# InferenceX B200 TP4 runs set 0.95), and the range a setting may take: below 0.1 no engine holds DeepSeek-V3's
# weights; above 0.98 nothing is left for activations and the CUDA context.
MEM_FRACTION = 0.9
MIN_MEM_FRACTION, MAX_MEM_FRACTION = 0.1, 0.98
# The KV cache's format: "auto" keeps it in the GPU's dense format (FP8 where the GPU computes FP8, else BF16, as
# the launch files set it); "fp8" or "bf16" set it (InferenceX's FP8 runs keep an FP8 cache; BF16 halves the batch)
KV_DTYPES = ("auto", "fp8", "bf16")
KV_BYTES = {"fp8": 1.0, "bf16": 2.0}

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
class Mtp:
    """MTP speculative decoding with the model's MTP module (DeepSeek-V3's): every decode step verifies `drafts` draft
    tokens, each accepted with chance `acceptance` given the ones before it were."""

    drafts: int = 1
    acceptance: float = MTP_ACCEPTANCE

    def __post_init__(self) -> None:
        d = self.drafts
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= MAX_DRAFTS:
            raise SpecError(f"`1 <= mtp.drafts <= {MAX_DRAFTS}` (a whole number) must hold, got {d!r}")
        a = self.acceptance
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 < a <= 1.0:
            raise SpecError(f"`0 < mtp.acceptance <= 1` must hold, got {a!r}")

    @property
    def accepted(self) -> float:
        """Draft tokens a step keeps on average: the i-th is kept when it and every one before it is accepted,
        Σ_{i=1..drafts} acceptance^i. A step yields 1 + this many tokens."""
        return float(sum(self.acceptance**i for i in range(1, self.drafts + 1)))


@dataclass(frozen=True)
class EngineSettings:
    """How the serving engines a plan launches run, as the cost model prices them and the launch files set them."""

    prefill_batch_tokens: int = 16384  # prompt tokens a prefill engine batches at most (SGLang --max-prefill-tokens)
    fp8_combine: bool = False  # decode combine in FP8 on FP4 GPUs (spec 4.11)
    aggregated: bool = False  # an island may also run aggregated engines (prefill and decode in mixed steps)
    # only parallel configurations engines run (attention TP divides the head count); search.shapes=any: the
    # thesis's free ones
    runnable_only: bool = True
    # the share of each GPU's memory an engine holds weights and KV cache in (SGLang --mem-fraction-static, vLLM
    # --gpu-memory-utilization): the rest is the engine's activations and the CUDA context
    mem_fraction: float = MEM_FRACTION
    kv_dtype: str = "auto"  # the KV cache's format (KV_DTYPES)
    # GB of host DRAM per GPU a prefill engine keeps prefix-cache blocks in once they leave GPU memory (SGLang's
    # hierarchical cache, --hicache-size per rank), loaded back over the GPU's host link on a hit (0: no host tier)
    host_cache_gb: float = 0.0
    # the most requests one decode or aggregated engine runs at once, its attention ranks together (SGLang
    # --max-running-requests, vLLM --max-num-seqs): its batch per rank is at most this over its ranks (None: what
    # memory and the SLOs allow)
    max_running_requests: int | None = None

    def __post_init__(self) -> None:
        cap = self.max_running_requests
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise SpecError(f"`max_running_requests >= 1` (a whole number, or null: no cap) must hold, got {cap!r}")
        batch = self.prefill_batch_tokens
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise SpecError(f"`prefill_batch_tokens >= 1` (a whole number) must hold, got {batch!r}")
        f = self.mem_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not MIN_MEM_FRACTION <= f <= MAX_MEM_FRACTION:
            raise SpecError(f"`{MIN_MEM_FRACTION} <= mem_fraction <= {MAX_MEM_FRACTION}` (the share of a GPU's memory "
                            f"an engine holds weights and KV cache in) must hold, got {f!r}")  # fmt: skip
        h = self.host_cache_gb
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not math.isfinite(h) or h < 0:
            raise SpecError(f"`host_cache_gb >= 0` (GB of host memory per GPU for the prefix cache) must hold, got "
                            f"{h!r}")  # fmt: skip
        if self.kv_dtype not in KV_DTYPES:
            raise SpecError(f"kv_dtype must be one of {list(KV_DTYPES)}, got {self.kv_dtype!r}")


@dataclass(frozen=True)
class CostSettings:
    """Everything besides GPU, model and workload that decides a cost-model number (module docstring)."""

    profile: CostProfile = field(default_factory=CostProfile.corrected)
    cache_hit: float = 0.0  # prefix-cache hit rate of prompts
    slo: Slo = field(default_factory=Slo)  # the latency targets (none: throughput only, the thesis's planning)
    engine: EngineSettings = field(default_factory=EngineSettings)
    mtp: Mtp | None = None  # speculative decoding (None: one token a step)

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_hit < 1.0:
            raise SpecError(f"`0 <= cache_hit < 1` must hold, got cache_hit={self.cache_hit!r}")

    @property
    def drafts(self) -> int:
        """Draft tokens every decode step verifies (0 without MTP)."""
        return self.mtp.drafts if self.mtp is not None else 0

    @property
    def accepted(self) -> float:
        """Draft tokens an MTP step keeps on average (0 without MTP): a step yields 1 + this many tokens."""
        return self.mtp.accepted if self.mtp is not None else 0.0

    @property
    def draft_layers(self) -> int:
        """MTP modules an engine runs and holds: one (DeepSeek's MTP head, reused for every draft) with MTP, else 0."""
        return 1 if self.mtp is not None else 0

    def to_json(self) -> dict[str, Any]:
        """Every switch and value, nested as the record is, as plan.json carries it."""
        return fields_data(self)

    @staticmethod
    def from_json(data: Any, where: str) -> CostSettings:
        """The record `to_json` wrote, or the flat `cost` of plan.json schemas 1 and 2; SpecError names `where` and
        the field that is off."""
        if isinstance(data, Mapping) and "switches" in data:
            data = _nested(data, where)
        try:
            return from_fields(CostSettings, data, where)
        except RecordError as err:
            raise SpecError(str(err)) from None


def _nested(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The flat `cost` record of plan.json schemas 1 and 2, in today's nesting (what they lack, at its default: every
    refinement and system switch off, no calibration, no MTP, no aggregated islands)."""
    expected = {"profile", "switches", "cache_hit", "fp8_combine", "ttft_ms", "tpot_ms", "ttft_percentile",
                "tpot_percentile", "prefill_batch_tokens", "engine_configs"}  # fmt: skip
    later = {"calibration", "mtp_drafts", "mtp_acceptance", "aggregated"}  # plans written before these lack them
    if not expected <= set(data) <= expected | later:
        raise SpecError(f"{where}: `cost` must have exactly the fields {sorted(expected)} (and {sorted(later)}), "
                        f"got {sorted(data)}")  # fmt: skip
    switches = data["switches"]
    optional = set(MODEL_DOCS) | set(SYSTEM_DOCS)
    if not isinstance(switches, Mapping) or not set(FIX_DOCS) <= set(switches) <= set(FIX_DOCS) | optional:
        raise SpecError(
            f"{where}: `cost.switches` must give every cost-model fix {sorted(FIX_DOCS)} true or false "
            f"(and may give {sorted(optional)})"
        )
    drafts = data.get("mtp_drafts", 0)
    mtp = None
    if drafts != 0:
        mtp = {"drafts": drafts, "acceptance": data.get("mtp_acceptance", MTP_ACCEPTANCE)}
    return {
        "profile": {"name": data["profile"], **switches, "calibration": data.get("calibration")},
        "cache_hit": data["cache_hit"],
        "slo": {k: data[k] for k in ("ttft_ms", "tpot_ms", "ttft_percentile", "tpot_percentile")},
        "engine": {"prefill_batch_tokens": data["prefill_batch_tokens"], "fp8_combine": data["fp8_combine"],
                   "aggregated": data.get("aggregated", False), "runnable_only": data["engine_configs"]},
        "mtp": mtp,
    }  # fmt: skip

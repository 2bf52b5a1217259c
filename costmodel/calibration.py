"""Calibration: per-GPU efficiency factors of the cost model's components, with their uncertainty.

The cost profiles (`shallowsim`, `corrected`) take every efficiency from the original program:
0.85 of every datasheet peak, 0.7 for attention kernels, a step table for grouped GEMMs, the full
link bandwidth for all-to-all. A `Calibration` multiplies each component's rate by a factor fitted
to measurements (`python -m costmodel.calibrate`), per GPU type:

| knob | multiplies | measured by |
|---|---|---|
| `dense_gemm` | the dense GEMM rate (attention projections, dense MLP) | FP8 GEMM benchmarks |
| `grouped_gemm_prefill` | the expert GEMM rate in prefill (routed, shared experts) | grouped GEMMs, contiguous |
| `grouped_gemm_decode` | the expert GEMM rate in decode, over the efficiency table | grouped GEMMs, masked layout |
| `hbm` | the bandwidth weights stream at | small-M GEMMs (memory-bound) |
| `attention_prefill` | the attention kernel's FLOP rate in prefill | attention prefill kernels |
| `attention_decode` | the attention kernel's FLOP rate in decode | MLA decode kernels, compute-bound |
| `kv_read` | the bandwidth the decode attention kernel reads the KV cache at | MLA decode kernels, memory-bound |
| `a2a_normal` | the link bandwidth of prefill dispatch/combine | expert-parallel all-to-all (normal kernels) |
| `a2a_low_latency` | the link bandwidth of decode dispatch/combine | expert-parallel all-to-all (low-latency kernels) |
| `allreduce` | the link bandwidth of TP all-reduce | all-reduce benchmarks |
| `kv_transfer` | the NIC bandwidth the KV cache moves at from prefill to decode islands | KV transfer benchmarks |
| `gemm_fixed` | 1 / the fixed cost of one dense GEMM kernel (`gemm_roofline` structure) | small dense GEMMs |
| `moe_tp` | the expert kernels' rate on 1/ep-wide slices (experts split by TP) over whole experts' | serving |
| `step_overhead` | 1 / the engine's fixed time per decode step (`step_overhead` structure) | serving |
| `sequence_overhead` | 1 / the engine's time per running sequence a decode step (`sequence_overhead`) | serving |
| `request_overhead` | 1 / a request's fixed time in the front end before its prefill (`request_overhead`) | serving |
| `handoff` | 1 / a disaggregated request's fixed time from prefill to decode beside its KV bytes | serving |
| `prefill_pass` | 1 / a serving engine's whole prefill forward over the kernel model's | serving |
| `model_prefill` | 1 / the whole prefill time: the model's own error, for the range only (factor 1) | residuals |
| `model_decode` | 1 / the whole decode step: the model's own error, for the range only (factor 1) | residuals |

The two `model_*` knobs are not fitted: their factor is 1 and their sigma is what the fitted model still misses on
measurements it never saw (`costmodel.calibrate --residuals`: the leave-one-GPU-out residuals of the end-to-end
fit, origin `residual`), so a rate band drawn from the calibration holds the model's error beside its factors'.

A factor is keyed by a GPU name, by a kernel stack (`cuda`, `rocm`: `GPU.software`) or by `*` (every
GPU), and a GPU's factor is the product of the three: its own, its stack's and every GPU's (each 1
where the calibration has none). Kernel benchmarks are fitted per GPU; end-to-end serving measurements
(InferenceX) per stack and globally, on top of the kernels': what they add (the engines' kernels,
scheduling and overheads beside the microbenchmarks) belongs to the software, and a GPU never measured
end to end takes it from the GPUs of its stack that were.

A factor above 1 means the component runs faster than the profile assumes. Each factor is
lognormal: `factor` is its median, `sigma` the standard deviation of its logarithm. `origin` says
where it came from: `fit` (measurements of this GPU) or `prior` (nothing measured on this GPU for
this knob: 1, the profile's own value, with the prior's sigma). Factors are not carried from one
GPU to another: a knob also absorbs the error of its GPU's catalogue figures (H800's 4000 GB/s
is the spec's, 3350 the datasheet's), which does not transfer. With every factor 1 the numbers
are the profile's, bit for bit.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.specs import SOFTWARE, SpecError
from costmodel.switches import MODEL_DOCS, PROFILE_NAMES

KNOBS: dict[str, str] = {
    "dense_gemm": "dense GEMM rate (attention projections, dense MLP)",
    "grouped_gemm_prefill": "expert (grouped) GEMM rate, prefill",
    "grouped_gemm_decode": "expert (grouped) GEMM rate, decode (over its efficiency table)",
    "hbm": "weight-streaming memory bandwidth",
    "attention_prefill": "attention kernel FLOP rate, prefill",
    "attention_decode": "attention kernel FLOP rate, decode",
    "kv_read": "KV-cache read bandwidth of the decode attention kernel",
    "a2a_normal": "prefill all-to-all link bandwidth (normal kernels)",
    "a2a_low_latency": "decode all-to-all link bandwidth (low-latency kernels)",
    "allreduce": "TP all-reduce link bandwidth",
    "kv_transfer": "KV-cache transfer bandwidth from prefill to decode islands (over the NIC)",
    "gemm_fixed": "1 / the fixed cost of one dense GEMM kernel (pipeline fill, epilogue, tail; gemm_roofline only)",
    "moe_tp": "rate of the expert kernels on 1/ep-wide slices of every expert (experts split by TP), over whole "
    "experts'",
    "step_overhead": "1 / the engine's fixed time per decode step (scheduling, launch, sampling; step_overhead only)",
    "sequence_overhead": "1 / the engine's time per running sequence a decode step outside the kernels "
    "(sequence_overhead only)",
    "request_overhead": "1 / a request's fixed time in the serving front end before its prefill (request_overhead)",
    "handoff": "1 / a disaggregated request's fixed time from prefill to decode beside its KV bytes (request_overhead)",
    "prefill_pass": "1 / a serving engine's prefill forward over the kernel model's: what its pass spends beyond the "
    "kernels (launches without CUDA graphs, scheduling, padding), set by TTFT across prompt lengths",
    "model_prefill": "1 / the whole prefill time: the model's own error on measurements it never saw (factor 1)",
    "model_decode": "1 / the whole decode step: the model's own error on measurements it never saw (factor 1)",
}
# knobs no measurement fits: their sigma is the fitted model's held-out error (costmodel.calibrate --residuals)
RESIDUAL_KNOBS = ("model_prefill", "model_decode")
# the engine behaviour (switches.SYSTEM_DOCS) a calibration fitted to end-to-end serving carries; `experts_fp8` is
# each measurement's own precision, not structure
STRUCTURE_SYSTEM = ("activated_experts", "overlap_chosen", "step_overhead", "sequence_overhead", "dp_imbalance",
                    "request_overhead", "node_dispatch", "lm_head", "draft_passes", "net_allreduce")
Z10 = 1.2815515655446004  # the standard normal's 90th percentile: a lognormal's 10th-90th percentile is +-Z10 sigma
ALL_GPUS = "*"  # a factor under this key holds for every GPU without its own fitted one (nor its stack's)
ORIGINS = ("fit", "prior", "residual")  # residual: a RESIDUAL_KNOBS spread, factor 1


@dataclass(frozen=True)
class Factor:
    factor: float  # median multiplier of the component's rate
    sigma: float  # std of log(factor)
    origin: str  # fit | prior
    rows: int = 0  # measurements of this GPU that inform it

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise SpecError(f"a calibration factor must be a positive number, got {self.factor!r}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise SpecError(f"a calibration sigma must be >= 0, got {self.sigma!r}")
        if self.origin not in ORIGINS:
            raise SpecError(f"a calibration factor's origin must be one of {ORIGINS}, got {self.origin!r}")


@dataclass(frozen=True)
class Calibration:
    """Factors per (GPU, knob); a GPU or knob it does not name keeps factor 1."""

    name: str
    factors: tuple[tuple[str, str, Factor], ...] = ()  # (gpu, knob, factor), sorted
    source: str = ""  # what it was fitted to (file names), for the record
    default_sigma: float = 0.0  # sigma of a (gpu, knob) it does not name
    # the model structure it was fitted with: profile.MODEL_DOCS, and the engine behaviour (STRUCTURE_SYSTEM) an
    # end-to-end fit assumed
    switches: tuple[tuple[str, bool], ...] = ()
    # the named profile whose fixes it was fitted under (costmodel.profile): its factors correct that profile's
    # components, and mean other things under another one ("": not recorded, applied under any)
    profile: str = ""
    # the models whose measured serving its end-to-end factors were fitted to (): kernel tables only, any model)
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        allowed = sorted({*MODEL_DOCS, *STRUCTURE_SYSTEM})
        for name, on in self.switches:
            if name not in allowed or not isinstance(on, bool):
                raise SpecError(f"calibration {self.name!r}: `switches` maps {allowed} to true or false, "
                                f"got {name!r}: {on!r}")  # fmt: skip
        for gpu, knob, _ in self.factors:
            if knob not in KNOBS:
                raise SpecError(f"calibration {self.name!r}: unknown knob {knob!r} for {gpu}; knobs: {list(KNOBS)}")

    @property
    def table(self) -> dict[tuple[str, str], Factor]:
        return {(g, k): f for g, k, f in self.factors}

    def get(self, gpu: str, knob: str, software: str = "") -> Factor:
        """`gpu`'s factor for `knob`: the product of its own, its stack's (`software`) and every GPU's (`*`); the
        sigmas add in quadrature; `fit` where any of them was fitted."""
        t = self.table
        parts = [t[(key, knob)] for key in (gpu, software, ALL_GPUS) if (key, knob) in t]
        if not parts:
            return Factor(1.0, self.default_sigma, "prior")
        if len(parts) == 1:
            return parts[0]
        origin = next((o for o in ORIGINS if any(f.origin == o for f in parts)), "prior")
        sigma = math.sqrt(sum(f.sigma**2 for f in parts))
        return Factor(math.prod(f.factor for f in parts), sigma, origin, sum(f.rows for f in parts))

    def own(self, gpu: str) -> Calibration:
        """Only `gpu`'s own factors (a kernel benchmark's: what its stack's engines add is not in a kernel)."""
        key = ("own", gpu)
        cache = self.__dict__.setdefault("_own", {})
        if key not in cache:
            cache[key] = replace(self, factors=tuple(f for f in self.factors if f[0] == gpu))
        return cache[key]

    def array(
        self, names: Iterable[str], knob: str, shape: tuple[int, ...], software: Iterable[str] = ()
    ) -> np.ndarray:
        """The factors of GPUs `names` (of stacks `software`) for `knob`, shaped like the GPUArray's fields (cached
        on the instance, outside its fields: every cost-model call looks them up)."""
        names = tuple(names)
        key = (names, tuple(software) or ("",) * len(names), knob)
        cache = self.__dict__.setdefault("_arrays", {})
        if key not in cache:
            cache[key] = np.asarray([self.get(n, knob, sw).factor for n, sw in zip(names, key[1], strict=True)],
                                    dtype=float)  # fmt: skip
            cache[key].flags.writeable = False
        return cache[key].reshape(shape)

    @property
    def uncertain(self) -> bool:
        return any(f.sigma > 0 for _, _, f in self.factors)

    def draws(self, n: int, seed: int = 0) -> list[Calibration]:
        """`n` calibrations with every factor drawn from its lognormal (independently). Each factor's draws come
        from a stream of its own, keyed by the seed and the factor's key and knob, so a factor added to or dropped
        from the calibration leaves every other factor's draws as they were."""
        z = np.array([np.random.default_rng([seed, zlib.crc32(f"{g}/{k}".encode())]).standard_normal(n)
                      for g, k, _ in self.factors]).reshape(len(self.factors), n)  # fmt: skip
        out = []
        for i in range(n):
            fs = tuple(
                (g, k, Factor(f.factor * math.exp(f.sigma * zi), 0.0, f.origin, f.rows))
                for (g, k, f), zi in zip(self.factors, z[:, i], strict=True)
            )
            out.append(replace(self, name=f"{self.name}#draw{i}", factors=fs, default_sigma=0.0))
        return out

    def widened(self, gpus: Iterable[str]) -> Calibration:
        """Every `model_*` spread (RESIDUAL_KNOBS, keyed `*`) once more on each of `gpus`, independently: where a
        plan runs outside the configurations the model was fitted on, its error there is taken as twice as
        uncertain (twice the variance) as where it was measured. Unchanged without such spreads."""
        table, spreads = self.table, [(k, f) for g, k, f in self.factors if g == ALL_GPUS and k in RESIDUAL_KNOBS]
        more = tuple((g, k, Factor(1.0, f.sigma, "residual", 0)) for g in sorted(set(gpus)) for k, f in spreads
                     if (g, k) not in table)  # fmt: skip
        if not more:
            return self
        return replace(self, factors=tuple(sorted((*self.factors, *more), key=lambda f: f[:2])))

    def unmeasured(self, model: str, gpus: Iterable[str]) -> Calibration:
        """For a plan of `model`, whose serving no shipped fit measured (`costmodel.measured.MEASURED_MODELS`; a
        published measurement kept for checking only is no fit): `widened` on every one of `gpus` (the model's own
        error is as unknown on each as where a plan extrapolates), and named so."""
        wide = self.widened(gpus)
        name = f"{self.name}, widened: no fit to measured serving of {model}"
        return wide if wide is self else replace(wide, name=name)

    def shifted(self, z: float) -> Calibration:
        """Every factor moved `z` standard deviations (z < 0: the pessimistic side), sigma 0."""
        fs = tuple((g, k, Factor(f.factor * math.exp(z * f.sigma), 0.0, f.origin, f.rows)) for g, k, f in self.factors)
        return replace(self, name=f"{self.name}@{z:+.2f}sigma", factors=fs, default_sigma=0.0)

    def to_json(self) -> dict[str, Any]:
        by_gpu: dict[str, dict[str, Any]] = {}
        for g, k, f in self.factors:
            by_gpu.setdefault(g, {})[k] = {"factor": f.factor, "sigma": f.sigma, "origin": f.origin, "rows": f.rows}
        return {"name": self.name, "source": self.source, **({"profile": self.profile} if self.profile else {}),
                **({"models": list(self.models)} if self.models else {}), "default_sigma": self.default_sigma,
                "switches": dict(self.switches), "factors": by_gpu}  # fmt: skip

    @staticmethod
    def from_json(data: Any, where: str) -> Calibration:
        """The record `to_json` wrote (a calibration file's content); SpecError names `where`."""
        if not isinstance(data, Mapping) or not isinstance(data.get("factors"), Mapping):
            raise SpecError(f"{where}: a calibration is a mapping with `name` and `factors: {{GPU: {{knob: ...}}}}`")
        unknown = sorted(set(data) - {"name", "source", "profile", "models", "default_sigma", "switches", "factors"})
        if unknown:
            raise SpecError(f"{where}: unknown calibration field(s) {unknown}")
        from costmodel.catalog import gpu_names

        known, rows = set(gpu_names()) | set(SOFTWARE) | {ALL_GPUS}, []
        for gpu, knobs in data["factors"].items():
            if str(gpu) not in known:
                raise SpecError(f"{where}: factors: unknown GPU {gpu!r}; the catalogue has {sorted(gpu_names())}, "
                                f"the stacks {list(SOFTWARE)} and {ALL_GPUS!r} (every GPU) are keys too (a "
                                "calibration of another GPU would be silently unused)")  # fmt: skip
            if not isinstance(knobs, Mapping):
                raise SpecError(f"{where}: factors.{gpu} must map knobs to {{factor, sigma, origin}}")
            for knob, f in knobs.items():
                if knob not in KNOBS:
                    raise SpecError(f"{where}: factors.{gpu}: unknown knob {knob!r}; knobs: {list(KNOBS)}")
                if not isinstance(f, Mapping) or not {"factor", "sigma", "origin"} <= set(f):
                    raise SpecError(f"{where}: factors.{gpu}.{knob} needs factor, sigma and origin")
                try:
                    rows.append((str(gpu), str(knob), Factor(float(f["factor"]), float(f["sigma"]), str(f["origin"]),
                                                            int(f.get("rows", 0)))))  # fmt: skip
                except (TypeError, ValueError, SpecError) as err:
                    raise SpecError(f"{where}: factors.{gpu}.{knob}: {err}") from None
        try:
            sigma = float(data.get("default_sigma", 0.0))
        except (TypeError, ValueError):
            raise SpecError(f"{where}: default_sigma must be a number") from None
        switches = data.get("switches") or {}
        if not isinstance(switches, Mapping):
            raise SpecError(f"{where}: `switches` must map model refinements to true or false")
        profile = data.get("profile", "")
        if profile not in ("", *PROFILE_NAMES):
            raise SpecError(f"{where}: profile {profile!r}: the named profile it was fitted under, one of "
                            f"{list(PROFILE_NAMES)}")  # fmt: skip
        models = data.get("models") or []
        if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
            raise SpecError(f"{where}: `models` must list the models whose serving it was fitted to, got {models!r}")
        try:
            return Calibration(str(data.get("name", Path(where).stem)), tuple(sorted(rows, key=lambda r: r[:2])),
                               str(data.get("source", "")), sigma, tuple(sorted(switches.items())),
                               profile, tuple(models))  # fmt: skip
        except SpecError as err:
            raise SpecError(f"{where}: {err}") from None


def load_calibration(path: str | Path) -> Calibration:
    """A calibration file (YAML or JSON) as `python -m costmodel.calibrate` writes it."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise SpecError(f"calibration file {p} not found: give costmodel.calibration=PATH of a file "
                        "`python -m costmodel.calibrate` wrote (conf/calibration/ ships one)")  # fmt: skip
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise SpecError(f"{p}: not a text file (byte {err.start} is not UTF-8): give a calibration file "
                        "`python -m costmodel.calibrate --out` wrote") from None  # fmt: skip
    except yaml.YAMLError as err:
        raise SpecError(f"{p}: not YAML/JSON ({err})") from None
    return Calibration.from_json(data, str(p))


@dataclass
class Knobs:
    """The factor arrays one `Rates` applies (all 1.0 without a calibration)."""

    values: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, knob: str) -> Any:
        return self.values.get(knob, 1.0)


def knobs_for(cal: Calibration | None, names: tuple[str, ...], shape: tuple[int, ...],
              software: tuple[str, ...] = ()) -> Knobs:  # fmt: skip
    if cal is None:
        return Knobs()
    return Knobs({k: cal.array(names, k, shape, software) for k in KNOBS})

"""Fit the cost model's component efficiencies to measurements: `python -m costmodel.calibrate`.

    python -m costmodel.calibrate conf/calibration/published.csv --out my.yaml
    python -m costmodel.calibrate published.csv mine.csv --out my.yaml   # several files, one fit

A measurement file is CSV, one measurement a row:

    component,gpu,shape,value,unit,source
    dense_gemm,H800,m=64 n=2112 k=7168,206,TFLOPS,DeepGEMM README (55ab91f) normal GEMMs table

`component` is one of COMPONENTS, `gpu` a catalogue name, `shape` the `key=value` parameters the
component needs, `value` and `unit` the measurement, `source` where it was published or who
measured it. Every row is checked on load; a bad one stops the load with its file and line.

The fit: each row's value is predicted by the cost model's own formula for that component, as a
function of the knobs (costmodel/calibration.py) it uses; the log of each knob's factor gets a
Gaussian prior (median 1, sigma `--prior-sigma`), and the fit maximises the posterior (least
squares in log space, `scipy.optimize.least_squares`). The sigma of each factor is the Laplace
approximation (the inverse Hessian of the log posterior at the optimum, the measurement scatter
estimated from the residuals). A knob no row of a GPU informs keeps its prior and is reported so.
The leave-one-out error refits without each row and predicts it.

`--residuals DUMP` adds the model's own error to the calibration, for its range: `benchmarks/inferencex_bench.py
--leave-gpu-out --dump DUMP` predicts every fitting GPU's rows under a fit without that GPU, and the spread of
those held-out errors becomes the sigma of the knobs `model_prefill` (TTFT of the rows too few users to queue)
and `model_decode` (TPOT), factor 1 (`model_error`).
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.calibration import ALL_GPUS, KNOBS, RESIDUAL_KNOBS, STRUCTURE_SYSTEM, Z10, Calibration, Factor
from costmodel.catalog import CONF_DIR, CatalogError, gpu_names, load_gpu, load_model
from costmodel.cli import ArgumentParser, UserError, run
from costmodel.formulas import (
    DECODE_A2A_LATENCY_MS,
    MLA_DISCOUNT,
    DecodeRun,
    Rates,
    _a2a_split_ms,
    _allreduce_ms,
    _gemm_ms,
    _grouped_gemm_ms,
    _h20_table,
    _xfer_ms,
    decode_step_ms,
    kv_bytes_per_seq,
    kv_link_gb_s,
    prefill_chunk_ms,
    prefill_time_ms,
    request_overheads_ms,
)
from costmodel.measured import FITTING_GPUS, INFERENCEX, QUEUE_FREE_USERS, load_inferencex, serving_rows
from costmodel.measurements import COMPONENTS, Measurement, load_measurements
from costmodel.profile import CostProfile
from costmodel.specs import GPUArray
from costmodel.switches import MODEL_DOCS

# the kernel tables every shipped calibration is fitted to: the kernel libraries' published benchmarks. Not the rows
# this project measured with PyTorch's own kernels (measured.csv, benchmarks/device_kernels.py): the engines run the
# libraries' kernels, and fitted beside InferenceX those rows made the held-out TPOT error 20 % where it is 13 %
# (docs/costmodel.md, "Kernels measured here")
KERNEL_TABLES = (CONF_DIR / "calibration" / "published.csv",)
# the prior sigma of end-to-end factors (log): chosen by the leave-one-GPU-out error within the fitting GPUs (the
# TPOT of H200, B200 and MI300X rows, each predicted by a fit without its GPU: 18 % at 0.3, 16 % at 0.15, 14 % at
# 0.1; benchmarks/inferencex_bench.py --leave-gpu-out), never by the check GPUs
SERVING_PRIOR_SIGMA = 0.1
# end-to-end knobs that are the serving engines' own, whatever the GPU: fitted once for every GPU (`*`)
ENGINE_KNOBS = ("moe_tp", "step_overhead", "sequence_overhead", "request_overhead", "handoff", "prefill_pass")
# end-to-end knobs whose prior is an order of magnitude, not a figure from a profile: their prior sigma (log), wide
# enough that the measurements set them
GUESSED_PRIOR_SIGMA = {"sequence_overhead": 1.0}

TIME_UNITS = {"s": 1e3, "ms": 1.0, "us": 1e-3}
FIT_MAX_S = 1800.0  # the longest fit, its leave-one-out refits included, the command starts (`fit_seconds`)
# least_squares' passes over a stage's rows per free factor (+ 1): the kernel stage of published.csv took 7, the
# serving stage of inferencex_dsr1.csv 14 (costmodel.calibrate prints its estimate beside the fit's time)
PASSES_PER_FACTOR = 15


# --- predictions: the cost model's own formula for each component ---------------------------------


def predict(row: Measurement, profile: CostProfile) -> float:
    """The row's quantity, in its unit, as the cost model (with `profile`'s calibration) gives it. A kernel
    benchmark measures the kernel alone: its GPU's own factors, not what its stack's engines add (`Calibration`)."""
    if COMPONENTS[row.component].keyed == "gpu" and profile.calibration is not None:
        profile = replace(profile, calibration=profile.calibration.own(row.gpu))
    gpu = load_gpu(row.gpu)
    g = GPUArray.of(gpu)
    p = row.params
    r = Rates(g, "decode", profile)  # kernel benchmarks run on every SM
    c = row.component
    if c == "dense_gemm":
        gflop = 2.0 * p["m"] * p["n"] * p["k"] / 1e9
        ms = _gemm_ms(np.asarray(float(p["m"])), p["n"], p["k"], r, profile)
    elif c == "grouped_gemm":
        gflop = 2.0 * p["groups"] * p["m"] * p["n"] * p["k"] / 1e9
        if p["layout"] == "masked":  # decode's kernel: the efficiency table at m tokens per expert
            m = np.asarray(float(p["m"]))
            compute = _grouped_gemm_ms(np.asarray(gflop), m, r.expert, _h20_table(g, profile), profile)
        else:  # prefill's: the plain rate, its own knob
            k = r.knobs
            compute = gflop / (r.expert / k["grouped_gemm_decode"] * k["grouped_gemm_prefill"])
        ms = compute + _xfer_ms(p["groups"] * p["n"] * p["k"] * r.wbytes, r.bw, profile)
    elif c == "attention_prefill":
        return float(r.f16 * r.knobs["attention_prefill"] * MLA_DISCOUNT)
    elif c == "attention_decode":
        return float(r.attn * MLA_DISCOUNT if row.unit == "TFLOPS" else r.kv_bw)
    elif c == "a2a_normal":
        link = r.nvl if p["ep"] <= gpu.gpus_per_node else r.net
        return float(link * r.knobs["a2a_normal"])  # `r` is decode's: its own a2a is the low-latency knob
    elif c == "a2a_low_latency":
        elem = 1.0 if p["op"] == "dispatch" else 2.0
        nbytes = p["tokens"] * p["hidden"] * p["topk"] * elem
        # the cost model's split, over a scale-up domain of one GPU where the kernels used only the NIC
        links = g if p.get("links", "nvlink+nic") == "nvlink+nic" else GPUArray.of(replace(gpu, gpus_per_node=1))
        ms = _a2a_split_ms(np.asarray(nbytes), np.asarray(p["ep"]), links, r, profile) + DECODE_A2A_LATENCY_MS
    elif c == "allreduce":
        tp = np.asarray(p["tp"])
        tokens = p["bytes"] / (load_model("deepseek_v3").hidden * 2.0)  # _allreduce_ms counts BF16 hidden vectors
        ms = _allreduce_ms(np.asarray(tokens), load_model("deepseek_v3"), tp, g, r, profile)
    elif c == "kv_transfer":
        if row.unit == "GB/s":
            return float(r.kv_link)
        ms = _xfer_ms(p["bytes"], r.kv_link, profile)
    elif c == "prefill_step":
        model = load_model(p.get("model", "deepseek_v3"))
        s = np.asarray(p["input_len"], dtype=float)  # the batch's prompts in one forward (an extend batch)
        ms = prefill_chunk_ms(gpu, model, p["batch"] * s, s, np.asarray(p["tp"]), np.ones(1), profile=profile)[0]
    elif c == "decode_step":
        model = load_model(p.get("model", "deepseek_v3"))
        ms = decode_step_ms(gpu, model, p["context"], p["batch"], p["tp"], p["tp"], profile=profile)
    elif c == "serving_tpot":
        ms = serving_tpot_ms(gpu, p, profile)
    elif c == "serving_ttft":
        ms = serving_ttft_ms(gpu, p, profile)
    else:  # pragma: no cover - COMPONENTS and this function list the same names
        raise AssertionError(c)
    ms = float(ms)
    if row.unit == "TFLOPS":
        return gflop / ms
    return ms / TIME_UNITS[row.unit]


def serving_tpot_ms(gpu: Any, p: dict[str, Any], profile: CostProfile) -> float:
    """A closed-loop benchmark's time per output token (ms) in its steady state: the decode step at the users'
    batch, per token it yields, plus on an aggregated engine the prompts it prefills meanwhile (each user
    starts a prompt every `output_len` tokens; the prompts a step takes are one forward spread over the engine's
    `ep / tp` attention ranks, `formulas.prefill_chunk_ms`). The simulator (simulator.core, simulator.aggregated)
    runs the same steps request by request; this is what a fit can afford to evaluate thousands of times."""
    model = load_model(p.get("model", "deepseek_v3"))
    prof = profile.with_fixes(experts_fp8=p.get("precision", "fp8") == "fp8")
    run = DecodeRun(draft_tokens=p.get("drafts", 0), moe_tp=p.get("moe", "ep") == "tp", kv_dtype=p.get("kv", "auto"))
    step = decode_step_ms(gpu, model, p["context"], p["batch"], p["tp"], p["ep"], profile=prof, run=run)
    ms = float(step) / (1.0 + p.get("accepted_pct", 0) / 100.0)
    if "users" in p:
        # a step's chunk holds the prompts that arrived since the last: `users` / `output_len` a step on average,
        # so a share 1 - exp(-that) of the steps prefill (Poisson), each those prompts in one forward over the ranks
        ranks = p["ep"] // p["tp"]
        arrived = p["users"] / p["output_len"]
        share = -math.expm1(-arrived)
        s = np.array([float(p["prefill_len"])])
        chunk = prefill_chunk_ms(gpu, model, s * arrived / share, s, np.array([p["tp"]]), np.array([ranks]),
                                 profile=prof)  # fmt: skip
        ms += share * float(chunk[0])
    return ms


def serving_ttft_ms(gpu: Any, p: dict[str, Any], profile: CostProfile) -> float:
    """A closed-loop benchmark's time to first token (ms) with too few users to queue: the front end's fixed time,
    the prompt's prefill on one attention rank, and disaggregated its KV transfer and hand-off; aggregated, the
    prompt is a forward spread over the engine's `dp` ranks (`formulas.prefill_chunk_ms`) beside one decode step of
    the others (simulator.aggregated)."""
    model = load_model(p.get("model", "deepseek_v3"))
    prof = profile.with_fixes(experts_fp8=p.get("precision", "fp8") == "fp8")
    front, handoff = request_overheads_ms(prof)
    tokens, tp, dp = np.array([float(p["input"])]), np.array([p["tp"]]), np.array([p["dp"]])
    if p.get("engine", "disagg") == "disagg":
        pre = float(prefill_time_ms(gpu, model, tokens, tp, dp, cache_hit=0.0, profile=prof)[0])
        kv = float(kv_bytes_per_seq(gpu, model, tokens, np.array([1.0]), prof, kv_dtype=p.get("kv", "auto"))[0])
        link = float(kv_link_gb_s(gpu, prof)) * p["tp"]
        return front + pre + kv / (link * 1e9) * 1e3 + handoff
    run = DecodeRun(moe_tp=p.get("moe", "ep") == "tp", kv_dtype=p.get("kv", "auto"))
    step = decode_step_ms(gpu, model, p.get("context", p["input"]), p.get("batch", 1), p["tp"], p.get("ep", p["dp"]),
                          profile=prof, run=run)  # fmt: skip
    # an engine polling for requests every `recv` decode steps (simulator.aggregated) while others decode: the prompt
    # waits half of them on average beyond the half step any engine makes it wait
    unseen = (p.get("recv", 1) - 1) / 2 if p.get("batch", 1) > 1 else 0.0
    chunk = float(prefill_chunk_ms(gpu, model, tokens, tokens, tp, dp, profile=prof)[0])
    return front + chunk + float(step) * (1.0 + unseen)


# --- the fit -----------------------------------------------------------------------------------------


@dataclass
class Fit:
    calibration: Calibration
    rows: list[Measurement]
    before: np.ndarray  # log(pred / measured) under the base profile
    after: np.ndarray  # ... under the calibration
    scatter: float  # estimated sigma of one measurement's log error
    seconds: float


def refined(base: CostProfile) -> CostProfile:
    """`base` with every structure refinement (profile.MODEL_DOCS) on."""
    return base.with_fixes(**dict.fromkeys(MODEL_DOCS, True))


def default_base() -> CostProfile:
    """The structure a calibration is fitted on unless told: `corrected` with every refinement."""
    return refined(CostProfile.corrected())


def structure(base: CostProfile) -> tuple[tuple[str, bool], ...]:
    """`base`'s refinement switches, and the engine behaviour it assumes where on (STRUCTURE_SYSTEM), which a
    calibration fitted on it carries."""
    system = [(k, True) for k in STRUCTURE_SYSTEM if getattr(base, k)]
    return tuple(sorted([*((k, bool(getattr(base, k))) for k in MODEL_DOCS), *system]))


def serving_base(base: CostProfile) -> CostProfile:
    """`base` with the engine behaviour end-to-end serving measurements are fitted with (STRUCTURE_SYSTEM)."""
    return base.with_fixes(**dict.fromkeys(STRUCTURE_SYSTEM, True))


def key_of(row: Measurement, knob: str) -> str:
    """Whose factor of `knob` a row informs: its GPU's for kernel benchmarks; for end-to-end serving, `*` (every
    GPU) for `moe_tp` and the GPU's kernel stack otherwise."""
    if COMPONENTS[row.component].keyed == "gpu":
        return row.gpu
    return ALL_GPUS if knob in ENGINE_KNOBS else load_gpu(row.gpu).software


def knobs_of(row: Measurement, base: CostProfile) -> tuple[str, ...]:
    """The knobs a row's prediction depends on under `base`'s structure."""
    knobs = COMPONENTS[row.component].knobs
    if not base.gemm_roofline:
        knobs = tuple(k for k in knobs if k != "gemm_fixed")
    if row.component == "grouped_gemm":
        drop = "grouped_gemm_decode" if row.params["layout"] == "contiguous" else "grouped_gemm_prefill"
        knobs = tuple(k for k in knobs if k != drop)
    if row.component == "attention_decode":  # compute-bound rows measure the FLOP rate, memory-bound the KV reads
        knobs = ("attention_decode",) if row.unit == "TFLOPS" else ("kv_read",)
    if row.component == "serving_ttft":
        p = row.params
        if p.get("engine", "disagg") == "disagg":
            # prefill (its TP all-reduces too), transfer and hand-off: no decode step
            decode = ("grouped_gemm_decode", "attention_decode", "kv_read", "a2a_low_latency", "moe_tp",
                      "step_overhead", "sequence_overhead")  # fmt: skip
            knobs = tuple(k for k in knobs if k not in decode)
        else:
            knobs = tuple(k for k in knobs if k not in ("handoff", "kv_transfer"))
            if p.get("moe", "ep") == "ep":
                knobs = tuple(k for k in knobs if k != "moe_tp")
    if row.component == "serving_tpot":
        p = row.params
        drop = {"moe_tp"} if p.get("moe", "ep") == "ep" else {"a2a_low_latency"}
        if "users" not in p:  # a decode engine alone: no prefill
            drop |= {"attention_prefill", "grouped_gemm_prefill"}
        knobs = tuple(k for k in knobs if k not in drop)
    return knobs


def _params(rows: Sequence[Measurement], base: CostProfile) -> list[tuple[str, str]]:
    """The (GPU, knob) pairs the rows inform, in a fixed order."""
    seen: dict[tuple[str, str], None] = {}
    for row in rows:
        for knob in knobs_of(row, base):
            seen[(key_of(row, knob), knob)] = None
    return list(seen)


def _calibration(pairs: list[tuple[str, str]], theta: np.ndarray, sigma: np.ndarray,
                 counts: dict[tuple[str, str], int], *, name: str, prior_sigma: float, source: str,
                 switches: tuple[tuple[str, bool], ...], profile: str = "", models: tuple[str, ...] = (),
                 held: tuple[tuple[str, str, Factor], ...] = ()) -> Calibration:  # fmt: skip
    fs = [(g, k, Factor(float(math.exp(t)), float(s), "fit", counts.get((g, k), 0)))
          for (g, k), t, s in zip(pairs, theta, sigma, strict=True)] + list(held)  # fmt: skip
    fitted = {(g, k) for g, k, _ in fs}
    for g in gpu_names():  # a GPU's prior stands below its stack's and every GPU's fits (Calibration.get)
        for k in KNOBS:
            if (g, k) not in fitted and k not in RESIDUAL_KNOBS:
                fs.append((g, k, Factor(1.0, prior_sigma, "prior", 0)))
    return Calibration(name, tuple(sorted(fs, key=lambda f: f[:2])), source, prior_sigma, switches, profile, models)


def log_errors(rows: Sequence[Measurement], profile: CostProfile) -> np.ndarray:
    return np.array([math.log(predict(r, profile) / r.value) for r in rows])


def fit(rows: Sequence[Measurement], base: CostProfile | None = None, prior_sigma: float = 0.3,
        name: str = "calibration", source: str = "", serving_sigma: float = SERVING_PRIOR_SIGMA,
        start: Calibration | None = None) -> Fit:  # fmt: skip
    """The maximum a-posteriori factors for `rows` over `base` (default: `default_base()`), searched from `start`'s
    factors where given (a refit of an earlier calibration converges in a few passes), else from the prior's.

    Kernel benchmarks and end-to-end serving rows are fitted in that order: first each GPU's own factors to its
    kernels (a kernel's prediction uses only those: `predict`), then the stacks' and every GPU's factors to the
    serving rows with the kernels' held, so what an engine adds beside its kernels cannot move them."""
    t0 = time.perf_counter()
    base = base or default_base()
    rows = list(rows)
    if not rows:
        raise UserError("no measurements to fit")
    serving = [r for r in rows if COMPONENTS[r.component].keyed == "stack"]
    if not serving:
        cal, scatter = _fit(rows, base, prior_sigma, name, source, serving_sigma, start=start)
    else:
        base = serving_base(base)  # end-to-end rows: the engines' behaviour
        kernels = [r for r in rows if COMPONENTS[r.component].keyed == "gpu"]
        held: tuple[tuple[str, str, Factor], ...] = ()
        if kernels:
            first, _ = _fit(kernels, base, prior_sigma, name, source, serving_sigma, start=start)
            held = tuple(f for f in first.factors if f[2].origin == "fit")
        cal, scatter = _fit(serving, base, prior_sigma, name, source, serving_sigma, held=held, start=start)
    calibrated = base.calibrated(cal)
    return Fit(cal, rows, log_errors(rows, base), log_errors(rows, calibrated), scatter, time.perf_counter() - t0)


def fit_seconds(rows: Sequence[Measurement], base: CostProfile) -> float:
    """About how long `fit(rows, base)` takes, on the safe side: per stage (kernels, then serving rows),
    `PASSES_PER_FACTOR` x (its Jacobian's evaluations, `column_groups`, + 1) passes over its rows, a pass timed on up
    to 64 of them."""
    serving = [r for r in rows if COMPONENTS[r.component].keyed == "stack"]
    if serving:
        base = serving_base(base)
    total = 0.0
    for stage in ([r for r in rows if r not in serving] if serving else list(rows)), serving:
        if not stage:
            continue
        sample = stage[:: max(len(stage) // 64, 1)]
        t0 = time.perf_counter()
        for row in sample:
            predict(row, base)
        pass_s = (time.perf_counter() - t0) / len(sample) * len(stage)
        groups = column_groups(sparsity(stage, _params(stage, base), base))
        total += PASSES_PER_FACTOR * (len(groups) + 1) * pass_s
    return total


def _fit(rows: list[Measurement], base: CostProfile, prior_sigma: float, name: str, source: str,
         serving_sigma: float, *, held: tuple[tuple[str, str, Factor], ...] = (),
         start: Calibration | None = None) -> tuple[Calibration, float]:  # fmt: skip
    """One stage of `fit`: the factors `rows` inform, with the `held` ones fixed (searched from `start`'s); and the
    measurement scatter."""
    from scipy.optimize import least_squares

    switches = structure(base)
    fixed = {(g, k) for g, k, _ in held}
    pairs = [pair for pair in _params(rows, base) if pair not in fixed]
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        for knob in knobs_of(row, base):
            key = (key_of(row, knob), knob)
            counts[key] = counts.get(key, 0) + 1
    logv = np.log([r.value for r in rows])
    # a GPU's kernel factors start at `prior_sigma`; the end-to-end factors (a stack's, every GPU's) correct rates
    # the kernel tables already set, at `serving_sigma`
    gpus = set(gpu_names())
    serving = min(prior_sigma, serving_sigma)
    priors = np.array([prior_sigma if g in gpus else max(GUESSED_PRIOR_SIGMA.get(k, 0.0), serving)
                       for g, k in pairs])  # fmt: skip
    meas_sigma = 0.1  # the fit's weighting only; the reported sigma uses the residual scatter

    def profile_of(theta: np.ndarray) -> CostProfile:
        free = ((g, k, Factor(float(math.exp(t)), 0.0, "fit")) for (g, k), t in zip(pairs, theta, strict=True))
        fs = tuple(sorted((*free, *held), key=lambda f: f[:2]))
        return base.calibrated(Calibration(name, fs, switches=switches))

    last: list[tuple[bytes, np.ndarray]] = []  # the residuals at the last point asked (the Jacobian's base)

    def residuals(theta: np.ndarray) -> np.ndarray:
        prof = profile_of(theta)
        pred = np.log([predict(r, prof) for r in rows])
        out = np.concatenate([(pred - logv) / meas_sigma, theta / priors])
        last[:] = [(theta.tobytes(), out)]
        return out

    reads = sparsity(rows, pairs, base)
    groups = column_groups(reads)

    def jacobian(theta: np.ndarray) -> np.ndarray:
        f0 = last[0][1] if last and last[0][0] == theta.tobytes() else residuals(theta)
        return forward_differences(residuals, theta, f0, reads, groups)

    # soft-L1 (Huber-like) loss: a row whose shape the model's structure cannot follow (an error
    # past ~10 %) weighs linearly, not quadratically, so it does not drag the factor off the rest
    began = {} if start is None else {(g, k): math.log(f.factor) for g, k, f in start.factors}
    sol = least_squares(residuals, np.array([began.get(p, 0.0) for p in pairs]), jac=jacobian, method="trf",
                        loss="soft_l1", f_scale=1.0)  # fmt: skip
    n = len(rows)
    data_res = sol.fun[:n] * meas_sigma
    dof = max(n - len(pairs), 1)
    scatter = max(float(np.sqrt(np.sum(data_res**2) / dof)), 0.02)
    j = sol.jac.copy()
    j[:n] *= meas_sigma / scatter  # re-weight the data rows by the scatter actually seen
    try:
        cov = np.linalg.inv(j.T @ j)
        sigma = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    except np.linalg.LinAlgError:
        sigma = priors.copy()
    cal = _calibration(pairs, sol.x, np.minimum(sigma, priors), counts, name=name, prior_sigma=prior_sigma,
                       source=source, switches=switches, profile=base.fixes_of(), models=_served(rows),
                       held=held)  # fmt: skip
    return cal, scatter


def sparsity(rows: Sequence[Measurement], pairs: Sequence[tuple[str, str]], base: CostProfile) -> np.ndarray:
    """Which of the factors `pairs` each row's prediction reads (its knobs, `knobs_of`, keyed as the row is), then one
    row per factor for its prior: the fit's residuals by its factors, True where one may move the other."""
    at = {pair: j for j, pair in enumerate(pairs)}
    reads = np.zeros((len(rows) + len(pairs), len(pairs)), dtype=bool)
    for i, row in enumerate(rows):
        for knob in knobs_of(row, base):
            j = at.get((key_of(row, knob), knob))
            if j is not None:
                reads[i, j] = True
    reads[len(rows):] = np.eye(len(pairs), dtype=bool)
    return reads


def column_groups(reads: np.ndarray) -> list[np.ndarray]:
    """The factors in groups that no residual reads two of (greedily, in order: Curtis, Powell and Reid), so one
    evaluation of the residuals differences a whole group: a stack's factors and another stack's, every GPU's own."""
    groups: list[list[int]] = []
    taken: list[np.ndarray] = []
    for j in range(reads.shape[1]):
        for group, rows in zip(groups, taken, strict=True):
            if not (rows & reads[:, j]).any():
                group.append(j)
                rows |= reads[:, j]
                break
        else:
            groups.append([j])
            taken.append(reads[:, j].copy())
    return [np.array(g) for g in groups]


def forward_differences(fun: Callable[[np.ndarray], np.ndarray], x: np.ndarray, f0: np.ndarray, reads: np.ndarray,
                        groups: Sequence[np.ndarray]) -> np.ndarray:  # fmt: skip
    """The Jacobian of `fun` at `x` (`f0` = fun(x)) by forward differences at SciPy's 2-point step (the square root of
    the machine epsilon, relative past 1), one evaluation a group of `column_groups`, each column's difference kept
    on the residuals that read it (`reads`): what a column at a time gives, in fewer evaluations."""
    step = np.finfo(float).eps ** 0.5 * np.where(x >= 0, 1.0, -1.0) * np.maximum(1.0, np.abs(x))
    jac = np.zeros(reads.shape)
    for group in groups:
        moved = x.copy()
        moved[group] += step[group]
        df = fun(moved) - f0
        for j in group:
            jac[reads[:, j], j] = df[reads[:, j]] / (moved[j] - x[j])
    return jac


def _served(rows: Sequence[Measurement]) -> tuple[str, ...]:
    """The models whose measured serving `rows` hold (their end-to-end rows'; kernel rows are any model's)."""
    return tuple(sorted({str(dict(r.shape).get("model", "deepseek_v3")) for r in rows
                         if COMPONENTS[r.component].keyed == "stack"}))  # fmt: skip


def leave_one_out(rows: Sequence[Measurement], base: CostProfile | None = None, prior_sigma: float = 0.3) -> np.ndarray:
    """log(pred / measured) of each row under a fit to all the other rows."""
    base = base or default_base()
    out = []
    for i, row in enumerate(rows):
        rest = [r for j, r in enumerate(rows) if j != i]
        cal = fit(rest, base, prior_sigma).calibration
        out.append(math.log(predict(row, base.calibrated(cal)) / row.value))
    return np.array(out)


# --- the command ------------------------------------------------------------------------------------


def summary(rows: Sequence[Measurement], columns: dict[str, np.ndarray]) -> str:
    """Median |error| per component and overall, one column per model (errors in log space -> %)."""
    head = "| component | rows | " + " | ".join(columns) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(columns)]
    comps = sorted({r.component for r in rows}, key=list(COMPONENTS).index)
    for comp in [*comps, "all"]:
        idx = [i for i, r in enumerate(rows) if comp in ("all", r.component)]
        cells = [f"{100 * (math.exp(float(np.median(np.abs(v[idx])))) - 1):.1f} %" for v in columns.values()]
        label = "**all**" if comp == "all" else comp
        lines.append(f"| {label} | {len(idx)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def factor_table(cal: Calibration, gpus: Iterable[str] | None = None) -> str:
    gpus = sorted(set(gpus) if gpus is not None else {g for g, _, _ in cal.factors})
    lines = ["| GPU | knob | factor | sigma (log) | origin | rows |", "|---|---|---:|---:|---|---:|"]
    for g, k, f in cal.factors:
        if g in gpus:
            lines.append(f"| {g} | {k} | {f.factor:.3f} | {f.sigma:.3f} | {f.origin} | {f.rows} |")
    return "\n".join(lines)


def write_calibration(cal: Calibration, path: Path, header: str = "") -> None:
    import yaml

    text = yaml.safe_dump(cal.to_json(), sort_keys=False, width=110)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((header + "\n" if header else "") + text)
    except OSError as err:
        raise UserError(f"--out {path}: cannot write the calibration there ({err.strerror or err}): choose a file "
                        "in a folder you can write") from None  # fmt: skip


HELD_OUT_SHARE = 0.8  # a model_* sigma puts this share of the held-out errors within its 10th-90th percentile


def model_error(dump: str | Path, measured: str | Path = INFERENCEX, *,
                every_row: bool = False) -> tuple[tuple[str, str, Factor], ...]:  # fmt: skip
    """The `model_prefill` and `model_decode` spreads (keyed `*`, factor 1, origin `residual`) from a
    `inferencex_bench.py --leave-gpu-out --dump` file: of the fitting GPUs' rows, each predicted by a fit without
    its GPU, the TTFT errors of rows with at most QUEUE_FREE_USERS users (prefill and the request's fixed times,
    as the fit takes TTFT) and the TPOT errors (decode). Each sigma is set so that the lognormal's 10th-90th
    percentile holds HELD_OUT_SHARE of those errors: |log(predicted / measured)| at that quantile over Z10.
    `every_row`: the dump of a model fitted to no end-to-end row (`inferencex_bench.py --extra costmodel=calibrated
    --dump`): every row of the fitting GPUs is one it never saw, held out or not; the check GPUs' rows stay out, to
    judge the range."""
    rows = {r.line: r for r in load_inferencex(measured)}
    errors: dict[str, list[float]] = {"model_prefill": [], "model_decode": []}
    path = Path(dump)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            for k, d in enumerate(csv.DictReader(f), start=2):
                if d.get("held_out") != "1" and not every_row:
                    continue
                row = rows.get(int(d["line"]))
                if every_row and row is not None and not row.fitting:
                    continue  # a check GPU's row: it judges the range, and sets nothing
                if row is None or not row.fitting:
                    raise UserError(f"{path}:{k}: line {d['line']} is not a fitting GPU's row of {measured}")
                pairs = [("model_decode", "median_tpot")]
                if row.conc <= QUEUE_FREE_USERS:
                    pairs.append(("model_prefill", "median_ttft"))
                for knob, metric in pairs:
                    pred, meas = d.get(f"{metric}_pred"), d.get(f"{metric}_meas")
                    if pred and meas:
                        errors[knob].append(math.log(float(pred) / float(meas)))
    except (OSError, KeyError, ValueError) as err:
        raise UserError(f"{path}: not a `inferencex_bench.py --leave-gpu-out --dump` file ({err})") from None
    out = []
    for knob in RESIDUAL_KNOBS:
        e = np.abs(np.asarray(errors[knob]))
        if len(e) < 10:
            raise UserError(f"{path}: {len(e)} held-out errors for {knob}; run the bench with --leave-gpu-out")
        out.append((ALL_GPUS, knob, Factor(1.0, float(np.quantile(e, HELD_OUT_SHARE)) / Z10, "residual", len(e))))
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m costmodel.calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("data", nargs="+", help="measurement CSV file(s)")
    ap.add_argument("--out", type=Path, help="write the calibration here (YAML); costmodel.calibration=PATH uses it")
    ap.add_argument("--name", help="the calibration's name (default: the output file's stem)")
    ap.add_argument("--base", default="corrected", help="the profile whose components it calibrates")
    ap.add_argument("--plain", action="store_true",
                    help=f"fit the profile's own structure, without the refinements {sorted(MODEL_DOCS)}")  # fmt: skip
    ap.add_argument("--prior-sigma", type=float, default=0.3, help="sigma of log(factor) before any measurement")
    ap.add_argument("--no-loo", action="store_true", help="skip the leave-one-out error (one refit per row)")
    ap.add_argument("--serving", type=Path, metavar="CSV",
                    help="also fit end-to-end serving: the median TPOT of an InferenceX extract's rows on the fitting "
                         "GPUs (costmodel.measured.FITTING_GPUS; every other GPU's rows are never fitted), e.g. "
                         "conf/measured/inferencex_dsr1.csv")  # fmt: skip
    ap.add_argument("--residuals", type=Path, metavar="DUMP",
                    help="add the model's held-out error as the range's model_prefill and model_decode spreads: "
                         "the dump of benchmarks/inferencex_bench.py --leave-gpu-out --dump DUMP (with --serving), "
                         "or of every row under the kernel tables alone (without: --extra costmodel=calibrated "
                         "--dump DUMP)")  # fmt: skip
    args = ap.parse_args(argv)
    if not args.prior_sigma > 0:
        raise UserError(f"--prior-sigma must be > 0, got {args.prior_sigma}")
    try:
        base = CostProfile.named(args.base)
        if not args.plain:
            base = refined(base)
    except ValueError as err:
        raise UserError(str(err)) from None
    rows = load_measurements(args.data)
    name = args.name or (args.out.stem if args.out else "calibration")
    source = ", ".join(Path(d).name for d in args.data)
    if args.serving:
        serving = serving_rows(args.serving)
        rows += serving
        base = serving_base(base)  # the engine behaviour end-to-end rows are fitted with (the fit would set it)
        source += f", {args.serving.name} ({len(serving)} rows of {', '.join(FITTING_GPUS)})"
    estimate = _announced(rows, base, loo=not args.no_loo)
    f = fit(rows, base, args.prior_sigma, name, source)
    if args.residuals:
        spreads = model_error(args.residuals, every_row=not args.serving)  # no --serving: no row was fitted
        cal = f.calibration
        f = replace(f, calibration=replace(cal, factors=tuple(sorted((*cal.factors, *spreads), key=lambda x: x[:2])),
                                           source=f"{cal.source}; residuals {args.residuals.name}"))  # fmt: skip
    print(f"{len(rows)} measurements of {len({r.gpu for r in rows})} GPU(s), {len({r.component for r in rows})} "
          f"component(s); fit in {f.seconds:.2f} s (estimated {estimate:.2f} s), "
          f"measurement scatter {100 * f.scatter:.1f} % (log sigma)\n")  # fmt: skip
    cols = {f"{base.name} (before)": f.before, "fitted (in-sample)": f.after}
    if not args.no_loo:
        cols["fitted (leave-one-out)"] = leave_one_out(rows, base, args.prior_sigma)
    print("Median |error| of the predictions, per component:\n")
    print(summary(rows, cols))
    print("\nFactors of the measured GPUs:\n")
    print(factor_table(f.calibration, {key_of(r, k) for r in rows for k in knobs_of(r, base)} | {r.gpu for r in rows}))
    unmeasured = sorted({g for g, _, fc in f.calibration.factors if fc.origin == "prior"} - {r.gpu for r in rows})
    print(f"\nNo measurements for {', '.join(unmeasured) or 'no other GPU'}: every knob keeps its prior "
          f"(factor 1, sigma {args.prior_sigma}), "
          "and so does every knob of a measured GPU no row informs.")  # fmt: skip
    if args.out:
        command = " ".join([*args.data, *(["--serving", str(args.serving)] if args.serving else []),
                            *(["--residuals", str(args.residuals)] if args.residuals else []),
                            *(["--base", args.base] if args.base != "corrected" else []),
                            *(["--plain"] if args.plain else [])])  # fmt: skip
        write_calibration(f.calibration, args.out, f"# python -m costmodel.calibrate {command}")
        print(f"\nwrote {args.out}; use it with costmodel.calibration={args.out}")
    return 0


def _announced(rows: Sequence[Measurement], base: CostProfile, loo: bool) -> float:
    """The fit's estimated seconds (`fit_seconds`); said first where the fit and its leave-one-out refits (`loo`)
    take over 10 s, refused past `FIT_MAX_S`."""
    one = fit_seconds(rows, base)
    refits = len(rows) * one if loo else 0.0
    if one + refits > FIT_MAX_S:
        how = ("add --no-loo (the leave-one-out refits, one per row, take the rest), or " if one <= FIT_MAX_S / 2
               else "")  # fmt: skip
        raise UserError(f"fitting {len(rows):,} rows takes about {_minutes(one)}"
                        + (f" and its leave-one-out refits {_minutes(refits)}" if refits else "")
                        + f", over the {_minutes(FIT_MAX_S)} this command starts: {how}fit fewer rows")  # fmt: skip
    if one + refits > 10:
        print(f"fitting {len(rows):,} rows: about {_minutes(one)}"
              + (f", then {_minutes(refits)} of leave-one-out refits (--no-loo skips them)" if refits else ""),
              flush=True)  # fmt: skip
    return one


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:,.0f} min"


if __name__ == "__main__":
    run(main, (CatalogError,))

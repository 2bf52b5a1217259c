"""Measurements of the cost model's components: what one looks like (`COMPONENTS`), the record (`Measurement`) and
the reader of a measurement file (`load_measurements`), shared by the fit (costmodel/calibrate.py) and the
end-to-end rows (costmodel/measured.py).

A measurement file is CSV, one measurement a row (`component,gpu,shape,value,unit,source`); every row is checked
on load and a bad one stops the load with its file and line.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costmodel.calibration import KNOBS, RESIDUAL_KNOBS
from costmodel.catalog import CatalogError, gpu_names, load_model
from costmodel.cli import UserError

FITTED = tuple(k for k in KNOBS if k not in RESIDUAL_KNOBS)  # knobs a measurement informs (not the model's error)
# kernel knobs end-to-end rows never move: a TTFT holds prefill's kernels and the front end's fixed time
# (request_overhead) together, and only the kernel tables tell them apart
KERNEL_HELD = ("attention_prefill", "grouped_gemm_prefill")


@dataclass(frozen=True)
class Component:
    """What a measurement of one component looks like, and which knobs its prediction uses."""

    params: tuple[str, ...]  # required shape keys (numbers unless listed in `words`)
    units: tuple[str, ...]
    knobs: tuple[str, ...]
    doc: str
    optional: tuple[str, ...] = ()
    words: dict[str, tuple[str, ...]] | None = None  # shape keys that take a word, and its choices
    keyed: str = "gpu"  # whose factors a row informs: its GPU's, or (`stack`) its kernel stack's and `moe_tp` for all


COMPONENTS: dict[str, Component] = {
    "dense_gemm": Component(("m", "n", "k"), ("TFLOPS", "ms", "us"), ("dense_gemm", "hbm", "gemm_fixed"),
                            "FP8 (BF16 without FP8) GEMM of m x k by k x n; weights n x k streamed once"),
    "grouped_gemm": Component(("groups", "m", "n", "k", "layout"), ("TFLOPS", "ms", "us"),
                              ("grouped_gemm_prefill", "grouped_gemm_decode", "hbm"),
                              "`groups` expert GEMMs of m tokens each; `layout` contiguous (prefill) or masked "
                              "(decode, the profile's efficiency table)",
                              words={"layout": ("contiguous", "masked")}),
    "attention_prefill": Component((), ("TFLOPS",), ("attention_prefill",),
                                   "attention kernel's sustained FLOP rate in prefill (compute-bound); `new` tokens "
                                   "over a `context` whose first context - new are in a prefix cache, optionally",
                                   optional=("new", "context")),
    "attention_decode": Component((), ("TFLOPS", "GB/s"), ("attention_decode", "kv_read"),
                                  "MLA decode kernel: TFLOPS when compute-bound, GB/s of KV read when memory-bound"),
    "a2a_normal": Component(("ep",), ("GB/s",), ("a2a_normal",),
                            "expert-parallel dispatch/combine, normal kernels: bandwidth of the bottleneck link "
                            "(NVLink within the scale-up domain, the NIC beyond)"),
    "a2a_low_latency": Component(("tokens", "hidden", "topk", "ep", "op"), ("us", "ms"), ("a2a_low_latency",),
                                 "decode dispatch (FP8) or combine (BF16) of `tokens` per GPU, low-latency kernels; "
                                 "`links=nic` where the kernels sent every copy over the NIC, even inside a node "
                                 "(DeepEP's pure-RDMA low-latency kernels), default `nvlink+nic`",
                                 optional=("links",),
                                 words={"op": ("dispatch", "combine"), "links": ("nvlink+nic", "nic")}),
    "allreduce": Component(("bytes", "tp"), ("us", "ms"), ("allreduce",), "all-reduce of `bytes` over a TP group"),
    "kv_transfer": Component(("bytes",), ("GB/s", "us", "ms"), ("kv_transfer",),
                             "one GPU sending `bytes` of KV cache to a GPU of another node (prefill to decode), "
                             "as a time or as GB/s"),
    "prefill_step": Component(
        ("batch", "input_len", "tp"),
        ("s", "ms"),
        tuple(k for k in FITTED
              if k not in ("attention_decode", "kv_read", "a2a_low_latency", "grouped_gemm_decode", "kv_transfer")),
        "one prefill forward of `batch` prompts on one TP group (an engine benchmark's prefill latency)",
        optional=("model",),
    ),
    "serving_tpot": Component(
        ("batch", "context", "tp", "ep"),
        ("s", "ms"),
        tuple(k for k in FITTED if k not in ("a2a_normal", "kv_transfer", *KERNEL_HELD)),
        "median time per output token of a closed-loop serving benchmark (InferenceX): decode steps of `batch` "
        "sequences per attention rank at `context` tokens on `ep` GPUs with attention TP `tp`; experts placed "
        "whole (`moe=ep`) or split by TP (`moe=tp`), in `precision` fp8|fp4; MTP verifying `drafts` tokens a step "
        "of which `accepted_pct` % are kept; an aggregated engine also prefills `users` / `output_len` prompts of "
        "`prefill_len` tokens a step. Fitted per kernel stack (GPU.software) and for every GPU (`moe_tp`)",
        optional=("moe", "precision", "drafts", "accepted_pct", "users", "output_len", "prefill_len", "model", "kv"),
        words={"moe": ("ep", "tp"), "precision": ("fp8", "fp4"), "kv": ("fp8", "bf16")},
        keyed="stack",
    ),
    "serving_ttft": Component(
        ("input", "tp", "dp"),
        ("s", "ms"),
        ("request_overhead", "handoff", "kv_transfer", "dense_gemm", "a2a_normal", "hbm", "gemm_fixed",
         "grouped_gemm_decode", "attention_decode", "kv_read", "a2a_low_latency", "allreduce", "moe_tp",
         "step_overhead", "sequence_overhead", "prefill_pass"),
        "median time to first token of a closed-loop serving benchmark with few users (no queue): the front end, the "
        "prefill of an `input`-token prompt on `dp` attention ranks of TP `tp`, and disaggregated (`engine=disagg`) "
        "its KV transfer and hand-off; aggregated, the decode step of the others (`batch`, `context`, `ep`, `moe`) "
        "the prompt's chunk shares, and half of the `recv` decode steps an SGLang engine launched with "
        "--scheduler-recv-interval lets pass between its polls for new requests. Fitted per kernel stack, and for "
        "every GPU for the fixed times",
        optional=("engine", "precision", "batch", "context", "ep", "moe", "model", "kv", "recv"),
        words={"engine": ("agg", "disagg"), "precision": ("fp8", "fp4"), "moe": ("ep", "tp"), "kv": ("fp8", "bf16")},
        keyed="stack",
    ),
    "decode_step": Component(
        ("batch", "context", "tp"),
        ("s", "ms"),
        tuple(k for k in FITTED if k not in ("attention_prefill", "a2a_normal", "grouped_gemm_prefill", "kv_transfer")),
        "one decode step of `batch` sequences at `context` tokens on one TP group (an engine benchmark's median "
        "decode latency)",
        optional=("model",),
    ),
}  # fmt: skip


class MeasurementError(UserError):
    """A measurement row that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Measurement:
    component: str
    gpu: str
    shape: tuple[tuple[str, Any], ...]
    value: float
    unit: str
    source: str
    where: str  # file:line

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.shape)

    @property
    def key(self) -> tuple[str, str]:
        return (self.component, self.gpu)


def positive(text: str, what: str) -> float:
    """`text` as a positive finite number; MeasurementError names `what` otherwise."""
    try:
        num = float(text)
    except ValueError:
        raise MeasurementError(f"{what} is not a number") from None
    if not (math.isfinite(num) and num > 0):
        raise MeasurementError(f"{what} must be a positive number")
    return num


def parse_shape(text: str, comp: Component, where: str) -> tuple[tuple[str, Any], ...]:
    out: dict[str, Any] = {}
    for item in text.split():
        k, sep, v = item.partition("=")
        if not sep or not k or not v:
            raise MeasurementError(f"{where}: shape item {item!r} is not key=value")
        if comp.words and k in comp.words:
            if v not in comp.words[k]:
                raise MeasurementError(f"{where}: shape {k}={v!r} must be one of {list(comp.words[k])}")
            out[k] = v
        elif k == "model":
            out[k] = v
        else:
            num = positive(v, f"{where}: shape {k}={v!r}")
            if num != int(num):  # every numeric shape key counts something: GPUs, tokens, bytes, rows
                raise MeasurementError(f"{where}: shape {k}={v!r} must be a whole number")
            out[k] = int(num)
    missing = [k for k in comp.params if k not in out]
    extra = [k for k in out if k not in comp.params and k not in comp.optional]
    if missing or extra:
        raise MeasurementError(f"{where}: shape needs exactly {list(comp.params)}"
                               f"{' (optional: ' + ', '.join(comp.optional) + ')' if comp.optional else ''}; "
                               f"missing {missing}, unknown {extra}")  # fmt: skip
    return tuple(sorted(out.items()))


def runnable(p: dict[str, Any], component: str, where: str) -> None:
    """An engine step's tensor-parallel size must shard the model's attention heads (no engine runs TP 3)."""
    if component not in ("prefill_step", "decode_step", "serving_tpot", "serving_ttft"):
        return
    aggregated = {k in p for k in ("users", "output_len", "prefill_len")}
    if component == "serving_tpot" and (p["ep"] % p["tp"] or len(aggregated) > 1):
        raise MeasurementError(f"{where}: serving_tpot needs tp dividing ep, and users, output_len and prefill_len "
                               "together (an aggregated engine) or none of them")  # fmt: skip
    name = p.get("model", "deepseek_v3")
    try:
        heads = load_model(name).n_heads
    except CatalogError as err:
        raise MeasurementError(f"{where}: shape model={name!r}: {err}") from None
    if heads % p["tp"]:
        raise MeasurementError(f"{where}: shape tp={p['tp']} does not divide {name}'s {heads} attention heads: no "
                               "engine runs that tensor-parallel size; give the engine's --tp-size")  # fmt: skip


def read_text(path: Path, what: str) -> str:
    """The text of `path`; MeasurementError when it cannot be read or is not UTF-8 text."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise MeasurementError(f"{path}: not a text file (byte {err.start} is not UTF-8): give {what}") from None
    except OSError as err:
        raise MeasurementError(f"{path}: cannot read it ({err.strerror or err})") from None


def csv_records(text: str) -> list[tuple[int, list[str]]]:
    """The CSV records of `text`, each with its line number; blank lines and comment lines (#) left out."""
    body = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip() and not ln.lstrip().startswith("#")]
    return list(zip((n for n, _ in body), csv.reader(ln for _, ln in body), strict=True))


def load_measurements(paths: Iterable[str | Path]) -> list[Measurement]:
    """Every row of the measurement files, checked: component, GPU, shape, value, unit, source."""
    rows: list[Measurement] = []
    known = set(gpu_names())
    header = ["component", "gpu", "shape", "value", "unit", "source"]
    for path in map(Path, paths):
        if not path.is_file():
            raise MeasurementError(f"measurement file {path} not found")
        records = csv_records(read_text(path, "a measurement CSV (header component,gpu,shape,value,unit,source)"))
        if not records:
            raise MeasurementError(f"{path}: no measurements (header {','.join(header)} and one row per measurement)")
        first, got = records[0]
        if [h.strip() for h in got] != header:
            raise MeasurementError(f"{path}:{first}: header must be {','.join(header)}, got {','.join(got)}")
        for lineno, rec in records[1:]:
            where = f"{path}:{lineno}"
            if len(rec) != len(header):
                raise MeasurementError(f"{where}: {len(rec)} fields, want {len(header)} ({','.join(header)}); "
                                       "quote a field that holds a comma")  # fmt: skip
            comp_name, gpu, shape, value, unit, source = (f.strip() for f in rec)
            comp = COMPONENTS.get(comp_name)
            if comp is None:
                raise MeasurementError(f"{where}: unknown component {comp_name!r}; components: {list(COMPONENTS)}")
            if gpu not in known:
                raise MeasurementError(f"{where}: unknown GPU {gpu!r}; the catalogue has {sorted(known)}")
            if unit not in comp.units:
                raise MeasurementError(f"{where}: {comp_name} is measured in {list(comp.units)}, got {unit!r}")
            v = positive(value, f"{where}: value {value!r}")
            if not source:
                raise MeasurementError(f"{where}: every measurement names its source (paper, benchmark table, run)")
            params = parse_shape(shape, comp, where)
            runnable(dict(params), comp_name, where)
            rows.append(Measurement(comp_name, gpu, params, v, unit, source, where))
    return rows

"""Published end-to-end serving measurements as typed rows: InferenceX's DeepSeek-R1 results
(conf/measured/inferencex_dsr1.csv, conf/measured/README.md), the data the cost model is checked on.

`load_inferencex()` reads and checks every row (a malformed file is one `MeasurementError` naming the
line); `Row` keeps the configuration, the closed-loop load and the metrics in InferenceX's own units
(seconds; tokens/s per GPU). FITTING_GPUS are the only GPUs whose rows may be fitted; every other row is
for checking.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

from costmodel.catalog import CONF_DIR
from costmodel.measurements import Measurement, MeasurementError, csv_records, read_text
from costmodel.settings import KV_BYTES, KV_DTYPES, MAX_MEM_FRACTION, MIN_MEM_FRACTION, MTP_ACCEPTANCE

INFERENCEX = CONF_DIR / "measured" / "inferencex_dsr1.csv"
# what each row's decode engines were launched to admit (conf/measured/README.md): `Row.max_running`
ADMISSION = CONF_DIR / "measured" / "inferencex_admission.csv"
SGLANG_FRAMEWORKS = ("sglang", "dynamo-sglang", "mori-sglang")  # whose memory fraction is SGLang's (weights + KV)
# the catalogue models the shipped measured serving is of: InferenceX's DeepSeek-R1 rows (DeepSeek-V3's architecture;
# no stored public serving measurement of another catalogue model was found: docs/costmodel.md). A plan of any other
# model carries the wider range of an unmeasured one (`pipeline.search.steps.band`)
MEASURED_MODELS = ("deepseek_v3",)
FITTING_GPUS = ("h200", "b200", "mi300x")  # InferenceX's names (H200, B200, MI300X); the rest are never fitted
# InferenceX's GPU names -> conf/gpu
GPUS = {"h100": "H100-SXM", "h200": "H200", "b200": "DGX-B200", "b300": "DGX-B300", "gb200": "GB200-NVL72",
        "gb300": "GB300-NVL72", "mi300x": "MI300X", "mi325x": "MI325X", "mi355x": "MI355X"}  # fmt: skip
# lengths uniform on [0.8 L, L]: InferenceX's benchmark template (.github/workflows/benchmark-tmpl.yml)
RANGE_RATIO = 0.8
# MTP rows: one draft token a step, accepted at DeepSeek's published rate (costmodel.settings.MTP_ACCEPTANCE);
# InferenceX does not record the engines' draft settings
MTP_DRAFTS, MTP_ACCEPTED = 1, MTP_ACCEPTANCE
# rows with at most this many users are fitted on their TTFT: with more, requests queue for the prefill or for
# admission to decode, which the steady-state prediction (costmodel.calibrate.serving_ttft_ms) leaves out
QUEUE_FREE_USERS = 16

_BOOL = {"true": True, "false": False}
_INTS = ("prefill_tp", "prefill_ep", "prefill_num_workers", "decode_tp", "decode_ep", "decode_num_workers",
         "num_prefill_gpu", "num_decode_gpu", "isl", "osl", "conc")  # fmt: skip
_METRICS = ("median_ttft", "median_tpot", "median_itl", "median_e2el", "median_intvty", "p99_ttft", "p99_tpot",
            "mean_ttft", "mean_tpot", "tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu")  # fmt: skip
_OPTIONAL = ("input_tput_per_gpu", "output_tput_per_gpu")  # missing in a few rows
# The most each metric can be in its unit: no engine serves a token in more than 10 s on average or a request in
# more than a day, nor a GPU 10 M tokens/s (InferenceX's extract: TPOT 2.6-198 ms, TTFT at most 292 s, ITL, a gap
# between streamed chunks, at most 14 s, 27,500 tokens/s/GPU); a larger value is in another unit or broken
_TOKENS_PER_S = ("median_intvty", "tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu")
_LIMITS = {"s per token": (10.0, ("median_tpot", "p99_tpot", "mean_tpot")),
           "s": (86_400.0, ("median_ttft", "median_itl", "median_e2el", "p99_ttft", "mean_ttft")),
           "tokens/s": (1e7, _TOKENS_PER_S)}  # fmt: skip


@dataclass(frozen=True)
class Phase:
    """One phase's engines as InferenceX describes them (an aggregated row's one engine kind is in `decode`)."""

    tp: int
    ep: int
    dp_attention: bool
    workers: int
    gpus: int


@dataclass(frozen=True)
class Row:
    """One InferenceX measurement: a configuration, its closed-loop load, and what was measured."""

    hardware: str
    framework: str
    precision: str  # fp8 | fp4
    spec_method: str  # none | mtp
    disagg: bool
    multinode: bool
    prefill: Phase
    decode: Phase
    isl: int
    osl: int
    conc: int
    metrics: dict[str, float]  # InferenceX's names; seconds, tokens/s/GPU
    image: str
    date: str
    run_url: str
    line: int  # in the CSV, for messages
    max_running: int | None = None  # requests one decode engine admits at once, as launched (None: not recorded)
    # the share of GPU memory its SGLang engines hold weights and KV cache in (--mem-fraction-static), as launched;
    # None where not recorded or not SGLang's (TensorRT-LLM's free_gpu_memory_fraction is a share of what the
    # weights leave, another quantity)
    mem_fraction: float | None = None
    kv_dtype: str | None = None  # the KV cache's format its decode engines ran (fp8 | bf16), as launched
    # decode steps between an SGLang engine's polls for new requests while it decodes (--scheduler-recv-interval), as
    # launched: 1 (SGLang's default, every step) where the launch set none or the engine is not SGLang's
    recv_interval: int = 1

    @property
    def speculation(self) -> tuple[int, float]:
        """(draft tokens a step, accepted a step) of the row's decode engines."""
        return (MTP_DRAFTS, MTP_ACCEPTED) if self.spec_method == "mtp" else (0, 0.0)

    @property
    def mean_lengths(self) -> tuple[int, int]:
        """(input, output) tokens on average: both uniform on [RANGE_RATIO L, L]."""
        return round(self.isl * (1 + RANGE_RATIO) / 2), round(self.osl * (1 + RANGE_RATIO) / 2)

    @property
    def gpus(self) -> int:
        """GPUs the row's throughput per GPU divides by: both phases' when disaggregated, the engine's TP size when
        aggregated (its `num_*_gpu` are TP x EP where EP > 1: 64 for TP 8 EP 8; the identity at one user,
        tokens/s/GPU x GPUs x E2E latency = a request's tokens, holds with TP, tests/test_measured.py)."""
        return self.prefill.gpus + self.decode.gpus if self.disagg else self.decode.tp

    @property
    def fitting(self) -> bool:
        return self.hardware in FITTING_GPUS

    @property
    def key(self) -> str:
        """A short name for tables: gpu framework precision spec P/D-or-agg isl/osl conc."""
        shape = (f"P{self.prefill.workers}x{self.prefill.tp} D{self.decode.workers}x{self.decode.tp}" if self.disagg
                 else f"agg tp{self.decode.tp} ep{self.decode.ep}")  # fmt: skip
        return (f"{self.hardware} {self.framework} {self.precision} {self.spec_method} {shape} "
                f"{self.isl // 1024}k/{self.osl // 1024}k c{self.conc}")  # fmt: skip


def worker(phase: Phase) -> tuple[int, int]:
    """(GPUs of one worker, its attention TP) of a disaggregated phase: the phase's GPUs over its workers (InferenceX
    records some DP-attention workers as TP 1 with 4 to 48 GPUs each), experts over the whole worker, attention TP 1
    under DP attention, else the recorded TP."""
    size = phase.gpus // phase.workers if phase.gpus % phase.workers == 0 else phase.tp
    size = max(size, phase.tp)
    return size, 1 if phase.dp_attention else min(phase.tp, size)


def decode_engine(row: Row) -> tuple[int, int, int]:
    """(GPUs of one decode engine, its attention TP, engines) the row's users are spread over: a disaggregated row's
    decode workers, or an aggregated row's one engine of TP GPUs (attention TP 1 under DP attention)."""
    if row.disagg:
        size, tp = worker(row.decode)
        return size, tp, row.decode.workers
    return row.decode.tp, 1 if row.decode.dp_attention else row.decode.tp, 1


def running(row: Row) -> int:
    """Requests the row's decode engines run at once: its users, or the engines' admission limit where the launch
    set one below them (the others wait for a slot: `Row.max_running`)."""
    _, _, engines = decode_engine(row)
    return row.conc if row.max_running is None else min(row.conc, row.max_running * engines)


def users_per_rank(row: Row) -> int:
    """The row's running requests over every attention rank of its decode engines (rounded up: the busiest rank)."""
    size, tp, engines = decode_engine(row)
    return max(-(-running(row) // (engines * (size // tp))), 1)


def serving_measurement(row: Row, path: str | Path = INFERENCEX) -> Measurement | None:
    """The row's median TPOT as a `serving_tpot` measurement for costmodel.calibrate (None: a row the cost model
    cannot express: a GPU outside the catalogue, or disaggregated workers not recorded). Mean lengths: inputs and
    outputs uniform on [RANGE_RATIO L, L]; context: the whole prompt and half the output."""
    if row.hardware not in GPUS or (row.disagg and not (row.prefill.workers and row.decode.workers)):
        return None
    size, tp, _ = decode_engine(row)
    mean_in, mean_out = row.mean_lengths
    shape: dict[str, object] = {"batch": users_per_rank(row), "context": mean_in + mean_out // 2,
                                "tp": tp, "ep": size, "moe": "tp" if row.decode.ep == 1 else "ep",
                                "precision": row.precision}  # fmt: skip
    drafts, accepted = row.speculation
    if drafts:
        shape |= {"drafts": drafts, "accepted_pct": round(100 * accepted)}
    if not row.disagg:
        shape |= {"users": row.conc, "output_len": mean_out, "prefill_len": mean_in}
    if row.kv_dtype:
        shape["kv"] = row.kv_dtype
    return Measurement("serving_tpot", GPUS[row.hardware], tuple(sorted(shape.items())), row.metrics["median_tpot"],
                       "s", row.run_url, f"{path}:{row.line}")  # fmt: skip


def ttft_measurement(row: Row, path: str | Path = INFERENCEX) -> Measurement | None:
    """The row's median TTFT as a `serving_ttft` measurement where it has at most QUEUE_FREE_USERS users (more queue
    for the prefill or for admission, which the steady-state prediction does not hold), else None."""
    tpot = serving_measurement(row, path)
    if tpot is None or row.conc > QUEUE_FREE_USERS:
        return None
    p = tpot.params
    mean_in, _ = row.mean_lengths
    if row.disagg:
        size, tp = worker(row.prefill)
        shape: dict[str, object] = {"input": mean_in, "tp": tp, "dp": size // tp, "engine": "disagg"}
    else:
        shape = {"input": mean_in, "tp": p["tp"], "dp": p["ep"] // p["tp"], "engine": "agg", "batch": p["batch"],
                 "context": p["context"], "ep": p["ep"], "moe": p["moe"]}  # fmt: skip
        if row.recv_interval > 1:
            shape["recv"] = row.recv_interval
    shape["precision"] = row.precision
    if row.kv_dtype:
        shape["kv"] = row.kv_dtype
    return Measurement("serving_ttft", tpot.gpu, tuple(sorted(shape.items())), row.metrics["median_ttft"], "s",
                       row.run_url, tpot.where)  # fmt: skip


def load_admission(path: str | Path, rows: list[Row]) -> list[Row]:
    """`rows` with the decode engines' admission limits of `path` (inferencex_admission.csv's columns: `line`, the
    row's `hardware`, `framework` and `conc` again, to check it describes that row, and `engine_max_running`,
    empty where the launch set none)."""
    p, by_line = Path(path), {r.line: r for r in rows}
    limits: dict[int, int] = {}
    fractions: dict[int, float] = {}
    kv: dict[int, str] = {}
    recv: dict[int, int] = {}
    try:
        with p.open(newline="", encoding="utf-8") as f:
            for k, d in enumerate(csv.DictReader(f), 2):
                row = by_line.get(int(d["line"]))
                if row is None or (row.hardware, row.framework, row.conc) != (d["hardware"], d["framework"],
                                                                              int(d["conc"])):  # fmt: skip
                    raise MeasurementError(f"{p}:{k}: line {d['line']} is not that row of the measurements it goes "
                                           f"with ({d['hardware']} {d['framework']} conc {d['conc']})")  # fmt: skip
                if d["engine_max_running"]:
                    limits[row.line] = int(d["engine_max_running"])
                    if limits[row.line] < 1:
                        raise MeasurementError(f"{p}:{k}: engine_max_running must be 1 or more")
                if d.get("kv_dtype"):
                    if d["kv_dtype"] not in KV_BYTES:
                        raise MeasurementError(f"{p}:{k}: kv_dtype must be one of {list(KV_BYTES)}, got "
                                               f"{d['kv_dtype']!r}")  # fmt: skip
                    kv[row.line] = d["kv_dtype"]
                if d.get("scheduler_recv_interval"):
                    recv[row.line] = int(d["scheduler_recv_interval"])
                    if recv[row.line] < 1:
                        raise MeasurementError(f"{p}:{k}: scheduler_recv_interval must be 1 or more")
                if d.get("mem_fraction") and row.framework in SGLANG_FRAMEWORKS:
                    fractions[row.line] = float(d["mem_fraction"])
                    if not MIN_MEM_FRACTION <= fractions[row.line] <= MAX_MEM_FRACTION:
                        raise MeasurementError(f"{p}:{k}: mem_fraction must be within {MIN_MEM_FRACTION}-"
                                               f"{MAX_MEM_FRACTION}")  # fmt: skip
    except (OSError, KeyError, ValueError) as err:
        raise MeasurementError(f"{p}: cannot read it as an admission table ({err})") from None
    return [replace(r, max_running=limits.get(r.line), mem_fraction=fractions.get(r.line), kv_dtype=kv.get(r.line),
                    recv_interval=recv.get(r.line, 1)) for r in rows]  # fmt: skip


def load_inferencex(path: str | Path = INFERENCEX, admission: str | Path | None = None) -> list[Row]:
    """Every row of an InferenceX extract (conf/measured/README.md's columns), checked, with its decode engines'
    admission limits from `admission` (default: ADMISSION for the shipped extract, none for another)."""
    p = Path(path)
    if admission is None and p.resolve() == INFERENCEX.resolve():
        admission = ADMISSION
    rows = _read_rows(p)
    return rows if admission is None else load_admission(admission, rows)


def _read_rows(p: Path) -> list[Row]:
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise MeasurementError(f"{p}: cannot read it as text ({err})") from None
    reader = csv.DictReader(text.splitlines())
    need = {"hardware", "framework", "precision", "spec_method", "disagg", "is_multinode", "prefill_dp_attention",
            "decode_dp_attention", "image", "date", "run_url", *_INTS, *_METRICS}  # fmt: skip
    missing = sorted(need - set(reader.fieldnames or ()))
    if missing:
        raise MeasurementError(f"{p}: lacks the column(s) {missing}: is it benchmarks/inferencex_extract.py's output?")
    rows = []
    for lineno, r in enumerate(reader, 2):
        where = f"{p}:{lineno}"
        try:
            ints = {k: int(r[k]) for k in _INTS}
            flags = {k: _BOOL[r[k]] for k in ("disagg", "is_multinode", "prefill_dp_attention", "decode_dp_attention")}
            metrics = {k: float(r[k]) for k in _METRICS if r[k] != "" or k not in _OPTIONAL}
        except (KeyError, ValueError) as err:
            raise MeasurementError(f"{where}: {err}: a number or true/false expected") from None
        bad = [k for k, v in metrics.items() if not (math.isfinite(v) and v > 0)]
        if bad or any(v < 0 for v in ints.values()) or min(ints["isl"], ints["osl"], ints["conc"]) < 1:
            raise MeasurementError(f"{where}: a metric or count out of range ({bad or 'isl/osl/conc'})")
        if r["precision"] not in ("fp8", "fp4") or r["spec_method"] not in ("none", "mtp"):
            raise MeasurementError(f"{where}: precision fp8|fp4 and spec_method none|mtp expected")
        phase = {}
        for ph in ("prefill", "decode"):
            dp, workers, gpus = flags[f"{ph}_dp_attention"], ints[f"{ph}_num_workers"], ints[f"num_{ph}_gpu"]
            phase[ph] = Phase(ints[f"{ph}_tp"], ints[f"{ph}_ep"], dp, workers, gpus)
        rows.append(
            Row(
                hardware=r["hardware"],
                framework=r["framework"],
                precision=r["precision"],
                spec_method=r["spec_method"],
                disagg=flags["disagg"],
                multinode=flags["is_multinode"],
                prefill=phase["prefill"],
                decode=phase["decode"],
                isl=ints["isl"],
                osl=ints["osl"],
                conc=ints["conc"],
                metrics=metrics,
                image=r["image"],
                date=r["date"],
                run_url=r["run_url"],
                line=lineno,
            )
        )
        if problem := _problem(rows[-1]):
            raise MeasurementError(f"{where}: {problem}")
    if not rows:
        raise MeasurementError(f"{p}: no rows")
    return rows


def _problem(row: Row) -> str:
    """What makes `row` one the cost model cannot read ("" if nothing): a GPU the catalogue does not map, an engine
    of no GPUs, an attention TP that does not split the heads evenly, a metric in another unit."""
    if row.hardware not in GPUS:
        return (f"hardware {row.hardware!r} is none of InferenceX's GPUs the catalogue maps ({sorted(GPUS)}): add it "
                "to costmodel.measured.GPUS with its conf/gpu name")  # fmt: skip
    for ph, phase in (("prefill", row.prefill), ("decode", row.decode)):
        if min(phase.tp, phase.ep, phase.gpus) < 1:
            return f"{ph}_tp {phase.tp}, {ph}_ep {phase.ep}, num_{ph}_gpu {phase.gpus}: each must be 1 or more"
    read = (("prefill", row.prefill), ("decode", row.decode)) if row.disagg else (("decode", row.decode),)
    for ph, phase in read:  # a phase the model reads: its attention TP splits the heads (DP attention: TP 1)
        if not phase.dp_attention and (not row.disagg or phase.workers) and phase.tp & (phase.tp - 1):
            return (f"{ph}_tp {phase.tp} without DP attention: an attention TP is a power of two (1, 2, 4, 8, ...: "
                    "it splits the model's heads evenly)")  # fmt: skip
    for unit, (most, names) in _LIMITS.items():
        over = [k for k in names if row.metrics.get(k, 0.0) > most]
        if over:
            return (f"{over[0]} {row.metrics[over[0]]:g} {unit}, over the {most:g} any engine takes: the extract's "
                    "times are seconds and its throughputs tokens/s")  # fmt: skip
    return ""


def serving_rows(path: Path) -> list[Measurement]:
    """The fitting GPUs' rows of an InferenceX extract as `serving_tpot` measurements, and those with few users
    as `serving_ttft` ones (the fit's end-to-end rows: `python -m costmodel.calibrate --serving`)."""
    every = load_inferencex(path)
    fitting = [r for r in every if r.fitting]
    rows = [serving_measurement(r, path) for r in fitting] + [ttft_measurement(r, path) for r in fitting]
    rows = [m for m in rows if m is not None]
    if not rows:
        raise MeasurementError(f"{path}: none of its {len(every)} rows is one the fit reads (a disaggregated row "
                               f"with its workers recorded, or an aggregated one) on a fitting GPU "
                               f"{list(FITTING_GPUS)}: --serving fits those GPUs' rows only")  # fmt: skip
    return rows


# --- published figures: a check, never fitted ---------------------------------------------------------------------

PUBLISHED = CONF_DIR / "measured" / "published_serving.csv"
PUBLISHED_METRICS = {"prefill": ("input_tok_s_gpu",), "decode": ("output_tok_s_gpu", "tok_s_user"),
                     "closed_loop": ("output_tok_s_gpu",)}  # fmt: skip
_FIGURE_COLUMNS = ("id", "gpu", "kind", "tp", "gpus", "moe", "experts", "batch", "length", "drafts", "accepted",
                   "output", "chunk", "kv_dtype", "metric", "value", "source", "quote", "assumed")  # fmt: skip


@dataclass(frozen=True)
class Figure:
    """One published serving figure (conf/measured/published_serving.csv): a prefill forward's input tokens/s per GPU,
    a decode step's output tokens/s (per GPU or a user's) or a closed-loop run's output tokens/s per GPU, at the
    configuration its source states."""

    id: str
    gpu: str  # conf/gpu name
    kind: str  # prefill | decode | closed_loop (PUBLISHED_METRICS)
    tp: int  # attention TP of a rank
    gpus: int  # the engine's GPUs: its expert-parallel group
    moe: str  # ep (experts placed whole) | tp (each split over the engine)
    experts: str  # fp8 | fp4: the routed experts' precision
    batch: int  # prefill: tokens a rank a forward; decode: sequences a rank; closed_loop: users a rank
    length: int  # prefill, closed_loop: the prompts' length; decode: the mean context
    drafts: int  # MTP drafts a decode step (0: none)
    accepted: float  # drafts kept a step on average
    output: int  # closed_loop: output tokens a request (0 otherwise)
    chunk: int  # closed_loop: prompt tokens a rank a step (0 otherwise)
    kv_dtype: str  # the KV cache's format (costmodel.settings.KV_DTYPES)
    metric: str
    value: float
    source: str
    quote: str
    assumed: str


def load_published(path: str | Path = PUBLISHED) -> list[Figure]:
    """Every figure of a published-serving table (comment lines start with #), checked: one MeasurementError naming
    the file, the line and what to fix."""
    from costmodel.catalog import gpu_names

    p = Path(path)
    records = csv_records(read_text(p, "a published-serving table (conf/measured/README.md)"))
    if not records or tuple(records[0][1]) != _FIGURE_COLUMNS:
        raise MeasurementError(f"{p}: the header must be {','.join(_FIGURE_COLUMNS)}")
    known, figures, seen = set(gpu_names()), [], set()
    for line, row in records[1:]:
        where = f"{p}:{line}"
        if len(row) != len(_FIGURE_COLUMNS):
            n = len(_FIGURE_COLUMNS)
            raise MeasurementError(f"{where}: {len(row)} fields, not {n} (quote a field with commas)")
        d = dict(zip(_FIGURE_COLUMNS, row, strict=True))
        try:
            f = Figure(d["id"], d["gpu"], d["kind"], int(d["tp"]), int(d["gpus"]), d["moe"], d["experts"],
                       int(d["batch"]), int(d["length"]), int(d["drafts"]), float(d["accepted"]), int(d["output"]),
                       int(d["chunk"]), d["kv_dtype"], d["metric"], float(d["value"]), d["source"], d["quote"],
                       d["assumed"])  # fmt: skip
        except ValueError as err:
            raise MeasurementError(f"{where}: {err}; tp, gpus, batch, length, drafts, output and chunk are whole "
                                   "numbers") from None  # fmt: skip
        problem = (
            f"id {f.id!r} appears twice" if f.id in seen
            else f"unknown GPU {f.gpu!r}; choose from {sorted(known)}" if f.gpu not in known
            else f"kind must be one of {sorted(PUBLISHED_METRICS)}, got {f.kind!r}" if f.kind not in PUBLISHED_METRICS
            else f"metric of a {f.kind} figure must be one of {PUBLISHED_METRICS[f.kind]}, got {f.metric!r}"
            if f.metric not in PUBLISHED_METRICS[f.kind]
            else "tp, gpus, batch and length must be at least 1" if min(f.tp, f.gpus, f.batch, f.length) < 1
            else f"tp {f.tp} must divide the engine's {f.gpus} GPUs" if f.gpus % f.tp
            else f"moe must be ep or tp, got {f.moe!r}" if f.moe not in ("ep", "tp")
            else f"experts must be fp8 or fp4, got {f.experts!r}" if f.experts not in ("fp8", "fp4")
            else f"0 <= accepted <= drafts must hold, got {f.accepted} of {f.drafts}"
            if not 0 <= f.accepted <= f.drafts
            else f"kv_dtype must be one of {list(KV_DTYPES)}, got {f.kv_dtype!r}" if f.kv_dtype not in KV_DTYPES
            else "a closed_loop figure needs its output length and chunk (at least 1 each)"
            if f.kind == "closed_loop" and min(f.output, f.chunk) < 1
            else f"value must be a positive number, got {f.value}" if not (math.isfinite(f.value) and f.value > 0)
            else "source must name where the figure was published" if not f.source.strip()
            else ""
        )  # fmt: skip
        if problem:
            raise MeasurementError(f"{where}: {problem}")
        seen.add(f.id)
        figures.append(f)
    return figures

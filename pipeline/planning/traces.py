"""Request traces: load (Arrow-backed), validate, and derive the compact histograms we ship.

Formats: Azure LLM inference traces (`TIMESTAMP, ContextTokens, GeneratedTokens`), BurstGPT
(`Timestamp, Model, Request tokens, Response tokens, ...`, timestamps in seconds), or any CSV /
Parquet with a column mapping. A bad file fails whole, with the file and the row; nothing is
half-loaded.

`python -m pipeline.traces derive TRACE.csv OUT.npz` derives the histogram a fresh install ships.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from pipeline.errors import WorkloadError
from simulator.arrivals import PROFILE_BIN_S, rate_profile
from simulator.cache import PrefixBlocks
from simulator.sessions import SessionModel

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
# A request longer than this is no request any model of the catalogue serves (DeepSeek-V3's
# context is 163,840 tokens): a trace that has one is broken, and a per-length histogram of it
# would take memory in proportion. A model's own context is checked when a plan is made.
MAX_TOKENS = 1 << 20
MAX_SPAN_DAYS = 40  # public LLM traces span hours to weeks; 40 days of 1-s arrival bins: 3.5 M, 28 MB


@dataclass(frozen=True)
class Columns:
    """Which columns hold input tokens, output tokens and (optionally) the arrival time."""

    input: str
    output: str
    timestamp: str | None = None
    timestamp_kind: str = "datetime"  # "datetime" (wall clock) or "seconds" (numeric)


FORMATS: dict[str, Columns] = {
    "azure": Columns("ContextTokens", "GeneratedTokens", "TIMESTAMP", "datetime"),
    "burstgpt": Columns("Request tokens", "Response tokens", "Timestamp", "seconds"),
}


@dataclass(frozen=True)
class Trace:
    name: str
    source: str
    input_tokens: np.ndarray  # int64, >= 1
    output_tokens: np.ndarray  # int64, >= 1
    arrival_s: np.ndarray | None  # seconds since the first request; the requests are in time order
    blocks: PrefixBlocks | None = None  # each prompt's prefix blocks (a trace that records reuse: Mooncake's)

    def __len__(self) -> int:
        return len(self.input_tokens)

    @property
    def span_s(self) -> float:
        """The trace's day: its first to last request plus a mean gap (its requests / this = its mean rate)."""
        t = self.arrival_s
        if t is None or len(t) < 2:
            return 0.0
        return max(float(t.max() - t.min()) * len(t) / (len(t) - 1), 1e-9)


def _read_table(path: Path) -> pa.Table:
    if not path.is_file():
        raise WorkloadError(f"{path}: no such trace file")
    try:
        head = path.open("rb").read(4096)
    except OSError as err:
        raise WorkloadError(f"{path}: cannot read it ({err.strerror})") from None
    is_parquet = head.startswith(b"PAR1")
    if not is_parquet and (b"\0" in head or not _utf8(head)):
        raise WorkloadError(f"{path}: not a CSV or Parquet trace (the file is binary): expected a CSV with a header")
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            return pq.read_table(path)
        return pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(strings_can_be_null=False))
    except (pa.ArrowInvalid, OSError) as err:
        if "Empty CSV file" in str(err):
            raise WorkloadError(f"{path}: the file is empty (expected a header and one row per request)") from None
        text = " ".join(str(err).encode("ascii", "backslashreplace").decode().split())[:300]
        raise WorkloadError(f"{path}: not a readable CSV/Parquet table ({text})") from None


def _utf8(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as err:
        return err.start >= len(head) - 3  # a character cut by the 4 KiB read is fine
    return True


def detect_format(names: list[str]) -> str | None:
    for fmt, cols in FORMATS.items():
        if {cols.input, cols.output} <= set(names):
            return fmt
    return None


def _tokens(table: pa.Table, col: str, path: Path) -> np.ndarray:
    arr = table.column(col)
    if arr.null_count:
        i = int(np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False))[0])
        raise WorkloadError(
            f"{path}: row {i + 1} (line {i + 2}): column `{col}` has no value (empty, NaN or null): "
            "every request needs a whole number of tokens"
        )
    if not pa.types.is_integer(arr.type):
        try:
            as_float = pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)
            whole = np.isfinite(as_float) & (as_float == np.floor(as_float)) & (np.abs(as_float) <= 2.0**62)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            texts = pc.cast(arr, pa.string()).to_pylist()
            whole = np.array([_is_whole(t) and abs(float(t)) <= 2.0**62 for t in texts])
            as_float = np.array([float(t) if w else 0.0 for t, w in zip(texts, whole, strict=True)])
        if not whole.all():
            i = int(np.flatnonzero(~whole)[0])
            text = pc.cast(arr, pa.string())[i].as_py()
            raise WorkloadError(
                f"{path}: row {i + 1} (line {i + 2}): column `{col}` must be a whole number of tokens, got {text!r}"
            )
        arr = pa.array(as_float.astype(np.int64))
    values = arr.to_numpy(zero_copy_only=False).astype(np.int64)
    bad = (values < 1) | (values > MAX_TOKENS)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise WorkloadError(
            f"{path}: row {i + 1} (line {i + 2}): column `{col}` must be 1..{MAX_TOKENS:,} tokens, got {values[i]}"
        )
    return values


def _arrivals(table: pa.Table, cols: Columns, path: Path) -> np.ndarray | None:
    if cols.timestamp is None or cols.timestamp not in table.column_names:
        return None
    arr = table.column(cols.timestamp)
    if cols.timestamp_kind == "seconds":
        try:
            secs = pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:
            texts = pc.cast(arr, pa.string()).to_pylist()
            i = next(i for i, t in enumerate(texts) if not _is_float(t))
            raise WorkloadError(
                f"{path}: row {i + 1} (line {i + 2}): column `{cols.timestamp}` must be seconds, got {texts[i]!r}"
            ) from None
    else:
        if not pa.types.is_timestamp(arr.type):
            texts = pc.cast(arr, pa.string()).to_pylist()
            parsed = [_parse_time(t) for t in texts]
            i = next((i for i, v in enumerate(parsed) if v is None), None)
            if i is not None:
                raise WorkloadError(
                    f"{path}: row {i + 1} (line {i + 2}): column `{cols.timestamp}` is not a "
                    f"timestamp (expected e.g. 2023-11-16 18:17:03.97), got {texts[i]!r}"
                )
            arr = pa.array(parsed, type=pa.timestamp("us"))
        per_s = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[arr.type.unit]  # the file's own unit
        secs = pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False) / per_s
    if not np.isfinite(secs).all():
        raise WorkloadError(f"{path}: column `{cols.timestamp}` has missing or non-finite times")
    span_s = float(secs.max() - secs.min())
    if span_s > MAX_SPAN_DAYS * 86400:
        raise WorkloadError(
            f"{path}: column `{cols.timestamp}` spans {span_s:.3g} s ({span_s / 86400:,.0f} days), over the "
            f"{MAX_SPAN_DAYS} days a trace's arrival model is binned for (its rate per {PROFILE_BIN_S:g}-s bin): "
            "check the times' unit (timestamp_kind: seconds reads numbers as seconds) or cut the trace"
        )
    return secs - secs.min()


def _is_float(text: object) -> bool:
    try:
        float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def _is_whole(text: object) -> bool:
    return _is_float(text) and float(text).is_integer()  # type: ignore[arg-type]  # NaN, inf: not whole


def _parse_time(text: str | None) -> np.datetime64 | None:
    try:
        return np.datetime64(str(text).strip().replace(" ", "T"), "us")
    except ValueError:
        return None


def load_trace(path: str | Path, fmt: str = "auto", columns: Columns | None = None, name: str | None = None) -> Trace:
    """Load a whole trace or fail with the file, row and column of the first problem."""
    path = Path(path)
    if fmt == "mooncake" or (fmt == "auto" and path.suffix.lower() in (".jsonl", ".npz")):
        return load_prefix_trace(path, name)
    table = _read_table(path)
    if table.num_rows == 0:
        raise WorkloadError(f"{path}: the file has a header but no requests")
    if columns is None:
        if fmt == "auto":
            detected = detect_format(table.column_names)
            if detected is None:
                raise WorkloadError(
                    f"{path}: columns {table.column_names} match no known format "
                    f"({sorted(FORMATS)}); map them with workload.columns "
                    "{input: ..., output: ..., timestamp: ...}"
                )
            fmt = detected
        if fmt not in FORMATS:
            raise WorkloadError(f"unknown trace format {fmt!r}; choose from {['auto', *sorted(FORMATS), 'mooncake']}")
        columns = FORMATS[fmt]
    needed = [c for c in (columns.input, columns.output) if c]
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise WorkloadError(f"{path}: missing column(s) {missing}; the file has {table.column_names}")
    if columns.timestamp and columns.timestamp not in table.column_names and fmt != "auto":
        raise WorkloadError(
            f"{path}: missing timestamp column {columns.timestamp!r}; the file has {table.column_names}"
        )
    inputs, outputs = _tokens(table, columns.input, path), _tokens(table, columns.output, path)
    arrival_s = _arrivals(table, columns, path)
    if arrival_s is not None and np.any(np.diff(arrival_s) < 0):  # a file in another order: its requests in time's
        order = np.argsort(arrival_s, kind="stable")
        inputs, outputs, arrival_s = inputs[order], outputs[order], arrival_s[order]
    return Trace(name or path.stem, str(path), inputs, outputs, arrival_s)


# --- shipped histograms ---------------------------------------------------------------------------


def derive_histogram(trace: Trace, out: Path, attribution: str) -> None:
    """Save the per-length request counts of a trace and, where it has timestamps, its arrival model (its rate per
    `PROFILE_BIN_S`-second bin over its mean: `simulator.arrivals.rate_profile`); no timestamps, no per-request rows."""
    iv, ic = np.unique(trace.input_tokens, return_counts=True)
    ov, oc = np.unique(trace.output_tokens, return_counts=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    timed = trace.arrival_s is not None and len(trace.arrival_s) > 1
    np.savez_compressed(
        out,
        input_values=iv,
        input_counts=ic,
        output_values=ov,
        output_counts=oc,
        source=np.array(Path(trace.source).name),
        attribution=np.array(attribution),
        **({"arrival_profile": rate_profile(trace.arrival_s)} if timed else {}),  # type: ignore[arg-type]
    )


def load_histogram(name: str) -> dict[str, np.ndarray]:
    path = DATA_DIR / f"{name}.npz"
    if not path.is_file():
        shipped = sorted(p.stem for p in DATA_DIR.glob("*.npz"))
        raise WorkloadError(f"no shipped histogram {name!r}; choose from {shipped}")
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


AZURE_ATTRIBUTION = (
    "Derived from the Azure LLM inference trace 2023 (Azure/AzurePublicDataset), CC BY 4.0; "
    "cite Patel et al., 'Splitwise: Efficient generative LLM inference using phase splitting', ISCA 2024."
)


# --- traces that record prefix reuse: Mooncake's -----------------------------------------------------------------

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake's released traces hash prompts in blocks of 512 tokens (FAST25-release/README)
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def load_prefix_trace(path: Path, name: str | None = None, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    """A trace whose requests name their prompts' prefix blocks: Mooncake's JSONL (one request a line: `timestamp`
    in ms, `input_length`, `output_length`, `hash_ids`, the ids of the prompt's 512-token blocks, equal ids for equal
    prefixes), or the npz `derive_prefix_trace` writes from one. A bad line fails the whole file, naming the line."""
    if not path.is_file():
        raise WorkloadError(f"{path}: no such trace file")
    if path.suffix.lower() == ".npz":
        return _load_prefix_npz(path, name)
    stamps, ins, outs, blocks = [], [], [], []
    try:
        lines = path.open(encoding="utf-8")
        for line_no, line in enumerate(lines, 1):
            if not line.strip():
                continue
            row = _json_row(line, path, line_no)
            t, n, o, ids = (row[k] for k in MOONCAKE_FIELDS)
            for key, v in (("input_length", n), ("output_length", o)):
                if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_TOKENS:
                    raise WorkloadError(f"{path}: line {line_no}: `{key}` must be a whole number of tokens "
                                        f"1..{MAX_TOKENS:,}, got {v!r}")  # fmt: skip
            if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
                raise WorkloadError(f"{path}: line {line_no}: `timestamp` must be milliseconds >= 0, got {t!r}")
            if not isinstance(ids, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in ids):
                raise WorkloadError(f"{path}: line {line_no}: `hash_ids` must be a list of whole numbers (the prompt's "
                                    f"block ids), got {str(ids)[:80]}")  # fmt: skip
            if len(ids) * block_tokens >= n + block_tokens:
                most = -(-n // block_tokens)
                raise WorkloadError(f"{path}: line {line_no}: {len(ids)} blocks of {block_tokens} tokens are longer "
                                    f"than the prompt's {n} tokens (at most {most} blocks)")  # fmt: skip
            stamps.append(float(t))
            ins.append(n)
            outs.append(o)
            blocks.append(ids)
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not a JSONL trace (the file is not UTF-8 text)") from None
    if not ins:
        raise WorkloadError(f"{path}: the file holds no requests (one JSON object a line)")
    arrival = np.asarray(stamps) / 1000.0
    order = np.argsort(arrival, kind="stable")
    pb = PrefixBlocks.of_lists(blocks, block_tokens).take(order)
    return Trace(name or path.stem, str(path), np.asarray(ins, np.int64)[order], np.asarray(outs, np.int64)[order],
                 arrival[order] - arrival.min(), pb)  # fmt: skip


def _json_row(line: str, path: Path, line_no: int) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise WorkloadError(f"{path}: line {line_no}: not a JSON object ({err.msg})") from None
    if not isinstance(row, dict):
        raise WorkloadError(f"{path}: line {line_no}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in MOONCAKE_FIELDS if k not in row]
    if missing:
        raise WorkloadError(f"{path}: line {line_no}: missing field(s) {missing}; each request has "
                            f"{list(MOONCAKE_FIELDS)}")
    return row


def derive_prefix_trace(trace: Trace, out: Path, attribution: str) -> None:
    """Save a prefix trace whole (its requests' times, lengths and block ids, in compact arrays) with its source."""
    if trace.blocks is None or trace.arrival_s is None:
        raise WorkloadError(f"{trace.source}: not a trace with timestamps and prefix blocks")
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        arrival_ms=np.round(trace.arrival_s * 1000.0).astype(np.int64),
        input_tokens=trace.input_tokens.astype(np.int32),
        output_tokens=trace.output_tokens.astype(np.int32),
        block_ids=trace.blocks.ids.astype(np.int32 if trace.blocks.ids.max(initial=0) < 2**31 else np.int64),
        block_counts=np.diff(trace.blocks.start).astype(np.int32),
        block_tokens=np.array(trace.blocks.block_tokens),
        source=np.array(Path(trace.source).name),
        attribution=np.array(attribution),
    )


def _load_prefix_npz(path: Path, name: str | None) -> Trace:
    try:
        with np.load(path) as z:
            counts = z["block_counts"].astype(np.int64)
            blocks = PrefixBlocks(z["block_ids"].astype(np.int64), np.concatenate([[0], np.cumsum(counts)]),
                                  int(z["block_tokens"]))  # fmt: skip
            return Trace(name or path.stem, str(path), z["input_tokens"].astype(np.int64),
                         z["output_tokens"].astype(np.int64), z["arrival_ms"] / 1000.0, blocks)  # fmt: skip
    except (OSError, KeyError, ValueError) as err:
        raise WorkloadError(f"{path}: not a prefix trace `python -m pipeline.traces derive` wrote ({err})") from None


MOONCAKE_ATTRIBUTION = (
    "Derived from Mooncake's FAST'25 trace release (kvcache-ai/Mooncake, FAST25-release/traces, at 3b5a594), "
    "Apache License 2.0; cite Qin et al., 'Mooncake: Trading More Storage for Less Computation', FAST 2025."
)


# --- session workloads fitted to a prefix trace (simulator.sessions) ---------------------------------------------


def sessions_yaml(trace: Trace) -> str:
    """A `kind: sessions` workload (conf/workload) fitted to a timed trace that names its prompts' blocks: the
    `SessionModel`'s parameters, what the fit found, and the trace's own request rate, as YAML."""
    if trace.blocks is None or trace.arrival_s is None or len(trace) < 2:
        raise WorkloadError(f"{trace.source}: fitting sessions needs a timed trace that names its prompts' prefix "
                            "blocks (Mooncake's JSONL, or the npz `derive` writes from one)")  # fmt: skip
    model, found = SessionModel.fit(trace.input_tokens, trace.output_tokens, trace.arrival_s, trace.blocks)
    lines = [f"# fitted to {Path(trace.source).name} by `python -m pipeline.traces fit-sessions`: "
             f"{int(found['requests']):,} requests, {int(found['sessions']):,} sessions seen, "
             f"{found['continuations']:.1%} of requests a next turn, {found['shrunk']:.1%} of next turns shorter "
             f"than the last (left out of growth_tokens), a {int(found['system_blocks'])}-block system prompt",
             "kind: sessions", f"rate_req_s: {found['request_rate']:.4g}  # the trace's own request rate",
             f"requests: {len(trace)}  # generated at rate_req_s for the planner's statistics", "seed: 0"]  # fmt: skip
    for key in SessionModel.keys():
        v = getattr(model, key)
        lines.append(f"{key}: {list(v) if isinstance(v, tuple) else v}")
    return "\n".join(lines) + "\n"

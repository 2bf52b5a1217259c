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
from dataclasses import dataclass
from pathlib import Path

from costmodel.calibrate import MeasurementError
from costmodel.catalog import CONF_DIR

INFERENCEX = CONF_DIR / "measured" / "inferencex_dsr1.csv"
FITTING_GPUS = ("h200", "b200", "mi300x")  # InferenceX's names; the rest are never fitted

_BOOL = {"true": True, "false": False}
_INTS = ("prefill_tp", "prefill_ep", "prefill_num_workers", "decode_tp", "decode_ep", "decode_num_workers",
         "num_prefill_gpu", "num_decode_gpu", "isl", "osl", "conc")  # fmt: skip
_METRICS = ("median_ttft", "median_tpot", "median_itl", "median_e2el", "median_intvty", "p99_ttft", "p99_tpot",
            "mean_ttft", "mean_tpot", "tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu")  # fmt: skip
_OPTIONAL = ("input_tput_per_gpu", "output_tput_per_gpu")  # missing in a few rows


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


def load_inferencex(path: str | Path = INFERENCEX) -> list[Row]:
    """Every row of an InferenceX extract (conf/measured/README.md's columns), checked."""
    p = Path(path)
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
    if not rows:
        raise MeasurementError(f"{p}: no rows")
    return rows

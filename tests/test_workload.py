"""Workloads: shipped histograms, traces in every format, synthetic mixes, ranges, bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from costmodel.catalog import CONF_DIR
from pipeline.errors import ConfigError, WorkloadError
from pipeline.planning.simulation import RequestMix
from pipeline.planning.traces import Columns, load_trace
from pipeline.planning.workload import (
    empirical,
    from_trace,
    make_ranges,
    synthetic_lognormal,
    synthetic_normal,
    workload_from_cfg,
)

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def conf(name: str) -> dict:
    return yaml.safe_load((CONF_DIR / "workload" / f"{name}.yaml").read_text())


@pytest.mark.parametrize(
    ("name", "mean_in", "mean_out", "max_out"),
    [
        ("azure_code", 2047.8, 27.9, 1899),
        ("azure_conv", 1154.7, 211.1, 1000),  # ../shared/data/traces/README.md
    ],
)
def test_shipped_histograms_match_the_published_statistics(
    name: str, mean_in: float, mean_out: float, max_out: int
) -> None:
    w = workload_from_cfg(name, conf(name))
    assert w.pmf.sum() == pytest.approx(1.0)
    assert w.mean_input == pytest.approx(mean_in, abs=0.05)
    assert w.mean_decode == pytest.approx(mean_out, abs=0.05)
    assert w.max_decode == max_out


@pytest.mark.parametrize("name", ["code", "conv"])
def test_a_shipped_arrival_model_is_its_traces_rate_per_bin(name: str) -> None:
    """The arrival model a shipped workload carries is derived from its trace, bin for bin: the trace beside the
    project (../shared/data/traces) gives the same profile; and its 60-s windows peak as the trace's do."""
    from pipeline.planning.traces import load_trace
    from simulator.arrivals import PROFILE_BIN_S, rate_profile

    trace = load_trace(CONF_DIR.parents[1] / "shared" / "data" / "traces" / f"AzureLLMInferenceTrace_{name}.csv")
    w = workload_from_cfg(f"azure_{name}", conf(f"azure_{name}"))
    assert w.arrival_profile is not None
    assert np.allclose(w.arrival_profile, rate_profile(trace.arrival_s))
    k = round(60 / PROFILE_BIN_S)  # bins a minute
    six = w.arrival_profile[: k * (len(w.arrival_profile) // k)].reshape(-1, k).mean(axis=1)  # 60-s windows
    t = np.sort(trace.arrival_s - trace.arrival_s.min())
    windows = np.bincount((t // 60).astype(int))[: len(six)]
    assert np.percentile(six, 99) == pytest.approx(np.percentile(windows / windows.mean(), 99), rel=0.05)


@pytest.mark.parametrize("width", [1, 7, 125, 500, 8000, 20000])
def test_ranges_cover_the_support_and_sum_to_one(width: int) -> None:
    w = workload_from_cfg("azure_conv", conf("azure_conv"))
    r = make_ranges(w, width)
    assert r.p.sum() == pytest.approx(1.0)
    assert r.start[0] == 0 and r.end[-1] == len(w.pmf)
    assert (r.start[1:] == r.end[:-1]).all()
    assert ((r.start <= r.mid) & (r.mid < r.end)).all()


def test_thesis_ranges_mid_rule() -> None:
    r = make_ranges(synthetic_normal("n", 500, 2000, 0, 8000, 100, 1000), 125)
    assert len(r) == 64 and r.mid[0] == 62 and r.mid[1] == 187 and r.end[-1] == 8001


def test_synthetic_options() -> None:
    ln = synthetic_lognormal("ln", 1000, 0.8, 16000, 200, 1000)
    assert ln.pmf.sum() == pytest.approx(1.0) and 900 < float(np.argmax(np.cumsum(ln.pmf) >= 0.5)) < 1100
    em = empirical("em", [100, 1000], [3, 1], 50, 100)
    assert em.pmf[100] == pytest.approx(0.75) and em.pmf[1000] == pytest.approx(0.25)


def test_trace_formats(tmp_path: Path) -> None:
    az = tmp_path / "az.csv"
    az.write_text(AZURE_HEADER + "2023-11-16 18:17:03.9799600,100,10\n2023-11-16 18:17:05.9799600,300,30\n")
    t = load_trace(az)
    assert t.input_tokens.tolist() == [100, 300] and t.arrival_s.tolist() == pytest.approx([0.0, 2.0])
    bg = tmp_path / "bg.csv"
    bg.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5.0,ChatGPT,472,18,490,Conversation log\n7.5,GPT-4,1000,200,1200,Conversation log\n"
    )
    t = load_trace(bg)
    assert t.output_tokens.tolist() == [18, 200] and t.arrival_s.tolist() == [0.0, 2.5]
    pqf = tmp_path / "x.parquet"
    pq.write_table(pa.table({"p": [5, 6], "o": [1, 2], "ts": [0.0, 1.0]}), pqf)
    t = load_trace(pqf, columns=Columns("p", "o", "ts", "seconds"))
    assert t.input_tokens.tolist() == [5, 6]
    w = workload_from_cfg("t", {"kind": "trace", "path": str(pqf), "columns": {"input": "p", "output": "o"}})
    assert w.mean_decode == 1.5 and w.max_decode == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", r"the file is empty"),
        (AZURE_HEADER, r"header but no requests"),
        ("TIMESTAMP,Prompt,GeneratedTokens\n2023-11-16 18:17:03,1,1\n", r"match no known format"),
        (
            AZURE_HEADER + "2023-11-16 18:17:03,5,3\n2023-11-16 18:17:04,abc,3\n",
            r"row 2 \(line 3\): column `ContextTokens` must be a whole number of tokens, got 'abc'",
        ),
        (
            AZURE_HEADER + "2023-11-16 18:17:03,5,3\n2023-11-16 18:17:04,5,0\n",
            r"row 2 \(line 3\): column `GeneratedTokens` must be 1..1,048,576 tokens, got 0",
        ),
        (
            AZURE_HEADER + "2023-11-16 18:17:03,-5,3\n",
            r"row 1 \(line 2\): column `ContextTokens` must be 1..1,048,576 tokens, got -5",
        ),
        # lengths no model serves: refused before a histogram of that size is allocated
        (
            AZURE_HEADER + "2023-11-16 18:17:03,1000000000,3\n",
            r"row 1 \(line 2\): column `ContextTokens` must be 1..1,048,576 tokens, got 1000000000",
        ),
        (
            AZURE_HEADER + "2023-11-16 18:17:03,5,3\n2023-11-16 18:17:04,1000000000000,3\n",
            r"row 2 \(line 3\): column `ContextTokens` must be 1..1,048,576 tokens, got 1000000000000",
        ),
        (
            AZURE_HEADER + "2023-11-16 18:17:03,5,3\n2023-11-16 18:17:04,5,100000000000\n",
            r"row 2 \(line 3\): column `GeneratedTokens` must be 1..1,048,576 tokens, got 100000000000",
        ),
        (
            AZURE_HEADER + "2023-11-16 18:17:03,5,3\n2023-11-16 18:17:04,,3\n",
            r"row 2 \(line 3\): column `ContextTokens` has no value \(empty, NaN or null\)",
        ),
        (
            AZURE_HEADER + "2023-11-16 18:17:03,nan,3\n",
            r"row 1 \(line 2\): column `ContextTokens` has no value \(empty, NaN or null\)",
        ),
        (
            AZURE_HEADER + "2023-11-16 18:17:03,5,3\nyesterday,5,3\n",
            r"row 2 \(line 3\): column `TIMESTAMP` is not a timestamp",
        ),
        (AZURE_HEADER + "2023-11-16 18:17:03,5.5,3\n", r"must be a whole number of tokens, got '5.5'"),
    ],
)
def test_bad_traces_fail_whole_with_file_and_row(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "trace.csv"
    f.write_text(content)
    with pytest.raises(WorkloadError, match=message) as err:
        load_trace(f)
    assert str(f) in str(err.value)


def test_a_trace_in_another_order_is_read_in_time_order(tmp_path: Path) -> None:
    """A file whose rows are not in time order: its requests in time order, each with its own lengths (a replay
    or a compressed trace then never goes back in time)."""
    f = tmp_path / "t.csv"
    rows = "2023-11-16 18:17:05,1000,10\n2023-11-16 18:17:03,2000,20\n2023-11-16 18:17:04,3000,30\n"
    f.write_text(AZURE_HEADER + rows)
    t = load_trace(f)
    assert t.arrival_s.tolist() == [0.0, 1.0, 2.0]
    assert t.input_tokens.tolist() == [2000, 3000, 1000] and t.output_tokens.tolist() == [20, 30, 10]
    squeezed = RequestMix.of(from_trace(t), t).requests(3, 2.0, "trace_compressed")  # twice its 1 req/s
    assert squeezed.arrival.tolist() == [0.0, 500.0, 1000.0] and squeezed.input_len.tolist() == [2000, 3000, 1000]


def test_a_replay_a_trace_is_too_short_or_too_sparse_for_is_refused_in_one_line() -> None:
    """arrivals=trace of 3 requests within 1.5 ns at 500 req/s keeps 1 request in 4 million: refused before it
    walks 12 billion; 3 requests a day at 500 req/s would copy each 14 million times: refused too."""
    from pipeline.planning.traces import Trace

    def mix(span_s: float) -> RequestMix:
        t = Trace("t", "t.csv", np.array([10, 20, 30]), np.array([1, 2, 3]), np.array([0.0, span_s / 2, span_s]))
        return RequestMix.of(from_trace(t), t)

    with pytest.raises(ConfigError) as err:
        mix(1e-9).requests(2000, 500.0, "trace")
    assert str(err.value) == (
        "arrivals=trace at 500 req/s on t (3 requests over 1.5e-09 s): 2.5e-07 x the trace's rate keeps 1 of its "
        "requests in 4,000,000, so 2,000 requests walk 8e+09 of them, 2.67e+09 times over its 3 (at most "
        "50,000,000): the trace is too dense for this rate; use arrivals=trace_compressed or workload"
    )
    with pytest.raises(ConfigError, match=r"copies each of its requests 1.44e\+07 times, over the 10,000 a replay"):
        mix(57_600.0).requests(2000, 500.0, "trace")


def test_a_trace_spanning_more_than_its_arrival_model_bins_is_refused(tmp_path: Path) -> None:
    """Timestamps 1e17 s apart (milliseconds or nanoseconds read as seconds): one line, before a 1-s bin count of
    that span is asked for."""
    f = tmp_path / "far.csv"
    f.write_text("timestamp,input,output\n0,1000,10\n1e17,2000,20\n")
    with pytest.raises(WorkloadError) as err:
        load_trace(f, columns=Columns("input", "output", "timestamp", "seconds"))
    assert str(err.value) == (
        f"{f}: column `timestamp` spans 1e+17 s (1,157,407,407,407 days), over the 40 days a trace's arrival "
        "model is binned for (its rate per 1-s bin): check the times' unit (timestamp_kind: seconds reads numbers "
        "as seconds) or cut the trace"
    )
    f.write_text(AZURE_HEADER + "2023-11-16 18:17:03,5,3\n3000-01-01 00:00:00,5,3\n")  # past nanoseconds' range
    with pytest.raises(WorkloadError, match=r"column `TIMESTAMP` spans 3.08e\+10 s \(356,522 days\), over the 40 "):
        load_trace(f)


def test_a_binary_file_is_named_not_printed(tmp_path: Path) -> None:
    f = tmp_path / "junk.csv"
    f.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(WorkloadError) as err:
        load_trace(f)
    assert str(err.value) == f"{f}: not a CSV or Parquet trace (the file is binary): expected a CSV with a header"


def test_missing_mapped_column_and_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("a,b\n1,2\n")
    with pytest.raises(WorkloadError, match=r"missing column\(s\) \['prompt'\]; the file has \['a', 'b'\]"):
        load_trace(f, columns=Columns("prompt", "b"))
    with pytest.raises(WorkloadError, match="no such trace file"):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(WorkloadError, match=r"missing field\(s\) \['path'\]"):
        workload_from_cfg("trace", conf("trace"))
    with pytest.raises(WorkloadError, match="unsupported workload kind"):
        workload_from_cfg("x", {"kind": "magic"})
    with pytest.raises(WorkloadError, match=r"ranges.width >= 1"):
        make_ranges(synthetic_normal("n", 500, 2000, 0, 8000, 100, 1000), 0)

"""conf/measured/published_serving.csv: engine teams' published DeepSeek-V3/R1 serving figures, a check the model is
never fitted to. Every figure loads with its source; a malformed table is one error naming its line; the bench prices
each figure at its configuration and summarises model over published."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from costmodel.measured import PUBLISHED, Figure, load_published
from costmodel.measurements import MeasurementError

ROOT = PUBLISHED.parents[2]
HEADER = ",".join(dataclasses.fields(Figure)[i].name for i in range(19)) + "\n"


def test_every_published_figure_loads_with_its_source_and_words() -> None:
    figures = load_published()
    assert len(figures) == 19 and len({f.id for f in figures}) == 19
    assert Counter(f.kind for f in figures) == {"prefill": 6, "decode": 10, "closed_loop": 3}
    assert {f.gpu for f in figures} == {"H100-SXM", "H800", "H20", "H200", "DGX-B200", "GB200-NVL72"}
    for f in figures:  # a repository at a commit and a path, the source's own words
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{12}:\S+\.md", f.source), f.id
        assert f.quote.strip() and f.assumed.strip(), f.id
    # per node of 8 GPUs where the source gives a node's figure
    h100 = {f.id: f for f in figures}["sglang-h100-decode-2k"]
    assert h100.value * 8 == pytest.approx(22_282) and (h100.batch, h100.length, h100.gpus) == (256, 2000, 72)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ("x,H999,decode,1,16,ep,fp8,8,4864,0,0,0,0,auto,output_tok_s_gpu,1,S,q,a", "figures.csv:2: unknown GPU 'H999'"),
        ("x,H20,decode,1,16,ep,fp8,8,4864,0,0,0,0,auto,input_tok_s_gpu,1,S,q,a", "metric of a decode figure"),
        ("x,H20,prefill,3,16,ep,fp8,8,4864,0,0,0,0,auto,input_tok_s_gpu,1,S,q,a", "tp 3 must divide"),
        ("x,H20,decode,1,16,ep,fp8,8,4864,1,1.5,0,0,auto,output_tok_s_gpu,1,S,q,a", "accepted <= drafts"),
        ("x,H20,decode,1,16,ep,fp8,8,4864,0,0,0,0,auto,output_tok_s_gpu,-3,S,q,a", "positive number"),
        ("x,H20,decode,1,16,ep,fp8,8,4864,0,0,0,0,auto,output_tok_s_gpu,3,,q,a", "source must name"),
        ("x,H20,decode,1,16.5,ep,fp8,8,4864,0,0,0,0,auto,output_tok_s_gpu,3,s,q,a", "whole numbers"),
        ("x,H20,decode,1,16,ep,fp8,8,4864,0,0,0,0,auto,output_tok_s_gpu,3,s,q", "18 fields, not 19"),
        ("x,H20,decode,1,16,ep,fp8,8,4864,0,0,0,0,fp6,output_tok_s_gpu,3,s,q,a", "kv_dtype must be one of"),
        ("x,H20,closed_loop,1,8,ep,fp8,8,1024,0,0,0,512,auto,output_tok_s_gpu,3,s,q,a", "needs its output length"),
    ],
)
def test_a_malformed_figure_is_one_error_naming_its_line(tmp_path: Path, row: str, match: str) -> None:
    path = tmp_path / "figures.csv"
    path.write_text(HEADER + row + "\n")
    with pytest.raises(MeasurementError, match=re.escape(match)):
        load_published(path)


def test_the_bench_prices_each_figure_and_summarises_model_over_published(tmp_path: Path) -> None:
    """Three figures republished at the model's own value, at twice it and at it again: a prefill and a decode figure
    of the shipped table and a small closed-loop run (16 users over 8 H200, 128 / 16 tokens). Model over published
    1.00, 0.50 and 1.00: a median |error| of 0 %, two of three within 15 %, a median ratio of 1.00; per kind 0 %,
    100 % (1 / 0.5 - 1) and 0 %."""
    import csv
    import io

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import published_bench as bench
    from common import context

    _, ctx = context(["+inventory=tiny_homo"])
    shipped = {f.id: f for f in load_published()}
    small = dataclasses.replace(shipped["trtllm-h200-max-throughput"], id="small-loop", batch=2, length=128, output=16,
                                chunk=512)  # fmt: skip
    picked = [shipped["sglang-h100-prefill-4k"], shipped["trtllm-b200-min-latency"], small]
    out = io.StringIO()
    for i, f in enumerate(picked):
        value = bench.predict(f, ctx.planner.model, ctx.planner.cost) * (2 if i == 1 else 1)
        csv.writer(out, lineterminator="\n").writerow(dataclasses.astuple(dataclasses.replace(f, value=value)))
    path = tmp_path / "figures.csv"
    path.write_text(HEADER + out.getvalue())
    r = subprocess.run([sys.executable, "benchmarks/published_bench.py", "--figures", str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "| all | 3 | 0 % | 2 of 3 | 1.00 |" in r.stdout
    assert "| prefill | 1 | 0 % | 1 of 1 | 1.00 |" in r.stdout and "| decode | 1 | 100 % | 0 of 1 | 0.50 |" in r.stdout
    assert "| closed_loop | 1 | 0 % | 1 of 1 | 1.00 |" in r.stdout

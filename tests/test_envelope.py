"""Where a plan extrapolates (pipeline/planning/envelope.py): each serving island against the configurations of the
InferenceX rows the serving calibration was fitted on, by hand; the search's plan records the reasons, report.md
lists them, and the rate band spreads the model's error once more on those GPU types."""

from __future__ import annotations

import pytest

from pipeline.planning.envelope import measured_spans, outside
from plan import Island, Precision, RangeShare


def island(gpu: str, role: str, size: int, tp: int, ep: int, batch: int, ranges: tuple[int, int],
           experts: str = "fp8") -> Island:  # fmt: skip
    dp = size // tp if role == "prefill" else size // ep
    return Island(gpu, size, role, tp, dp, ep, batch, Precision("fp8", experts), 1.0,
                  (RangeShare(ranges[0], ranges[1], 1.0, 0.5),), experts_per_gpu=256 // ep,
                  chunk_tokens=512 if role == "aggregated" else 0)  # fmt: skip


def test_the_measured_configurations_are_the_fitting_gpus_rows() -> None:
    """H200 ran 8-GPU engines only (disaggregated decode with 1-171 sequences per rank, attention TP and DP); B200
    4 and 8; MI300X aggregated engines alone; no other GPU was fitted."""
    spans = measured_spans()
    assert {gpu for gpu, _ in spans} == {"H200", "DGX-B200", "MI300X"}
    h200 = spans[("H200", "decode")]
    assert h200.engine_gpus == (8, 8) and h200.per_rank == (1, 171) and h200.dp_attention == {True, False}
    assert h200.prompt == (819, 8192) and h200.experts == {"fp8"} and h200.mtp == {True, False}
    assert spans[("DGX-B200", "decode")].engine_gpus == (4, 8) and "fp4" in spans[("DGX-B200", "decode")].experts
    assert ("MI300X", "decode") not in spans and ("MI300X", "aggregated") in spans


@pytest.mark.parametrize(
    ("isl", "drafts", "why"),
    [
        (island("H200", "decode", 8, 1, 8, 64, (1000, 4000)), 0, ()),
        (island("H200", "decode", 8, 8, 8, 171, (819, 8192)), 1, ()),
        (island("H200", "decode", 16, 1, 16, 200, (1000, 4000)), 0,
         ("an engine of 16 GPUs (measured 8-8)", "200 sequences per rank (measured 1-171)")),
        (island("H200", "prefill", 8, 8, 8, 1, (0, 1000)), 2, ("prompts of 0-1,000 tokens (measured 819-8,192)",)),
        (island("H200", "prefill", 8, 8, 8, 1, (750, 1000)), 2, ()),  # its middle, 875 tokens, was measured
        (island("DGX-B200", "decode", 8, 1, 8, 32, (1000, 2000), experts="fp4"), 0, ()),
        (island("H200", "decode", 8, 1, 8, 32, (1000, 2000), experts="fp4"), 0, ("experts in FP4",)),
        (island("MI300X", "decode", 8, 1, 8, 32, (1000, 2000)), 0, ("no decode engine was measured on MI300X",)),
        (island("MI300X", "aggregated", 8, 8, 8, 32, (1000, 2000)), 1, ("MTP 1 drafts",)),
        (island("H20", "decode", 16, 2, 16, 32, (1000, 2000)), 0, ("H20 was never measured serving",)),
    ],
)
def test_an_island_outside_the_measured_configurations_says_how(isl: Island, drafts: int, why: tuple[str, ...]) -> None:
    assert outside(isl, drafts, measured_spans()) == why


def test_a_plan_of_the_serving_model_records_and_reports_where_it_extrapolates(tmp_path: object) -> None:
    """tiny_hetero under the default model: every serving island judged (its H800 and H20 were never measured
    serving), the reasons in plan.json and report.md; under the kernel-only model nothing is judged."""
    from pathlib import Path

    import pandas as pd

    import plan as plans
    from helpers import plan_of
    from pipeline.records.report import report

    path, _ = plan_of(Path(str(tmp_path)))
    plan = plans.load(path)
    judged = {isl.gpu: isl.outside for isl in plan.serving}
    assert all(v is not None for v in judged.values())
    assert judged.get("H20", ("H20 was never measured serving",)) == ("H20 was never measured serving",)
    text = report(plan, pd.DataFrame(), "# plan")
    out = [isl for isl in plan.serving if isl.outside]
    assert f"| measured | {len(out)} of {len(plan.serving)} serving islands extrapolate" in text
    for isl in out:
        assert f"| {isl.role} | {'; '.join(isl.outside or ())} |" in text
    (Path(str(tmp_path)) / "k").mkdir()
    kernel_path, _ = plan_of(Path(str(tmp_path)) / "k", "costmodel=calibrated")
    kernel = plans.load(kernel_path)
    assert all(isl.outside is None for isl in kernel.serving)
    assert "| measured |" not in report(kernel, pd.DataFrame(), "# plan")

"""Where a plan extrapolates (pipeline/planning/envelope.py): each serving island against the configurations of the
InferenceX rows the serving calibration was fitted on, by hand; the search's plan records the reasons, report.md
lists them, and the rate band spreads the model's error once more on those GPU types."""

from __future__ import annotations

import pytest

from costmodel.measured import load_inferencex
from pipeline.planning.envelope import delivered, measured_spans, outside
from plan import Island, Precision, RangeShare


def island(gpu: str, role: str, size: int, tp: int, ep: int, batch: int, ranges: tuple[int, int],
           experts: str = "fp8", load: float = 0.0) -> Island:  # fmt: skip
    dp = size // tp if role == "prefill" else size // ep
    return Island(gpu, size, role, tp, dp, ep, batch, Precision("fp8", experts), 1.0,
                  (RangeShare(ranges[0], ranges[1], 1.0, 0.5),), experts_per_gpu=256 // ep,
                  chunk_tokens=512 if role == "aggregated" else 0, tokens_per_gpu_s=load)  # fmt: skip


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


def test_the_load_a_measured_engine_delivered_per_gpu_by_hand() -> None:
    """InferenceX's per-GPU throughputs are over all of a row's GPUs: the CSV's first row (B200, FP4, 1k/1k, 256
    users; one prefill worker of 4 GPUs, six decode workers of 8) measured 972.44 tokens/s a GPU, 526.99 of them
    output, so its prefill GPUs took (972.44 - 526.99) x 52 / 4 = 5,790.9 input tokens/s each and its decode GPUs
    526.99 x 52 / 48 = 570.9 output tokens/s. The most over the fitting rows is each span's bound, per experts'
    format (B200's FP8 and FP4 prefill workers apart)."""
    row = next(r for r in load_inferencex() if r.line == 2)
    assert (row.prefill.gpus, row.decode.gpus) == (4, 48)
    got = delivered(row)
    assert got["prefill"] == pytest.approx(5790.9, abs=0.1) and got["decode"] == pytest.approx(570.9, abs=0.1)
    spans = measured_spans()
    fitting = [r for r in load_inferencex() if r.fitting and r.hardware == "b200" and r.disagg and r.precision == "fp4"
               and r.prefill.workers and r.decode.workers]  # fmt: skip
    assert spans[("DGX-B200", "prefill")].most["fp4"] == max(delivered(r)["prefill"] for r in fitting)
    assert spans[("DGX-B200", "prefill")].most["fp8"] < spans[("DGX-B200", "prefill")].most["fp4"]
    assert set(spans[("H200", "aggregated")].most) == {"fp8"}


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
        # a load a GPU: H200's prefill workers delivered at most 2,899 input tokens/s, its decode GPUs 3,682 output
        (island("H200", "prefill", 8, 8, 8, 1, (750, 1000), load=2800.0), 2, ()),
        (island("H200", "prefill", 8, 8, 8, 1, (750, 1000), load=3000.0), 2,
         ("3,000 input tokens/s a GPU (measured at most 2,899)",)),
        (island("H200", "decode", 8, 1, 8, 64, (1000, 4000), load=5000.0), 0,
         ("5,000 output tokens/s a GPU (measured at most 3,682)",)),
        (island("H200", "decode", 16, 1, 16, 64, (1000, 4000), load=3600.0), 0,
         ("an engine of 16 GPUs (measured 8-8)",)),
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

    path, planner = plan_of(Path(str(tmp_path)))
    plan = plans.load(path)
    # every prompt is prefilled once and every output token decoded once: the islands' tokens a GPU add up to the
    # plan's rate times the workload's mean prompt and output
    assert {isl.role for isl in plan.serving} == {"prefill", "decode"}
    by_role = {role: sum(isl.tokens_per_gpu_s * isl.size for isl in plan.serving if isl.role == role)
               for role in ("prefill", "decode")}  # fmt: skip
    assert by_role["prefill"] == pytest.approx(plan.rates.rate_req_s * float(planner.ranges.p @ planner.ranges.mean))
    assert by_role["decode"] == pytest.approx(plan.rates.output_tok_s)
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

"""MTP speculative decoding as a deployment setting (`costmodel.mtp`): priced by hand, planned, simulated with the
plan's own setting, carried by plan.json, and launched as priced."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import plan as plans
from costmodel.catalog import load_gpu, load_model
from costmodel.formulas import DecodeRun, decode_step_ms, max_batch, prefill_parts, weight_bytes_per_gpu
from costmodel.island_bench import benchmark_island
from costmodel.profile import CostProfile
from costmodel.settings import MTP_ACCEPTANCE, CostSettings, Mtp
from costmodel.specs import SpecError
from helpers import compose, plan_of

DSV3 = load_model("deepseek_v3")
H200 = load_gpu("H200")


def test_accepted_tokens_are_a_chain_of_acceptances() -> None:
    """The i-th draft is kept when it and every one before it are accepted: 0.8 + 0.8^2 for two drafts at 0.8."""
    assert CostSettings().accepted == 0.0 and CostSettings().draft_layers == 0 and CostSettings().drafts == 0
    assert CostSettings(mtp=Mtp(1)).accepted == pytest.approx(MTP_ACCEPTANCE)
    assert CostSettings(mtp=Mtp(2, 0.8)).accepted == pytest.approx(1.44) == Mtp(2, 0.8).accepted
    assert CostSettings(mtp=Mtp(3)).draft_layers == 1  # one MTP module, run once per draft
    for bad in ({"drafts": 0}, {"drafts": -1}, {"drafts": 9}, {"drafts": 1.5}, {"acceptance": 0.0}):
        with pytest.raises(SpecError, match="mtp"):
            Mtp(**bad)


def test_the_mtp_module_is_one_more_moe_layer_of_prefill_and_of_memory() -> None:
    """Prefill with the MTP module runs it over the prompt: the sum grows by exactly one MoE layer's terms. Memory
    holds one more MoE layer of weights (attention, shared and routed experts) and one more layer of KV cache."""
    p = CostProfile.corrected()
    base = prefill_parts(H200, DSV3, 4096, 8, 1, cache_hit=0.0, profile=p)
    mtp = prefill_parts(H200, DSV3, 4096, 8, 1, cache_hit=0.0, profile=p, draft_layers=1)
    layer = (base["TP_MLA"] + base["Shared_Expert"] + base["Routed_Expert"] + max(float(base["Overlap1"]), 0.0)
             + max(float(base["Overlap2"]), 0.0))  # fmt: skip
    assert float(mtp["Sum"] - base["Sum"]) == pytest.approx(float(layer), rel=1e-9)
    routed = 32.0  # 256 experts over 8 GPUs
    extra = weight_bytes_per_gpu(H200, DSV3, 8, routed, p, 1) - weight_bytes_per_gpu(H200, DSV3, 8, routed, p)
    fp8 = 1.0  # H200 stores weights in FP8 (no FP4 rate)
    by_hand = (DSV3.attn_params_per_layer / 8 + (routed + 1) * DSV3.expert_params) * fp8
    assert float(extra) == pytest.approx(by_hand, rel=1e-9)
    b0, b1 = (float(max_batch(H200, DSV3, 4096, 1024, 8, routed, profile=p, draft_layers=k)) for k in (0, 1))
    assert b1 < b0 and b1 == pytest.approx(b0 * 61 / 62, rel=0.05)  # mostly the 62nd KV layer


def test_an_island_decodes_its_tokens_at_the_mtp_steps_time_over_the_tokens_a_step_yields() -> None:
    """One output token per request (no context growth): an MTP step verifying one draft, accepted with 0.85, serves
    the batch's 1.85 tokens a sequence; the island's decode rate is the batch over that step's time per token."""
    lengths, weights = np.array([2048.0]), np.array([1.0])
    off = benchmark_island(H200, 8, DSV3, lengths, weights, 1.0, 64, cost=CostSettings())
    on = benchmark_island(H200, 8, DSV3, lengths, weights, 1.0, 64, cost=CostSettings(mtp=Mtp(1)))
    assert on.decode.chosen >= 0 and off.decode.chosen >= 0
    i = on.decode.chosen
    tp, ep, batch = on.decode.tp[i], on.decode.ep[i], on.decode.batch[i, 0]
    step = float(decode_step_ms(H200, DSV3, 2049.0, batch, tp, ep, run=DecodeRun(draft_tokens=1)))
    assert on.decode.time_ms[i, 0] == pytest.approx(step / (1 + MTP_ACCEPTANCE), rel=1e-9)
    assert on.decode_req_s[0] == pytest.approx(batch * (8 / tp) * 1000 / (step / 1.85), rel=1e-9)
    assert on.decode_req_s[0] > off.decode_req_s[0]  # at this batch the drafts pay for themselves
    assert on.prefill_req_s[0] < off.prefill_req_s[0]  # the prompt also runs through the MTP module


def test_a_model_without_an_mtp_module_is_refused() -> None:
    qwen = load_model("qwen3_235b_a22b")
    with pytest.raises(SpecError, match=r"has no MTP module .*costmodel\.mtp\.drafts=0"):
        benchmark_island(H200, 8, qwen, np.array([1024.0]), np.array([1.0]), 100.0, 200, cost=CostSettings(mtp=Mtp(1)))


def test_the_mtp_setting_travels_from_the_config_to_plan_json_and_back(tmp_path: Path) -> None:
    from pipeline.errors import ConfigError
    from pipeline.planning.config import cost_settings_from_cfg

    cost = cost_settings_from_cfg(compose(["costmodel.mtp.drafts=2", "costmodel.mtp.acceptance=0.8"]))
    assert cost.mtp == Mtp(2, 0.8) and cost.drafts == 2
    back = CostSettings.from_json(json.loads(json.dumps(cost.to_json())), "plan.json")
    assert back == cost
    old = {k: v for k, v in cost.to_json().items() if k != "mtp"}  # a plan from before MTP
    assert CostSettings.from_json(old, "plan.json").mtp is None
    for override, msg in (("costmodel.mtp.drafts=-1", "costmodel.mtp.drafts must be a whole number"),
                          ("costmodel.mtp.drafts=7", "0 <= mtp.drafts <= 4"),
                          ("costmodel.mtp.drafts=1.5", "costmodel.mtp.drafts must be a whole number"),
                          ("costmodel.mtp.acceptance=1.5", "costmodel.mtp.acceptance must be a number"),
                          ("+costmodel.mtp.rate=1", "costmodel.mtp.rate is not an MTP setting")):  # fmt: skip
        with pytest.raises(ConfigError, match=msg):
            cost_settings_from_cfg(compose([override]))
    path, planner = plan_of(tmp_path, "costmodel.mtp.drafts=1")
    plan = plans.load(path)
    assert plan.cost == planner.cost and plan.cost.mtp == Mtp(1, MTP_ACCEPTANCE)


def test_a_plan_with_mtp_is_simulated_with_its_drafts_and_holds_its_rate(tmp_path: Path) -> None:
    """The simulator's decode engines take the plan's MTP setting (the same plan without it decodes slower), and the
    plan's stated rate holds its SLOs there, request by request."""
    import dataclasses

    from omegaconf import OmegaConf

    from costmodel.catalog import CONF_DIR
    from pipeline.planning.simulation import Runner, request_mix
    from simulator.build import build

    path, _ = plan_of(tmp_path, "costmodel.mtp.drafts=1")
    plan = plans.load(path)
    gpus = {isl.gpu: load_gpu(isl.gpu) for isl in plan.serving}
    _, with_mtp, _ = build(plan, gpus)
    _, without, _ = build(dataclasses.replace(plan, cost=dataclasses.replace(plan.cost, mtp=None)), gpus)
    a, b = with_mtp[0].timing, without[0].timing
    assert a.step_ms(a.max_seqs, 2048.0) < b.step_ms(a.max_seqs, 2048.0)
    runner = Runner(plan, plan.slo)
    spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "workload" / "azure_code.yaml"))
    _, metrics, _ = runner.simulate(request_mix("azure_code", spec).requests(20000, plan.rate_req_s))  # type: ignore[arg-type]
    assert runner.verdict(metrics) == ""


def test_the_report_says_how_the_plan_decodes() -> None:
    import dataclasses

    import pandas as pd

    from helpers import tiny_plan
    from pipeline.records.report import report

    plan = tiny_plan(96.0)
    assert "| decoding | one token a step (no MTP: costmodel.mtp.drafts=0) |" in report(plan, pd.DataFrame(), "# p")
    mtp = dataclasses.replace(plan, cost=dataclasses.replace(plan.cost, mtp=Mtp(2, 0.8)))
    text = report(mtp, pd.DataFrame(), "# p")
    assert "| decoding | MTP, 2 draft tokens a step, each accepted with 0.8: 2.44 tokens a step |" in text

"""SGLang's own settings resolution and checks as Archipelago runs them (deployment.engines.sglang.check:
`prepare_server_args`, `resolve_once`, `check_server_args`, on a stubbed device probe reporting the engine's GPU),
and what SGLang-specific the parameter table writes. Every plan's engines through it, read back row by row:
tests/test_engine_contract.py (every engine passes it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

if importlib.util.find_spec("sglang") is None:  # importing it needs deployment.engines.sglang.check's stubs
    pytest.skip("SGLang is not installed: pip install --no-deps 'sglang==0.5.23'", allow_module_level=True)

from test_engine_contract import off_plan

import plan as plans
from deployment.commands import engine_argv
from deployment.deployable import engines
from deployment.engines import adapter
from deployment.launch import example_argv
from deployment.options import DeployOptions
from helpers import REPO, plan_of

PLANS = sorted((REPO / "tests" / "data" / "plans").glob("*.json"))
SMALL = ["--model-path", "/models/DeepSeek-V3", "--trust-remote-code", "--tp-size", "8"]


@pytest.fixture(scope="module")
def sc():
    """deployment.engines.sglang.check with SGLang imported behind its stubs: once per test process."""
    from deployment.engines.sglang import check

    check.resolve(SMALL, "H20")
    return check


def sglang_argv(e) -> list[str]:
    """What follows `python3 -m sglang.launch_server` on engine `e`'s leader (a record changed by the test too)."""
    return example_argv(adapter("sglang").command(e, 0, DeployOptions()), 0)[3:]


def test_a_known_good_command_resolves(sc):
    args = sc.resolve(SMALL, "H20")
    assert sc.value(args, "chunked_prefill_size") == 8192  # SGLang's default for a 96 GB GPU (memory_hook.py)
    assert sc.value(args, "model_path") == str(sc.MODEL_DIR)
    assert 0 < sc.value(args, "mem_fraction_static") < 1
    assert sc.kv_pool_tokens(args, "H20", weight_bytes=80e9) > 0


def test_memory_dependent_defaults_follow_the_gpu(sc):
    """The device probe reports the engine's GPU: 80 GB and 141 GB give SGLang's other static fractions."""
    fractions = {gpu: sc.value(sc.resolve(SMALL, gpu), "mem_fraction_static") for gpu in ("H800", "H20", "H200")}
    assert fractions["H800"] < fractions["H20"] < fractions["H200"], fractions


def test_each_resolve_probes_its_own_gpu_whatever_was_resolved_before(sc):
    """SGLang caches its platform probes for the process (`is_blackwell`, `is_sm100`, ...; its defaults follow
    them): a B200 resolved first must not answer for an H200 resolved after it, nor the H200 for the next B200."""
    from sglang.srt.utils import common

    for gpu, sm100 in (("DGX-B200", True), ("H200", False), ("DGX-B200", True)):
        sc.resolve(SMALL, gpu)
        assert common.is_sm100_supported.cache_info().currsize == 1, "the resolution asked the probe"
        assert common.is_sm100_supported() is sm100, gpu  # what the resolution was answered


def test_a_command_sglang_refuses_raises_its_message(sc):
    argv = ["--model-path", "/models/DeepSeek-V3", "--tp-size", "16", "--ep-size", "16", "--attn-dp-size", "4",
            "--moe-dense-tp-size", "4", "--enable-dp-lm-head"]  # fmt: skip
    with pytest.raises(sc.EngineRefused, match="moe_dense_tp_size only supports None, 1, or tp_size"):
        sc.resolve(argv, "H20")


def test_a_gpu_without_device_facts_is_one_error_naming_the_file_to_add_them_to(sc):
    from deployment.engines.device import NoDevice

    with pytest.raises(NoDevice, match=r"H100-SXM: conf/gpu/H100-SXM.yaml has no `device:` block"):
        sc.resolve(SMALL, "H100-SXM")


def test_an_unknown_flag_is_refused(sc):
    with pytest.raises(sc.EngineRefused, match="unrecognized arguments: --no-such-flag"):
        sc.resolve([*SMALL, "--no-such-flag"], "H20")


def test_a_setting_that_departs_from_the_plan_is_caught(sc):
    """The comparison can fail: an engine left at SGLang's default chunked prefill (divided by its DP ranks)."""
    plan = plans.load(PLANS[0])
    e = next(e for e in engines(plan) if e.attn_dp > 1)
    argv = engine_argv(e, 0, plan, DeployOptions())[3:]
    at = argv.index("--chunked-prefill-size")
    rows = {s.name: s for s in sc.settings(plan, e, argv[:at] + argv[at + 2 :])}
    chunk = rows["prefill tokens per rank per forward"]
    assert not chunk.holds and chunk.resolved == 8192 // e.attn_dp


def test_a_prefill_engine_left_at_sglangs_own_memory_fraction_would_not_start(sc):
    """SGLang reserves activation memory for its whole chunked-prefill size (every attention rank's share, 1.5 MB a
    token): left to its own memory fraction, a prefill engine resolves a negative one and SGLang would size no KV
    pool ("Loaded weights leave no GPU memory for the KV cache"). The plan's fraction, the cost model's, is set."""
    plan = plans.load(PLANS[0])
    e = next(e for e in engines(plan) if e.role == "prefill" and e.attn_dp > 1)
    argv = engine_argv(e, 0, plan, DeployOptions())[3:]
    at = argv.index("--mem-fraction-static")
    assert argv[at + 1] == "0.9"
    rows = {s.name: s for s in sc.settings(plan, e, argv[:at] + argv[at + 2 :])}
    assert rows["mem_fraction_static"].resolved < 0 and not rows["mem_fraction_static"].holds
    pool = next(s for n, s in rows.items() if n.startswith("KV pool"))
    assert pool.resolved == 0 and not pool.holds


def test_a_decode_island_priced_with_one_micro_batch_launches_without_the_overlap(sc, tmp_path: Path):
    """Under `overlap_chosen` (costmodel=serving) a decode island runs two overlapped micro-batches only where the
    cost model found that faster at its batch (plan.Island.overlap): its engines get --enable-two-batch-overlap
    exactly then, SGLang resolves that, and an engine launched against its island's choice is caught."""
    import dataclasses

    path, _ = plan_of(tmp_path, "costmodel=serving")
    plan = plans.load(path)
    assert plan.cost.profile.overlap_chosen
    for e in engines(plan):
        assert e.overlap == plan.islands[e.island].overlap
    e = next(e for e in engines(plan) if e.role == "decode")
    for overlap in (True, False):
        mine = dataclasses.replace(e, overlap=overlap)
        argv = sglang_argv(mine)
        assert ("--enable-two-batch-overlap" in argv) == overlap
        rows = {s.name: s for s in sc.settings(plan, mine, argv)}
        assert rows["two-batch overlap"].holds and rows["two-batch overlap"].resolved == overlap
        other = {s.name: s for s in sc.settings(plan, dataclasses.replace(e, overlap=not overlap), argv)}
        assert not other["two-batch overlap"].holds


def test_the_memory_fraction_and_kv_format_a_plan_was_priced_at_are_the_ones_its_engines_run(sc):
    """costmodel.mem_fraction=0.95 (InferenceX's B200 TP4 runs) and costmodel.kv_dtype=bf16: the plan's batches are
    sized in 95 % of each GPU's memory with a BF16 cache, and its engines launch with --mem-fraction-static 0.95
    and --kv-cache-dtype bfloat16, which SGLang's own resolution keeps."""
    import dataclasses

    from costmodel.settings import CostSettings, EngineSettings
    from helpers import tiny_plan
    from plan.engines import engines_of

    plan = tiny_plan()
    plan = dataclasses.replace(plan, cost=CostSettings(engine=EngineSettings(mem_fraction=0.95, kv_dtype="bf16")))
    e = engines_of(plan)[0]
    assert (e.mem_fraction, e.kv_dtype) == (0.95, "bf16")
    args = sc.resolve(sglang_argv(e), e.gpu)
    assert sc.value(args, "mem_fraction_static") == 0.95 and str(sc.value(args, "kv_cache_dtype")) == "bfloat16"


def test_a_plan_with_mtp_launches_its_drafts_on_every_engine(sc, tmp_path: Path):
    """`costmodel.mtp.drafts=1`: every engine runs the MTP module drafting one token a step (prefill engines too: they
    send decode its first draft, and the plan priced their prompts through it). SGLang accepts every engine and
    resolves the plan's drafts and batch; an engine launched without them is caught."""
    path, _ = plan_of(tmp_path, "costmodel.mtp.drafts=1")
    plan = plans.load(path)
    for e in engines(plan):
        argv = engine_argv(e, 0, plan, DeployOptions())[3:]
        assert argv[argv.index("--speculative-num-steps") + 1] == "1"
        rows = {s.name: s for s in sc.settings(plan, e, argv)}
        off = [f"{n}: {s.resolved} against {s.plan}" for n, s in rows.items() if not s.holds]
        assert not off and rows["MTP draft tokens per step"].resolved == 1, (e.name, off)
    e = next(e for e in engines(plan) if e.role == "decode")
    argv = engine_argv(e, 0, plan, DeployOptions())[3:]
    at = argv.index("--speculative-algorithm")
    plain = argv[:at] + argv[at + 8 :]
    assert "--speculative-num-steps" not in plain
    rows = {s.name: s for s in sc.settings(plan, e, plain)}
    assert not rows["MTP draft tokens per step"].holds and rows["MTP draft tokens per step"].resolved == 0


B200 = ("~inventory.gpus.H800", "~inventory.gpus.H20", "~inventory.gpus.H200", "+inventory.gpus.DGX-B200=16")


@pytest.mark.parametrize("experts", ["fp4", "fp8"])
def test_a_b200_plan_launches_its_experts_in_the_format_it_priced(sc, tmp_path: Path, experts: str):
    """16 B200: the cost model prices the routed experts at the GPU's FP4 rate unless told FP8. An FP4 island's
    engines load the FP8 checkpoint with --quantization modelopt_fp4, which SGLang's own model config resolves against
    the checkpoint's FP8 quantization as NVFP4 experts requantized on load (dense layers stay FP8); an FP8 island's
    get no flag and resolve the checkpoint's fp8. Every setting holds on a Blackwell device probe; an FP4 engine
    launched without the flag is caught."""
    import dataclasses

    fixes = () if experts == "fp4" else ("+costmodel.fixes.experts_fp8=true",)
    path, _ = plan_of(tmp_path, *B200, "costmodel=serving", *fixes)
    plan = plans.load(path)
    assert {i.precision.experts for i in plan.islands if i.serving} == {experts}
    for e in engines(plan):
        argv = engine_argv(e, 0, plan, DeployOptions())[3:]
        assert ("--quantization" in argv) == (experts == "fp4")
        rows = {s.name: s for s in sc.settings(plan, e, argv)}
        off = [f"{n}: {s.resolved} against {s.plan}" for n, s in rows.items() if not s.holds]
        assert not off and rows["routed experts' format"].resolved == experts, (e.name, off)
    e = engines(plan)[0]
    other = dataclasses.replace(e, experts="fp8" if experts == "fp4" else "fp4")
    rows = {s.name: s for s in sc.settings(plan, e, sglang_argv(other))}
    assert not rows["routed experts' format"].holds


def test_the_check_of_a_plan_on_a_gpu_without_a_device_probe_is_one_line(sc, tmp_path: Path):
    from helpers import cli, on_one_gpu

    path, _ = plan_of(tmp_path)
    h100 = on_one_gpu(plans.load(path), "H100-SXM")
    (tmp_path / "h100.json").write_text(__import__("json").dumps(plans.to_json(h100)))
    r = cli("deployment.sglang_check", str(tmp_path / "h100.json"))
    assert r.returncode != 0 and r.stderr.strip().startswith("error:") and "H100-SXM" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_re_plans_engines_resolve_to_what_it_priced(sc, tmp_path: Path):
    """A re-plan (search.from_plan) of the small plan after it loses an H20 host: the engines pipeline.deploy launches
    anew (the changed islands) pass SGLang's own checks and resolve to the plan's settings, and so do the islands
    that run on, at the batch they were launched with."""
    from helpers import SMALL, in_process
    from pipeline.search.run import execute

    def search(out: Path, *args: str) -> Path:
        r = in_process(execute, "search", *SMALL, "search.band_draws=0", "search.verify=false", *args,
                       f"out_root={out}", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db")  # fmt: skip
        assert r.returncode == 0, r.stderr
        return next(out.glob("*/*/plan.json"))

    old = search(tmp_path / "old", "search.sampler=exact")
    path = search(tmp_path / "new", "inventory.gpus.H20=24", f"search.from_plan={old}", "search.lost_hosts=[H20:3]")
    plan = plans.load(path)
    assert plan.replan is not None
    launched = [e for e in engines(plan) if e.island not in set(plan.replan.kept)]
    assert plan.replan.moves and launched and plan.replan.kept  # islands launched anew beside islands that run on
    off = off_plan(adapter("sglang"), plan)
    assert not off, "\n".join(off)


def test_a_plan_priced_with_a_host_kv_tier_launches_sglangs_hierarchical_cache_of_that_size(sc):
    """costmodel.host_cache_gb=200: the prefill engines launch with --enable-hierarchical-cache --hicache-size 200,
    which SGLang's own resolution keeps and the check reads back; decode engines keep no prefix cache and take none.
    A fractional size is refused in one line (SGLang takes whole GB), and so is a host tier on vLLM, whose launch
    files keep the cache in GPU memory only."""
    import dataclasses

    from costmodel.settings import CostSettings, EngineSettings
    from deployment.errors import DeployError
    from helpers import tiny_plan
    from plan.engines import engines_of

    base = tiny_plan()
    plan = dataclasses.replace(base, cost=CostSettings(engine=EngineSettings(host_cache_gb=200)))
    pre = [e for e in engines_of(plan) if e.role.value == "prefill"]
    dec = [e for e in engines_of(plan) if e.role.value != "prefill"]
    assert pre and dec and all(e.host_cache_gb == 200 for e in pre) and all(e.host_cache_gb == 0 for e in dec)
    argv = sglang_argv(pre[0])
    assert argv[argv.index("--hicache-size") + 1] == "200" and "--enable-hierarchical-cache" in argv
    args = sc.resolve(argv, pre[0].gpu)
    assert sc.value(args, "enable_hierarchical_cache") is True and sc.value(args, "hicache_size") == 200
    rows = {s.name: s for s in adapter("sglang").settings(plan, pre[0], argv, {}, DeployOptions())}
    tier = rows["hierarchical cache's host pool, GB per rank"]
    assert (tier.resolved, tier.plan, tier.holds) == (200.0, 200, True)
    assert "--enable-hierarchical-cache" not in sglang_argv(dec[0])
    half = dataclasses.replace(base, cost=CostSettings(engine=EngineSettings(host_cache_gb=12.5)))
    with pytest.raises(DeployError, match=r"host KV tier of 12.5 GB per GPU; SGLang takes it in whole GB"):
        sglang_argv(next(e for e in engines_of(half) if e.role.value == "prefill"))
    vllm = DeployOptions(engine="vllm")
    with pytest.raises(DeployError, match=r"the vLLM launch files keep its prefix cache in GPU memory only"):
        adapter("vllm").command(pre[0], 0, vllm)


def test_a_plan_of_a_model_the_checks_hold_no_config_for_is_refused_not_judged_as_deepseek(sc) -> None:
    """The checks resolve a command against its model's config.json; SGLang's holds the catalogue's priced models'
    only, so a plan of another model (here the tests' plan renamed glm_5, its islands kept) is refused in one line
    rather than its engines judged as DeepSeek-V3 engines."""
    import dataclasses

    from deployment.engines.base import EngineRefused
    from helpers import tiny_plan
    from plan.engines import engines_of

    base = tiny_plan()
    plan = dataclasses.replace(base, model=dataclasses.replace(base.model, name="glm_5"))
    with pytest.raises(EngineRefused, match=r"'s only \(tests/data/models\): glm_5's engines are not judged here"):
        adapter("sglang").check(plan, engines_of(plan)[0], 0, DeployOptions())


@pytest.mark.parametrize("model", ["qwen3_coder_480b_a35b", "qwen3_235b_a22b", "qwen3_30b_a3b", "gpt_oss_120b",
                                   "kimi_k2", "deepseek_v32", "glm_4_6", "llama_3_3_70b"])
def test_another_models_plan_runs_what_it_priced_by_sglangs_own_resolution_of_its_config(sc, tmp_path: Path,
                                                                                        model: str) -> None:
    """tiny_hetero's exact plan of another MoE model than DeepSeek-V3 (GQA: Qwen3-Coder-480B's 160 experts, Qwen3-235B's
    and 30B's 128, GPT-OSS-120B's 128 MXFP4 experts and sliding window; MLA: Kimi-K2's 384 experts and 64 heads,
    DeepSeek-V3.2's sparse attention and its indexer's key cache; dense: Llama-3.3-70B's replicas):
    every engine's command, resolved by SGLang against the
    model's config (tests/data/models), holds every row of the parameter table (GPT-OSS's experts resolved MXFP4, as
    priced) and a KV pool (its KV heads split over the attention TP group) at least what the plan keeps there.
    (vLLM's check of the same plans: tests/test_vllm_check.py.)"""
    path, _ = plan_of(tmp_path, f"model={model}", "costmodel=calibrated")
    plan = plans.load(path)
    assert plan.model.name == model and plan.rate_req_s > 0
    for e in engines(plan):
        rows = adapter("sglang").check(plan, e, 0, DeployOptions())
        assert rows and all(s.holds for s in rows), [(s.name, s.resolved, s.plan) for s in rows if not s.holds]
        assert any(s.name.startswith("KV pool") for s in rows)


@pytest.mark.parametrize(("gpu", "kv"), [("H200", "fp8"), ("H200", "bf16"), ("DGX-B200", "fp8")])
def test_a_sparse_attention_models_kv_cache_is_the_bytes_sglang_sizes_its_pool_by(sc, gpu: str, kv: str) -> None:
    """DeepSeek-V3.2's KV cache per token, as the cost model prices it (`kv_bytes_per_seq`: the latent in SGLang's
    FlashMLA FP8 layout on Hopper, 656 bytes a layer, the plain FP8 row of Blackwell's TRT-LLM kernels, 576, or
    BF16's 1,152; the indexer's 132-byte keys), is what SGLang sizes its pool by: the same memory holds the same
    tokens, to SGLang's page."""
    import numpy as np

    from costmodel.catalog import load_gpu, load_model
    from costmodel.formulas import kv_bytes_per_seq
    from costmodel.profile import CostProfile
    from deployment.engines.base import MODELS_DIR

    args = sc.resolve(["--tp-size", "8", "--kv-cache-dtype", {"fp8": "fp8_e4m3", "bf16": "bfloat16"}[kv],
                       "--mem-fraction-static", "0.9"], gpu, MODELS_DIR / "deepseek-v32")  # fmt: skip
    free = 100e9
    pool = sc.kv_pool_tokens(args, gpu, weight_bytes=0.0, free_bytes=free)
    per_token = float(kv_bytes_per_seq(load_gpu(gpu), load_model("deepseek_v32"), np.array(1.0), np.array(8),
                                       CostProfile.corrected(), kv_dtype=kv))  # fmt: skip
    assert per_token == 61 * ({("H200", "fp8"): 656, ("DGX-B200", "fp8"): 576}.get((gpu, kv), 1152) + 132)
    page = int(sc.value(args, "page_size"))
    assert free * 0.9 / per_token - page <= pool <= free * 0.9 / per_token


def test_a_dense_models_islands_launch_as_replicas_of_their_tp_group(sc, tmp_path: Path) -> None:
    """Llama-3.3-70B (no experts): every island, prefill or decode, is replicas of `tp` GPUs, launched one engine a
    host: SGLang's data parallelism (--dp-size, no DP attention) runs the host's replicas, with no expert
    parallelism, no all-to-all and nothing overlapped, as its steps were priced, and as SGLang resolves each
    engine's command."""
    path, _ = plan_of(tmp_path, "model=llama_3_3_70b", "costmodel=calibrated")
    plan = plans.load(path)
    assert plan.model.dense
    for k, isl in enumerate(plan.islands):
        if not isl.serving:
            continue
        mine = [e for e in engines(plan) if e.island == k]
        assert not isl.overlap and isl.experts_per_gpu == 0
        assert sum(e.gpus for e in mine) == isl.size and sum(e.replicas for e in mine) == isl.dp
        for e in mine:
            assert (e.attn_tp, e.attn_dp * e.attn_tp, e.ep_group, e.overlap, e.nnodes) == (isl.tp, e.gpus, 1, False, 1)
            args = sc.resolve(engine_argv(e, 0, plan, DeployOptions())[3:], e.gpu,
                              REPO / "tests" / "data" / "models" / "llama-3.3-70b")
            v = sc.view(args)
            assert (int(v.tp_size), int(v.dp_size), int(v.ep_size), int(v.attn_dp_size), str(v.moe_a2a_backend),
                    bool(v.enable_two_batch_overlap)) == (isl.tp, e.attn_dp, 1, 1, "none", False)  # fmt: skip

"""vLLM 0.33.0's own settings resolution as Archipelago runs it (`deployment.engines.vllm.check`: vLLM's parser,
`ServeSubcommand`, `EngineArgs.create_engine_config`, on the real DeepSeek-V3 config with a stubbed CUDA platform
reporting the GPU's catalogue device facts), and what vLLM-specific the parameter table writes. Every plan's engines
through it, read back row by row: tests/test_engine_contract.py (every engine passes it). Skips, naming what to
install, where vLLM's source or the packages it imports are missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import plan as plans
from deployment.commands import engine_argv
from deployment.deployable import engines
from deployment.engines import adapter
from deployment.engines.base import EngineArgsMissing
from deployment.launch import example_argv
from deployment.options import DeployOptions
from helpers import plan_of
from plan import Engine

PLANS = sorted((Path(__file__).parent / "data" / "plans").glob("*.json"))
OPTS = DeployOptions(engine="vllm")


@pytest.fixture(scope="module")
def vllm_check():
    from deployment.engines.vllm import check

    try:
        check._vllm()
    except EngineArgsMissing as err:
        pytest.skip(str(err))
    return check


def launch_env(e: Engine, rank: int, plan) -> dict[str, str]:
    """The engine's environment as its launch file sets it (host-known values as examples)."""
    from deployment.engines.vllm.check import launch_env as env_of

    return env_of(e, rank, plan, OPTS)


def vllm_argv(e: Engine) -> list[str]:
    """What follows `vllm serve` on engine `e`'s leader (a record changed by the test too)."""
    return example_argv(adapter("vllm").command(e, 0, OPTS), 0)[2:]


def test_a_known_good_command_resolves_and_its_values_read_back(vllm_check) -> None:
    argv = [
        "/models/DeepSeek-V3", "--trust-remote-code",
        "--tensor-parallel-size", "2", "--data-parallel-size", "4", "--enable-expert-parallel",
        "--max-num-batched-tokens", "8192", "--max-num-seqs", "64",
        "--enable-eplb", "--eplb-config", json.dumps({"num_redundant_experts": 32}),
        "--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}),
        "--gpu-memory-utilization", "0.85", "--port", "30000",
    ]  # fmt: skip
    c = vllm_check.resolve(argv, "H200")
    p = c.parallel_config
    assert (p.tensor_parallel_size, p.data_parallel_size, p.data_parallel_size_local) == (2, 4, 4)
    assert p.enable_expert_parallel and p.enable_eplb and p.eplb_config.num_redundant_experts == 32
    assert (c.scheduler_config.max_num_batched_tokens, c.scheduler_config.max_num_seqs) == (8192, 64)
    assert c.cache_config.gpu_memory_utilization == 0.85
    assert c.kv_transfer_config.kv_connector == "NixlConnector" and c.kv_transfer_config.kv_role == "kv_both"
    assert c.model_config.hf_config.n_routed_experts == 256 and c.model_config.use_mla  # the real config.json
    assert c.compilation_config.cudagraph_capture_sizes[-1] <= 2 * 64  # decode graphs up to the batch

    from vllm.platforms import current_platform  # the stubbed device probe answers for the GPU asked

    assert current_platform.get_device_name() == "NVIDIA H200"
    assert current_platform.get_device_total_memory() == 143771 << 20
    assert current_platform.get_device_capability().to_int() == 90


def test_each_resolve_probes_its_own_gpu_whatever_was_resolved_before(vllm_check) -> None:
    """vLLM caches the device's compute capability for the life of a process: a B200 (10.0) resolved first must
    not answer for an H200 (9.0) resolved after it (its attention backends and FP8 kernels are chosen by it)."""
    from vllm.platforms import current_platform

    argv = ["/models/DeepSeek-V3", "--trust-remote-code", "--tensor-parallel-size", "8", "--port", "30000"]
    for gpu, capability in (("DGX-B200", 100), ("H200", 90), ("DGX-B200", 100)):
        vllm_check.resolve(argv, gpu)
        assert current_platform.get_device_capability().to_int() == capability, gpu


def test_a_gpu_without_device_facts_is_one_error_naming_the_file_to_add_them_to(vllm_check) -> None:
    from deployment.engines.device import NoDevice

    with pytest.raises(NoDevice, match=r"H100-SXM: conf/gpu/H100-SXM.yaml has no `device:` block"):
        vllm_check.resolve(["/m", "--tensor-parallel-size", "8"], "H100-SXM")


def test_a_command_vllm_refuses_raises_with_vllms_message(vllm_check) -> None:
    with pytest.raises(vllm_check.EngineRefused, match=r"argument --all2all-backend: invalid choice: 'deepep'"):
        vllm_check.resolve(["/m", "--enable-expert-parallel", "--all2all-backend", "deepep"], "H20")
    # 16 GPUs of tensor parallel on one 8-GPU host (ParallelConfig._verify_args)
    with pytest.raises(vllm_check.EngineRefused, match=r"World size \(16\) is larger than the number of available"):
        vllm_check.resolve(["/m", "--tensor-parallel-size", "16"], "H800")
    # dual-batch overlap needs a DeepEP / NIXL-EP all2all backend (VllmConfig, config/vllm.py)
    dbo = ["/m", "--data-parallel-size", "8", "--enable-expert-parallel", "--enable-dbo"]
    with pytest.raises(vllm_check.EngineRefused, match=r"Microbatching currently only supports the deepep_low_latency"):
        vllm_check.resolve(dbo, "H20")
    assert vllm_check.resolve([*dbo, "--all2all-backend", "deepep_low_latency"], "H20").parallel_config.use_ubatching


def test_a_setting_that_departs_from_the_plan_is_caught(vllm_check) -> None:
    """The comparison can fail: a decode engine left at vLLM's default all-to-all (allgather/reduce-scatter)."""
    plan = plans.load(PLANS[0])
    e = next(e for e in engines(plan) if e.role == "decode")
    argv = engine_argv(e, 0, plan, OPTS)[2:]
    at = argv.index("--all2all-backend")
    argv = argv[:at] + argv[at + 2 :]
    argv.remove("--enable-dbo")  # vLLM refuses micro-batch overlap without a DeepEP-like backend
    rows = {s.name: s for s in vllm_check.settings(plan, e, argv, launch_env(e, 0, plan))}
    assert not rows["all-to-all"].holds and rows["all-to-all"].resolved == "allgather_reducescatter"


def test_dual_batch_overlap_follows_the_islands_pricing(vllm_check) -> None:
    """--enable-dbo exactly where the island was priced with two overlapped micro-batches (plan.Island.overlap);
    vLLM resolves it so, and a command against the island's choice is caught."""
    import dataclasses

    plan = plans.load(PLANS[0])
    e = next(e for e in engines(plan) if e.role == "decode")
    env = launch_env(e, 0, plan)
    for overlap in (True, False):
        mine = dataclasses.replace(e, overlap=overlap)
        argv = vllm_argv(mine)
        assert ("--enable-dbo" in argv) == overlap
        rows = {s.name: s for s in vllm_check.settings(plan, mine, argv, env)}
        assert rows["dual-batch overlap"].holds
        other = dataclasses.replace(e, overlap=not overlap)
        assert not {s.name: s for s in vllm_check.settings(plan, other, argv, env)}["dual-batch overlap"].holds


def test_a_plan_with_mtp_launches_its_drafts_on_every_engine(vllm_check, tmp_path: Path) -> None:
    """`costmodel.mtp.drafts=1`: every engine gets the MTP speculative config; vLLM resolves one draft token, and a
    decode engine's CUDA graph at its batch's tokens (each sequence's own and its draft); without the config the
    departure is caught."""
    path, _ = plan_of(tmp_path, "costmodel.mtp.drafts=1")
    plan = plans.load(path)
    for e in engines(plan):
        argv = engine_argv(e, 0, plan, OPTS)[2:]
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec == {"method": "mtp", "num_speculative_tokens": 1}
        rows = {s.name: s for s in vllm_check.settings(plan, e, argv, launch_env(e, 0, plan))}
        off = [f"{n}: {s.resolved} against {s.plan}" for n, s in rows.items() if not s.holds]
        assert not off and rows["MTP draft tokens per step"].resolved == 1, (e.name, off)
    e = next(e for e in engines(plan) if e.role == "decode")
    argv = engine_argv(e, 0, plan, OPTS)[2:]
    at = argv.index("--speculative-config")
    rows = {s.name: s for s in vllm_check.settings(plan, e, argv[:at] + argv[at + 2 :], launch_env(e, 0, plan))}
    assert not rows["MTP draft tokens per step"].holds and rows["MTP draft tokens per step"].resolved == 0


def test_the_check_of_a_plan_on_a_gpu_without_a_device_probe_is_one_line(tmp_path: Path) -> None:
    from helpers import cli, on_one_gpu

    path, _ = plan_of(tmp_path)
    h100 = on_one_gpu(plans.load(path), "H100-SXM")
    (tmp_path / "h100.json").write_text(json.dumps(plans.to_json(h100)))
    r = cli("deployment.vllm_check", str(tmp_path / "h100.json"))
    assert r.returncode != 0 and r.stderr.strip().startswith("error:") and "H100-SXM" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("model", ["qwen3_coder_480b_a35b", "qwen3_235b_a22b", "qwen3_30b_a3b", "gpt_oss_120b",
                                   "kimi_k2", "deepseek_v32", "glm_4_6", "llama_3_3_70b"])
def test_another_models_plan_runs_what_it_priced_by_vllms_own_resolution_of_its_config(vllm_check, tmp_path: Path,
                                                                                       model: str) -> None:
    """tiny_hetero's exact plan of each catalogue model but DeepSeek-V3 (whose plans the other tests judge): an engine
    of every island, resolved by vLLM against the model's own config (tests/data/models), holds every row of the
    parameter table: GPT-OSS's experts in vLLM's MXFP4, a dense model's replicas without expert parallelism, and
    every decode batch in a CUDA graph of exactly its tokens (past vLLM's default grid, the capture sizes given)."""
    path, _ = plan_of(tmp_path, f"model={model}", "costmodel=calibrated")
    plan = plans.load(path)
    first = {}
    for e in engines(plan):
        first.setdefault(e.island, e)
    for e in first.values():
        rows = adapter("vllm").check(plan, e, 0, OPTS)
        assert rows and all(s.holds for s in rows), [(s.name, s.resolved, s.plan) for s in rows if not s.holds]


def test_a_decode_batch_off_vllms_capture_grid_is_captured_as_priced() -> None:
    """A batch on vLLM's default capture grid is left to it; one off it (or past 512 tokens) gets the capture sizes
    written: the grid and its own tokens a step (with MTP drafts, each sequence's tokens)."""
    from dataclasses import replace

    from deployment.parameters import VLLM_GRAPH_GRID, _vllm_batch
    from helpers import tiny_plan
    from plan.engines import engines_of

    e = next(x for x in engines_of(tiny_plan()) if x.role.decodes)
    assert _vllm_batch(48, replace(e, drafts=0), OPTS) == ["--max-num-seqs", "48"]
    assert _vllm_batch(100, replace(e, drafts=1), OPTS) == ["--max-num-seqs", "100"]  # 200 tokens: on the grid
    for batch, drafts, tokens in ((354, 0, 354), (535, 0, 535), (99, 1, 198), (300, 1, 600)):
        out = _vllm_batch(batch, replace(e, drafts=drafts), OPTS)
        assert out[:2] == ["--max-num-seqs", str(batch)] and out[2] == "--compilation-config"
        sizes = json.loads(out[3])["cudagraph_capture_sizes"]
        assert tokens in sizes and set(VLLM_GRAPH_GRID) <= set(sizes) and sizes == sorted(sizes)

"""The `vllm serve` command lines Archipelago writes, run through vLLM 0.33.0's own settings resolution
(`deployment.vllm_check`: vLLM's parser, `ServeSubcommand`, `EngineArgs.create_engine_config`, on the real
DeepSeek-V3 config with a stubbed H-series CUDA platform). Skips, naming what to install, where vLLM's
source or the packages it imports are missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import plan as plans
from deployment.commands import DeployOptions, engine_argv
from deployment.engine_args import EngineArgsMissing
from deployment.engines import Engine, engines
from helpers import plan_of

PLANS = sorted((Path(__file__).parent / "data" / "plans").glob("*.json"))
OPTS = DeployOptions(engine="vllm")


@pytest.fixture(scope="module")
def vllm_check():
    from deployment import vllm_check

    try:
        vllm_check._vllm()
    except EngineArgsMissing as err:
        pytest.skip(str(err))
    return vllm_check


def launch_env(e: Engine, rank: int, plan) -> dict[str, str]:
    """The engine's environment as its launch file sets it (host-known values as examples)."""
    from deployment.vllm_check import launch_env as env_of

    return env_of(e, rank, plan, OPTS)


def refusals(vllm_check, plan) -> list[str]:
    out = []
    for e in engines(plan):
        for rank in (0, 1) if e.nnodes > 1 else (0,):
            argv = engine_argv(e, rank, plan, OPTS)
            assert argv[:2] == ["vllm", "serve"], argv
            try:
                vllm_check.resolve(argv[2:], e.gpu, launch_env(e, rank, plan))
            except vllm_check.EngineRefused as err:
                out.append(f"{e.name} rank {rank} ({' '.join(argv[2:])}): {err}")
    return out


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


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_every_generated_command_of_the_plans_resolves(vllm_check, path: Path) -> None:
    assert refusals(vllm_check, plans.load(path)) == []


def test_every_generated_command_of_the_tiny_plan_resolves(vllm_check, tmp_path: Path) -> None:
    path, _ = plan_of(tmp_path)
    assert refusals(vllm_check, plans.load(path)) == []


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_vllm_runs_the_configuration_the_plan_priced(vllm_check, path: Path) -> None:
    """The settings vLLM resolves, against the plan's numbers (`vllm_check.settings`; the table docs/deploy.md
    shows for the default plan)."""
    plan = plans.load(path)
    off = [f"{e.name}: {s.name} resolves to {s.resolved}, the plan has {s.plan}"
           for e in engines(plan)
           for s in vllm_check.settings(plan, e, engine_argv(e, 0, plan, OPTS)[2:], launch_env(e, 0, plan))
           if not s.holds]  # fmt: skip
    assert not off, "\n".join(off)


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
    for overlap in (True, False):
        mine = dataclasses.replace(e, overlap=overlap)
        argv = engine_argv(mine, 0, plan, OPTS)[2:]
        assert ("--enable-dbo" in argv) == overlap
        rows = {s.name: s for s in vllm_check.settings(plan, mine, argv, launch_env(mine, 0, plan))}
        assert rows["dual-batch overlap"].holds
        other = dataclasses.replace(e, overlap=not overlap)
        assert not {s.name: s for s in vllm_check.settings(plan, other, argv, launch_env(mine, 0, plan))}[
            "dual-batch overlap"
        ].holds


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


def test_a_b200_plan_with_fp8_experts_resolves_as_priced_on_a_blackwell_probe(vllm_check, tmp_path: Path) -> None:
    """16 B200 with the experts in FP8 (`+costmodel.fixes.experts_fp8=true`; vLLM's launch files do not requantize
    them): every engine resolves on a compute-capability 10.0 device probe and every setting holds."""
    b200 = ("~inventory.gpus.H800", "~inventory.gpus.H20", "~inventory.gpus.H200", "+inventory.gpus.DGX-B200=16")
    path, _ = plan_of(tmp_path, *b200, "costmodel=serving", "+costmodel.fixes.experts_fp8=true")
    plan = plans.load(path)
    assert {i.gpu for i in plan.islands if i.serving} == {"DGX-B200"}
    assert refusals(vllm_check, plan) == []
    off = [f"{e.name}: {s.name} resolves to {s.resolved}, the plan has {s.plan}"
           for e in engines(plan)
           for s in vllm_check.settings(plan, e, engine_argv(e, 0, plan, OPTS)[2:], launch_env(e, 0, plan))
           if not s.holds]  # fmt: skip
    assert not off, "\n".join(off)


def test_the_check_of_a_plan_on_a_gpu_without_a_device_probe_is_one_line(tmp_path: Path) -> None:
    import dataclasses

    from helpers import cli

    path, _ = plan_of(tmp_path)
    plan = plans.load(path)
    h100 = dataclasses.replace(plan, islands=tuple(dataclasses.replace(i, gpu="H100-SXM") for i in plan.islands))
    (tmp_path / "h100.json").write_text(json.dumps(plans.to_json(h100)))
    r = cli("deployment.vllm_check", str(tmp_path / "h100.json"))
    assert r.returncode != 0 and r.stderr.strip().startswith("error:") and "H100-SXM" in r.stderr
    assert "Traceback" not in r.stderr

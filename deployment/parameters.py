"""One table from what the plan priced to what each engine is told and what it resolves: a row per planned quantity.

A row (`Parameter`) names a quantity of one engine (`plan.Engine`), says where its planned value comes from (the
engine's record, or the deploy options for what the cluster decides), and for each engine (`Flags`) the flags it
writes for that value, the setting the engine's own resolution reads back, and how the two compare. Both ends use
it: an adapter's command is its fixed arguments around `arguments(engine, e, opts)`; its check is
`read_back(engine, e, opts, resolved)` over what the engine resolved from that command (`deployment.engines`). A new
engine feature is one row; a new engine is one more key in the rows it takes.

What `read` takes is the engine check's record of what the engine resolved: for SGLang
`deployment.engines.sglang.check.Resolved` (SGLang's read view of its `ServerArgs`, its model config's
quantization), for vLLM `deployment.engines.vllm.check.Resolved` (its `VllmConfig`, the launch's environment).
Every flag is as the releases the adapters pin define it (SGLang 0.5.23, vLLM 0.33.0).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from costmodel.roles import Role
from deployment.errors import DeployError
from deployment.launch import BOOTSTRAP_PORT, HOST, Ref
from deployment.options import DeployOptions
from deployment.resolved import Setting
from plan import Engine

Write = Callable[[Any, Engine, DeployOptions], list[str]]
Env = Callable[[Any, Engine, DeployOptions], dict[str, str | Ref]]

# SGLang's DeepEP kernels by role: normal for prompts, low-latency for decode steps, either by batch (auto) for
# aggregated engines, whose batches hold both
DEEPEP_MODE = {"prefill": "normal", "decode": "low_latency", "aggregated": "auto"}
# vLLM's all-to-all by role: DeepEP's high-throughput kernels for prompts, low-latency ones for decode steps and for
# aggregated engines, whose steps are decode steps with a small chunk of prompt tokens (and whose micro-batch
# overlap, like any, needs DeepEP's kernels)
VLLM_ALL2ALL = {"prefill": "deepep_high_throughput", "decode": "deepep_low_latency",
                "aggregated": "deepep_low_latency"}  # fmt: skip
# the KV cache's format as each engine names it (both: FP8 is E4M3)
KV_DTYPES = {"sglang": {"fp8": "fp8_e4m3", "bf16": "bfloat16"}, "vllm": {"fp8": "fp8_e4m3", "bf16": "bfloat16"}}
# the quantization an engine's model config resolves -> the routed experts' format it loads them in
# mxfp4: the checkpoint's own (GPT-OSS), which vLLM names gpt_oss_mxfp4
EXPERT_FORMATS = {"fp8": "fp8", "modelopt_fp4": "fp4", "mxfp4": "mxfp4", "gpt_oss_mxfp4": "mxfp4"}
NIXL = "NixlConnector"  # vLLM's KV connector for transfer_backend nixl


def nothing(value: Any, e: Engine, opts: DeployOptions) -> list[str]:
    return []


def flag(name: str, fmt: Callable[[Any], str] = str) -> Write:
    """`name value` for every value."""
    return lambda value, e, opts: [name, fmt(value)]


def switch(name: str) -> Write:
    """`name` where the value is true."""
    return lambda value, e, opts: [name] if value else []


@dataclass(frozen=True)
class Flags:
    """How one engine takes one planned quantity: the flags `write` gives for the value (and `env`, the launch's
    environment), what its own resolution reads back (`read`, from its check's record), named `label` where it
    counts in its own way; it holds where it equals the value in the engine's terms (`expect`). `refuse` says why the
    engine cannot run a value ("" where it can): the launch files are not written."""

    write: Write
    read: Callable[[Any], Any]
    label: str = ""
    expect: Callable[[Any], Any] = lambda value: value
    env: Env | None = None
    refuse: Callable[[Any, Engine], str] | None = None


@dataclass(frozen=True)
class Parameter:
    """One planned quantity: its value for engine `e` under the deploy options (None: the engine has none, e.g. a
    prefill engine's decode batch) and, per engine name, how that engine takes it."""

    name: str
    planned: Callable[[Engine, DeployOptions], Any]
    engines: Mapping[str, Flags] = field(default_factory=dict)


# --- what the engines resolve, where a row reads more than one setting -------------------------------------


def _sglang_drafts(r: Any) -> Any:
    """SGLang's MTP: K drafts where they are a chain (top-k 1, K + 1 tokens verified with the sequence's own)."""
    v = r.view
    if v.speculative_algorithm is None:
        return 0
    k, topk, verified = int(v.speculative_num_steps), int(v.speculative_eagle_topk), int(v.speculative_num_draft_tokens)
    return k if topk == 1 and verified == k + 1 else f"{v.speculative_algorithm}: {k} steps, top-k {topk}, {verified}"


def _vllm_drafts(r: Any) -> int:
    spec = r.config.speculative_config
    return int(spec.num_speculative_tokens) if spec is not None and spec.method == "mtp" else 0


def _vllm_graph_batch(r: Any) -> Any:
    """vLLM's sequences per DP rank, where it captures a CUDA graph at exactly their tokens a step (every sequence's
    own and its drafts); else what it misses."""
    seqs = int(r.config.scheduler_config.max_num_seqs)
    tokens = seqs * (1 + _vllm_drafts(r))
    captured = r.config.compilation_config.cudagraph_capture_sizes or []
    return seqs if tokens in captured else f"{seqs}, no CUDA graph at their {tokens} tokens"


VLLM_GRAPH_CEILING = 512  # vLLM's default widest CUDA graph on Hopper (config/vllm.py `_set_cudagraph_sizes`)
# ... and its default capture sizes below it: 1, 2, 4, every 8 to 248, every 16 from 256
VLLM_GRAPH_GRID = (1, 2, 4, *range(8, 256, 8), *range(256, VLLM_GRAPH_CEILING + 1, 16))


def _vllm_batch(value: Any, e: Engine, opts: DeployOptions) -> list[str]:
    """`--max-num-seqs`; where the batch's tokens a step are off vLLM's default capture grid or past its widest
    graph (which of its own sizes vLLM adds depends on other settings, e.g. dual-batch overlap), the capture sizes
    given explicitly, the grid and those tokens, so its decode steps run in a CUDA graph at exactly the batch the
    plan priced rather than padded to the next size."""
    tokens = value * (1 + e.drafts)
    out = ["--max-num-seqs", str(value)]
    if tokens not in VLLM_GRAPH_GRID:
        out += ["--compilation-config", json.dumps({"cudagraph_capture_sizes": sorted({*VLLM_GRAPH_GRID, tokens})})]
    return out


def _vllm_world(r: Any) -> int:
    par = r.config.parallel_config
    return int(par.tensor_parallel_size) * int(par.data_parallel_size)


def _kv_role(r: Any) -> str:
    kv = r.config.kv_transfer_config
    return "none" if kv is None else str(kv.kv_role)


def _kv_format(name: str) -> str:
    """An engine's KV-cache dtype as the plan's format (fp8_e4m3 -> fp8)."""
    return {"fp8_e4m3": "fp8", "fp8": "fp8", "bfloat16": "bf16", "bf16": "bf16"}.get(name, name)


def _vllm_fp4(value: Any, e: Engine) -> str:
    if value != "fp4":
        return ""
    return (f"{e.name} was priced with FP4 routed experts; the vLLM launch files load the FP8 checkpoint's experts in "
            "FP8, so they would not run what the plan priced: use engine=sglang (it requantizes the experts to NVFP4 "
            "as they load) or plan with FP8 experts (+costmodel.fixes.experts_fp8=true)")  # fmt: skip


def _sglang_eplb(value: Any, e: Engine, opts: DeployOptions) -> list[str]:
    """EPLB places the redundant experts from the experts' observed load, from a recorded distribution if given."""
    start = getattr(opts.engine_options, "expert_location", None)
    return ["--enable-eplb", *(["--init-expert-location", start] if start else [])] if value else []


def _sglang_attention_dp(value: Any, e: Engine, opts: DeployOptions) -> list[str]:
    """DP attention (SGLang 0.5.2x's --attn-dp-size), and the dense MLP in data parallel: SGLang takes 1 or the whole
    engine, not the attention TP the cost model splits it over; with 1 each rank runs its share of its group's tokens
    through whole weights (the same FLOPs, up to 1.2 GB more weights per GPU). A dense model's replicas: SGLang's
    data parallelism (--dp-size), each its own scheduler and TP group, its data-parallel controller spreading the
    engine's requests over them."""
    if value <= 1:
        return []
    if not e.moe:
        return ["--dp-size", str(value)]
    return ["--attn-dp-size", str(value), "--moe-dense-tp-size", "1", "--enable-dp-lm-head"]


def _sglang_mtp(value: Any, e: Engine, opts: DeployOptions) -> list[str]:
    """The model's MTP module drafting `value` tokens a step in a chain (NEXTN, SGLang's EAGLE path for it)."""
    if not value:
        return []
    return ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(value),
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(value + 1)]  # fmt: skip


def _sglang_disaggregation(value: Any, e: Engine, opts: DeployOptions) -> list[str]:
    if value == "none":
        return []
    return ["--disaggregation-mode", value, *(["--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)]
                                              if value == "prefill" else [])]  # fmt: skip


def _sglang_transfer(value: Any, e: Engine, opts: DeployOptions) -> list[str]:
    return ["--disaggregation-transfer-backend", value,
            *(["--disaggregation-ib-device", opts.ib_devices] if opts.ib_devices else [])]  # fmt: skip


def _vllm_transfer_env(value: Any, e: Engine, opts: DeployOptions) -> dict[str, str | Ref]:
    """NIXL's side channel on the address the other engines reach this host at (vLLM's default is localhost); UCX,
    under NIXL, on the RDMA devices given."""
    env: dict[str, str | Ref] = {"VLLM_NIXL_SIDE_CHANNEL_HOST": Ref(HOST)}
    if opts.ib_devices:
        env["UCX_NET_DEVICES"] = ",".join(f"{d.strip()}:1" for d in opts.ib_devices.split(","))
    return env


def _sglang_hicache(value: Any, e: Engine, opts: DeployOptions) -> list[str]:
    """SGLang's hierarchical cache: its radix cache's evicted blocks kept in `--hicache-size` GB of host memory per
    rank (an MLA rank's GPU keeps the whole latent KV, so per GPU, as the cost model counts it)."""
    return ["--enable-hierarchical-cache", "--hicache-size", str(int(value))] if value else []


def _sglang_hicache_whole(value: Any, e: Engine) -> str:
    if float(value).is_integer():
        return ""
    return (f"{e.name} was priced with a host KV tier of {value:g} GB per GPU; SGLang takes it in whole GB "
            "(--hicache-size): plan with a whole costmodel.host_cache_gb")  # fmt: skip


def _vllm_host_tier(value: Any, e: Engine) -> str:
    if not value:
        return ""
    return (f"{e.name} was priced with a host KV tier of {value:g} GB per GPU (costmodel.host_cache_gb); the vLLM "
            "launch files keep its prefix cache in GPU memory only, so they would not run what the plan priced: use "
            "engine=sglang (its hierarchical cache) or plan with costmodel.host_cache_gb=0")  # fmt: skip


def _decoding(value: Callable[[Engine], Any]) -> Callable[[Engine, DeployOptions], Any]:
    """A quantity of engines that decode (None for a prefill engine)."""
    return lambda e, opts: value(e) if e.role.decodes else None


PARAMETERS: tuple[Parameter, ...] = (
    # SGLang's --tp-size is the engine's GPUs under DP attention (MoE), a replica's beside --dp-size (dense)
    Parameter("GPUs (world size)", lambda e, opts: e.gpus, {
        "sglang": Flags(lambda v, e, opts: ["--tp-size", str(v if e.moe else e.attn_tp)],
                        lambda r: int(r.view.tp_size) * int(r.view.dp_size), "TP x DP (the engine's GPUs)"),
        "vllm": Flags(nothing, _vllm_world, "TP x DP (the engine's GPUs)"),
    }),
    Parameter("attention TP", lambda e, opts: e.attn_tp, {
        "sglang": Flags(nothing, lambda r: int(r.view.tp_size) // int(r.view.attn_dp_size),
                        "attention TP (TP / attention DP)"),
        "vllm": Flags(flag("--tensor-parallel-size"), lambda r: int(r.config.parallel_config.tensor_parallel_size)),
    }),
    Parameter("attention DP ranks", lambda e, opts: e.attn_dp, {
        "sglang": Flags(_sglang_attention_dp, lambda r: max(int(r.view.attn_dp_size), int(r.view.dp_size)),
                        "attention DP ranks (a dense model's replicas: DP)"),
        "vllm": Flags(flag("--data-parallel-size"), lambda r: int(r.config.parallel_config.data_parallel_size)),
    }),
    Parameter("expert-parallel group", lambda e, opts: e.ep_group, {
        "sglang": Flags(flag("--ep-size"), lambda r: int(r.view.ep_size)),
        "vllm": Flags(lambda v, e, opts: ["--enable-expert-parallel"] if v > 1 else [],
                      lambda r: _vllm_world(r) if r.config.parallel_config.enable_expert_parallel else 1),
    }),
    Parameter("EPLB", lambda e, opts: e.redundant_experts > 0, {
        "sglang": Flags(_sglang_eplb, lambda r: bool(r.view.enable_eplb)),
        "vllm": Flags(switch("--enable-eplb"), lambda r: bool(r.config.parallel_config.enable_eplb)),
    }),
    Parameter("redundant experts", lambda e, opts: e.redundant_experts, {
        "sglang": Flags(lambda v, e, opts: ["--ep-num-redundant-experts", str(v)] if v else [],
                        lambda r: int(r.view.ep_num_redundant_experts)),
        "vllm": Flags(lambda v, e, opts: ["--eplb-config", json.dumps({"num_redundant_experts": v})] if v else [],
                      lambda r: int(r.config.parallel_config.eplb_config.num_redundant_experts)),
    }),
    # SGLang gives each attention DP rank chunked_prefill_size // attn_dp tokens a forward (the resolved value is that
    # share; each of a dense model's replicas, its own scheduler, the whole); vLLM counts tokens a step per DP rank
    Parameter("prefill tokens per attention rank", lambda e, opts: e.prefill_tokens, {
        "sglang": Flags(lambda v, e, opts: ["--chunked-prefill-size", str(v * e.replica_ranks),
                                            "--max-prefill-tokens", str(v)],
                        lambda r: int(r.view.chunked_prefill_size), "prefill tokens per rank per forward"),
        "vllm": Flags(flag("--max-num-batched-tokens"), lambda r: int(r.config.scheduler_config.max_num_batched_tokens),
                      "tokens per DP rank per step"),
    }),
    Parameter("running requests", _decoding(lambda e: e.max_running), {
        # SGLang spreads them over DP-attention ranks, and gives each of a dense model's replicas (--dp-size) its own
        "sglang": Flags(lambda v, e, opts: ["--max-running-requests", str(v // e.replicas)],
                        lambda r: int(r.view.max_running_requests) * int(r.view.dp_size),
                        "running requests (per scheduler x DP replicas)"),
        # vLLM admits sequences per DP rank: the decode batch's row writes them
        "vllm": Flags(nothing, lambda r: int(r.config.scheduler_config.max_num_seqs) * int(
            r.config.parallel_config.data_parallel_size), "running requests (sequences per DP rank x DP)"),
    }),
    Parameter("decode batch per attention rank (CUDA graph)", _decoding(lambda e: e.decode_batch), {
        "sglang": Flags(flag("--cuda-graph-max-bs-decode"), lambda r: r.view.cuda_graph_config.decode.max_bs
                        if r.view.cuda_graph_config is not None else None, "decode CUDA graph max batch per rank"),
        # vLLM captures a CUDA graph at exactly this batch's tokens a step
        "vllm": Flags(_vllm_batch, _vllm_graph_batch, "sequences per DP rank, a CUDA graph at their tokens"),
    }),
    # the memory before loading the KV pool is sized from: SGLang's pool = pre-load memory x fraction - weights, the
    # cost model's; vLLM's is that less the activations it profiles at start (docs/deploy.md)
    Parameter("memory fraction", lambda e, opts: e.mem_fraction, {
        "sglang": Flags(flag("--mem-fraction-static", "{:g}".format), lambda r: float(r.view.mem_fraction_static),
                        "mem_fraction_static"),
        "vllm": Flags(flag("--gpu-memory-utilization", "{:g}".format),
                      lambda r: float(r.config.cache_config.gpu_memory_utilization), "gpu_memory_utilization"),
    }),
    Parameter("KV-cache format", lambda e, opts: e.kv_dtype, {
        "sglang": Flags(lambda v, e, opts: ["--kv-cache-dtype", KV_DTYPES["sglang"][v]],
                        lambda r: _kv_format(str(r.view.kv_cache_dtype))),
        "vllm": Flags(lambda v, e, opts: ["--kv-cache-dtype", KV_DTYPES["vllm"][v]],
                      lambda r: _kv_format(str(r.config.cache_config.cache_dtype))),
    }),
    Parameter("micro-batch overlap", lambda e, opts: e.overlap, {
        "sglang": Flags(switch("--enable-two-batch-overlap"), lambda r: bool(r.view.enable_two_batch_overlap),
                        "two-batch overlap"),
        "vllm": Flags(switch("--enable-dbo"), lambda r: bool(r.config.parallel_config.enable_dbo),
                      "dual-batch overlap"),
    }),
    # on every engine: prefill engines run the MTP module over the prompt and send decode its first draft
    Parameter("MTP draft tokens per step", lambda e, opts: e.drafts, {
        "sglang": Flags(_sglang_mtp, _sglang_drafts),
        "vllm": Flags(lambda v, e, opts: ["--speculative-config", json.dumps({"method": "mtp",
                                                                               "num_speculative_tokens": v})]
                      if v else [], _vllm_drafts),
    }),
    Parameter("all-to-all", lambda e, opts: e.role if e.moe else None, {  # a dense model's: none to run
        "sglang": Flags(lambda v, e, opts: ["--moe-a2a-backend", "deepep", "--deepep-mode", DEEPEP_MODE[v]],
                        lambda r: str(r.view.deepep_mode) if str(r.view.moe_a2a_backend) == "deepep"
                        else str(r.view.moe_a2a_backend), "DeepEP mode", expect=lambda v: DEEPEP_MODE[v]),
        "vllm": Flags(lambda v, e, opts: ["--all2all-backend", VLLM_ALL2ALL[v]],
                      lambda r: str(r.config.parallel_config.all2all_backend), expect=lambda v: VLLM_ALL2ALL[v]),
    }),
    # the engine's side of the KV hand-off between a prefill and a decode engine (an aggregated engine has none)
    Parameter("disaggregation", lambda e, opts: str(e.role) if e.role.disaggregated else "none", {
        "sglang": Flags(_sglang_disaggregation, lambda r: str(r.view.disaggregation_mode),
                        expect=lambda v: "null" if v == "none" else v),
        # vLLM's engines take either side, per request (the KV connector's role, written by the transfer's row)
        "vllm": Flags(nothing, _kv_role, "KV role", expect=lambda v: "none" if v == "none" else "kv_both"),
    }),
    Parameter("KV transfer backend", lambda e, opts: getattr(opts.engine_options, "transfer_backend", None)
              if e.role.disaggregated else None, {
        "sglang": Flags(_sglang_transfer, lambda r: str(r.view.disaggregation_transfer_backend)),
        "vllm": Flags(lambda v, e, opts: ["--kv-transfer-config", json.dumps({"kv_connector": NIXL,
                                                                              "kv_role": "kv_both"})],
                      lambda r: {NIXL: "nixl"}.get(r.config.kv_transfer_config.kv_connector), "KV connector",
                      env=_vllm_transfer_env),
    }),
    # an aggregated engine's prompt chunks in its decode steps, as the island was priced
    Parameter("mixed chunks", lambda e, opts: True if e.role is Role.AGGREGATED else None, {
        "sglang": Flags(switch("--enable-mixed-chunk"), lambda r: bool(r.view.enable_mixed_chunk)),
        # vLLM's chunked prefill puts a step's prompt chunks beside its decoding sequences, unasked
        "vllm": Flags(nothing, lambda r: bool(r.config.scheduler_config.enable_chunked_prefill), "chunked prefill"),
    }),
    # a prefill engine's prefix cache's host tier (costmodel.host_cache_gb), as the plan priced its loads from it
    Parameter("host KV tier, GB per GPU", lambda e, opts: e.host_cache_gb if e.role is Role.PREFILL else None, {
        "sglang": Flags(_sglang_hicache, lambda r: float(r.view.hicache_size) if r.view.enable_hierarchical_cache
                        else 0.0, "hierarchical cache's host pool, GB per rank", refuse=_sglang_hicache_whole),
        "vllm": Flags(nothing, lambda r: 0.0, "host KV tier (none)", refuse=_vllm_host_tier),
    }),
    # FP4: the FP8 checkpoint's routed experts requantized to NVFP4 as they load (SGLang's model config accepts
    # modelopt_fp4 on it, model_config.py `_verify_quantization`); the dense layers stay FP8
    Parameter("routed experts' format", lambda e, opts: e.experts, {
        "sglang": Flags(lambda v, e, opts: ["--quantization", "modelopt_fp4"] if v == "fp4" else [],
                        lambda r: EXPERT_FORMATS.get(r.quantization, r.quantization)),
        "vllm": Flags(nothing, lambda r: EXPERT_FORMATS.get(str(r.config.model_config.quantization),
                                                            str(r.config.model_config.quantization)),
                      refuse=_vllm_fp4),
    }),
)  # fmt: skip


def taken(engine: str) -> list[tuple[Parameter, Flags]]:
    """The rows engine `engine` takes, with its flags."""
    return [(p, p.engines[engine]) for p in PARAMETERS if engine in p.engines]


def arguments(engine: str, e: Engine, opts: DeployOptions) -> tuple[list[str], dict[str, str | Ref]]:
    """(argv, environment) that tell engine `engine` every planned quantity of `e` it takes; DeployError where it
    cannot run one."""
    argv: list[str] = []
    env: dict[str, str | Ref] = {}
    for p, flags in taken(engine):
        value = p.planned(e, opts)
        if value is None:
            continue
        if flags.refuse is not None and (why := flags.refuse(value, e)):
            raise DeployError(why)
        argv += flags.write(value, e, opts)
        if flags.env is not None:
            env.update(flags.env(value, e, opts))
    return argv, env


def read_back(engine: str, e: Engine, opts: DeployOptions, resolved: Any) -> list[Setting]:
    """Every planned quantity of `e` engine `engine` takes, as it resolved it (`resolved`, its check's record)
    against the plan's value in its terms."""
    out = []
    for p, flags in taken(engine):
        value = p.planned(e, opts)
        if value is None:
            continue
        out.append(Setting.equal(flags.label or p.name, flags.read(resolved), flags.expect(value)))
    return out

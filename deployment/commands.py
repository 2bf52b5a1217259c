"""Engine command lines for one host of an engine: SGLang's `launch_server` and `vllm serve`.

Every value a modelled quantity depends on comes from the plan: the parallelism, the prefill tokens
per attention rank, the decode batch (running requests, CUDA graphs), the redundant experts with
EPLB, micro-batch overlap, the DeepEP kernels by role and MTP's draft tokens. The commands are written for the releases
`deployment.engine_args` pins and checked by those releases' own settings resolution
(`deployment.sglang_check`, `deployment.vllm_check`), which the tests read back against the plan.
A command is a `deployment.launch.Launch`: literal arguments, its environment, and the few values
only the host knows when it starts, which each target writes as explicit references.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from deployment.engine_args import SGLANG_VERSION, VLLM_VERSION
from deployment.engines import DeployError, Engine
from deployment.launch import HOST, INDEX, LEADER, Launch, Ref, example_argv
from plan import Plan

ENGINES = ("sglang", "vllm")
TARGETS = ("shell", "k8s", "llmd")
TRANSFER_BACKENDS = ("mooncake", "nixl")
ENGINE_PORT = 30000
BOOTSTRAP_PORT = 8998  # SGLang's prefill bootstrap server (--disaggregation-bootstrap-port default)
DIST_PORT = 5000  # the leader's port for the engine's distributed init
ROUTER_PORT = 8000
# SGLang's DeepEP kernels by role: normal for prompts, low-latency for decode steps, either by batch (auto) for
# aggregated engines, whose batches hold both
DEEPEP_MODE = {"prefill": "normal", "decode": "low_latency", "aggregated": "auto"}
# vLLM's all-to-all by role: DeepEP's high-throughput kernels for prompts, low-latency ones for decode steps and for
# aggregated engines, whose steps are decode steps with a small chunk of prompt tokens (and whose micro-batch
# overlap, like any, needs DeepEP's kernels)
VLLM_ALL2ALL = {"prefill": "deepep_high_throughput", "decode": "deepep_low_latency",
                "aggregated": "deepep_low_latency"}  # fmt: skip
# SGLang's PD timeouts (sglang/srt/environ.py; 300 s each by default): a prefill-decode handshake may wait for the
# peer engine to finish loading (an hour, the Kubernetes startup probe's allowance); a decode engine waits for a
# request's KV as long as the router waits for an answer (its --timeout, 600 s)
SGLANG_ENV = {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "3600", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "600"}
WORKER = -1  # a Kubernetes worker pod's rank: LeaderWorkerSet's LWS_WORKER_INDEX, read at start
# the engine releases whose argument definitions the commands are checked against (deployment.engine_args)
IMAGES = {"sglang": f"lmsysorg/sglang:v{SGLANG_VERSION}", "vllm": f"vllm/vllm-openai:v{VLLM_VERSION}"}
VERSIONS = {"sglang": f"SGLang {SGLANG_VERSION}", "vllm": f"vLLM {VLLM_VERSION}"}


@dataclass(frozen=True)
class DeployOptions:
    """What the launch files are written for (conf/deploy.yaml): the engine, the target, and what the
    cluster provides."""

    engine: str = "sglang"
    target: str = "shell"
    model_path: str = "/models/DeepSeek-V3"  # the weights' path on every host
    image: str | None = None  # k8s: the engine image (None: the release the commands are checked against)
    router_image: str = "archipelago:latest"  # k8s: an image with Archipelago installed (runs the router)
    transfer_backend: str = "mooncake"  # SGLang's KV transfer between prefill and decode engines
    gpu_label: str = "archipelago/gpu"  # k8s: the node label whose value is the GPU type
    ib_devices: str | None = None  # RDMA devices for KV transfer, e.g. "mlx5_0,mlx5_1" (None: the engine's pick)
    weights_pvc: str | None = None  # k8s: a PersistentVolumeClaim holding the weights (None: model_path on each node)
    rdma_resource: str | None = "rdma/rdma_shared_device_a"  # k8s: the RDMA device plugin's resource (None: none)
    host_network: bool = False  # k8s: pods on their nodes' network (RDMA without a secondary network)
    expert_location: str | None = None  # SGLang: a recorded expert distribution to start EPLB from (None: trivial)
    router_replicas: int = 2  # k8s: router pods behind its Service (stateless; ~2,400 req/s a core)

    def __post_init__(self) -> None:
        for key, allowed in (("engine", ENGINES), ("target", TARGETS), ("transfer_backend", TRANSFER_BACKENDS)):
            if getattr(self, key) not in allowed:
                raise DeployError(f"{key}={getattr(self, key)!r}: choose from {list(allowed)}")
        if self.router_replicas < 1:
            raise DeployError(f"k8s.router_replicas={self.router_replicas}: at least 1")
        if not self.model_path or not self.model_path.startswith("/"):
            raise DeployError(f"model_path={self.model_path!r}: give the weights' absolute path on every host")
        if self.ib_devices is not None and not re.fullmatch(r"\s*[\w.:-]+(\s*,\s*[\w.:-]+)*\s*", self.ib_devices):
            raise DeployError(f"ib_devices={self.ib_devices!r}: RDMA device names separated by commas, e.g. "
                              "mlx5_0,mlx5_1 (`ibv_devices` lists a host's)")  # fmt: skip
        if "\n" in self.model_path or "\0" in self.model_path:
            raise DeployError("model_path holds a line break or NUL: give the weights' path on every host")

    @property
    def engine_image(self) -> str:
        return self.image or IMAGES[self.engine]


def sglang_command(e: Engine, rank: int, plan: Plan, opts: DeployOptions) -> Launch:
    """`python -m sglang.launch_server ...` for host `rank` of engine `e` (SGLang 0.5.23 flags).

    What the cost model prices, as SGLang resolves it (docs/deploy.md tabulates both; tests/test_sglang_check.py
    reads the resolved values back): a prefill forward of the plan's batch per attention rank (SGLang divides
    `--chunked-prefill-size` by the attention DP size); decode at the plan's batch per rank (running requests and
    the CUDA graphs captured up to it); two micro-batches overlapped where the island was priced so (always for
    prefill; plan.Island.overlap); DeepEP normal
    for prefill, low-latency for decode; the redundant experts rebalanced by EPLB; with MTP (`costmodel.mtp`), the
    model's MTP module drafting the plan's tokens a step in a chain (NEXTN, SGLang's EAGLE path for it: top-k 1,
    drafts + 1 tokens verified), on prefill engines too (they run it over the prompt and send decode its first
    draft, as the cost model prices them)."""
    batch = e.chunk if e.role == "aggregated" else plan.cost.engine.prefill_batch_tokens
    mixed = e.role == "aggregated"
    pd = [] if mixed else ["--disaggregation-mode", e.role, "--disaggregation-transfer-backend", opts.transfer_backend]
    cmd = [
        "python3", "-m", "sglang.launch_server",
        "--model-path", opts.model_path,
        "--trust-remote-code",
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        *pd,
        "--tp-size", str(e.gpus),
        "--ep-size", str(e.gpus),
        "--moe-a2a-backend", "deepep",
        "--deepep-mode", DEEPEP_MODE[e.role],
        "--chunked-prefill-size", str(batch * e.attn_dp),
        "--max-prefill-tokens", str(batch),
    ]  # fmt: skip
    if mixed:  # the prompts' chunks in the decode steps, as the island was priced
        cmd += ["--enable-mixed-chunk"]
    if e.overlap:  # two micro-batches, as the island's steps were priced (one where that is faster at its batch)
        cmd.insert(cmd.index("--chunked-prefill-size"), "--enable-two-batch-overlap")
    if e.experts == "fp4":  # the FP8 checkpoint's routed experts requantized to NVFP4 as they load; dense stays FP8
        cmd += ["--quantization", "modelopt_fp4"]
    drafts = plan.cost.drafts
    if drafts:
        cmd += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(drafts),
                "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(drafts + 1)]  # fmt: skip
    if e.attn_dp > 1:  # DP attention: SGLang 0.5.2x's --attn-dp-size (was --dp-size N --enable-dp-attention)
        # dense MLP in data parallel: SGLang takes 1 or the whole engine, not the attention TP the cost model splits
        # it over; with 1 each rank runs its share of the group's tokens through whole weights (the same FLOPs)
        cmd += ["--attn-dp-size", str(e.attn_dp), "--moe-dense-tp-size", "1", "--enable-dp-lm-head"]
    if e.redundant_experts:  # EPLB places the redundant experts from the experts' observed load
        cmd += ["--ep-num-redundant-experts", str(e.redundant_experts), "--enable-eplb"]
        if opts.expert_location:  # a recorded expert distribution (or placement) to start from
            cmd += ["--init-expert-location", opts.expert_location]
    if opts.ib_devices and not mixed:
        cmd += ["--disaggregation-ib-device", opts.ib_devices]
    if e.role == "prefill":
        cmd += ["--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)]
    else:
        per_rank = max(e.max_running // e.attn_dp, 1)
        cmd += ["--max-running-requests", str(e.max_running), "--cuda-graph-max-bs-decode", str(per_rank)]
    late = []
    if e.nnodes > 1:
        cmd += ["--nnodes", str(e.nnodes), "--node-rank", "0"] if rank == 0 else ["--nnodes", str(e.nnodes)]
        late = [("--dist-init-addr", Ref(LEADER, f":{DIST_PORT}"))] + ([("--node-rank", Ref(INDEX))] if rank else [])
    return Launch(cmd, env=dict(SGLANG_ENV), late=late)


def vllm_command(e: Engine, rank: int, plan: Plan, opts: DeployOptions) -> Launch:
    """`vllm serve ...` for host `rank` of engine `e` (vLLM 0.33.0 flags): data parallel attention ranks of the
    plan's TP, experts parallel over the engine on DeepEP (high-throughput kernels for prefill, low-latency for
    decode), two micro-batches overlapped where the island was priced so (DBO; plan.Island.overlap), the NIXL KV
    connector for disaggregation, and with MTP the model's MTP module drafting the plan's tokens a step. vLLM counts
    `--max-num-batched-tokens` and `--max-num-seqs` per DP rank."""
    if e.experts == "fp4":
        raise DeployError(
            f"{e.name} was priced with FP4 routed experts; the vLLM launch files load the FP8 checkpoint's experts "
            "in FP8, so they would not run what the plan priced: use engine=sglang (it requantizes the experts to "
            "NVFP4 as they load) or plan with FP8 experts (+costmodel.fixes.experts_fp8=true)"
        )
    local = min(e.gpus, e.node_gpus) // e.attn_tp  # attention DP ranks on one host
    mixed = e.role == "aggregated"  # no KV hand-off: vLLM's own chunked prefill beside the decoding sequences
    cmd = [
        "vllm", "serve", opts.model_path,
        "--trust-remote-code",
        "--tensor-parallel-size", str(e.attn_tp),
        "--data-parallel-size", str(e.attn_dp),
        "--enable-expert-parallel",
        "--all2all-backend", VLLM_ALL2ALL[e.role],
        "--max-num-batched-tokens", str(e.chunk if mixed else plan.cost.engine.prefill_batch_tokens),
        *([] if mixed else ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector",
                                                                "kv_role": "kv_both"})]),
    ]  # fmt: skip
    if e.overlap:  # dual-batch overlap, as the island's steps were priced
        cmd.insert(cmd.index("--max-num-batched-tokens"), "--enable-dbo")
    if plan.cost.drafts:
        cmd += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": plan.cost.drafts})]
    if e.role != "prefill":
        per_rank = max(e.max_running // e.attn_dp, 1)
        cmd += ["--max-num-seqs", str(per_rank)]  # vLLM captures a CUDA graph at exactly this batch
    if e.redundant_experts:
        cmd += ["--enable-eplb", "--eplb-config", json.dumps({"num_redundant_experts": e.redundant_experts})]
    late = []
    if e.nnodes > 1:
        cmd += ["--data-parallel-size-local", str(local), "--data-parallel-rpc-port", str(DIST_PORT)]
        late = [("--data-parallel-address", Ref(LEADER))]
        if rank != 0:
            cmd += ["--headless"]
            late += [("--data-parallel-start-rank", Ref(INDEX, times=local))]
    if rank == 0:
        cmd += ["--port", str(ENGINE_PORT)]
    # NIXL's side channel: the address the other engines reach this host at (vLLM's default is localhost)
    env: dict[str, str | Ref] = {} if mixed else {"VLLM_NIXL_SIDE_CHANNEL_HOST": Ref(HOST)}
    if opts.ib_devices and not mixed:  # UCX, under NIXL, on the RDMA devices given
        env["UCX_NET_DEVICES"] = ",".join(f"{d.strip()}:1" for d in opts.ib_devices.split(","))
    return Launch(cmd, env=env, late=late)


COMMANDS = {"sglang": sglang_command, "vllm": vllm_command}


def command(e: Engine, rank: int, plan: Plan, opts: DeployOptions) -> Launch:
    """The launch of host `rank` of engine `e` (0 the leader; WORKER a Kubernetes worker pod) for `opts.engine`."""
    return COMMANDS[opts.engine](e, rank, plan, opts)


def engine_argv(e: Engine, rank: int, plan: Plan, opts: DeployOptions) -> list[str]:
    """The command line as the engine on host `rank` parses it (host-known values as examples): what the
    engines' own checks (deployment.sglang_check, deployment.vllm_check) are given."""
    return example_argv(command(e, rank, plan, opts), 1 if rank == WORKER else rank)

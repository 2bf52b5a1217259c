"""What each engine of a plan runs: the planned quantities of one engine instance, computed once from its island.

An island is one or more engine instances (`Island.engines`):

- a prefill island is one engine over all its GPUs: attention data parallel with the plan's attention TP, experts
  parallel over the island, a forward prefilling `prefill_batch_tokens` per attention rank;
- a decode island is `dp` engines, each one EP group of `ep` GPUs, attention-DP ranks of the plan's TP, each rank
  holding the plan's decode batch (the batch its CUDA graphs are captured at);
- an aggregated island is `dp` engines shaped as decode's that also prefill, chunk by chunk, the island's
  `chunk_tokens` per attention rank a step beside their decoding sequences;
- a dense model's island (no experts to spread) is replicas of `tp` GPUs in every role, each decoding and
  prefilling on its own, no expert parallelism and nothing overlapped, launched one engine a host: the engine's own
  data parallelism (SGLang's `--dp-size`, vLLM's `--data-parallel-size`) runs its host's replicas behind one port.

An engine of whole hosts runs one process set per host; one smaller than a host gets a slice of its host's GPUs.

The records are what both readers of a plan's engines take: the simulator (`simulator.build`, `simulator.mixed`:
token budgets, running sequences, drafts, chunks) and the launch files (`deployment`: every flag an engine gets
for a planned quantity, `deployment.parameters`). Nothing is refused here: what an engine cannot be placed on or run
is the deployment's to say.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.catalog import load_gpu
from costmodel.roles import Role
from plan.record import Island, Plan


@dataclass(frozen=True)
class Placement:
    """Where an engine runs: host numbers of its GPU type (as report.md's node map numbers them), the GPUs it takes
    on its host when it is smaller than one (first, last), and how many GPUs a host has."""

    node_gpus: int
    hosts: tuple[int, ...]
    gpu_slice: tuple[int, int] | None = None


@dataclass(frozen=True)
class Engine:
    """One engine instance of a plan's island: the quantities the cost model priced it with."""

    name: str  # e.g. "i03-prefill-h20"
    island: int  # its island's index in plan.islands
    role: Role
    gpu: str
    gpus: int  # world size: one expert-parallel group (the routed experts spread over all its GPUs)
    attn_tp: int  # attention tensor parallel size (the island's tp)
    attn_dp: int  # attention data-parallel ranks (gpus / attn_tp)
    redundant_experts: int  # expert replicas added so the routed experts divide over the group
    prefill_tokens: int  # prompt tokens per attention rank a forward prefills (aggregated: a mixed step's chunk)
    decode_batch: int  # decoding engines: running sequences per attention rank (its CUDA-graph batch); prefill: 0
    mem_fraction: float  # the memory before loading the KV pool is sized from (x this, less the weights)
    kv_dtype: str  # the KV cache's format, as priced: the island's dense format (bf16 | fp8)
    overlap: bool  # two micro-batches overlapped, as the island's steps were priced (plan.Island.overlap)
    drafts: int  # MTP draft tokens a step verifies (0: no speculative decoding)
    experts: str  # the routed experts' format the island was priced in (plan.Island.precision.experts)
    placement: Placement | None  # None: the island has no hosts, or hosts no engine can be placed on
    # a prefill engine's prefix cache's host tier, GB of host memory per GPU, as priced (costmodel.host_cache_gb)
    host_cache_gb: float = 0.0
    moe: bool = True  # the model has routed experts (False: a dense model's engine of replicas, no expert parallelism)

    @property
    def ep_group(self) -> int:
        """GPUs the routed experts spread over: the whole engine (1 for a dense model: none)."""
        return self.gpus if self.moe else 1

    @property
    def replicas(self) -> int:
        """Serving units of the engine that run apart: 1 (its attention ranks step together, an all-to-all between
        them), or a dense model's data-parallel replicas, each `attn_tp` GPUs on its own."""
        return 1 if self.moe else self.attn_dp

    @property
    def replica_ranks(self) -> int:
        """Attention ranks of one replica: those that step together (the engine's, or 1 for a dense model's)."""
        return self.attn_dp // self.replicas

    @property
    def max_running(self) -> int:
        """Sequences the engine admits: its decode batch on every attention rank (0 for a prefill engine)."""
        return self.decode_batch * self.attn_dp

    @property
    def chunk(self) -> int:
        """Aggregated: the prompt tokens per attention rank a mixed step prefills (0 for other engines)."""
        return self.prefill_tokens if self.role is Role.AGGREGATED else 0

    @property
    def hosts(self) -> tuple[int, ...]:
        return self.placement.hosts if self.placement else ()

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def where(self) -> str:
        """'H20 0,1' or 'H20 6 (GPUs 0-3)'; 'H20 (not placed)' without a placement."""
        if self.placement is None:
            return f"{self.gpu} (not placed)"
        cut = self.placement.gpu_slice
        return f"{self.gpu} " + ",".join(map(str, self.hosts)) + (f" (GPUs {cut[0]}-{cut[1]})" if cut else "")


def engines_of(plan: Plan) -> tuple[Engine, ...]:
    """The engines of every serving island, in island order."""
    return tuple(e for k, isl in enumerate(plan.islands) if isl.serving for e in island_engines(plan, k))


def island_engines(plan: Plan, k: int) -> tuple[Engine, ...]:
    """The engines of island `k` of `plan` (none for an idle island)."""
    isl = plan.islands[k]
    if not isl.serving:
        return ()
    per_rank = isl.batch if plan.cost.profile.batch_per_attention_rank else isl.batch * isl.tp  # shallowsim: per GPU
    tokens = isl.chunk_tokens if isl.role is Role.AGGREGATED else plan.cost.engine.prefill_batch_tokens
    dense = plan.model.dense  # replicas of tp GPUs in every role, a host's of them one engine
    group = _host_of_replicas(isl) if dense else isl.ep_group
    count = isl.size // group if dense else isl.engines
    out = []
    for c in range(count):
        name = f"i{k:02d}-{isl.role}-{isl.gpu.lower()}" + (f"-{c}" if count > 1 else "")
        out.append(Engine(
            name=name, island=k, role=isl.role, gpu=isl.gpu, gpus=group, attn_tp=isl.tp,
            attn_dp=group // isl.tp, redundant_experts=isl.redundant_experts, prefill_tokens=tokens,
            decode_batch=per_rank if isl.role.decodes else 0, mem_fraction=plan.cost.engine.mem_fraction,
            kv_dtype=isl.precision.dense if plan.cost.engine.kv_dtype == "auto" else plan.cost.engine.kv_dtype,
            overlap=isl.overlap, drafts=plan.cost.drafts, experts=isl.precision.experts,
            placement=_placement(isl, c, group), host_cache_gb=plan.cost.engine.host_cache_gb
            if isl.role is Role.PREFILL else 0.0, moe=not dense,
        ))  # fmt: skip
    return tuple(out)


def _host_of_replicas(isl: Island) -> int:
    """GPUs of one engine of a dense model's island: the replicas on one host (the island, if smaller), or one
    replica where that does not divide the island into whole replicas."""
    node = isl.hosts.node_gpus if isl.hosts is not None else load_gpu(isl.gpu).gpus_per_node
    group = min(isl.size, node)
    return group if group % isl.tp == 0 and isl.size % group == 0 else isl.tp


def _placement(isl: Island, c: int, group: int) -> Placement | None:
    """Engine `c` of `group` GPUs of island `isl` on its hosts: whole hosts each, or a slice of one host each."""
    h = isl.hosts
    if h is None or not h.aligned(isl.size):
        return None
    node, hosts = h.node_gpus, list(h.nodes)
    if group >= node:  # whole hosts per engine
        per = group // node
        return Placement(node, tuple(hosts[c * per : (c + 1) * per]))
    at = h.first_gpu + c * group  # several engines per host
    return Placement(node, (hosts[at // node - h.first_gpu // node],), (at % node, at % node + group - 1))

"""A plan's serving islands as engine instances: their GPUs, parallelism and hosts.

- a prefill island is one engine over all its GPUs: tensor size = the island, attention data
  parallel (DP attention) with the plan's attention TP, expert parallel over the island;
- a decode island is `dp` engines, each one EP group of `ep` GPUs, attention DP ranks of the
  plan's TP, admitting the plan's batch per rank (batch x ranks running requests);
- an aggregated island is `dp` engines shaped as decode's that also prefill, chunk by chunk, the plan's
  `chunk_tokens` per rank a step beside their decoding sequences.

An engine of whole hosts runs one process set per host (node rank 0 the leader); an engine
smaller than a host gets its slice of the host's GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.catalog import CatalogError, load_gpu
from costmodel.cli import UserError
from plan import Plan


class DeployError(UserError):
    """A plan or setting the launch files cannot be written for; the message says why and what to change."""


@dataclass(frozen=True)
class Engine:
    """One engine instance of an island: its GPUs, parallelism and hosts."""

    name: str  # e.g. "i03-prefill-h20"
    island: int
    role: str
    gpu: str
    gpus: int  # world size
    attn_tp: int
    attn_dp: int
    max_running: int  # decode: sequences admitted (batch x attention ranks); prefill: 0
    redundant_experts: int
    hosts: tuple[int, ...]  # host indices of its GPU type
    gpu_slice: tuple[int, int] | None  # (first, last) GPU within its host when smaller than a host
    node_gpus: int
    overlap: bool = True  # two micro-batches overlapped, as the plan's island was priced (plan.Island.overlap)
    chunk: int = 0  # aggregated: prompt tokens per attention rank a mixed step prefills (plan.Island.chunk_tokens)
    experts: str = "fp8"  # the routed experts' format the island was priced in (plan.Island.precision.experts)

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def where(self) -> str:
        """'H20 0,1' or 'H20 6 (GPUs 0-3)'."""
        text = f"{self.gpu} " + ",".join(map(str, self.hosts))
        return text + (f" (GPUs {self.gpu_slice[0]}-{self.gpu_slice[1]})" if self.gpu_slice else "")


def _software(gpu: str) -> str:
    """The kernel stack of a GPU type of the catalog (cuda | rocm); CUDA for one the catalog does not have."""
    try:
        return load_gpu(gpu).software
    except CatalogError:
        return "cuda"


def engines(plan: Plan) -> list[Engine]:
    """The engines of every serving island, on the hosts the plan's node map gives it."""
    if not plan.serves:
        raise DeployError("the plan serves no requests (no island can run the model in a role): nothing to deploy")
    out = []
    for k, isl in enumerate(plan.islands):
        if not isl.serving:
            continue
        if isl.hosts is None:
            raise DeployError(f"plan island {k} has no hosts: re-run the search that wrote it with this version")
        node = isl.hosts.node_gpus
        if not (isl.size % node == 0 or node % isl.size == 0) or not isl.hosts.aligned(isl.size):
            raise DeployError(
                f"plan island {k} ({isl.size} x {isl.gpu}) is neither a divisor of a {node}-GPU host nor whole hosts: "
                "engines cannot be placed on it; plan with search.shapes=nodes (the default)"
            )
        if isl.precision.experts == "fp4" and _software(isl.gpu) != "cuda":
            raise DeployError(
                f"plan island {k} ({isl.size} x {isl.gpu}) was priced with FP4 routed experts; the launch files "
                "requantize the FP8 checkpoint's experts to NVFP4 on load, an NVIDIA (CUDA) path only: plan with FP8 "
                "experts (+costmodel.fixes.experts_fp8=true)"
            )
        if plan.model.n_heads % isl.tp:
            raise DeployError(
                f"plan island {k}: attention TP {isl.tp} does not divide {plan.model.name}'s {plan.model.n_heads} "
                "attention heads: no engine shards attention that way"
            )
        group, hosts, first = isl.ep_group, list(isl.hosts.nodes), isl.hosts.first_gpu
        for c in range(isl.engines):
            name = f"i{k:02d}-{isl.role}-{isl.gpu.lower()}" + (f"-{c}" if isl.engines > 1 else "")
            if group >= node:  # whole hosts per engine
                per = group // node
                mine, gslice = tuple(hosts[c * per : (c + 1) * per]), None
            else:  # several engines per host
                at = first + c * group
                mine, gslice = (hosts[at // node - first // node],), (at % node, at % node + group - 1)
            out.append(
                Engine(
                    name,
                    k,
                    isl.role,
                    isl.gpu,
                    group,
                    isl.tp,
                    isl.attention_ranks,
                    isl.batch * isl.attention_ranks if isl.role != "prefill" else 0,
                    isl.redundant_experts,
                    mine,
                    gslice,
                    node,
                    isl.overlap,
                    isl.chunk_tokens,
                    isl.precision.experts,
                )
            )
    return out

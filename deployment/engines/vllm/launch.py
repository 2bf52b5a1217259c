"""vLLM's release, options and command: `vllm serve` for one host of an engine.

The command is vLLM's fixed arguments (the weights, a multi-host engine's data-parallel ranks on this host and its
leader's address, the HTTP port on the leader) around what the parameter table writes for every planned quantity
(`deployment.parameters`, read back by `deployment.engines.vllm.check`). vLLM counts tokens and sequences per DP
rank."""

from __future__ import annotations

from dataclasses import dataclass

from deployment.launch import DIST_PORT, ENGINE_PORT, INDEX, LEADER, Launch, Ref
from deployment.options import DeployOptions, EngineOptions, one_of, setting
from deployment.parameters import arguments
from plan import Engine

VERSION = "0.33.0"  # the release whose flags and settings the commands are written for and checked against
IMAGE = f"vllm/vllm-openai:v{VERSION}"
PROGRAM = ("vllm", "serve")
TRANSFER_BACKENDS = ("nixl",)  # the KV connectors whose protocol the router speaks (kv_transfer_params)


@dataclass(frozen=True)
class Vllm(EngineOptions):
    """vLLM's own options (conf/deploy.yaml `vllm:`)."""

    # KV transfer between prefill and decode engines: NIXL (NixlConnector)
    transfer_backend: str = setting("nixl", one_of(*TRANSFER_BACKENDS))


def command(e: Engine, rank: int, opts: DeployOptions) -> Launch:
    """Host `rank` of engine `e`: a multi-host engine's data-parallel ranks spread over its hosts, the others joining
    the leader's (rank 0) headless at their first rank."""
    planned, env = arguments("vllm", e, opts)
    cmd = [*PROGRAM, opts.model_path, "--trust-remote-code", *planned]
    late: list[tuple[str, Ref]] = []
    if e.nnodes > 1:
        assert e.placement is not None
        local = min(e.gpus, e.placement.node_gpus) // e.attn_tp  # attention DP ranks on one host
        cmd += ["--data-parallel-size-local", str(local), "--data-parallel-rpc-port", str(DIST_PORT)]
        late = [("--data-parallel-address", Ref(LEADER))]
        if rank != 0:
            cmd += ["--headless"]
            late += [("--data-parallel-start-rank", Ref(INDEX, times=local))]
    if rank == 0:
        cmd += ["--port", str(ENGINE_PORT)]
    return Launch(cmd, env=env, late=late)

"""SGLang's release, options and command: `python3 -m sglang.launch_server` for one host of an engine.

The command is SGLang's fixed arguments (the weights, the HTTP server, a multi-host engine's ranks and its leader's
address) around what the parameter table writes for every planned quantity (`deployment.parameters`, read back by
`deployment.engines.sglang.check`)."""

from __future__ import annotations

from dataclasses import dataclass

from deployment.launch import DIST_PORT, ENGINE_PORT, INDEX, LEADER, Launch, Ref
from deployment.options import EXPERT_LOCATION, DeployOptions, EngineOptions, one_of, setting
from deployment.parameters import arguments
from plan import Engine

VERSION = "0.5.23"  # the release whose flags the commands are written for and checked against
IMAGE = f"lmsysorg/sglang:v{VERSION}"
PROGRAM = ("python3", "-m", "sglang.launch_server")
TRANSFER_BACKENDS = ("mooncake", "nixl")
# SGLang's PD timeouts (sglang/srt/environ.py; 300 s each by default): a prefill-decode handshake may wait for the
# peer engine to finish loading (an hour, the Kubernetes startup probe's allowance); a decode engine waits for a
# request's KV as long as the router waits for an answer (its --timeout, 600 s)
ENV = {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "3600", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "600"}


@dataclass(frozen=True)
class Sglang(EngineOptions):
    """SGLang's own options (conf/deploy.yaml `sglang:`)."""

    # KV transfer between prefill and decode engines (mooncake | nixl)
    transfer_backend: str = setting("mooncake", one_of(*TRANSFER_BACKENDS))
    # a recorded expert distribution to start EPLB from, an absolute .pt or .json path (None: trivial)
    expert_location: str | None = setting(None, EXPERT_LOCATION)


def command(e: Engine, rank: int, opts: DeployOptions) -> Launch:
    """Host `rank` of engine `e`: rank 0 the leader of a multi-host engine, the others joining it at its address."""
    planned, env = arguments("sglang", e, opts)
    cmd = [*PROGRAM, "--model-path", opts.model_path, "--trust-remote-code", "--host", "0.0.0.0",
           "--port", str(ENGINE_PORT), *planned]  # fmt: skip
    late: list[tuple[str, Ref]] = []
    if e.nnodes > 1:
        cmd += ["--nnodes", str(e.nnodes), "--node-rank", "0"] if rank == 0 else ["--nnodes", str(e.nnodes)]
        late = [("--dist-init-addr", Ref(LEADER, f":{DIST_PORT}"))] + ([("--node-rank", Ref(INDEX))] if rank else [])
    return Launch(cmd, env={**ENV, **env}, late=late)

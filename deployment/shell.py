"""target=shell: one bash script per engine and host, under hosts/<gpu>-host<NNN>/."""

from __future__ import annotations

from pathlib import Path

from deployment.commands import DeployOptions, command
from deployment.engines import Engine
from deployment.launch import HOST, LEADER, shell_env, shell_line, uses
from plan import Plan


def scripts(plan: Plan, es: list[Engine], opts: DeployOptions) -> dict[str, str]:
    """{path relative to the folder: script} for every host of every engine."""
    out = {}
    for e in es:
        for rank, host in enumerate(e.hosts):
            launch = command(e, rank, plan, opts)
            env = []
            if LEADER in uses(launch):
                env.append(f"export LEADER_ADDR=${{LEADER_ADDR:?set to the address of {e.gpu} host {e.hosts[0]}}}")
            if HOST in uses(launch):
                env.append(f"export HOST_ADDR=${{HOST_ADDR:?set to the address of {e.gpu} host {host}}}")
            if e.gpu_slice:
                gpus = ",".join(map(str, range(e.gpu_slice[0], e.gpu_slice[1] + 1)))
                env.append(f"export CUDA_VISIBLE_DEVICES={gpus}")
            body = [
                "#!/usr/bin/env bash",
                f"# {e.name}: {e.role}, {e.gpus} x {e.gpu}, {e.gpu} host {host}"
                + (f" (rank {rank} of {e.nnodes})" if e.nnodes > 1 else ""),
                "set -euo pipefail",
                "# RDMA (KV transfer, DeepEP) registers GPU memory: lift the locked-memory limit where allowed",
                'ulimit -l unlimited 2>/dev/null || echo "warning: cannot lift the locked-memory limit (ulimit -l):'
                ' RDMA registration may fail" >&2',
                *env,
                *shell_env(launch, rank),
                shell_line(launch, rank),
                "",
            ]
            out[str(Path("hosts") / f"{e.gpu.lower()}-host{host:03d}" / f"{e.name}.sh")] = "\n".join(body)
    return out

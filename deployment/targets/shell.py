"""target=shell: one bash script per engine and host, under hosts/<gpu>-host<NNN>/."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployment.commands import command
from deployment.errors import DeployError
from deployment.launch import ENGINE_PORT, HOST, LEADER, ROUTER_PORT, shell_env, shell_line, uses, visible_devices
from deployment.options import DeployOptions, TargetOptions
from deployment.targets.base import Target
from plan import Engine, Plan


@dataclass(frozen=True)
class Shell(TargetOptions):
    """target=shell's own options: none (the hosts' addresses are filled in where the scripts ask for them)."""


class ShellTarget(Target):
    """Host scripts: each engine host runs its script, the router runs anywhere that reaches the engines."""

    name = "shell"
    Options = Shell
    sections = ("shell",)

    def address(self, e: Engine) -> str:
        return f"http://HOST-{e.gpu.lower()}-{e.hosts[0]}:{ENGINE_PORT}"

    def refuse(self, plan: Plan, es: list[Engine], opts: DeployOptions) -> None:
        """Engines that share a host: every script of a host starts its engine on the same ports (the HTTP server,
        SGLang's bootstrap server, the distributed init), and the router would reach them at one address."""
        clash = shared_host((e.name, e.gpu, e.hosts) for e in es)
        if clash is not None:
            one, other, gpu, h = clash
            raise DeployError(f"engines {one} and {other} share {gpu} host {h} (islands smaller than a host, packed "
                              "side by side), and target=shell starts every engine of a host on the same ports: "
                              "deploy with target=k8s (a pod per engine), or plan islands of whole hosts "
                              "(search.min_island at least a host)")  # fmt: skip

    def files(self, plan: Plan, es: list[Engine], opts: DeployOptions, route: dict[str, Any]) -> dict[str, str]:
        return scripts(plan, es, opts)

    def readme(self, opts: DeployOptions) -> list[str]:
        return [
            "- for each multi-host engine, `LEADER_ADDR`: the address of its first host (the scripts stop if unset);",
            "- where a script asks for `HOST_ADDR` (vLLM): the address other hosts reach this host at;",
            "- the router's `routing.json`: replace each `HOST-<gpu>-<n>` with that host's address.",
            "",
            "## Start",
            "",
            "On each host run its scripts (`hosts/<gpu>-host<NNN>/*.sh`, one per engine there; every rank of a",
            "multi-host engine must start), then the router anywhere that reaches the engines:",
            "",
            "```bash",
            "export ARCHIPELAGO_ROUTER_API_KEY=...   # clients send `Authorization: Bearer <key>`",
            f"python -m deployment.router routing.json --host 0.0.0.0 --port {ROUTER_PORT}",
            "```",
        ]


def shared_host(owners: Iterable[tuple[str, str, tuple[int, ...]]]) -> tuple[str, str, str, int] | None:
    """The first host two owners (engines, or a fleet's models) share, from (owner, GPU type, its hosts) each:
    (the one there first, the other, the GPU type, the host); None where no host is shared."""
    seen: dict[tuple[str, int], str] = {}
    for owner, gpu, hosts in owners:
        for h in hosts:
            first = seen.setdefault((gpu, h), owner)
            if first != owner:
                return first, owner, gpu, h
    return None


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
            env += [f"export {name}={value}" for name, value in visible_devices(e).items()]
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

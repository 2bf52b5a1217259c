"""An engine's command for one host, by the engine the deploy options name: what every target writes and the
engines' own checks judge (`deployment.engines`: each adapter's fixed arguments around the parameter table's).

A command is a `deployment.launch.Launch`: literal arguments, its environment, and the few values only the host
knows when it starts, which each target writes as explicit references.
"""

from __future__ import annotations

from deployment.deployable import engine_of
from deployment.engines import adapter
from deployment.launch import WORKER, Launch, example_argv
from deployment.options import DeployOptions
from plan import Engine, Plan


def command(e: Engine, rank: int, plan: Plan, opts: DeployOptions) -> Launch:
    """The launch of host `rank` (0 the leader; WORKER a Kubernetes worker pod) of engine `e` of `plan`, for
    `opts.engine`."""
    return adapter(opts.engine).command(engine_of(plan, e), rank, opts)


def engine_argv(e: Engine, rank: int, plan: Plan, opts: DeployOptions) -> list[str]:
    """The command line as the engine on host `rank` parses it (host-known values as examples): what the engines'
    own checks are given."""
    return example_argv(command(e, rank, plan, opts), 1 if rank == WORKER else rank)

"""What a deploy target is: where a plan's engines run and the files that start them.

A target (one module of deployment/targets/, one line in `TARGETS`) owns its options (`Options`, read from
conf/deploy.yaml's `sections`), what it refuses to deploy, where the router reaches an engine, the files it writes
for the engines it launches, and its README's fill-in and start sections. `tests/test_target_contract.py` runs every
target through one suite.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from deployment.engines import adapter
from deployment.errors import DeployError
from deployment.launch import ENGINE_PORT
from deployment.options import DeployOptions, TargetOptions
from plan import Engine, Plan


class Target:
    """A deploy target: its options, refusals, engine addresses, files and README sections."""

    name: ClassVar[str]  # its registry name, conf/deploy.yaml's `target=`
    Options: ClassVar[type[TargetOptions]] = TargetOptions
    sections: ClassVar[tuple[str, ...]] = ()  # conf/deploy.yaml's sections its options are read from, merged

    def own(self, opts: DeployOptions) -> DeployOptions:
        """`opts` with this target's own options (its defaults where `opts` has none)."""
        if opts.target != self.name:
            raise DeployError(f"options for target={opts.target} given to the {self.name} target")
        if opts.target_options is None:
            return replace(opts, target_options=self.Options())
        if not isinstance(opts.target_options, self.Options):
            raise DeployError(f"target={self.name} takes {self.Options.__name__} options, "
                              f"not {type(opts.target_options).__name__}")  # fmt: skip
        return opts

    def refuse(self, plan: Plan, es: list[Engine], opts: DeployOptions) -> None:
        """DeployError where this target cannot run the plan's engines (none by default)."""

    def launched(self, plan: Plan, es: list[Engine]) -> list[Engine]:
        """The engines to write launches for: a re-plan's islands that run on unchanged need none."""
        kept = set(plan.replan.kept) if plan.replan is not None else set()
        return [e for e in es if e.island not in kept]

    def address(self, e: Engine) -> str:
        """Engine `e`'s base URL for the router."""
        return f"http://{e.name}:{ENGINE_PORT}"

    def health(self, e: Engine) -> str | None:
        """Where the router asks `e`'s health when not at its address (None: there)."""
        return None

    def protocol(self, opts: DeployOptions) -> str:
        """What the router speaks to the engines (routing.json's `protocol`): the engine's by default."""
        return opts.engine

    def routes(self, opts: DeployOptions) -> str:
        """How the router hands a request to the engines, for the README: the engine's protocol by default."""
        return adapter(opts.engine).routes

    def files(self, plan: Plan, es: list[Engine], opts: DeployOptions, route: dict[str, Any]) -> dict[str, str]:
        """{path in the launch folder: text} that start engines `es` of `plan` and the router (routing `route`)."""
        raise NotImplementedError

    def readme(self, opts: DeployOptions) -> list[str]:
        """The README's lines on what to fill in for this target (after the model path) and how to start."""
        raise NotImplementedError

"""What an engine adapter is: the base every engine Archipelago launches derives from, and what its checks raise.

An adapter (one folder of deployment/engines/, one line in `ENGINES`) owns its release (`version`, `image`), its own
options (`Options`: conf/deploy.yaml's section of its name), its command for one host of an engine (its fixed
arguments around the parameter table's, `deployment.parameters`), the ports it serves, and its own check: the
command through the engine's own settings resolution on a device probe of the engine's GPU (`settings`), read back
against the plan by the same table. `tests/test_engine_contract.py` runs every adapter through one suite.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from deployment.errors import DeployError
from deployment.launch import ENGINE_PORT, WORKER, Launch, example_argv, example_env, visible_devices
from deployment.options import DeployOptions, EngineOptions
from deployment.resolved import Setting
from plan import Engine, Plan

# the models whose config.json the engines' checks resolve a command against (tests/data/models/<folder>)
MODELS_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "models"
CHECKED_MODELS = {"deepseek_v3": "deepseek-v3", "qwen3_coder_480b_a35b": "qwen3-coder-480b-a35b",
                  "qwen3_235b_a22b": "qwen3-235b-a22b", "qwen3_30b_a3b": "qwen3-30b-a3b",
                  "gpt_oss_120b": "gpt-oss-120b", "kimi_k2": "kimi-k2", "deepseek_v32": "deepseek-v32",
                  "glm_4_6": "glm-4.6", "llama_3_3_70b": "llama-3.3-70b"}


class EngineRefused(Exception):
    """The engine refuses a command line; the message is the engine's own."""


class EngineArgsMissing(RuntimeError):
    """The engine package (its source) is not installed here."""


def parse_strictly(parser: argparse.ArgumentParser, argv: list[str], engine: str) -> argparse.Namespace:
    """Parse `argv` as the engine would; ValueError names the flag or value `engine` rejects."""
    try:
        ns, unknown = parser.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit) as err:
        raise ValueError(f"{engine} rejects {argv}: {err}") from None
    if unknown:
        raise ValueError(f"{engine} has no flag(s) {unknown}")
    return ns


class Adapter:
    """An engine: its release, its options, its command for one host, its ports and its own check."""

    name: ClassVar[str]  # its registry name, conf/deploy.yaml's `engine=` and routing.json's protocol
    title: ClassVar[str]  # as a reader names it, with its release ("SGLang 0.5.23")
    version: ClassVar[str]  # the release its commands are written for and checked by
    image: ClassVar[str]  # the container image of that release
    program: ClassVar[tuple[str, ...]]  # what precedes the engine's own arguments on its command line
    Options: ClassVar[type[EngineOptions]] = EngineOptions
    routes: ClassVar[str] = ""  # how the router hands a request to its engines, for a launch folder's README
    # the models its check resolves against their own config.json (tests/data/models/<folder>), by catalogue name
    checked_models: ClassVar[dict[str, str]] = CHECKED_MODELS

    def own(self, opts: DeployOptions) -> DeployOptions:
        """`opts` with this engine's own options (its defaults where `opts` has none)."""
        if opts.engine != self.name:
            raise DeployError(f"options for engine={opts.engine} given to the {self.name} adapter")
        if opts.engine_options is None:
            return replace(opts, engine_options=self.Options())
        if not isinstance(opts.engine_options, self.Options):
            raise DeployError(f"engine={self.name} takes {self.Options.__name__} options, "
                              f"not {type(opts.engine_options).__name__}")  # fmt: skip
        return opts

    def command(self, e: Engine, rank: int, opts: DeployOptions) -> Launch:
        """The launch of host `rank` of engine `e` (0 the leader; WORKER a Kubernetes worker pod)."""
        raise NotImplementedError

    def ports(self, e: Engine) -> dict[str, int]:
        """The ports engine `e`'s leader serves, by name (a Service's and a container's)."""
        return {"http": ENGINE_PORT}

    def settings(self, plan: Plan, e: Engine, argv: list[str], env: dict[str, str], opts: DeployOptions,
                 ) -> list[Setting]:  # fmt: skip
        """Engine `e` of `plan` (its arguments `argv` after `program`, its environment `env`) as the engine's own
        settings resolution gives it, setting by setting, against the plan; EngineRefused where it refuses them."""
        raise NotImplementedError

    def check(self, plan: Plan, e: Engine, rank: int, opts: DeployOptions) -> list[Setting]:
        """Host `rank` of engine `e` as its launch runs it (host-known values as examples, the engine's slice of its
        host's GPUs), through the engine's own settings resolution, against the plan. EngineRefused for a plan of a
        model whose config this check does not hold (`checked_models`): resolved against another's, it would pass
        while judging another model's engine."""
        if plan.model.name not in self.checked_models:
            raise EngineRefused(
                f"{self.title}'s check resolves a command against its model's own config.json, and holds "
                f"{', '.join(self.checked_models)}'s only (tests/data/models): {plan.model.name}'s engines are not "
                "judged here (their launch files are written as planned)"
            )
        opts = self.own(opts)
        launch = self.command(e, rank, opts)
        index = 1 if rank == WORKER else rank
        argv = example_argv(launch, index)
        assert tuple(argv[: len(self.program)]) == self.program, argv[:4]
        env = {**example_env(launch, index), **visible_devices(e)}
        return self.settings(plan, e, argv[len(self.program) :], env, opts)

"""vLLM (`vllm serve`): its command (`launch`), its own settings resolution run without a GPU and read back against
the plan (`check`), and its argument definitions read from its pinned source without importing it (`args`)."""

from __future__ import annotations

from typing import ClassVar

from deployment.engines.base import MODELS_DIR, Adapter
from deployment.engines.vllm import check, launch
from deployment.launch import Launch
from deployment.options import DeployOptions
from deployment.resolved import Setting
from plan import Engine, Plan


class VllmAdapter(Adapter):
    """vLLM with the NIXL KV connector and DeepEP, its DP ranks counted per rank."""

    name = "vllm"
    title = f"vLLM {launch.VERSION}"
    version = launch.VERSION
    image = launch.IMAGE
    program = launch.PROGRAM
    Options = launch.Vllm
    routes: ClassVar[str] = (
        "sends the request to both in the vLLM NIXL protocol (prefill with max_tokens 1 returning kv_transfer_params, "
        "then decode with them)."
    )

    def command(self, e: Engine, rank: int, opts: DeployOptions) -> Launch:
        return launch.command(e, rank, self.own(opts))

    def settings(self, plan: Plan, e: Engine, argv: list[str], env: dict[str, str], opts: DeployOptions,
                 ) -> list[Setting]:  # fmt: skip
        return check.settings(plan, e, argv, env, self.own(opts), MODELS_DIR / self.checked_models[plan.model.name])

"""SGLang (`python3 -m sglang.launch_server`): its command (`launch`), its own settings resolution run without a GPU
and read back against the plan (`check`), and its argument definitions read without importing it (`args`)."""

from __future__ import annotations

from typing import ClassVar

from deployment.engines.base import MODELS_DIR, Adapter
from deployment.engines.sglang import check, launch
from deployment.launch import BOOTSTRAP_PORT, Launch
from deployment.options import DeployOptions
from deployment.resolved import Setting
from plan import Engine, Plan, Role


class SglangAdapter(Adapter):
    """SGLang with prefill-decode disaggregation (Mooncake or NIXL) and DeepEP."""

    name = "sglang"
    title = f"SGLang {launch.VERSION}"
    version = launch.VERSION
    image = launch.IMAGE
    program = launch.PROGRAM
    Options = launch.Sglang
    routes: ClassVar[str] = (
        "sends the request to both in the SGLang PD protocol (bootstrap host, port and room added to the request)."
    )

    def command(self, e: Engine, rank: int, opts: DeployOptions) -> Launch:
        return launch.command(e, rank, self.own(opts))

    def ports(self, e: Engine) -> dict[str, int]:
        """The HTTP port, and on a prefill engine the bootstrap port its decode peers fetch KV through."""
        return {**super().ports(e), **({"bootstrap": BOOTSTRAP_PORT} if e.role is Role.PREFILL else {})}

    def settings(self, plan: Plan, e: Engine, argv: list[str], env: dict[str, str], opts: DeployOptions,
                 ) -> list[Setting]:  # fmt: skip
        return check.settings(plan, e, argv, self.own(opts), MODELS_DIR / self.checked_models[plan.model.name])

"""A plan's engines as an engine's own settings resolution gives them, against the plan: the table docs/deploy.md
shows (`python -m deployment.sglang_check PLAN.json`, `python -m deployment.vllm_check PLAN.json`)."""

from __future__ import annotations

import argparse

from costmodel.catalog import CatalogError
from costmodel.cli import UserError
from deployment.deployable import engines
from deployment.engines import adapter
from deployment.engines.base import Adapter, EngineArgsMissing, EngineRefused
from deployment.engines.device import probed
from deployment.options import DeployOptions
from deployment.resolved import Setting, table
from plan import Plan, load


def checked(plan: Plan, engine: Adapter, opts: DeployOptions | None = None) -> list[tuple[str, list[Setting]]]:
    """(name, settings) of every engine of `plan` as `engine` resolves its leader's command for `opts`."""
    opts = opts or DeployOptions(engine=engine.name)
    return [(e.name, engine.check(plan, e, 0, opts)) for e in engines(plan)]


def main(engine: str, argv: list[str] | None = None) -> None:
    """`python -m deployment.<engine>_check PLAN.json`: the table of the plan's engines as the engine resolves them;
    one `error:` line for a plan, GPU or command it cannot check."""
    ap = argparse.ArgumentParser(prog=f"python -m deployment.{engine}_check", description=main.__doc__)
    ap.add_argument("plan")
    path = ap.parse_args(argv).plan
    try:
        a = adapter(engine)
        plan = load(path)
        for gpu in sorted({isl.gpu for isl in plan.serving}):
            probed(gpu)
        print(table(checked(plan, a)))
    except (UserError, CatalogError, EngineRefused, EngineArgsMissing) as err:
        raise SystemExit(f"error: {path}: {err}") from None

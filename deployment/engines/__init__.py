"""The engines Archipelago launches, one adapter each (`base.Adapter`: its release, options, command, ports and own
check), and their registry. Adding one: a folder beside sglang/ and vllm/, its flags in the parameter table's rows
(`deployment.parameters`), a line here; `tests/test_engine_contract.py` runs it through the suite every engine
passes."""

from __future__ import annotations

from deployment.engines.base import Adapter
from deployment.engines.sglang import SglangAdapter
from deployment.engines.vllm import VllmAdapter
from deployment.errors import DeployError

ENGINES: dict[str, Adapter] = {a.name: a for a in (SglangAdapter(), VllmAdapter())}


def adapter(name: str) -> Adapter:
    """The engine named `name`; DeployError with the valid choices for another."""
    if name not in ENGINES:
        raise DeployError(f"engine={name!r}: unknown engine; choose from {sorted(ENGINES)}")
    return ENGINES[name]

"""routing.json: what the router (`deployment.router`) applies, from a plan and its engines.

Per phase, each serving island's engine URLs and its share of every input-length range (weights
within an island are equal, its engines being identical).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deployment.commands import BOOTSTRAP_PORT
from deployment.engines import Engine
from plan import Plan


def routing(plan: Plan, es: list[Engine], engine: str, address: Callable[[Engine], str]) -> dict[str, Any]:
    """The router's config; `address(e)` is engine `e`'s base URL."""
    islands: dict[int, list[str]] = {}
    for e in es:
        islands.setdefault(e.island, []).append(address(e))
    phases: dict[str, dict[str, Any]] = {"prefill": {}, "decode": {}}
    for k, isl in enumerate(plan.islands):
        if isl.serving:
            phases[isl.role][str(k)] = {
                "engines": islands[k],
                "ranges": [[r.start, r.end, r.fraction] for r in isl.ranges],
            }
    return {
        "protocol": engine,
        "bootstrap_port": BOOTSTRAP_PORT,
        "chars_per_token": 4.0,  # prompts given as text: a token is about 4 characters (set from your tokenizer)
        "islands": phases,
        "source_plan": {"rate_req_s": plan.rate_req_s, "workload": plan.workload},
    }

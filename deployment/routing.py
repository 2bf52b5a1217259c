"""routing.json: what the router (`deployment.router`) applies, from a plan and its engines.

Per role (prefill, decode, aggregated), each serving island's engine URLs and its share of every input-length
range (weights within an island are equal, its engines being identical).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from deployment.launch import BOOTSTRAP_PORT
from plan import Engine, Plan


def routing(
    plan: Plan,
    es: list[Engine],
    engine: str,
    address: Callable[[Engine], str],
    model_path: str,
    health: Callable[[Engine], str | None] = lambda e: None,
) -> dict[str, Any]:
    """The router's config; `address(e)` is engine `e`'s base URL, `health(e)` where its health is asked when not
    there, `model_path` the model's folder (its tokenizer)."""
    islands: dict[int, list[str]] = {}
    for e in es:
        islands.setdefault(e.island, []).append(address(e))
    phases: dict[str, dict[str, Any]] = {"prefill": {}, "decode": {}}
    if any(isl.role == "aggregated" for isl in plan.serving):
        phases["aggregated"] = {}
    for k, isl in enumerate(plan.islands):
        if isl.serving:
            phases[isl.role][str(k)] = {
                "engines": islands[k],
                "ranges": [[r.start, r.end, r.fraction] for r in isl.ranges],
            }
    for islands_of_role in phases.values():
        _fill_gaps(islands_of_role)
    checks = {address(e): url for e in es if (url := health(e))}
    return {
        "protocol": engine,
        "bootstrap_port": BOOTSTRAP_PORT,
        "tokenizer": str(PurePosixPath(model_path) / "tokenizer.json"),  # where the router's host has it
        "chars_per_token": 4.0,  # without the tokenizer, text prompts are estimated at 4 characters a token
        "in_flight": in_flight(plan),
        "islands": phases,
        **({"health": checks} if checks else {}),
        "source_plan": {"rate_req_s": plan.rate_req_s, "workload": plan.workload},
    }


def _fill_gaps(islands: dict[str, dict[str, Any]]) -> None:
    """A range no island of the role serves (no prompt of the workload fell in it, so the plan routes it nowhere)
    goes as the range below it goes (the first ones: as the range above): the router covers every length."""
    cover: dict[tuple[float, float], list[tuple[str, float]]] = {}
    for name, isl in islands.items():
        for start, end, frac in isl["ranges"]:
            cover.setdefault((start, end), []).append((name, frac))
    spans = sorted(cover)
    if not spans:
        return
    filled: list[tuple[float, float, tuple[float, float]]] = []  # (start, end, the span whose split it takes)
    if spans[0][0] > 0:
        filled.append((0, spans[0][0], spans[0]))
    for lower, upper in itertools.pairwise(spans):
        if upper[0] > lower[1]:
            filled.append((lower[1], upper[0], lower))
    for start, end, like in filled:
        for name, frac in cover[like]:
            islands[name]["ranges"].append([start, end, frac])
    for isl in islands.values():
        isl["ranges"].sort()


def in_flight(plan: Plan) -> int:
    """Requests in flight at the plan's rate (Little's law): each island's share of the rate times its time per
    request, the prefill's TTFT (at the SLO percentile: an upper side) and the decode's mean output x TPOT."""
    rate = plan.rate_req_s
    if rate <= 0:
        return 0
    out_tokens = plan.rates.output_tok_s / rate
    seconds = 0.0
    for isl in plan.serving:
        if isl.role == "prefill" and isl.ttft_ms_expected:
            seconds += isl.traffic_share * isl.ttft_ms_expected / 1000
        elif isl.role.decodes and isl.tpot_ms_expected:
            seconds += isl.traffic_share * out_tokens * isl.tpot_ms_expected / 1000
    return math.ceil(rate * seconds)

"""A plan (`plan.json` of `pipeline.search`) as simulator engines and a router."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.settings import CostSettings
from costmodel.specs import GPU, Model
from simulator.core import DecodeEngine, PrefillEngine, Router
from simulator.routers import RouterInputs, make_router
from simulator.timing import decode_timing, prefill_timing


@dataclass(frozen=True)
class Island:
    gpu: str
    size: int
    role: str
    tp: int
    dp: int
    ep: int
    batch: int
    ranges: tuple[tuple[int, int, float], ...]  # (start, end, share of the range's traffic in this phase)


def islands_from_plan(plan: Mapping[str, Any], where: str = "plan") -> list[Island]:
    """The islands that serve traffic; ValueError names the offending field."""
    if not isinstance(plan.get("islands"), list) or not plan["islands"]:
        raise ValueError(f"{where}: no `islands` list: is this a plan.json written by pipeline.search?")
    out = []
    for k, isl in enumerate(plan["islands"]):
        try:
            if isl["role"] == "idle":
                continue
            island = Island(
                str(isl["gpu"]),
                int(isl["size"]),
                str(isl["role"]),
                int(isl["tp"]),
                int(isl["dp"]),
                int(isl["ep"]),
                int(isl["batch"]),
                tuple((int(r["start"]), int(r["end"]), float(r["fraction"])) for r in isl["ranges"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"{where}: islands[{k}] lacks or mangles {err}: needs gpu, size, role, tp, dp, ep, batch, ranges"
            ) from None
        if island.role not in ("prefill", "decode") or min(island.tp, island.dp, island.ep) < 1:
            raise ValueError(
                f"{where}: islands[{k}] has role {island.role!r}, tp {island.tp}, dp {island.dp}, ep {island.ep}"
            )
        out.append(island)
    for role in ("prefill", "decode"):
        if not any(i.role == role for i in out):
            raise ValueError(f"{where}: no {role} island: the plan cannot serve a request")
    return out


def build(
    islands: list[Island],
    gpus: Mapping[str, GPU],
    model: Model,
    cost: CostSettings,
    *,
    router: str = "plan",
    max_len: int = 8192,
    max_context: int = 16384,
    token_budget: int = 16384,
    seed: int = 0,
    stats: Mapping[str, float] | None = None,
    expert_imbalance: float = 1.0,
) -> tuple[list[PrefillEngine], list[DecodeEngine], Router]:
    """Engines for every serving island (dp each) and the router named `router`.

    `stats` (mean_input, mean_output, std_output of the workload) parameterise `sal` and `mapper`;
    `expert_imbalance` (an expert placement's busiest-over-mean GPU load) slows every decode step.
    """
    prefill: list[PrefillEngine] = []
    decode: list[DecodeEngine] = []
    engines_of: dict[str, list[list[int]]] = {"prefill": [], "decode": []}
    phase_islands: dict[str, list[Island]] = {"prefill": [], "decode": []}
    for k, isl in enumerate(islands):
        if isl.gpu not in gpus:
            raise ValueError(f"plan island {k} uses GPU {isl.gpu!r}, not among {sorted(gpus)}")
        gpu = gpus[isl.gpu]
        phase_islands[isl.role].append(isl)
        if isl.role == "prefill":
            t = prefill_timing(gpu, model, isl.tp, isl.dp, max_len, cost)
            ids = list(range(len(prefill), len(prefill) + isl.dp))
            prefill += [PrefillEngine(i, k, t, token_budget) for i in ids]
        else:
            t = decode_timing(gpu, model, isl.tp, isl.ep, isl.batch, max_context, cost, expert_imbalance)
            if t.kv_tokens < 1:
                raise ValueError(f"plan island {k} ({isl.size} x {isl.gpu}, ep {isl.ep}) has no KV memory left")
            rebuild = prefill_timing(gpu, model, isl.tp, isl.ep // isl.tp, max_context, cost)
            ids = list(range(len(decode), len(decode) + isl.dp))
            decode += [DecodeEngine(i, k, t, rebuild) for i in ids]
        engines_of[isl.role].append(ids)
    ends = sorted({r[1] for isl in islands for r in isl.ranges})
    shares = {}
    for phase, isls in phase_islands.items():
        f = np.zeros((len(ends), len(isls)))
        for k, isl in enumerate(isls):
            for _, end, frac in isl.ranges:
                f[ends.index(end), k] = frac
        shares[phase] = f
    stats = stats or {}
    inputs = RouterInputs(
        seed,
        token_budget,
        *(float(stats.get(k, v)) for k, v in (("mean_input", 1.0), ("mean_output", 1.0), ("std_output", 0.0))),
        range_end=np.array(ends),
        shares=shares,
        engines_of=engines_of,
    )
    return prefill, decode, make_router(router, inputs)

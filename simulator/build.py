"""A `Plan` as simulator engines and a router: every serving island's engines (dp each), with step times from
the cost model the plan was made with (its model and cost settings)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from costmodel.specs import GPU
from plan import Island, Plan
from simulator.core import DecodeEngine, PrefillEngine, Router
from simulator.routers import RouterInputs, make_router
from simulator.timing import decode_timing, prefill_timing


def range_ends(plan: Plan) -> np.ndarray:
    """The upper ends of every range the plan's serving islands take, sorted."""
    return np.array(sorted({r.end for isl in plan.serving for r in isl.ranges}))


def range_shares(islands: Sequence[Island], ends: np.ndarray) -> np.ndarray:
    """(ranges, islands): each island's share of each range's requests (ranges by `ends`)."""
    f = np.zeros((len(ends), len(islands)))
    for k, isl in enumerate(islands):
        for r in isl.ranges:
            f[int(np.searchsorted(ends, r.end)), k] = r.fraction
    return f


def build(
    plan: Plan,
    gpus: Mapping[str, GPU],
    *,
    router: str = "plan",
    max_len: int = 8192,
    max_context: int = 16384,
    token_budget: int | None = None,
    seed: int = 0,
    stats: Mapping[str, float] | None = None,
    expert_imbalance: float = 1.0,
) -> tuple[list[PrefillEngine], list[DecodeEngine], Router]:
    """Engines for every prefill and decode island of `plan` (dp each) and the router named `router`. Aggregated
    islands run apart (`simulator.mixed`): the router routes what the plan leaves to the others.

    `token_budget`: prompt tokens a prefill engine batches (None: the plan's `prefill_batch_tokens`);
    `stats` (mean_input, mean_output, std_output of the workload) parameterise `sal` and `mapper`;
    `expert_imbalance` (an expert placement's busiest-over-mean GPU load) slows every decode step.
    """
    model, cost = plan.model, plan.cost
    token_budget = cost.engine.prefill_batch_tokens if token_budget is None else token_budget
    islands = [isl for isl in plan.serving if isl.role != "aggregated"]
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
            t = decode_timing(gpu, model, isl.tp, isl.ep, isl.batch, max_context, cost,
                              expert_imbalance=expert_imbalance)  # fmt: skip
            if t.kv_tokens < 1:
                raise ValueError(f"plan island {k} ({isl.size} x {isl.gpu}, ep {isl.ep}) has no KV memory left")
            rebuild = prefill_timing(gpu, model, isl.tp, isl.ep // isl.tp, max_context, cost)
            ids = list(range(len(decode), len(decode) + isl.dp))
            decode += [DecodeEngine(i, k, t, rebuild) for i in ids]
        engines_of[isl.role].append(ids)
    ends = range_ends(plan)
    shares = {phase: range_shares(isls, ends) for phase, isls in phase_islands.items()}
    # the share of each range aggregated islands take
    whole = range_shares([isl for isl in plan.serving if isl.role == "aggregated"], ends).sum(axis=1)
    stats = stats or {}
    inputs = RouterInputs(
        seed,
        token_budget,
        *(float(stats.get(k, v)) for k, v in (("mean_input", 1.0), ("mean_output", 1.0), ("std_output", 0.0))),
        range_end=ends,
        shares=shares,
        engines_of=engines_of,
        elsewhere=whole >= 1.0 - 1e-9,
    )
    return prefill, decode, make_router(router, inputs)

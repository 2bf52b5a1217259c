"""A `Plan` as simulator engines and a router: every serving island's engines (dp each), with step times from
the cost model the plan was made with (its model and cost settings)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from costmodel.specs import GPU
from plan import Island, Plan, island_engines
from simulator.cache import PrefixCache
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
    cache_block_tokens: int | None = None,
) -> tuple[list[PrefillEngine], list[DecodeEngine], Router]:
    """Engines for every prefill and decode island of `plan` (dp each) and the router named `router`. Aggregated
    islands run apart (`simulator.mixed`): the router routes what the plan leaves to the others. Each island's
    engines run what the plan's engine records say (`plan.island_engines`): a prefill engine is one attention rank of
    its island's engine, batching its prompt tokens per rank; a decode engine admits its running sequences and
    verifies its MTP drafts.

    `token_budget`: prompt tokens a prefill engine batches (None: its engine record's, the plan's
    `prefill_batch_tokens`); `stats` (mean_input, mean_output, std_output of the workload) parameterise `sal` and
    `mapper`; `expert_imbalance` (an expert placement's busiest-over-mean GPU load) slows every decode step;
    `cache_block_tokens`: each prefill engine keeps a prefix cache of blocks of that many tokens in the KV memory its
    batch leaves (`simulator.cache`; None: no cache, every prompt prefilled whole).
    """
    model, cost = plan.model, plan.cost
    islands = [(j, isl) for j, isl in enumerate(plan.islands) if isl.serving and isl.role != "aggregated"]
    prefill: list[PrefillEngine] = []
    decode: list[DecodeEngine] = []
    engines_of: dict[str, list[list[int]]] = {"prefill": [], "decode": []}
    phase_islands: dict[str, list[Island]] = {"prefill": [], "decode": []}
    budgets = []  # the prefill engines' token budgets, for the routers that size batches
    for k, (j, isl) in enumerate(islands):
        if isl.gpu not in gpus:
            raise ValueError(f"plan island {k} uses GPU {isl.gpu!r}, not among {sorted(gpus)}")
        gpu, mine = gpus[isl.gpu], island_engines(plan, j)
        phase_islands[isl.role].append(isl)
        if isl.role == "prefill":
            e = mine[0]  # one engine over the island, or a dense model's replicas: every attention rank prefills apart
            budget = e.prefill_tokens if token_budget is None else token_budget
            budgets.append(budget)
            cached = cache_block_tokens is not None
            t = prefill_timing(gpu, model, e.attn_tp, e.attn_dp, max_len, cost, cached=cached, chunk=budget)
            ids = list(range(len(prefill), len(prefill) + sum(x.attn_dp for x in mine)))
            blocks = (t.kv_tokens - budget) // cache_block_tokens if cached else 0  # type: ignore[operator]
            host = t.host_tokens // cache_block_tokens if cached else 0  # type: ignore[operator]
            prefill += [PrefillEngine(i, k, t, budget, PrefixCache(blocks, host) if cached else None) for i in ids]
        else:
            e = mine[0]  # the island's engines are alike; a dense model's replicas decode apart
            ranks = e.replica_ranks
            t = decode_timing(gpu, model, e.attn_tp, e.attn_tp * ranks, isl.batch, max_context, cost,
                              expert_imbalance=expert_imbalance, draft_tokens=e.drafts)  # fmt: skip
            if t.kv_tokens < 1:
                raise ValueError(f"plan island {k} ({isl.size} x {isl.gpu}, ep {isl.ep}) has no KV memory left")
            t = replace(t, max_seqs=e.max_running // e.replicas)
            rebuild = prefill_timing(gpu, model, e.attn_tp, ranks, max_context, cost)
            ids = list(range(len(decode), len(decode) + sum(x.replicas for x in mine)))
            decode += [DecodeEngine(i, k, t, rebuild) for i in ids]
        engines_of[isl.role].append(ids)
    if token_budget is None:  # the routers that size batches: the prefill engines' (the plan's, where none prefill)
        token_budget = budgets[0] if budgets else cost.engine.prefill_batch_tokens
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

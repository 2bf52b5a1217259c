"""A plan whose islands include aggregated ones, simulated in parts: each request goes, on arrival, to an
aggregated island or to the disaggregated islands by the plan's routing (its input length's range and the
share of that range each aggregated island takes), and each part runs on its own. The parts share no
engines, so this is the whole plan's run; their outcomes are joined into one record of requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from costmodel.specs import GPU
from plan import Plan, island_engines
from simulator.aggregated import AggregatedEngine, AggregatedSimulation
from simulator.build import range_ends, range_shares
from simulator.cache import PrefixCache
from simulator.core import DecodeEngine, PrefillEngine, Simulation
from simulator.requests import Requests
from simulator.timing import decode_timing, prefill_timing

OUTCOMES = ("prefill_engine", "decode_engine", "first_token", "finish", "preemptions", "cached")


@dataclass
class MixedRun:
    """The joined run: `r` as `Simulation.r`; `prefill`, `decode` the disaggregated part's engines."""

    r: Requests
    prefill: list[PrefillEngine] = field(default_factory=list)
    decode: list[DecodeEngine] = field(default_factory=list)
    kv_trace: list[tuple[float, float]] = field(default_factory=list)
    aggregated: dict[int, list[AggregatedEngine]] = field(default_factory=dict)  # plan.serving index -> its engines
    engine_island: dict[int, int] = field(default_factory=dict)  # an aggregated engine's number in `r` -> its island


def split(plan: Plan, input_len: np.ndarray, seed: int = 0) -> np.ndarray:
    """Per request, the index in `plan.serving` of the aggregated island it goes to, or -1 (disaggregated)."""
    ends = range_ends(plan)
    agg = [k for k, isl in enumerate(plan.serving) if isl.role == "aggregated"]
    share = range_shares([plan.serving[k] for k in agg], ends)
    j = np.minimum(np.searchsorted(ends, input_len, side="right"), len(ends) - 1)
    cum = np.cumsum(share, axis=1)[j]  # (requests, aggregated islands)
    # a stream of its own: the requests' lengths may have been drawn from default_rng(seed)'s first uniforms
    u = np.random.default_rng((seed, 0xA66)).random(len(input_len))
    pick = (u[:, None] >= cum).sum(axis=1)  # the first island whose cumulative share passes u
    return np.where(pick < len(agg), np.array([*agg, -1])[pick], -1)


def aggregated_engines(plan: Plan, k: int, gpu: GPU, max_len: int, max_context: int,
                       expert_imbalance: float = 1.0, cache_block_tokens: int | None = None,
                       ) -> list[AggregatedEngine]:  # fmt: skip
    """The `dp` engines of aggregated island `plan.serving[k]`, as its engine records say (`plan.island_engines`):
    decode steps as a decode island's, a step's chunk of the record's `chunk` tokens per rank one forward spread over
    the ranks (`PrefillTiming.forward_ms`, as `island_bench._aggregated` prices it); `cache_block_tokens`: each
    with a prefix cache of such blocks (None: none)."""
    j = [i for i, isl in enumerate(plan.islands) if isl.serving][k]
    isl, model, cost, mine = plan.islands[j], plan.model, plan.cost, island_engines(plan, j)
    e = mine[0]  # the island's engines are alike; a dense model's replicas run apart, each an engine here
    ranks = e.replica_ranks
    dec = decode_timing(gpu, model, e.attn_tp, e.attn_tp * ranks, isl.batch, max_context, cost,
                        expert_imbalance=expert_imbalance, draft_tokens=e.drafts)  # fmt: skip
    if dec.kv_tokens < 1:
        raise ValueError(f"plan island {k} ({isl.size} x {isl.gpu}, ep {isl.ep}) has no KV memory left")
    dec = replace(dec, max_seqs=e.max_running // e.replicas)
    cached = cache_block_tokens is not None
    pre = prefill_timing(gpu, model, e.attn_tp, ranks, max_len, cost, cached=cached, ranks=ranks,
                         chunk=e.chunk * ranks)  # fmt: skip
    pre = replace(pre, handoff_ms=0.0)
    return [AggregatedEngine(i, dec, pre, e.chunk * ranks,
                             cache=PrefixCache(dec.kv_tokens // cache_block_tokens) if cached else None)  # type: ignore[operator]
            for i in range(sum(x.replicas for x in mine))]  # fmt: skip


def run(
    plan: Plan,
    r: Requests,
    gpus: Mapping[str, GPU],
    disaggregated: Callable[[Requests], Simulation],
    seed: int = 0,
    expert_imbalance: float = 1.0,
    cache_block_tokens: int | None = None,
    affinity: float | None = None,
) -> MixedRun:
    """Run `r` through `plan`: `disaggregated(requests)` builds and runs the disaggregated part (returning the
    finished simulation); every aggregated island runs its share itself (`cache_block_tokens`, `affinity`: its
    engines' prefix caches and cache-aware routing, `aggregated_engines` and `AggregatedSimulation`)."""
    where = split(plan, r.input_len, seed)
    out = MixedRun(r)
    max_len, max_context = int(r.input_len.max()), int((r.input_len + r.output_len).max())
    parts: list[tuple[np.ndarray, Requests]] = []
    rest = np.flatnonzero(where < 0)
    if rest.size:
        sub = r.take(rest)
        sim = disaggregated(sub)
        out.prefill, out.decode, out.kv_trace = sim.prefill, sim.decode, list(sim.kv_trace)
        parts.append((rest, sub))
    engines = max(len(out.prefill), len(out.decode))  # aggregated engines numbered after the others
    for k in sorted(set(where[where >= 0].tolist())):
        idx = np.flatnonzero(where == k)
        sub = r.take(idx)
        isl = plan.serving[k]
        pool = aggregated_engines(plan, k, gpus[isl.gpu], max_len, max_context, expert_imbalance, cache_block_tokens)
        AggregatedSimulation(sub, pool, affinity=affinity).run()
        out.aggregated[k] = pool
        sub.prefill_engine = np.where(sub.prefill_engine >= 0, sub.prefill_engine + engines, -1)
        sub.decode_engine = sub.prefill_engine.copy()
        out.engine_island.update({engines + i: k for i in range(len(pool))})
        engines += len(pool)
        parts.append((idx, sub))
    for idx, sub in parts:
        for name in OUTCOMES:
            getattr(r, name)[idx] = getattr(sub, name)
    return out


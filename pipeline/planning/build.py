"""The one builder of a `Plan`: a layout solved, routed and described island by island.

`build_plan` solves the layout in the search's model (each island's utilisation caps for the whole
workload's mix: what the search scored and the exact reference solves), then again with each
island's caps for the mix its routing gives it (`Planner.solve_routed`: the plan's rate), re-scores
that routing at every input length, and describes every island: role, parallelism, the batch its
engines run, precision, the ranges it serves with their shares, what it is expected to do at the
plan's rate, and its hosts. What the search adds (how it was found, the reference and gap, the
rate band, the simulated check) goes onto the record with `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from costmodel.formulas import DecodeRun, decode_parts, priced_precision
from costmodel.island_bench import IslandBenchmark, PhaseTable
from costmodel.queueing import mix_moments, mix_quantile, wait_quantile
from pipeline.planning.envelope import judged
from pipeline.planning.planner import Layout, Planner
from plan import Hosts, InventoryInfo, Island, Plan, Precision, RangeShare, Rates, Role
from solvers.inner import InnerProblem, InnerSolution


def build_plan(
    planner: Planner,
    layout: Layout,
    time_limit_s: float,
    backend: str = "AUTO",
    inventory: InventoryInfo | None = None,
    roles: tuple[str, ...] | None = None,
    hosts: Sequence[Hosts] | None = None,
) -> Plan:
    """Solve `layout` (max_rate, routed caps) and describe every island: the plan of that layout. `roles`: every
    island's role, given (search.spare_hosts: the roles that keep the most with hosts lost), not chosen here;
    `hosts`: every island's hosts, given (a re-plan keeps islands where they run), not placed here.

    A planner of bursty arrivals (`Planner.arrivals`, search.arrivals=workload) gives the roles, the ones that keep
    the most under them, unless `roles` are given; the plan's rates, routing and loads are Poisson's, as every
    plan states them, with the rate under the workload's own arrivals beside them (`bursty_req_s`)."""
    if planner.arrivals is not None:
        if roles is None:
            roles = planner.solve(layout, "max_rate", time_limit_s, backend=backend)[1].roles
        planner = planner.poisson()
    fixed = {} if roles is None else {"roles": roles}
    # prefix caches: the hit rates found again for this plan's own routing (the search may have priced the layout
    # with the same roles at another rate, its routing another)
    planner.hit_cache.pop(layout, None)
    searched = planner.solve(layout, "max_rate", time_limit_s, backend=backend, **fixed)  # the search's model
    prob, sol = planner.solve_routed(layout, time_limit_s, backend=backend, first=searched, roles=roles)
    ev, _ = planner.evaluate(layout, prob, sol)
    islands = describe(planner, layout, prob, sol, hosts)
    fluid = sol.rate_req_s  # without SLOs all three are one rate
    if planner.cost.slo.any:
        fluid = planner.solve(layout, "max_rate", time_limit_s, backend=backend, queueing=False, **fixed)[1].rate_req_s
    other = roles_compared(planner, layout, time_limit_s, backend)
    bursty = planner.bursty()
    if bursty is not None:  # the same islands in the same roles, each capped for the workload's own arrivals
        bursty_req_s = bursty.solve(layout, "max_rate", time_limit_s, backend=backend, roles=sol.roles)[1].rate_req_s
    rates = Rates(
        rate_req_s=sol.rate_req_s,
        fluid_req_s=fluid,
        searched_req_s=searched[1].rate_req_s,
        evaluated_req_s=ev.rate_req_s,
        output_tok_s=sol.rate_req_s * planner.workload.mean_decode,
        disaggregated_req_s=other if planner.cost.engine.aggregated else sol.rate_req_s,
        with_aggregated_req_s=sol.rate_req_s if planner.cost.engine.aggregated else other,
        bursty_req_s=None if bursty is None else bursty_req_s,
        cache_free_req_s=cache_free(planner, layout, time_limit_s, backend),
    )
    return Plan(tuple(islands), rates, planner.model, planner.cost, planner.workload.name, sol.status, inventory,
                workload_spec=planner.workload.spec)  # fmt: skip


def describe(
    planner: Planner, layout: Layout, prob: InnerProblem, sol: InnerSolution, hosts: Sequence[Hosts] | None = None
) -> tuple[Island, ...]:
    """Every island of `layout` as `sol` runs it: role, parallelism, batch, precision, the ranges it serves with
    their shares, what it is expected to do at `sol`'s rate, and its hosts (`place`'s unless given; an island
    given nothing is idle)."""
    r = planner.ranges
    if hosts is None:
        hosts = place(layout.islands, {g: planner.gpus[g].node_gpus for g, _ in layout.islands})
    islands = []
    # each phase's req/s per island and range, and per range in all (once: a layout may have thousands of islands)
    caps = {"decode": prob.decode_req_s * sol.x_decode, "prefill": prob.prefill_req_s * sol.x_prefill}
    tots = {k: v.sum(axis=0) for k, v in caps.items()}
    for i, (gpu, size) in enumerate(layout.islands):
        serves = sol.x_prefill[i].sum() + sol.x_decode[i].sum() > 1e-9
        bench = planner.benchmark(gpu, size)
        phase = Role(sol.roles[i]) if Role(sol.roles[i]).decodes else Role.PREFILL
        # (an aggregated island has the same share in both phases, at its aggregated rate: `InnerProblem.resolved`)
        key = "decode" if phase == "decode" else "prefill"
        x, cap, tot = (sol.x_decode if key == "decode" else sol.x_prefill), caps[key], tots[key]
        served = np.flatnonzero(cap[i] > 0)
        cfg = bench.config(phase) if serves else None
        table = bench.table(phase)
        fraction = cap[i] / np.where(tot > 0, tot, 1.0)
        # a prefill island's caches speed its prompts up as priced (Planner.speedup at its expected hit rates)
        speed = planner.cache_speed(layout, i) if cfg and phase == "prefill" else None
        facts = _serving_facts(planner, bench, phase, cfg, fraction, sol.rate_req_s, speed) if cfg else {}
        batch = engine_batch(table, cap[i], served, phase) if cfg and table is not None else 0
        if cfg and (phase.decodes or planner.model.dense):
            facts["overlap"] = overlapped(planner, gpu, cfg, batch, fraction)
        if cfg and phase == "aggregated" and table is not None and table.chunk is not None:
            facts["chunk_tokens"] = max(int(table.chunk[table.chosen, served].min()), 1)  # no step past TPOT
        hits = planner.hit_cache[layout][1][i] if cfg and phase == "prefill" and layout in planner.hit_cache else None
        if hits is not None:  # its tokens' share its caches hold, as priced
            tokens = cap[i] * r.mean
            facts["cache_hit_expected"] = float(tokens @ hits / tokens.sum()) if tokens.sum() > 0 else 0.0
        if cfg:
            facts["tokens_per_gpu_s"] = _load(planner, phase, fraction, sol.rate_req_s, size, hits)
        islands.append(
            Island(
                gpu=gpu,
                size=size,
                role=phase if cfg else "idle",  # an island too small to hold the model serves nothing
                tp=cfg["tp"] if cfg else 0,
                dp=cfg["dp"] if cfg else 0,
                ep=cfg["ep"] if cfg else 0,
                batch=batch,
                precision=Precision(*priced_precision(planner.gpus[gpu], planner.profile, planner.model)),
                cost_per_hour=size * planner.gpus[gpu].price_per_hour,
                ranges=tuple(
                    RangeShare(int(r.start[j]), int(r.end[j]), float(cap[i, j] / tot[j]), float(x[i, j]))
                    for j in served
                )
                if cfg
                else (),
                hosts=hosts[i],
                **facts,
            )
        )
    return judged(islands, planner.model.name, planner.cost)


def _load(planner: Planner, phase: str, fraction: np.ndarray, rate: float, size: int,
          hits: np.ndarray | None) -> float:  # fmt: skip
    """`Island.tokens_per_gpu_s` at `rate`: a prefill island's prompt tokens (those its caches do not hold, `hits`
    per range), a decode island's output tokens, an aggregated one's both, over its `size` GPUs."""
    routed = rate * planner.ranges.p * fraction  # req/s of each range through it
    computed = planner.ranges.mean * (1.0 - hits) if hits is not None else planner.ranges.mean
    prompts, outputs = float(routed @ computed), float(routed.sum()) * planner.workload.mean_decode
    return {"prefill": prompts, "decode": outputs}.get(phase, prompts + outputs) / size


def cache_free(planner: Planner, layout: Layout, time_limit_s: float, backend: str = "AUTO") -> float | None:
    """The layout's rate (`Planner.solve_routed`, as the plan's) priced without its prefix caches (None: the
    workload names no prompt blocks, so nothing was priced with them)."""
    if planner.reuse is None:
        return None
    bare = dataclasses.replace(planner, reuse=None, hit_cache={})
    return max(bare.solve_routed(layout, time_limit_s, backend=backend)[1].rate_req_s, 0.0) + 0.0  # (no -0.0)


def roles_compared(planner: Planner, layout: Layout, time_limit_s: float, backend: str = "AUTO") -> float:
    """The layout's rate (`Planner.solve_routed`, as the plan's) with the other choice of roles: prefill and decode
    islands only where the plan allowed aggregated ones, aggregated ones allowed where it did not (report.md
    compares the two)."""
    engine = planner.cost.engine
    cost = dataclasses.replace(planner.cost, engine=dataclasses.replace(engine, aggregated=not engine.aggregated))
    other = planner.with_cost(cost)
    return max(other.solve_routed(layout, time_limit_s, backend=backend)[1].rate_req_s, 0.0) + 0.0  # (no -0.0)


def overlapped(planner: Planner, gpu: str, cfg: Mapping[str, int], batch: int, fraction: np.ndarray) -> bool:
    """Whether a decode island runs two overlapped micro-batches at its batch, as the cost model prices its steps
    (costmodel.formulas.decode_parts `Overlap`, at the mean context of the mix it serves): always unless the profile
    chooses (`overlap_chosen`). A dense model's never does: it has no all-to-all to hide."""
    if planner.model.dense:
        return False
    if not planner.profile.overlap_chosen:
        return True
    w = planner.ranges.p * fraction
    context = float(w @ planner.lengths / w.sum()) + planner.workload.mean_decode / 2 if w.sum() > 0 else 1.0
    parts = decode_parts(planner.gpus[gpu], planner.model, context, batch, cfg["tp"], cfg["ep"],
                         profile=planner.profile, run=DecodeRun.of(planner.cost))  # fmt: skip
    return bool(float(parts["Overlap"]) > 0)


def _serving_facts(
    planner: Planner, bench: IslandBenchmark, phase: str, cfg: Mapping[str, int], fraction: np.ndarray, rate: float,
    speed: np.ndarray | None = None,
) -> dict[str, Any]:
    """What a deployment needs to know of one serving island besides its shape.

    - `redundant_experts`: r >= 0 extra expert replicas so the E + r routed experts divide evenly
      over the island's EP group (G GPUs, ceil(E / G) each: the memory the cost model counts);
      engines require (E + r) % G == 0 (SGLang --ep-num-redundant-experts).
    - `traffic_share`: the share of all requests that pass through the island in its phase.
    - `utilisation`: the share of its time it is busy at the plan's rate (at most its SLO cap).
    - prefill `ttft_ms_expected`: the TTFT bound at the SLO percentile the queueing model gives the
      island at that load (W_q + batching + S_q, docs/inner.md); decode `tpot_ms_expected`: its mean
      step over the mix it serves (aggregated: with the prompts' chunks in its steps).
    """
    experts = planner.model.n_routed_experts
    group = int(cfg["ep"]) if Role(phase).decodes else int(cfg["tp"]) * int(cfg["dp"])
    per_gpu = -(-experts // group)
    table = bench.table(phase)
    speed = np.ones(len(planner.ranges.p)) if speed is None else speed  # (prefill: its caches' speed-up per range)
    raw = bench.req_s(phase) * speed
    routed = rate * planner.ranges.p * fraction  # req/s of each range through this island
    ok = routed > 0
    out: dict[str, Any] = {
        "experts_per_gpu": per_gpu,
        "redundant_experts": per_gpu * group - experts,
        "traffic_share": float(planner.ranges.p @ fraction),
        "utilisation": float((routed[ok] / raw[ok]).sum()) if ok.any() else 0.0,
    }
    if not ok.any() or table is None or table.chosen < 0:
        return out
    times_s = table.time_ms[table.chosen, ok] / 1e3 / speed[ok]
    if phase != "prefill":  # (aggregated: the decode step stretched by the prompts it interleaves)
        out["tpot_ms_expected"] = float(routed[ok] @ times_s / routed[ok].sum() * 1e3)
        return out
    cost = planner.cost
    q = cost.slo.ttft_percentile / 100
    mean, cs2 = mix_moments(times_s, routed[ok])
    c = int(cfg["dp"])
    rho = min(out["utilisation"], 0.9999)
    wait = wait_quantile(c, rho * c / mean, mean, cs2, q)
    tokens = float(routed[ok] @ planner.lengths[ok] / routed[ok].sum())
    batch_s = mean / tokens * max(cost.engine.prefill_batch_tokens - tokens, 0.0)
    out["ttft_ms_expected"] = float((wait + min(rho * wait, batch_s) + mix_quantile(times_s, routed[ok], q)) * 1e3)
    return out


def place(islands: Sequence[tuple[str, int]], node_gpus: Mapping[str, int]) -> list[Hosts]:
    """Every island's hosts, in the order given: per GPU type, whole-host islands first on hosts 0, 1, ...,
    then islands smaller than a host packed into the next hosts (first fit). An island that is
    neither (search.shapes=any) spans hosts from where the last one ended (`Hosts.aligned` says so)."""
    out: list[Hosts | None] = [None] * len(islands)
    by_type: dict[str, list[int]] = {}
    for k, (gpu, _) in enumerate(islands):
        by_type.setdefault(gpu, []).append(k)
    for gpu, ks in by_type.items():
        n = node_gpus[gpu]
        nxt = 0  # next free GPU, counted over the type's hosts
        free: list[tuple[int, int]] = []  # (host, first free GPU) of partly used hosts
        for k in sorted(ks, key=lambda k: -islands[k][1]):
            size = islands[k][1]
            if size < n and n % size == 0:
                spot = next((s for s, (_, g) in enumerate(free) if g + size <= n), None)
                if spot is None:
                    host = -(-nxt // n)
                    free.append((host, 0))
                    nxt = (host + 1) * n
                    spot = len(free) - 1
                host, first = free[spot]
                free[spot] = (host, first + size)
                out[k] = Hosts(n, (host,), first)
                continue
            start = -(-nxt // n) * n if size % n == 0 else nxt  # whole hosts start on a host boundary
            out[k] = Hosts(n, tuple(range(start // n, (start + size - 1) // n + 1)), start % n)
            nxt = start + size
    return [h for h in out if h is not None]


def engine_batch(table: PhaseTable, routed: np.ndarray, served: np.ndarray, phase: str) -> int:
    """The one batch an island's engines run with, from the per-range batches of its benchmark.

    Prefill: the batch at the range with the most traffic. Decode: the benchmark sizes a batch
    per range as if each range decoded alone (the largest that fits in memory and meets the
    TPOT step cap). An engine running the island's mix holds one batch whose step and KV use are
    set by the mix's mean context; with step time and KV memory linear in the batch's summed
    context, that batch is the traffic-weighted harmonic mean of the per-range batches: its
    throughput equals the range-by-range capacity the inner solve counted (docs/inner.md).
    Rounded down, so the mix's step stays within the cap.
    """
    if table.chosen < 0 or not served.size:
        return 0
    b = table.batch[table.chosen, served]
    w = routed[served]
    if phase == "prefill" or (b <= 0).any():
        return int(b[np.argmax(w)])
    # (aggregated: as decode, the batch of its decoding sequences)
    return max(int(np.floor(w.sum() / (w / b).sum() + 1e-9)), 1)


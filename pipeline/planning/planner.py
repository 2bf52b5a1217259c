"""From an island layout to a solved, evaluated plan: benchmarks (cached), problem, solve, evaluate.

`Planner` holds what stays fixed across layouts (model, workload, ranges, cost profile, GPU
specs) and a cache of island benchmarks keyed by (GPU, size): for a fixed workload and profile
a repeated island costs nothing, so a repeated layout costs only the solve.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from costmodel.formulas import kv_bytes_per_seq, kv_link_gb_s, prefill_time_ms
from costmodel.island_bench import IslandBenchmark, benchmark_island, utilisation_caps
from costmodel.profile import CostProfile
from costmodel.queueing import RateProfile, mix_moments, wait_tail
from costmodel.reuse import Reuse
from costmodel.settings import CostSettings
from costmodel.specs import GPU, Model
from pipeline.errors import ConfigError
from pipeline.planning.config import calibrated_for, host_cache_fits
from pipeline.planning.workload import Ranges, Workload
from simulator.arrivals import PROFILE_BIN_S
from simulator.timing import host_cache_tokens, host_load_ms, kv_bytes_per_token, prefill_kv_tokens
from solvers.evaluate import Evaluation, PhaseRouting, evaluate
from solvers.inner import InnerProblem, InnerSolution, solve

REUSE_ROUNDS = 2  # solves after the first that re-price prefill at the hit rates the last routing gives
TIGHTEN_ROUNDS = 8  # solves at most that tighten the caps where the routing's own mix holds less than it was solved at


@dataclass(frozen=True)
class Layout:
    """Islands as (gpu, size) pairs, kept in a canonical sorted order."""

    islands: tuple[tuple[str, int], ...]

    @staticmethod
    def of(islands: Sequence[tuple[str, int]]) -> Layout:
        return Layout(tuple(sorted(((str(g), int(n)) for g, n in islands), key=lambda t: (t[0], -t[1]))))

    @property
    def key(self) -> str:
        return ";".join(f"{g}x{n}" for g, n in self.islands)

    @property
    def short_hash(self) -> str:
        return layout_id(self.key)

    def describe(self) -> str:
        counts: dict[tuple[str, int], int] = {}
        for isl in self.islands:
            counts[isl] = counts.get(isl, 0) + 1
        return ", ".join(f"{g} {n}x{c}" for (g, n), c in counts.items())


def layout_id(key: str) -> str:
    """A short, stable name of a layout from its `Layout.key` ("-" for none), for MLflow's tables."""
    return hashlib.sha1(key.encode()).hexdigest()[:10] if key else "-"


def layout_from_cfg(cfg: Any, where: str) -> Layout:
    """`[{gpu: H200, size: 8, count: 4}, ...]` -> Layout; errors name `where`."""
    if not isinstance(cfg, Sequence) or isinstance(cfg, str) or not cfg:
        raise ConfigError(f"{where}: `islands` must be a list of {{gpu, size, count}}")
    out: list[tuple[str, int]] = []
    for k, item in enumerate(cfg):
        if not isinstance(item, Mapping) or not {"gpu", "size"} <= set(item):
            raise ConfigError(f"{where}: islands[{k}] must have `gpu` and `size` (and optional `count`)")
        size, count = item["size"], item.get("count", 1)
        for name, v in (("size", size), ("count", count)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{where}: islands[{k}].{name} must be a whole number >= 1, got {v!r}")
        out += [(str(item["gpu"]), size)] * count
    return Layout.of(out)


@dataclass
class Planner:
    model: Model
    workload: Workload
    ranges: Ranges
    cost: CostSettings
    gpus: Mapping[str, GPU]
    kv_transfer: bool = False  # max_rate: cap KV GB/s out of prefill and into decode islands by their NICs
    budget_per_hour: float | None = None  # max_rate: $/h cap on the islands in use (others stay idle)
    arrivals: RateProfile | None = None  # the SLO caps under these bursty arrivals (None: Poisson's)
    reuse: Reuse | None = None  # price prefill at each island's expected prefix-cache hit rate (costmodel.reuse)
    _cache: dict[tuple[str, int], IslandBenchmark] = field(default_factory=dict, repr=False)
    _full: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    _caps: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    _other: Planner | None = field(default=None, repr=False)  # `poisson` / `bursty`: the same planner, other caps
    # pipeline.planning.failures.spare_solve's results by (layout, hosts lost, backend): a search proposes a layout
    # more than once
    spare_cache: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)
    # with `reuse`: per layout, the roles and (islands, ranges) expected hit rates of a routing (`expected_hits`),
    # which every later problem of the layout is priced at
    # (and of them, the share found in the host tier: costmodel.host_cache_gb)
    hit_cache: dict[Layout, tuple[tuple[str, ...], np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    hits: int = 0
    misses: int = 0

    def __post_init__(self) -> None:
        calibrated_for(self.cost, self.model)
        host_cache_fits(self.cost, self.gpus)
        if self.reuse is not None and self.cost.cache_hit > 0:
            raise ConfigError(
                f"costmodel.cache_hit={self.cost.cache_hit} assumes a hit rate the prefix caches of workload "
                f"{self.workload.name} already price from its trace: set costmodel.cache_hit=0, or "
                "search.prefix_cache=false to use the flat rate instead"
            )

    @property
    def profile(self) -> CostProfile:
        return self.cost.profile

    @property
    def lengths(self) -> np.ndarray:
        """The length each range is benchmarked at (`Ranges.benchmark_lengths`)."""
        return self.ranges.benchmark_lengths(self.cost.slo.any)

    def benchmark(
        self,
        gpu: str,
        size: int,
        lengths: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        only: tuple[tuple[int, int], tuple[int, int]] | None = None,
    ) -> IslandBenchmark:
        """The island's benchmark at the ranges' lengths (`lengths`; cached), or at other lengths (not cached;
        `only` restricts it to one prefill and one decode configuration, as `benchmark_island` says)."""
        if gpu not in self.gpus:
            raise ConfigError(f"GPU {gpu!r} of the layout is not in the inventory {sorted(self.gpus)}")
        if lengths is None:
            key = (gpu, size)
            if key in self._cache:
                self.hits += 1
                return self._cache[key]
            self.misses += 1
        bench = benchmark_island(
            self.gpus[gpu],
            size,
            self.model,
            self.lengths if lengths is None else lengths,
            self.ranges.p if weights is None else weights,
            self.workload.mean_decode,
            self.workload.max_decode,
            cost=self.cost,
            output_pmf=self.workload.output_pmf,
            only=only,
        )
        if lengths is None:
            self._cache[(gpu, size)] = bench
        return bench

    def caps(self, gpu: str, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Per range, the share of its time the island may be busy in each phase and meet the SLOs (cached)."""
        key = (gpu, size)
        if key not in self._caps:
            bench = self.benchmark(gpu, size)
            self._caps[key] = utilisation_caps(bench, self.ranges.p, self.workload.mean_decode, self.cost,
                                               self.arrivals)  # fmt: skip
        return self._caps[key]

    def with_cost(self, cost: CostSettings) -> Planner:
        """This planner under other cost settings, its caches fresh."""
        return dataclasses.replace(self, cost=cost, _cache={}, _full={}, _caps={}, _other=None, spare_cache={}, hits=0,
                                   misses=0, hit_cache={})

    def poisson(self) -> Planner:
        """This planner with the SLO caps of Poisson arrivals (itself where it has them); benchmarks shared."""
        if self.arrivals is None:
            return self
        if self._other is None:
            self._other = dataclasses.replace(self, arrivals=None, _caps={}, _other=self)
        return self._other

    def bursty(self) -> Planner | None:
        """This planner with the SLO caps under the workload's own arrivals (its trace's rate profile; itself where
        it has them); None where the workload has no trace, there are no SLOs, or islands may aggregate (an
        aggregated island's rate within the SLOs is Poisson's, not capped by a queue: `island_bench._aggregated`)."""
        if self.arrivals is not None:
            return self
        if self.workload.arrival_profile is None or not self.cost.slo.any or self.cost.engine.aggregated:
            return None
        if self._other is None:
            profile = RateProfile(self.workload.arrival_profile, PROFILE_BIN_S)
            self._other = dataclasses.replace(self, arrivals=profile, _caps={}, _other=self)
        return self._other

    def rates(self, gpu: str, size: int, queueing: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(prefill, decode) req/s per range of island (gpu, size): with `queueing`, at the load the SLOs
        allow (the benchmark's rate times its utilisation cap); without, the fluid rate of a busy island."""
        bench = self.benchmark(gpu, size)
        if not queueing or not self.cost.slo.any:
            return bench.prefill_req_s, bench.decode_req_s
        u_pre, u_dec = self.caps(gpu, size)
        return bench.prefill_req_s * u_pre, bench.decode_req_s * u_dec

    def problem(
        self,
        layout: Layout,
        objective: str = "max_rate",
        queueing: bool = True,
        caps: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
        **kw: Any,
    ) -> InnerProblem:
        """`caps`: per island, utilisation caps to use instead of the cached whole-workload ones (`routed_caps`).
        With `reuse`, prefill is priced at the layout's expected hit rates (`hit_cache`), once its routing set them."""
        if caps is None:
            rates = [self.rates(g, n, queueing) for g, n in layout.islands]
        else:
            rates = []
            for (g, n), (u_pre, u_dec) in zip(layout.islands, caps, strict=True):
                bench = self.benchmark(g, n)
                rates.append((bench.prefill_req_s * u_pre, bench.decode_req_s * u_dec))
        if layout in self.hit_cache:
            rates = [(pre * self.cache_speed(layout, i), dec) for i, (pre, dec) in enumerate(rates)]
        if objective == "max_rate":
            if self.kv_transfer:
                kw.setdefault("kv_gb", self.kv_gb_per_range(layout))
                kw.setdefault(
                    "link_gb_s",
                    np.array([n * float(kv_link_gb_s(self.gpus[g], self.profile)) for g, n in layout.islands]),
                )
            if self.budget_per_hour is not None:
                kw.setdefault("budget_per_hour", self.budget_per_hour)
                kw.setdefault("cost_per_hour", self.cost_per_hour(layout))
            if self.cost.engine.aggregated:  # already within the SLOs (`island_bench._aggregated`)
                kw.setdefault("aggregated_req_s", np.array([self.benchmark(g, n).aggregated_req_s
                                                            for g, n in layout.islands]))  # fmt: skip
        return InnerProblem(
            layout.islands,
            self.ranges.p,
            np.array([r[0] for r in rates]),
            np.array([r[1] for r in rates]),
            objective,
            range_start=self.ranges.start,
            range_end=self.ranges.end,
            **kw,
        )

    def cost_per_hour(self, layout: Layout) -> np.ndarray:
        """$/h of each island (size x the GPU's price, inventory overrides included)."""
        return np.array([n * self.gpus[g].price_per_hour for g, n in layout.islands], dtype=float)

    def kv_gb_per_range(self, layout: Layout) -> np.ndarray:
        """GB of KV cache one request of each range hands from prefill to decode.

        At the range's representative length, in the largest KV element any GPU of the layout
        stores (BF16 where a GPU lacks FP8): conservative when GPU types mix.
        """
        tokens = self.ranges.mid.astype(float)
        per_gpu = [
            kv_bytes_per_seq(self.gpus[g], self.model, tokens, np.ones_like(tokens), self.profile,
                             kv_dtype=self.cost.engine.kv_dtype)
            for g in {g for g, _ in layout.islands}
        ]
        return np.max(per_gpu, axis=0) / 1e9

    def solve(
        self,
        layout: Layout,
        objective: str = "max_rate",
        time_limit_s: float = 10.0,
        backend: str = "AUTO",
        queueing: bool = True,
        **kw: Any,
    ) -> tuple[InnerProblem, InnerSolution]:
        prob = self.problem(layout, objective, queueing, **kw)
        sol = solve(prob, time_limit_s=time_limit_s, backend=backend)
        if objective == "max_rate":
            for _ in range(REUSE_ROUNDS if self._stale_hits(layout, sol) else 0):
                self.hit_cache[layout] = (sol.roles, *self.expected_hits(layout, prob.resolved(sol.roles), sol))
                prob = self.problem(layout, objective, queueing, **kw)
                sol = solve(prob, time_limit_s=time_limit_s, backend=backend)
                if not self._stale_hits(layout, sol):
                    break
        return prob.resolved(sol.roles), sol

    def _stale_hits(self, layout: Layout, sol: InnerSolution) -> bool:
        """With `reuse`: the layout's hit rates are not yet priced, or were for islands in other roles than `sol`'s
        (the hit rates follow the routing and roles, and they the hit rates)."""
        if self.reuse is None or sol.rate_req_s <= 0:
            return False
        known = self.hit_cache.get(layout)
        return known is None or known[0] != sol.roles

    def expected_hits(self, layout: Layout, prob: InnerProblem, sol: InnerSolution) -> tuple[np.ndarray, np.ndarray]:
        """(islands, ranges) prefix-cache hit rates a solution's routing gives its prefill islands' engines
        (`costmodel.reuse`): each engine's cache the KV memory its batch leaves, the router keeping prompts with the
        engine that holds them; and of them, the share its host tier holds (`costmodel.host_cache_gb`: an LRU cache
        as large as both tiers finds what the GPU's alone does and the host tier's blocks besides). Zeros without
        `reuse`, and on islands that do not prefill apart."""
        n_i, n_j = len(layout.islands), len(self.ranges.p)
        out = np.zeros((n_i, n_j))
        if self.reuse is None:
            return out, out
        routed = (prob.prefill_req_s * sol.x_prefill).T  # (ranges, islands) req/s
        pre = [i for i, r in enumerate(sol.roles) if r == "prefill"]
        total = routed[:, pre].sum(axis=1, keepdims=True)
        share = np.zeros((n_j, n_i))
        share[:, pre] = np.divide(routed[:, pre], total, out=np.zeros((n_j, len(pre))), where=total > 0)
        capacity, host, engines, ready = np.zeros(n_i), np.zeros(n_i), np.ones(n_i), np.zeros((n_j, n_i))
        wait = np.tile([0.0, np.inf], (n_i, 1))  # (islands, 2): the queue's P(wait), its tail's rate (1/s)
        busy, behind = np.zeros((n_j, n_i, 2)), np.zeros(n_i)  # per engine: utilisation and service by range; queue
        for i in pre:
            g, n = layout.islands[i]
            c = self.benchmark(g, n).config("prefill")
            if c is None:
                continue
            kv = prefill_kv_tokens(self.gpus[g], self.model, c["tp"], c["dp"], self.cost)
            capacity[i] = max(kv - self.cost.engine.prefill_batch_tokens, 0)
            host[i] = host_cache_tokens(self.gpus[g], self.model, c["tp"], self.cost)
            engines[i] = c["dp"]
            # a prompt's own prefill there (the reuse model takes off what its own prefix saved it): its successor
            # finds it only after that ...
            L = self.lengths.astype(float)
            tp, dp = np.full_like(L, c["tp"]), np.full_like(L, c["dp"])
            ready[:, i] = prefill_time_ms(self.gpus[g], self.model, L, tp, dp, profile=self.profile,
                                          draft_layers=self.cost.draft_layers) / 1e3  # fmt: skip
            # ... and its wait in the island's queue: the queueing model's wait at the island's load, its prompts
            # as fast as the solve priced them (the hit rates it was given)
            lam, table = routed[:, i], self.benchmark(g, n).table("prefill")
            if lam.sum() > 0 and table is not None and table.chosen >= 0:
                speed = self.cache_speed(layout, i)
                # s a prompt of each range takes one server
                service = table.time_ms[table.chosen] / 1e3 / (1.0 if speed is None else speed)
                mean, cs2 = mix_moments(service[lam > 0], lam[lam > 0])
                wait[i] = wait_tail(c["dp"], min(lam.sum(), 0.9999 * c["dp"] / mean), mean, cs2)
                # each engine's batch under way and the prompts queued behind it (Little's law), which the router
                # weighs a turn's saving against (`costmodel.reuse._stay`)
                busy[:, i, 0], busy[:, i, 1] = lam * service / c["dp"], service
                pw, theta = wait[i]
                behind[i] = lam.sum() * pw / theta / c["dp"] if theta > 0 else np.inf
        range_of = self.reuse.range_of(self.ranges.end)
        args = (ready, sol.rate_req_s, wait, busy, behind)
        hits = self.reuse.hit_rates(range_of, n_j, share, capacity + host, engines, *args).T
        if not host.any():
            return hits, np.zeros_like(hits)
        gpu = self.reuse.hit_rates(range_of, n_j, share, capacity, engines, *args).T
        return hits, np.clip(hits - gpu, 0.0, None)

    def speedup(self, gpu: str, size: int, hits: np.ndarray, host: np.ndarray | None = None) -> np.ndarray:
        """Per range, how much faster island (gpu, size)'s chosen prefill configuration prefills a range's prompt
        with `hits` of it cached (the cost model's `cache_hit`: the rest computed, attending to the whole prompt),
        `host` of it loaded back from the host tier first (its KV bytes over the GPU's host link)."""
        c = self.benchmark(gpu, size).config("prefill")
        if c is None or not hits.any():
            return np.ones_like(hits)
        L = self.lengths.astype(float)
        tp, dp = np.full_like(L, c["tp"]), np.full_like(L, c["dp"])
        kw = {"profile": self.profile, "draft_layers": self.cost.draft_layers}
        whole = prefill_time_ms(self.gpus[gpu], self.model, L, tp, dp, cache_hit=0.0, **kw)
        cached = prefill_time_ms(self.gpus[gpu], self.model, L, tp, dp, cache_hit=np.minimum(hits, 0.999), **kw)
        if host is not None and host.any():
            g = self.gpus[gpu]
            cached = cached + host_load_ms(host * L, kv_bytes_per_token(g, self.model, self.cost), g.host_link_gb_s)
        return np.divide(whole, cached, out=np.ones_like(L), where=cached > 0)

    def cache_speed(self, layout: Layout, i: int) -> np.ndarray | None:
        """Island i's prefill speed-up per range at the hit rates its layout is priced at (None: none priced)."""
        known = self.hit_cache.get(layout)
        if known is None:
            return None
        g, n = layout.islands[i]
        return self.speedup(g, n, known[1][i], known[2][i])

    def routed_caps(
        self, layout: Layout, prob: InnerProblem, sol: InnerSolution
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per island, its utilisation caps for the service mix the solution routes to it.

        The cached caps (`caps`) assume an island serves the whole workload's mix of lengths; an
        island given only long prompts, or a few long among many short, queues differently.
        Islands that serve nothing keep the cached caps.
        """
        out, seen = [], {}  # islands of one shape given one mix (many, in a large inventory) share their caps
        for i, (g, n) in enumerate(layout.islands):
            routed = sol.x_prefill[i] * prob.prefill_req_s[i] + sol.x_decode[i] * prob.decode_req_s[i]
            if routed.sum() <= 0:
                out.append(self.caps(g, n))
                continue
            key = (g, n, routed.tobytes())
            if key not in seen:
                seen[key] = utilisation_caps(self.benchmark(g, n), routed, self.workload.mean_decode, self.cost,
                                             self.arrivals)  # fmt: skip
            out.append(seen[key])
        return out

    def solve_routed(
        self,
        layout: Layout,
        time_limit_s: float = 10.0,
        backend: str = "AUTO",
        rounds: int = 4,
        first: tuple[InnerProblem, InnerSolution] | None = None,
        roles: tuple[str, ...] | None = None,
    ) -> tuple[InnerProblem, InnerSolution]:
        """max_rate with every island's caps computed from the mix the routing gives it (docs/inner.md).

        The caps depend on the routing and the routing on the caps: solve, recompute each island's
        caps from its routed mix, solve again, until the caps settle (at most `rounds` solves).
        Without SLOs there are no caps and this is `solve`. `first`: that whole-mix solve, if already made.
        `roles`: every island's role fixed (an LP each round), not chosen.
        """
        fixed = {} if roles is None else {"roles": roles}
        prob, sol = first or self.solve(layout, "max_rate", time_limit_s, backend=backend, **fixed)
        if not self.cost.slo.any or sol.rate_req_s <= 0:
            return prob, sol
        caps, own = None, None
        for _ in range(rounds - 1):
            new = self.routed_caps(layout, prob, sol)
            if caps is not None and all(
                np.allclose(a, b, atol=1e-3)
                for old, cur in zip(caps, new, strict=True)
                for a, b in zip(old, cur, strict=True)
            ):
                own = new  # the last routing's own caps, already worked out
                break
            caps = new
            prob = self.problem(layout, "max_rate", caps=caps, **fixed)
            sol = solve(prob, time_limit_s=time_limit_s, backend=backend)
            prob = prob.resolved(sol.roles)
        if caps is not None:
            prob, sol, caps = self._tightened(layout, prob, sol, caps, fixed, time_limit_s, backend, own)
        if self._stale_hits(layout, sol):  # its roles moved from those the hit rates were priced for: once more
            self.hit_cache[layout] = (sol.roles, *self.expected_hits(layout, prob, sol))
            prob = self.problem(layout, "max_rate", caps=caps, **fixed)
            sol = solve(prob, time_limit_s=time_limit_s, backend=backend)
            prob = prob.resolved(sol.roles)
        if self.reuse is not None and sol.rate_req_s > 0:  # the hit rates of this routing (the same roles may route
            for _ in range(REUSE_ROUNDS):  # otherwise than those they were priced for), its roles kept
                served = sol.x_prefill > 1e-9
                self.hit_cache[layout] = (sol.roles, *self.expected_hits(layout, prob, sol))
                prob = self.problem(layout, "max_rate", caps=caps, roles=sol.roles)
                sol = solve(prob, time_limit_s=time_limit_s, backend=backend)
                prob = prob.resolved(sol.roles)
                if np.array_equal(served, sol.x_prefill > 1e-9):
                    break
        return prob, sol

    def _tightened(
        self, layout: Layout, prob: InnerProblem, sol: InnerSolution, caps: list[tuple[np.ndarray, np.ndarray]],
        fixed: dict[str, Any], time_limit_s: float, backend: str,
        own: list[tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> tuple[InnerProblem, InnerSolution, list[tuple[np.ndarray, np.ndarray]]]:
        """The routed solve made honest: where the caps have not settled (the routing and the caps chase each other),
        the last routing may give an island a mix that holds less load than the caps it was solved with. Each island
        then keeps the lower of its caps and its own mix's, and the routing is solved again, until every island's mix
        holds the load it is given (the caps only fall, so this ends; at most TIGHTEN_ROUNDS solves). `own`: the caps
        of `sol`'s routing, where the caller has them."""
        for _ in range(TIGHTEN_ROUNDS):
            own = self.routed_caps(layout, prob, sol) if own is None else own
            if all(np.all(b >= a - 1e-3) for used, cur in zip(caps, own, strict=True)
                   for a, b in zip(used, cur, strict=True)):  # fmt: skip
                break
            caps = [tuple(np.minimum(a, b) for a, b in zip(used, cur, strict=True))  # type: ignore[misc]
                    for used, cur in zip(caps, own, strict=True)]  # fmt: skip
            prob = self.problem(layout, "max_rate", caps=caps, **fixed)
            sol = solve(prob, time_limit_s=time_limit_s, backend=backend)
            prob = prob.resolved(sol.roles)
            own = None  # the new routing's are worked out next round
        return prob, sol, caps

    def solve_without(
        self,
        layout: Layout,
        roles: Sequence[str],
        down: Collection[int],
        time_limit_s: float = 10.0,
        backend: str = "AUTO",
        rounds: int = 4,
    ) -> tuple[InnerProblem, InnerSolution]:
        """max_rate of `layout` with islands `down` gone and every other island kept in its role (`roles`, as its
        engines run): the routing alone re-solved, each island's caps from the mix it is then given, as in
        `solve_routed`. What the router can do when a host's engines stop; an LP, the roles being fixed."""
        fixed = tuple("idle" if i in down else r for i, r in enumerate(roles))
        caps = [tuple(np.zeros_like(c) for c in self.caps(g, n)) if i in down else self.caps(g, n)
                for i, (g, n) in enumerate(layout.islands)]  # fmt: skip
        prob = self.problem(layout, "max_rate", caps=caps, roles=fixed)  # type: ignore[arg-type]
        sol = solve(prob, time_limit_s=time_limit_s, backend=backend)
        prob = prob.resolved(sol.roles)
        if not self.cost.slo.any or sol.rate_req_s <= 0:
            return prob, sol
        own = None
        for _ in range(rounds - 1):
            new = self.routed_caps(layout, prob, sol)
            new = [tuple(np.zeros_like(c) for c in caps[i]) if i in down else cap for i, cap in enumerate(new)]
            if all(np.allclose(a, b, atol=1e-3) for old, cur in zip(caps, new, strict=True)
                   for a, b in zip(old, cur, strict=True)):  # fmt: skip
                own = new  # the last routing's own caps (the lost islands' 0), already worked out
                break
            caps = new
            prob = self.problem(layout, "max_rate", caps=caps, roles=fixed)  # type: ignore[arg-type]
            sol = solve(prob, time_limit_s=time_limit_s, backend=backend)
            prob = prob.resolved(sol.roles)
        prob, sol, _ = self._tightened(layout, prob, sol, caps, {"roles": fixed}, time_limit_s, backend, own)
        return prob, sol

    def support(self) -> tuple[np.ndarray, np.ndarray]:
        """Every input length the workload has, and its probability."""
        lengths = np.flatnonzero(self.workload.pmf > 0)
        return lengths, self.workload.pmf[lengths]

    def exact_rates(self, layout: Layout, prob: InnerProblem | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(I, L) prefill and decode req/s of each island's chosen configuration at every support length,
        at the load the SLOs allow: each length under its range's utilisation cap, the one `prob` was
        built with (a routed solve's caps, from the mix the routing gives each island), else the
        whole workload's.

        The plan's configuration is the one chosen at range resolution; each (GPU, size) is
        benchmarked at full resolution once per planner.
        """
        lengths, p_len = self.support()
        range_of = np.searchsorted(self.ranges.end, lengths, side="right")
        for gpu, size in set(layout.islands) - set(self._full):
            coarse = self.benchmark(gpu, size)
            pre, dec = coarse.prefill, coarse.decode
            if pre.chosen < 0 and dec.chosen < 0:
                self._full[(gpu, size)] = (np.zeros(len(lengths)), np.zeros(len(lengths)))
                continue
            only = tuple(  # the configurations chosen at range resolution: one row each at every length
                (int(t.tp[max(t.chosen, 0)]), int(t.dp[max(t.chosen, 0)])) for t in (pre, dec)
            )
            fine = self.benchmark(gpu, size, lengths, p_len, only)  # type: ignore[arg-type]
            self._full[(gpu, size)] = (
                _row(fine.prefill.req_s, 0 if pre.chosen >= 0 else -1, len(lengths)),
                _row(fine.decode.req_s, 0 if dec.chosen >= 0 else -1, len(lengths)),
            )
        full = [np.array([self._full[isl][k] for isl in layout.islands]) for k in (0, 1)]
        agg = [] if prob is None or prob.roles is None else [i for i, r in enumerate(prob.roles) if r == "aggregated"]
        if agg:  # an aggregated island at its ranges' rates (within the SLOs already; not re-scored by length)
            rows = prob.prefill_req_s[agg][:, range_of]  # type: ignore[union-attr]
            full = [f.copy() for f in full]
            full[0][agg] = full[1][agg] = rows
        if not self.cost.slo.any:
            return full[0], full[1]
        caps = []
        for k, rows in enumerate((None, None) if prob is None else (prob.prefill_req_s, prob.decode_req_s)):
            if rows is None:
                caps.append(np.array([self.caps(g, n)[k] for g, n in layout.islands]))
                continue
            fluid = np.array([self.rates(g, n, queueing=False)[k] for g, n in layout.islands])
            caps.append(np.divide(rows, fluid, out=np.zeros_like(rows), where=fluid > 0))
            caps[-1][agg] = 1.0
        return full[0] * caps[0][:, range_of], full[1] * caps[1][:, range_of]

    def evaluate(self, layout: Layout, prob: InnerProblem, sol: InnerSolution) -> tuple[Evaluation, np.ndarray]:
        """Re-score `sol` at every input length the workload has (thesis 5.2.2); returns the lengths too."""
        lengths, p_len = self.support()
        range_of = np.searchsorted(self.ranges.end, lengths, side="right")
        exact_p, exact_d = self.exact_rates(layout, prob)
        ev = evaluate(
            PhaseRouting(sol.x_prefill, prob.prefill_req_s, exact_p),
            PhaseRouting(sol.x_decode, prob.decode_req_s, exact_d),
            range_of,
            p_len,
        )
        return ev, lengths


def _row(table: np.ndarray, chosen: int, n: int) -> np.ndarray:
    return table[chosen] if chosen >= 0 else np.zeros(n)

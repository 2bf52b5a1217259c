"""Routers: which prefill engine, and later which decode engine, serves a request.

- `plan`: the plan's routing. A request's input length picks its range; an island serving that
  range is drawn with the plan's fraction for it (per phase); the least-loaded engine of that
  island takes the request. Where prefill engines keep prefix caches (a trace naming its prompts' blocks), a
  prompt goes to the island of its range whose engines hold the longest prefix of it (drawn by the plan's
  fractions among islands that tie, as every island does on a shared system prompt), while the range's prompt
  tokens sent to that island stay within `AFFINITY_BOUND` x its fraction of them (bounded loads over the run, so
  the plan's shares hold and each island serves the load it was priced for), else among the islands within the
  bound; in the island, the engine that would prefill it soonest: what is left of its batch under way, then its
  queued work not cached when it arrived plus the prompt's tokens its cache lacks, at its time per token (Dynamo's
  KV router weighs queued and new blocks alike; SGLang's cache-aware router and llm-d's prefix scorer trade cache
  against load the same way), the prompt's own work counted once more for each prompt expected to queue behind it
  (Little's law: the island's engines' mean queue now), so at load a turn stays where its cache saves the island
  work. A prompt no engine holds any of goes where the plan's fractions draw it, to the island's least loaded
  engine, as without caches. An engine holds what its cache holds and what the prompts
  queued there will leave in it (`PrefillEngine.holds`): a conversation's next turn that comes while its last is
  still queued follows it, as SGLang's cache-aware router inserts a prompt in its tree of an engine when it sends
  it, and finds it cached when its own turn comes.
- `length`: `plan` without the caches: the least-loaded engine of the island, whatever it holds.
- `cache`: the cache-aware choice over every prefill engine of every island, whatever the prompt's length:
  cache-aware routing without the plan's ranges. `length` and `cache` route decode as `plan`.
- `session`: the deployment router's policy (`deployment.router`): the range by length, then the engine of the
  range's islands its session's last turn went to, else the one its session hashes to (weighted rendezvous hashing),
  within bounded loads of the work it sent (`SessionRouter`); it needs each request's session (a session
  workload's, `simulator.sessions`), not the engines' caches.
- `round_robin`, `random`: over all engines of the phase, ignoring lengths and load.
- `p2c` (power of two choices): two engines drawn at random, the less loaded one wins.
- `sal` (seed 002, Eq. 2): load(s, r) = max(β·(memory(r) − free(s)), queued_tokens(s, r) /
  max_tokens_per_batch), β = (μ_in + μ_out) / μ_out; lowest load wins. Memory and free memory are
  in KV tokens (a prefill engine keeps no KV, so only its queue counts); state is read exactly
  rather than polled at 10 Hz.
- `mapper` (seed 001, Algorithm 2 with its min-max start fixed to +∞): per engine s a workload
  w = T_r^s · exp(θ·kvusage(s)), θ = 2, where T_r^s is r's time on s amortised over the batch
  that fills s's KV with copies of r, and kvusage counts the tokens (prompt + predicted output)
  of the requests routed to s and not finished; r goes where the largest workload after adding
  it is smallest (ties: the smallest resulting load, then the lowest index). Outputs are
  predicted as the paper does: a normal draw with the workload's mean and deviation. Prefill
  engines hold no KV, so there T is the prompt's prefill time and kvusage is 0.
- `dp_select` (seed 004, Algorithm 1, as printed): round robin, unless an engine's KV usage is at
  or above θ_kv = 0.9: then the least-used engine if usage differs by ≥ θ_diff = 0.1, else the
  least running load (running + waiting tokens) if loads differ by more than θ_load = 3000; a
  user's last decode engine is reused while no engine is saturated and the mapping is younger
  than 10 minutes (the paper gives no expiry; requests without a user skip this).

Load: a prefill engine's waiting prompt tokens; a decode engine's running plus waiting requests.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from costmodel.reuse import BOUND
from simulator.cache import cached_tokens
from simulator.core import Router, Simulation
from simulator.timing import PrefillTiming

# bounded loads (Mirrokni et al., c = 1.25): `plan` keeps each island within this multiple of its share of a range's
# prompt tokens, aggregated engines a prompt's engine within it of the mean load + 1 (the planner's reuse model
# prices the same bound: `costmodel.reuse.BOUND`)
AFFINITY_BOUND = BOUND
CACHE_ROUTERS = ("plan", "cache", "session")  # the routers that route for prefix caches (aggregated islands' too)
SESSION_ROUTERS = ("session",)  # the routers that need each request's session (`Requests.session`)


def _prefill_load(sim: Simulation, i: int) -> int:
    return sim.prefill[i].queued_tokens + (1 if sim.prefill[i].batch else 0)


def _decode_load(sim: Simulation, i: int) -> int:
    return sim.decode[i].load


class RoundRobin(Router):
    def __init__(self) -> None:
        self.next = {"prefill": 0, "decode": 0}

    def _pick(self, phase: str, n: int) -> int:
        i = self.next[phase] % n
        self.next[phase] += 1
        return i

    def prefill(self, sim: Simulation, req: int) -> int:
        return self._pick("prefill", len(sim.prefill))

    def decode(self, sim: Simulation, req: int) -> int:
        return self._pick("decode", len(sim.decode))


class RandomRouter(Router):
    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def prefill(self, sim: Simulation, req: int) -> int:
        return int(self.rng.integers(len(sim.prefill)))

    def decode(self, sim: Simulation, req: int) -> int:
        return int(self.rng.integers(len(sim.decode)))


class PowerOfTwo(Router):
    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def _pick(self, n: int, load: object, sim: Simulation) -> int:
        if n == 1:
            return 0
        a, b = self.rng.choice(n, 2, replace=False)
        return int(a) if load(sim, int(a)) <= load(sim, int(b)) else int(b)  # type: ignore[operator]

    def prefill(self, sim: Simulation, req: int) -> int:
        return self._pick(len(sim.prefill), _prefill_load, sim)

    def decode(self, sim: Simulation, req: int) -> int:
        return self._pick(len(sim.decode), _decode_load, sim)


class PlanRouter(Router):
    """Route by the plan: per range and phase, islands with the share of traffic the plan gives them."""

    def __init__(
        self,
        range_end: np.ndarray,
        shares: dict[str, np.ndarray],
        engines_of: dict[str, list[list[int]]],
        seed: int = 0,
        elsewhere: np.ndarray | None = None,
        cache_aware: bool = True,
    ) -> None:
        """`shares[phase]`: (ranges, islands of the phase) fractions; `engines_of[phase][k]`: island k's engines;
        `elsewhere`: per range, True where aggregated islands serve all of it (no request of it comes here);
        `cache_aware`: within an island, the engine that would prefill a prompt soonest, its prefix cache counted,
        where engines keep caches (else, and without caches, the least loaded)."""
        self.cache_aware = cache_aware
        self.caches: bool | None = None  # whether the run's prefill engines keep prefix caches (at its first prompt)
        self.ends = [float(v) for v in range_end]  # the ranges' upper ends, a list for bisect: one lookup a request
        self.cum = {}
        for phase, f in shares.items():
            tot = f.sum(axis=1, keepdims=True)
            if elsewhere is not None:
                f = np.where((tot <= 0) & elsewhere[:, None], 1.0, f)
                tot = f.sum(axis=1, keepdims=True)
            if (tot <= 0).any():
                j = int(np.flatnonzero(tot[:, 0] <= 0)[0])
                raise ValueError(
                    f"the plan routes no {phase} traffic for range {j}: every range needs a serving island"
                )
            self.cum[phase] = np.cumsum(f / tot, axis=1)
        self.cum_lists = {phase: c.tolist() for phase, c in self.cum.items()}
        self.engines_of = engines_of
        self.rng = np.random.default_rng(seed)
        self.sent: dict[int, np.ndarray] = {}  # range -> prompt tokens sent to each island (cache-aware prefill)

    def _range(self, tokens: int) -> int:
        return min(bisect_right(self.ends, tokens), len(self.ends) - 1)

    def _pick(self, sim: Simulation, req: int, phase: str, load: object) -> int:
        cum = self.cum_lists[phase][self._range(int(sim.r.input_len[req]))]
        k = min(bisect_right(cum, self.rng.random() * cum[-1]), len(cum) - 1)
        engines = self.engines_of[phase][k]
        return min(engines, key=lambda i: load(sim, i))  # type: ignore[operator]

    def prefill(self, sim: Simulation, req: int) -> int:
        if self.caches is None:  # the engines keep caches or not for the whole run
            self.caches = sim.r.blocks is not None and any(e.cache is not None for e in sim.prefill)
        if not (self.cache_aware and self.caches):
            return self._pick(sim, req, "prefill", _prefill_load)
        j, n = self._range(int(sim.r.input_len[req])), int(sim.r.input_len[req])
        cum = self.cum["prefill"][j]
        share = np.diff(cum, prepend=0.0) / cum[-1]
        sent = self.sent.setdefault(j, np.zeros(len(share)))
        # the islands the plan gives this range, each while the range's prompt tokens sent to it stay within the
        # bound of its share (bounded loads over the run, so the plan's shares hold) ...
        serving = [int(k) for k in np.flatnonzero(share > 0)]
        open_ = [k for k in serving if sent[k] <= AFFINITY_BOUND * share[k] * (sent.sum() + n)] or serving
        # ... those whose engines hold the longest prefix of the prompt (every island where none holds any) ...
        held = {k: max(_matched(sim, req, self.engines_of["prefill"][k])) for k in serving}
        best = max(held[k] for k in open_)
        holders = [k for k in open_ if held[k] == best] if max(held.values()) > 0 else serving
        # ... drawn by the plan's shares, and in it the engine that would prefill the prompt soonest
        w = np.cumsum(share[holders])
        k = holders[min(int(np.searchsorted(w, self.rng.random() * w[-1], side="right")), len(w) - 1)]
        sent[k] += n
        return self._soonest(sim, req, self.engines_of["prefill"][k])

    def decode(self, sim: Simulation, req: int) -> int:
        return self._pick(sim, req, "decode", _decode_load)

    def _soonest(self, sim: Simulation, req: int, engines: list[int]) -> int:
        """The engine of `engines` that would prefill `req` soonest, its cache counted, the work it adds weighed by
        the prompts that will wait behind it (`_prefill_cost_ms`); where none holds any of it, the least loaded."""
        match = _matched(sim, req, engines)
        if not any(match):  # held nowhere: the least loaded, as without caches
            return min(engines, key=lambda i: _prefill_load(sim, i))
        behind = sum(len(sim.prefill[i].queue) for i in engines) / len(engines)
        cost = [_prefill_cost_ms(sim, req, i, m, behind) for i, m in zip(engines, match, strict=True)]
        return engines[min(range(len(engines)), key=lambda j: (cost[j], -match[j], j))]


def _matched(sim: Simulation, req: int, engines: list[int]) -> list[int]:
    """Per engine, the leading blocks of `req`'s prompt its prefix cache holds, or will once the prompts queued
    there are prefilled (`PrefillEngine.holds`; 0 without a cache)."""
    blocks = sim.r.blocks
    if blocks is None:
        return [0] * len(engines)
    ids = blocks.of(req)
    return [sim.prefill[i].holds(ids) for i in engines]


def _prefill_cost_ms(sim: Simulation, req: int, i: int, matched: int, behind: float = 0.0) -> float:
    """What sending `req` to engine `i` costs, its cache holding `matched` of its blocks: when it would be prefilled
    (what is left of the batch under way, then the work queued there and the prompt's own, less what the cache
    holds, at the engine's time per token: Dynamo's KV router weighs an engine's queued blocks and a prompt's new
    blocks alike), its own work counted once more for each of the `behind` prompts that will wait behind it there
    (Little's law: about as many as the engines hold queued now). Idle engines weigh a prompt's wait alone; at load,
    the work a cache saves is saved for everyone queued after it, and a conversation's turn stays with the engine
    that holds it unless that engine's batch under way outlasts the saving (`costmodel.reuse` prices the same)."""
    e, n = sim.prefill[i], int(sim.r.input_len[req])
    blocks = sim.r.blocks
    new = n - (cached_tokens(matched, blocks.block_tokens, n) if blocks is not None else 0)
    busy = max(e.busy_until - sim.now, 0.0) if e.batch else 0.0  # what is left of the batch under way
    return busy + (e.queued_new + new * (1.0 + behind)) * e.timing.prefill_ms(n) / n


class CacheAffinity(PlanRouter):
    """Cache-aware routing without the plan's length ranges: every prompt to the prefill engine, of any island, that
    would prefill it soonest, its cache counted. Decode as `plan`."""

    def prefill(self, sim: Simulation, req: int) -> int:
        return self._soonest(sim, req, list(range(len(sim.prefill))))


class SessionRouter(PlanRouter):
    """The deployment router's policy (`deployment.router.table.pick`), simulated. What a router in front of the
    engines knows: each request's session and prompt tokens, and where it sent each session's last turn, not the
    engines' caches. A prompt's range by its length, then among every prefill engine of the range's islands: the
    engine its session's last turn went to, then the others in the order of weighted rendezvous hashing of its
    session (weight: the island's fraction over its engines), the first whose work in flight, this prompt's
    counted, stays within `AFFINITY_BOUND` x the mean (Mirrokni et al.'s bounded loads). A prompt's work is its
    tokens, less its session's last prompt where it goes to the engine that prefilled that (whose cache should hold
    it). Decode as `plan`."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.last: dict[int, tuple[int, int]] = {}  # session -> (engine, prompt tokens) of its last turn
        self.work: dict[int, tuple[int, int]] = {}  # request in prefill -> (engine, its work)
        self.load: dict[int, int] = {}  # engine -> work in flight

    def prefill(self, sim: Simulation, req: int) -> int:
        if sim.r.session is None:
            raise ValueError("router=session routes by each request's session; these requests carry none")
        cum = self.cum["prefill"][self._range(int(sim.r.input_len[req]))]
        share = np.diff(cum, prepend=0.0)
        engines = [(i, share[k] / len(self.engines_of["prefill"][k])) for k in np.flatnonzero(share > 0)
                   for i in self.engines_of["prefill"][k]]  # fmt: skip
        n, session = int(sim.r.input_len[req]), int(sim.r.session[req])
        home, before = self.last.get(session, (-1, 0))
        ranked = sorted(engines, key=lambda c: (c[0] != home, -c[1] / -math.log(_unit(session, c[0]))))
        total = sum(self.load.get(i, 0) for i, _ in engines)

        def work(i: int) -> int:  # the growth alone where its last turn was prefilled
            return n - before if i == home and before < n else n

        within = (i for i, _ in ranked if self.load.get(i, 0) + work(i) <= AFFINITY_BOUND * (total + work(i))
                  / len(engines))  # fmt: skip
        pick = next(within, ranked[0][0])
        self.last[session] = (pick, n)
        self.work[req] = (pick, work(pick))
        self.load[pick] = self.load.get(pick, 0) + work(pick)
        return pick

    def prefilled(self, sim: Simulation, req: int) -> None:
        engine, work = self.work.pop(req, (-1, 0))
        if engine >= 0:
            self.load[engine] -= work


def _unit(session: int, engine: int) -> float:
    """A hash of (session, engine) in (0, 1): SplitMix64's finaliser of the pair, as rendezvous hashing's draw."""
    x = (session * 0x9E3779B97F4A7C15 + engine * 0xBF58476D1CE4E5B9 + 1) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return ((x ^ (x >> 31)) + 0.5) / 2.0**64


def _decode_free(sim: Simulation, i: int) -> int:
    d = sim.decode[i]
    waiting = sum(int(sim.r.input_len[q]) for q in d.waiting)
    return d.timing.kv_tokens - d.context_sum - waiting


class SAL(Router):
    def __init__(self, beta: float, max_tokens_per_batch: int) -> None:
        self.beta, self.budget = beta, max_tokens_per_batch

    def prefill(self, sim: Simulation, req: int) -> int:
        n = int(sim.r.input_len[req])
        return min(range(len(sim.prefill)), key=lambda i: (sim.prefill[i].queued_tokens + n) / self.budget)

    def decode(self, sim: Simulation, req: int) -> int:
        n = int(sim.r.input_len[req])

        def load(i: int) -> float:
            queued = sum(int(sim.r.input_len[q]) for q in sim.decode[i].waiting) + n
            return max(self.beta * (n - _decode_free(sim, i)), queued / self.budget)

        return min(range(len(sim.decode)), key=load)


class Mapper(Router):
    def __init__(self, mean_output: float, std_output: float, theta: float = 2.0, seed: int = 0) -> None:
        self.mean, self.std, self.theta = mean_output, std_output, theta
        self.rng = np.random.default_rng(seed)
        self.loads: dict[str, np.ndarray] = {}
        self.tokens: dict[str, np.ndarray] = {}
        self.charged: dict[tuple[str, int], tuple[int, float, float]] = {}  # (phase, req) -> (engine, w, tokens)
        self.predicted: dict[int, float] = {}
        self.groups: tuple[list[PrefillTiming], np.ndarray] | None = None

    def _state(self, phase: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        if phase not in self.loads:
            self.loads[phase], self.tokens[phase] = np.zeros(n), np.zeros(n)
        return self.loads[phase], self.tokens[phase]

    def _choose(self, phase: str, req: int, w: np.ndarray, tokens: float) -> int:
        loads, routed = self._state(phase, len(w))
        after = loads + w
        # the largest load elsewhere: the maximum, or for the engine holding it, the runner-up
        first = int(np.argmax(loads))
        others = np.full(len(w), loads[first])
        others[first] = np.partition(loads, -2)[-2] if len(w) > 1 else 0.0
        top = np.maximum(after, others)
        best = np.flatnonzero(top == top.min())
        c = int(best[np.argmin(after[best])])
        loads[c] += w[c]
        routed[c] += tokens
        self.charged[(phase, req)] = (c, float(w[c]), tokens)
        return c

    def _release(self, phase: str, req: int) -> None:
        c, w, tokens = self.charged.pop((phase, req))
        self.loads[phase][c] -= w
        self.tokens[phase][c] -= tokens

    def prefill(self, sim: Simulation, req: int) -> int:
        n = int(sim.r.input_len[req])
        self.predicted[req] = max(1.0, float(self.rng.normal(self.mean, self.std)))
        if self.groups is None:  # engines of an island share one timing table: one lookup per island
            timings = list({id(e.timing): e.timing for e in sim.prefill}.values())
            index = {id(t): k for k, t in enumerate(timings)}
            self.groups = (timings, np.array([index[id(e.timing)] for e in sim.prefill]))
        timings, group = self.groups
        w = np.array([t.prefill_ms(n) for t in timings])[group]
        return self._choose("prefill", req, w, float(n))

    def decode(self, sim: Simulation, req: int) -> int:
        n, out = int(sim.r.input_len[req]), self.predicted.get(req, self.mean)
        _, routed = self._state("decode", len(sim.decode))
        w = np.empty(len(sim.decode))
        for s, d in enumerate(sim.decode):
            t = d.timing
            b = max(1, min(t.max_seqs, int(t.kv_tokens // (n + out))))  # copies of r that fill s's KV
            per_copy = t.step_ms(b, n + out / 2) * out / b
            w[s] = per_copy * np.exp(self.theta * routed[s] / t.kv_tokens)
        return self._choose("decode", req, w, n + out)

    def prefilled(self, sim: Simulation, req: int) -> None:
        self._release("prefill", req)

    def finished(self, sim: Simulation, req: int) -> None:
        if ("decode", req) in self.charged:
            self._release("decode", req)
        self.predicted.pop(req, None)


class DPSelect(Router):
    def __init__(
        self, theta_kv: float = 0.9, theta_diff: float = 0.1, theta_load: float = 3000.0, affinity_ms: float = 600_000.0
    ) -> None:
        """`affinity_ms`: how long a user's last engine stays theirs (the paper gives no expiry; 10 min here)."""
        self.theta_kv, self.theta_diff, self.theta_load = theta_kv, theta_diff, theta_load
        self.cursor = {"prefill": 0, "decode": 0}
        self.affinity_ms = affinity_ms
        self.user_engine: dict[int, tuple[int, float]] = {}  # user -> (decode engine, when)

    def _rr(self, phase: str, n: int) -> int:
        i = self.cursor[phase] % n
        self.cursor[phase] += 1
        return i

    def prefill(self, sim: Simulation, req: int) -> int:
        return self._rr("prefill", len(sim.prefill))  # no KV on a prefill engine: never saturated

    def decode(self, sim: Simulation, req: int) -> int:
        e = self._rr("decode", len(sim.decode))
        user = -1 if sim.r.user is None else int(sim.r.user[req])
        usage = np.array([d.context_sum / d.timing.kv_tokens for d in sim.decode])
        if usage.max() >= self.theta_kv:
            if usage.max() - usage.min() >= self.theta_diff:
                e = int(np.argmin(usage))
            else:
                load = np.array(
                    [d.context_sum + sum(int(sim.r.input_len[q]) for q in d.waiting) for d in sim.decode], dtype=float
                )
                if load.max() - load.min() > self.theta_load:
                    e = int(np.argmin(load))
        elif user >= 0 and user in self.user_engine:  # affinity only while no engine is saturated
            last, when = self.user_engine[user]
            if sim.now - when <= self.affinity_ms:
                e = last
        if user >= 0:
            self.user_engine[user] = (e, sim.now)
        return e


@dataclass(frozen=True)
class RouterInputs:
    """What a router may be built from: the workload's statistics, the engine budget, the plan's routing."""

    seed: int = 0
    token_budget: int = 16384
    mean_input: float = 1.0
    mean_output: float = 1.0
    std_output: float = 0.0
    range_end: np.ndarray | None = None  # the plan's ranges (upper ends) ...
    shares: dict[str, np.ndarray] | None = None  # ... each phase's (range, island) fractions ...
    engines_of: dict[str, list[list[int]]] | None = None  # ... and each island's engines, per phase
    elsewhere: np.ndarray | None = None  # ... and the ranges aggregated islands serve whole


def _plan(a: RouterInputs, kind: type[PlanRouter] = PlanRouter, cache_aware: bool = True) -> Router:
    if a.range_end is None or a.shares is None or a.engines_of is None:
        raise ValueError("router=plan needs a plan's routing (range ends, fractions, engines)")
    return kind(a.range_end, a.shares, a.engines_of, a.seed, a.elsewhere, cache_aware)


# name -> factory; a new router is one class plus one line here, and tests/test_contracts.py runs
# it through the family's contract (every request gets a valid engine, none is lost).
ROUTERS: dict[str, Callable[[RouterInputs], Router]] = {
    "plan": _plan,
    "length": lambda a: _plan(a, cache_aware=False),
    "cache": lambda a: _plan(a, CacheAffinity),
    "session": lambda a: _plan(a, SessionRouter),
    "round_robin": lambda a: RoundRobin(),
    "random": lambda a: RandomRouter(a.seed),
    "p2c": lambda a: PowerOfTwo(a.seed),
    "sal": lambda a: SAL((a.mean_input + a.mean_output) / a.mean_output, a.token_budget),
    "mapper": lambda a: Mapper(a.mean_output, a.std_output, seed=a.seed),
    "dp_select": lambda a: DPSelect(),
}


def make_router(name: str, inputs: RouterInputs) -> Router:
    if name not in ROUTERS:
        raise ValueError(f"router={name!r} is unknown: choose from {list(ROUTERS)}")
    return ROUTERS[name](inputs)

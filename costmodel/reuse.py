"""Expected prefix-cache hit rates of a trace that names its prompts' blocks, per length range and island, from the
trace's reuse and the islands' cache sizes: what the planner prices prefill at (docs/inner.md, "Prefix caches").

`Reuse.of` reads the trace once, in order, as one unbounded LRU cache would see it (a prompt's blocks touched last to
first after it is looked up, as `simulator.cache` does). For every block a prompt could find cached (a leading block
some earlier prompt stored) it records:

- the tokens it saves (`gain`: a whole block, the last one short of the prompt's last token),
- its LRU stack distance (`distance`, tokens): the distinct blocks stored since it was last touched, the largest
  along the prompt's prefix up to it. An LRU cache of C tokens that sees the whole stream holds it iff distance < C,
- the prompt that last touched it (`parent`) and how many prompts touched it before (`touches`).

An island k of E_k prefill engines, each with a cache of C_k tokens, that receives a share phi_k of the stream's
prompt tokens: each engine sees about phi_k / E_k of the stream, so a distance d on the whole stream is
d x phi_k / E_k there, and the island keeps a block its last toucher left there while d < C_k E_k / phi_k (its
reach). Blocks are of two kinds:

- a conversation's own (touched by at most `HOT_SHARE` of the trace's prompts): on the island its last toucher
  was prefilled on, if within reach (`kept`);
- a shared prompt's (a system prompt, a tool list: touched by more): on every island one of its recent touches
  went to, J = min(touches, floor(reach / d)) of them each on island k with its share psi_k of the stream's
  prompts: 1 - (1 - psi_k)^J (`held`).

The router (`simulator.routers`' `plan`) sends a prompt to the island of its range holding its longest prefix,
while the range's tokens sent there stay within `BOUND` x the island's share; the rest are drawn among the range's
islands so each fills its share (`_routing`). A conversation's turn (`chain`: the prompt that last touched its
deepest block past the shared ones) thus goes home, to the island its last turn went to, when that island kept
it, serves the turn's range and has room; where each turn goes follows from where the turn before it went,
conversation depth by depth. A turn at home finds every block kept there; a drawn one, the shared blocks its
island holds. The expected hit rate of range r on island k is what its prompts find there over the prompt tokens
of r sent there. A turn sent home finds its conversation's blocks even while its last turn is still queued: the
router follows the prompts it queued (`simulator.core.PrefillEngine.holds`), so it waits behind its last turn on
the same engine. A drawn prompt finds another's blocks only once the prompt that stored them has been prefilled
when it arrives: its gap from the first prompt that stored them at least that prompt's prefill (`ready_s`) and its
wait in the island's queue (the M/G/c wait's tail, `queueing.wait_tail`). A turn sent home leaves its engine for
another of the island when that engine's batch under way outlasts what its cache saves (`_stay`). A trace replayed
faster comes with shorter gaps; a paced one (sessions at their own think times) keeps them, more sessions coming
between two touches of a block instead (docs/inner.md, "Prefix caches").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

# a leading block more prompts than this share of the trace's (and `HOT_MIN_TOUCHES`) touched is a shared prompt's
# (a system prompt, a tool list), held on every island; past it a prompt's blocks are its own conversation's
HOT_SHARE, HOT_MIN_TOUCHES = 0.005, 50
BOUND = 1.25  # the router keeps each island within this multiple of its share of a range (`simulator.routers`)
ROUTING_ROUNDS = 3


@dataclass(frozen=True)
class Reuse:
    """A trace's reusable blocks (module docstring): one entry per block a prompt could find cached."""

    input_tokens: np.ndarray  # (requests,) prompt tokens of each request
    request: np.ndarray  # (hits,) the request the block belongs to
    gain: np.ndarray  # (hits,) tokens it saves
    distance: np.ndarray  # (hits,) LRU stack distance, tokens, running maximum along the prefix
    parent: np.ndarray  # (hits,) the request that last touched it
    touches: np.ndarray  # (hits,) how many earlier prompts touched it
    # (hits,) seconds from the arrival of the first prompt that stored it to its own, on the trace's clock (its
    # parent's, for a block touched once): a block is cached once one of its touches was prefilled
    gap_s: np.ndarray | None = None
    rate_req_s: float = 0.0  # the trace's own request rate
    # how the trace grows to another rate: False, replayed faster (every gap shrinks, the stream's order stays);
    # True, paced (`simulator.sessions`: more sessions at the same think times, so gaps stay and r / its own rate
    # times as many blocks come between two touches of one)
    paced: bool = False
    counted_from: int = 0  # the requests before this one warm the caches and are not counted (`of`'s `warmup`)
    own: np.ndarray | None = None  # (requests,) the share of each prompt an unbounded cache holds (its own reuse)
    hot: np.ndarray | None = None  # (hits,) the block is a shared prompt's (touched by over `HOT_SHARE` of them)
    # (requests,) the prompt that last touched the request's deepest block past the shared ones: the turn before it
    # in its conversation (-1: none, a conversation's first turn or a prompt sharing only shared blocks)
    chain: np.ndarray | None = None

    @staticmethod
    def of(ids: np.ndarray, start: np.ndarray, block_tokens: int, input_tokens: np.ndarray,
           arrival_s: np.ndarray | None = None, paced: bool = False, warmup: float = 0.0) -> Reuse:  # fmt: skip
        """`ids`, `start`: the requests' block ids, concatenated, request i's at ids[start[i]:start[i + 1]] (in
        arrival order); `input_tokens`: their prompts' tokens; `arrival_s`: their arrivals (None: not timed);
        `paced`: the trace grows to other rates as sessions do (the field); `warmup`: the share of its first
        requests that fill the caches uncounted, as the simulator's measurements skip their warm-up."""
        n_req = len(start) - 1
        touches = int(start[-1])
        tree = [0] * (touches + 1)  # Fenwick tree over touch positions: 1 where a block was last touched

        def add(i: int, v: int) -> None:
            i += 1
            while i <= touches:
                tree[i] += v
                i += i & -i

        def before(i: int) -> int:  # markers at positions < i
            s = 0
            while i > 0:
                s += tree[i]
                i -= i & -i
            return s

        hot = max(HOT_MIN_TOUCHES, HOT_SHARE * n_req)  # a block touched by more prompts is a shared prompt's
        last: dict[int, tuple[int, int]] = {}  # block -> (touch position, request)
        count: dict[int, int] = {}  # block -> prompts that touched it
        first: dict[int, int] = {}  # block -> the first request that touched it
        req_l, gain_l, dist_l, par_l, touch_l, first_l, hot_l = [], [], [], [], [], [], []
        chain = np.full(n_req, -1, dtype=np.int64)
        pos = 0
        ids_l = ids.tolist()
        for i in range(n_req):
            mine = ids_l[start[i]:start[i + 1]]
            n = int(input_tokens[i])
            deepest = 0
            for j, b in enumerate(mine):
                seen = last.get(b)
                if seen is None:
                    break
                gain = min(block_tokens, n - 1 - j * block_tokens)
                if gain <= 0:
                    break
                d = (len(last) - before(seen[0] + 1)) * block_tokens  # distinct blocks touched since
                deepest = max(deepest, d)
                req_l.append(i)
                gain_l.append(gain)
                dist_l.append(deepest)
                par_l.append(seen[1])
                touch_l.append(count[b])
                first_l.append(first[b])
                hot_l.append(count[b] > hot)
                if count[b] <= hot:  # its deepest block past the shared ones: the prompt its conversation went on
                    chain[i] = seen[1]
            for b in reversed(mine):
                seen = last.get(b)
                if seen is not None:
                    add(seen[0], -1)
                add(pos, 1)
                last[b] = (pos, i)
                count[b] = count.get(b, 0) + 1
                first.setdefault(b, i)
                pos += 1
        request, parent = np.asarray(req_l, dtype=np.int64), np.asarray(par_l, dtype=np.int64)
        own = np.bincount(request, weights=np.asarray(gain_l, dtype=float), minlength=n_req) / np.maximum(
            np.asarray(input_tokens, dtype=float), 1.0)
        gap, rate = None, 0.0
        if arrival_s is not None and len(arrival_s) > 1 and arrival_s[-1] > arrival_s[0]:
            t = np.asarray(arrival_s, dtype=float)
            gap, rate = t[request] - t[np.asarray(first_l, dtype=np.int64)], (len(t) - 1) / float(t[-1] - t[0])
        return Reuse(np.asarray(input_tokens, dtype=float), request, np.asarray(gain_l, dtype=float),
                     np.asarray(dist_l, dtype=float), parent, np.asarray(touch_l, dtype=float), gap, rate,
                     paced, int(n_req * warmup), own, np.asarray(hot_l, dtype=bool), chain)  # fmt: skip

    @property
    def unbounded(self) -> float:
        """The share of the prompt tokens an unbounded cache seeing the whole stream finds."""
        return float(self.gain.sum() / self.input_tokens.sum())

    def hit_rates(
        self, range_of: np.ndarray, n_ranges: int, share: np.ndarray, capacity: np.ndarray, engines: np.ndarray,
        ready_s: np.ndarray | None = None, rate_req_s: float = 0.0, queue: np.ndarray | None = None,
        busy: np.ndarray | None = None, behind: np.ndarray | None = None,
    ) -> np.ndarray:
        """(ranges, islands) expected hit rates. `range_of`: each request's range; `share`: (ranges, islands), the
        share of each range's prompts each island prefills; `capacity`: (islands,) tokens each engine's cache holds;
        `engines`: (islands,) prefill engines per island. `ready_s`: (ranges, islands), how long a prompt of each
        range takes to prefill on each island, and `rate_req_s` the rate served: a timed trace replayed at that
        rate comes rate / its own rate times as fast, and a block first stored by a prompt that arrived less than its
        prefill before it is not cached yet (None: every parent done). A paced trace (sessions) keeps its gaps at
        any rate, and `rate_req_s` stretches its distances instead. The prompt that stored it prefilled only what
        its own prefix left (`ready_s` x the share an unbounded cache leaves of it), after its wait in the island's
        queue: `queue` (islands, 2), each island's chance a prompt waits and the rate (1/s) its wait's exponential
        tail falls at (`costmodel.queueing.wait_tail`; None: no wait). `busy`: (ranges, islands, 2), each engine's
        utilisation by prompts of each range and their service time (s), and `behind`: (islands,) the prompts queued
        per engine, for the chance a turn sent home leaves its engine (`_stay`; None: it never does)."""
        n_req, n_i = len(self.input_tokens), len(capacity)
        counted = np.arange(n_req) >= self.counted_from
        tokens = np.bincount(range_of[counted], weights=self.input_tokens[counted], minlength=n_ranges)
        phi = (share * tokens[:, None]).sum(axis=0) / max(tokens.sum(), 1.0)  # each island's share of the stream
        r_parent = range_of[self.parent]
        timed = ready_s is not None and self.gap_s is not None and rate_req_s > 0 and self.rate_req_s > 0
        # served at r times the trace's rate: a replayed trace's gaps shrink r-fold; a paced one's distances grow
        speed = rate_req_s / self.rate_req_s if timed else 1.0
        distance = np.maximum(self.distance * speed if self.paced else self.distance, 1.0)
        gap = None if not timed else self.gap_s if self.paced else self.gap_s / speed  # type: ignore[operator]
        # (hits, islands): the block is on the island its last toucher was prefilled on (`kept`), and on it by
        # any of its recent touches, each routed there with the island's share of their range (`held`)
        reach = np.divide(capacity * np.maximum(engines, 1), phi, out=np.zeros(n_i), where=(phi > 0) & (capacity > 0))
        kept = (distance[:, None] <= reach[None, :]).astype(float)
        recent = np.minimum(self.touches[:, None], np.floor(reach[None, :] / distance[:, None]))
        hot = self.hot if self.hot is not None else np.zeros(len(self.gain), dtype=bool)
        # a shared block's touches come from every range: each to the island with its share of the stream's prompts
        psi = (share * np.bincount(range_of[counted], minlength=n_ranges)[:, None]).sum(axis=0) / max(
            int(counted.sum()), 1)
        held = 1.0 - (1.0 - np.where(hot[:, None], psi[None, :], share[r_parent])) ** recent
        if gap is not None:
            computed = 1.0 - self.own[self.parent] if self.own is not None else 1.0
            # the chance the parent's wait ended in time to prefill it before this prompt came
            slack = gap[:, None] - ready_s[r_parent] * np.asarray(computed)[..., None]  # type: ignore[index]
            pw, theta = (np.zeros(n_i), np.full(n_i, np.inf)) if queue is None else (queue[:, 0], queue[:, 1])
            with np.errstate(invalid="ignore"):
                late = pw * np.exp(-theta * np.maximum(slack, 0.0))
            ready = np.where(slack >= 0, 1.0 - np.nan_to_num(late, nan=0.0), 0.0)
            held = held * ready  # a turn drawn elsewhere finds a block another prompt stored only once it is done;
            # one sent home queues behind its last turn on the engine the router sent that to, and finds it
        chain = self.chain if self.chain is not None else np.full(n_req, -1)
        own_chain = ~hot & (self.parent == chain[self.request])  # the blocks its conversation's last turn left
        # per request and island: what a prompt finds where its conversation's last turn went (all of its blocks
        # kept there), and where the router draws it (the shared blocks the island holds)
        found_home, found_drawn = np.zeros((n_req, n_i)), np.zeros((n_req, n_i))
        for k in range(n_i):
            found_home[:, k] = np.bincount(self.request, weights=self.gain * kept[:, k], minlength=n_req)
            found_drawn[:, k] = np.bincount(self.request[~own_chain], weights=(self.gain * held[:, k])[~own_chain],
                                            minlength=n_req)  # fmt: skip
        # a conversation's turn can go home when the island holds its first block past the shared ones
        first = np.unique(self.request[own_chain], return_index=True)[1]
        home_ok = np.zeros((n_req, n_i))
        home_ok[self.request[own_chain][first]] = kept[own_chain][first]
        p, q = _routing(chain, self.levels, range_of, share, home_ok, self.input_tokens * counted, n_ranges)
        out = np.zeros((n_ranges, n_i))
        if busy is not None:
            found_home = _stay(found_home, found_drawn, self.input_tokens, range_of, busy, behind)
        hits = (q * found_home + (p - q) * found_drawn) * counted[:, None]
        routed = p * (self.input_tokens * counted)[:, None]
        for k in range(n_i):
            saved = np.bincount(range_of, weights=hits[:, k], minlength=n_ranges)
            tok = np.bincount(range_of, weights=routed[:, k], minlength=n_ranges)
            out[:, k] = np.minimum(np.divide(saved, tok, out=np.zeros(n_ranges), where=tok > 0), 1.0)
        return out

    @cached_property
    def levels(self) -> list[np.ndarray]:
        """The requests by their depth in their conversation (`chain`): first turns, second turns, ..."""
        chain = self.chain if self.chain is not None else np.full(len(self.input_tokens), -1)
        depth = np.zeros(len(chain), dtype=np.int64)
        for i in np.flatnonzero(chain >= 0):  # a turn is one deeper than the turn before it (which came earlier)
            depth[i] = depth[chain[i]] + 1
        return [np.flatnonzero(depth == d) for d in range(int(depth.max(initial=0)) + 1)]

    def range_of(self, ends: np.ndarray) -> np.ndarray:
        """Each request's range, by the ranges' upper ends (exclusive; past the last end: the last range)."""
        return np.minimum(np.searchsorted(ends, self.input_tokens, side="right"), len(ends) - 1)


def _stay(found_home: np.ndarray, found_drawn: np.ndarray, tokens: np.ndarray, range_of: np.ndarray,
          busy: np.ndarray, behind: np.ndarray | None) -> np.ndarray:
    """What a turn sent home finds, its engine's batch under way counted: the router sends it to another engine of
    the island (finding only what that one holds, `found_drawn`) when its engine's batch under way has more left than
    the turn's cache saves, weighed by the prompts queued behind it (`simulator.routers`' `_prefill_cost_ms`).
    `busy`: (ranges, islands, 2), each engine's utilisation by prompts of each range and their service time (s);
    `behind`: (islands,) prompts queued per engine. A batch under way is one prompt (the long ones, that outlast a
    turn's saving, are prefilled alone), found at a uniform point of its service: more than x s left with chance
    (1 - x / S) while busy with it."""
    n_i = found_home.shape[1]
    rho, service = busy[..., 0], busy[..., 1]
    b = np.zeros(n_i) if behind is None else behind
    out = found_home.copy()
    for k in range(n_i):
        if not (rho[:, k] > 0).any():
            continue
        full = service[range_of, k]  # the turn's own prompt's service, uncached
        with np.errstate(invalid="ignore"):  # nothing found at home saves nothing, whatever queues behind it
            saved = np.where(found_home[:, k] > 0, found_home[:, k] / np.maximum(tokens, 1.0) * full * (1.0 + b[k]),
                             0.0)  # fmt: skip
        on = rho[:, k] > 0
        left = np.clip(1.0 - saved[:, None] / service[on, k][None, :], 0.0, None)
        depart = np.minimum((rho[on, k][None, :] * left).sum(axis=1), 1.0)
        out[:, k] = (1.0 - depart) * found_home[:, k] + depart * found_drawn[:, k]
    return out


def _routing(chain: np.ndarray, levels: list[np.ndarray], range_of: np.ndarray, share: np.ndarray,
             home_ok: np.ndarray, tokens: np.ndarray, n_ranges: int) -> tuple[np.ndarray, np.ndarray]:
    """(requests, islands) where the router sends each prompt (`p`) and of that, to its conversation's last turn's
    island (`q`), as `simulator.routers`' `plan` does: a turn goes to the island its last turn went to where that
    island holds it (`home_ok`) and serves its range, while the range's prompt tokens sent there stay within
    `BOUND` x the island's share; the rest are drawn among the range's islands so each fills its share. Turns are
    placed conversation depth by depth (`levels`, `Reuse.levels`); the bound and the draws settle in
    `ROUTING_ROUNDS` rounds. `tokens`: each request's prompt tokens where it counts (0: a warm-up request)."""
    n_req, n_i = home_ok.shape
    want = share * np.bincount(range_of, weights=tokens, minlength=n_ranges)[:, None]  # each island's share
    accept, draw = (share > 0).astype(float), share.copy()
    p, q = np.zeros((n_req, n_i)), np.zeros((n_req, n_i))
    for _ in range(ROUTING_ROUNDS):
        asked = np.zeros((n_req, n_i))  # going home, were the bound not there
        for d, idx in enumerate(levels):
            r = range_of[idx]
            if d:
                asked[idx] = p[chain[idx]] * home_ok[idx] * (share[r] > 0)
            q[idx] = asked[idx] * accept[r]
            p[idx] = q[idx] + (1.0 - q[idx].sum(axis=1, keepdims=True)) * draw[r]
        demand = np.stack([np.bincount(range_of, weights=asked[:, k] * tokens, minlength=n_ranges)
                           for k in range(n_i)], axis=1)  # fmt: skip
        accept = np.where(share > 0, np.minimum(1.0, np.divide(BOUND * want, demand, out=np.ones_like(want),
                                                               where=demand > 0)), 0.0)  # fmt: skip
        left = np.maximum(want - demand * accept, 0.0)
        total = left.sum(axis=1, keepdims=True)
        draw = np.divide(left, total, out=share.copy(), where=total > 0)
    return p, q

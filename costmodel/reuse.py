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
prompt tokens, its router keeping prompts with the engine that holds them (`simulator.routers`' `plan`): each engine
sees about phi_k / E_k of the stream, so a distance d on the whole stream is d x phi_k / E_k there. The island holds
the block if one of its recent touches was routed to it: the j-th latest touch lies about j x d back, so the touches
within reach are J = min(touches, floor(C_k E_k / (phi_k d))), each routed to k with the island's share s of the
parent's range, and the block is on it with probability 1 - (1 - s)^J (a block every prompt carries, a system
prompt, is on every island; a conversation's own, touched once, where its last turn went). The router sends a
prompt to whichever island of its range holds its prefix, so the block is found with the sum of those chances over
the range's islands (capped at 1), each island keeping its own. The expected hit rate of range r on island k is the
gains so found there over the prompt tokens of r the island prefills. A block counts only once the first prompt
that stored it has been prefilled when this one arrives (`ready_s`): a trace replayed faster comes with shorter
gaps; a paced one (sessions at their own think times) keeps them, more sessions coming between two touches of a
block instead (docs/inner.md, "Prefix caches").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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

        last: dict[int, tuple[int, int]] = {}  # block -> (touch position, request)
        count: dict[int, int] = {}  # block -> prompts that touched it
        first: dict[int, int] = {}  # block -> the first request that touched it
        req_l, gain_l, dist_l, par_l, touch_l, first_l = [], [], [], [], [], []
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
                     paced, int(n_req * warmup), own)  # fmt: skip

    @property
    def unbounded(self) -> float:
        """The share of the prompt tokens an unbounded cache seeing the whole stream finds."""
        return float(self.gain.sum() / self.input_tokens.sum())

    def hit_rates(
        self, range_of: np.ndarray, n_ranges: int, share: np.ndarray, capacity: np.ndarray, engines: np.ndarray,
        ready_s: np.ndarray | None = None, rate_req_s: float = 0.0, wait_s: np.ndarray | None = None,
    ) -> np.ndarray:
        """(ranges, islands) expected hit rates. `range_of`: each request's range; `share`: (ranges, islands), the
        share of each range's prompts each island prefills; `capacity`: (islands,) tokens each engine's cache holds;
        `engines`: (islands,) prefill engines per island. `ready_s`: (ranges, islands), how long a prompt of each
        range takes to prefill on each island, and `rate_req_s` the rate served: a timed trace replayed at that
        rate comes rate / its own rate times as fast, and a block first stored by a prompt that arrived less than its
        prefill before it is not cached yet (None: every parent done). A paced trace (sessions) keeps its gaps at
        any rate, and `rate_req_s` stretches its distances instead. The prompt that stored it prefilled only what
        its own prefix left (`ready_s` x the share an unbounded cache leaves of it), after `wait_s` (islands,) in
        the island's queue."""
        counted = np.arange(len(self.input_tokens)) >= self.counted_from
        tokens = np.bincount(range_of[counted], weights=self.input_tokens[counted], minlength=n_ranges)
        phi = (share * tokens[:, None]).sum(axis=0) / max(tokens.sum(), 1.0)  # each island's share of the stream
        r_own, r_parent = range_of[self.request], range_of[self.parent]
        timed = ready_s is not None and self.gap_s is not None and rate_req_s > 0 and self.rate_req_s > 0
        # served at r times the trace's rate: a replayed trace's gaps shrink r-fold; a paced one's distances grow
        speed = rate_req_s / self.rate_req_s if timed else 1.0
        distance = self.distance * speed if self.paced else self.distance
        gap = None if not timed else self.gap_s if self.paced else self.gap_s / speed  # type: ignore[operator]
        held = np.zeros((len(self.gain), len(capacity)))  # (hits, islands): the block is on the island
        for k in range(len(capacity)):
            if phi[k] <= 0 or capacity[k] <= 0:
                continue
            # the island holds the block if one of its recent touches went there: the j-th latest, about j x its
            # distance back, within the engine's reach, each with the island's share
            reach = capacity[k] * max(engines[k], 1) / phi[k]
            recent = np.minimum(self.touches, np.floor(reach / np.maximum(distance, 1.0)))
            held[:, k] = 1.0 - (1.0 - share[r_parent, k]) ** recent
            if gap is not None:
                computed = 1.0 - self.own[self.parent] if self.own is not None else 1.0
                wait = 0.0 if wait_s is None else wait_s[k]
                held[:, k] *= gap >= ready_s[r_parent, k] * computed + wait  # type: ignore[index]
        # the router sends a prompt to the island of its range that holds its prefix (`simulator.routers`' `plan`
        # chooses among all the range's islands): found where any of them holds it. A block touched once is on one
        # island (the chances add); one touched often on several (their sum, past 1, is capped)
        there = held * (share[r_own] > 0)
        on = there / np.maximum(there.sum(axis=1), 1.0)[:, None]
        out = np.zeros((n_ranges, len(capacity)))
        mine = self.request >= self.counted_from
        for k in range(len(capacity)):
            saved = np.bincount(r_own[mine], weights=(self.gain * on[:, k])[mine], minlength=n_ranges)
            routed = share[:, k] * tokens  # the range's prompt tokens the plan gives the island
            out[:, k] = np.minimum(np.divide(saved, routed, out=np.zeros(n_ranges), where=routed > 0), 1.0)
        return out

    def range_of(self, ends: np.ndarray) -> np.ndarray:
        """Each request's range, by the ranges' upper ends (exclusive; past the last end: the last range)."""
        return np.minimum(np.searchsorted(ends, self.input_tokens, side="right"), len(ends) - 1)

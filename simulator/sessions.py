"""Session workloads: conversations whose every turn resends the context so far, generated at any rate.

A session starts with a prompt (one of a few shared system prompts, then the user's first message), and each later
turn's prompt is the last one grown by the answer and the next message: its leading blocks are the last turn's, so
a prefix cache that kept them prefills only the growth. Sessions start as a Poisson process (or any of
`simulator.arrivals`' kinds) at the request rate over the mean turns per session; a session's turns follow one
another after think times that do not depend on the rate. More traffic is more sessions at the same pace, not the
same sessions faster (a trace replayed faster compresses its think times, which real growth does not).

`SessionModel` holds the parameters, each length and time as quantiles (an inverse CDF, linear between them), so
bimodal distributions (a short follow-up or a pasted document) keep their shape; `SessionModel.fit` fits them to a
trace that names its prompts' prefix blocks (Mooncake's released traces): a request whose blocks extend an earlier
request's (all of them but its last, partial one, and more than the shared system prompt) is that request's next
turn. docs/simulator.md, "Session workloads", lists the fit on Mooncake's conversation trace.

Block ids: a system prompt's whole blocks are shared by every session that uses it; a session's whole blocks are its
own and stay the same from turn to turn; a prompt's last, partial block is its own (its content changes as the
context grows), as Mooncake's hashing of 512-token blocks has them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

import numpy as np

from simulator.arrivals import arrivals_ms
from simulator.cache import PrefixBlocks
from simulator.requests import Requests

QUANTILES = 21  # each distribution's quantiles at 0, 5, ..., 100 %
SYSTEM_SHARE = 0.005  # a leading block touched by more than this share of the requests (and 50) is a system prompt's
SYSTEM_MIN_TOUCHES = 50
FIT_STEPS = 10  # bisection steps fitting the mean turns per session
WARM_QUANTILE = 0.95  # the warm-up before measured requests: this quantile of the think time
BURN_IN_SESSIONS = 3.0  # sessions start this many mean session lengths before the first request kept


@dataclass(frozen=True)
class SessionModel:
    """A session workload's parameters (module docstring); lengths in tokens, times in seconds."""

    turns_mean: float  # turns per session, geometric on 1, 2, ... with this mean
    think_s: tuple[float, ...]  # quantiles: seconds from one turn's arrival to the next's
    first_tokens: tuple[float, ...]  # quantiles: a session's first prompt past its system prompt
    growth_tokens: tuple[float, ...]  # quantiles: what a turn's prompt adds to the last turn's
    output_tokens: tuple[float, ...]  # quantiles: an answer's tokens
    max_tokens: int  # a session ends before a prompt past this
    system_prompts: int = 1  # distinct shared system prompts (0: none) ...
    system_tokens: int = 512  # ... each this long ...
    system_zipf: float = 1.0  # ... the k-th most used drawn with weight k ** -system_zipf
    block_tokens: int = 512  # the prefix blocks' size (Mooncake's traces: 512)

    def __post_init__(self) -> None:
        for f in ("think_s", "first_tokens", "growth_tokens", "output_tokens"):
            q = np.asarray(getattr(self, f), dtype=float)
            if q.ndim != 1 or len(q) < 2 or not np.isfinite(q).all() or (np.diff(q) < 0).any():
                raise ValueError(f"`{f}` must be at least two finite quantiles in increasing order, got "
                                 f"{list(getattr(self, f))[:6]}")  # fmt: skip
            low = 0.0 if f == "think_s" else 1.0
            if q[0] < low:
                what = "seconds >= 0 (a think time cannot be negative)" if f == "think_s" else f"tokens >= {low:g}"
                raise ValueError(f"`{f}` must be {what}, got {q[0]:g} as its lowest quantile")
        checks = (("turns_mean", self.turns_mean >= 1, ">= 1"), ("max_tokens", self.max_tokens >= 1, ">= 1"),
                  ("system_prompts", self.system_prompts >= 0, ">= 0"), ("system_tokens", self.system_tokens >= 0,
                  ">= 0"), ("system_zipf", self.system_zipf >= 0, ">= 0"), ("block_tokens", self.block_tokens >= 1,
                  ">= 1"))  # fmt: skip
        for name, ok, want in checks:
            if not ok:
                raise ValueError(f"`{name}` must be {want}, got {getattr(self, name)!r}")
        if self.system_prompts and self.system_tokens + self.first_tokens[0] > self.max_tokens:
            raise ValueError(f"`system_tokens` ({self.system_tokens}) and the shortest first message leave no prompt "
                             f"within `max_tokens` ({self.max_tokens})")  # fmt: skip

    @staticmethod
    def keys() -> tuple[str, ...]:
        return tuple(f.name for f in fields(SessionModel))

    @property
    def mean_think_s(self) -> float:
        return _quantile_mean(self.think_s)

    @property
    def warm_s(self) -> float:
        """The warm-up before a measured window: the think time 95 % of turns come within, so the turns measured
        find their predecessors (and their prefixes) simulated."""
        return float(np.interp(WARM_QUANTILE, np.linspace(0.0, 1.0, len(self.think_s)), self.think_s))

    def requests(self, n: int, rate_req_s: float, seed: int = 0, kind: str = "poisson",
                 profile: np.ndarray | None = None, warm: bool = True) -> Requests:  # fmt: skip
        """`n` requests at `rate_req_s`: sessions starting at `kind` arrivals at rate / `turns_mean`, from before the
        first request kept (so the first requests include later turns, as a window of live traffic does), each
        request with its session's id (`Requests.session`) and its prompt's prefix blocks. `warm`: preceded by the
        `warm_s` seconds of requests before them (`Requests.warm` counts them), which warm the engines' caches."""
        if n < 1:
            raise ValueError(f"a session workload needs n >= 1 requests, got {n}")
        lead = round(self.warm_s * rate_req_s) if warm else 0
        n += lead
        rng = np.random.default_rng(seed)
        session_rate = rate_req_s / self.turns_mean
        burn_s = BURN_IN_SESSIONS * self.turns_mean * self.mean_think_s
        sessions = math.ceil((n / rate_req_s + burn_s) * session_rate * 1.1) + 16
        start = arrivals_ms(kind, sessions, session_rate, rng, profile) / 1000.0 - burn_s
        turns = rng.geometric(1.0 / self.turns_mean, sessions)
        total = int(turns.sum())
        sid = np.repeat(np.arange(sessions), turns)
        first = np.cumsum(turns) - turns  # each session's first request
        turn = np.arange(total) - np.repeat(first, turns)
        think = np.where(turn > 0, self._draw(self.think_s, total, rng), 0.0)
        at = np.repeat(start, turns) + _cumsum_by(think, first, turns)
        grow = np.where(turn > 0, self._draw(self.growth_tokens, total, rng), self._draw(self.first_tokens, total,
                                                                                          rng))  # fmt: skip
        system = self._systems(sessions, rng)
        length = np.repeat(np.where(system >= 0, self.system_tokens, 0), turns) + _cumsum_by(grow, first, turns)
        length = np.maximum(np.round(length), 1).astype(np.int64)
        # a session ends before its first prompt past max_tokens (its later turns are dropped with it)
        over = length > self.max_tokens
        ended = np.maximum.accumulate(np.where(over, sid, -1)) == sid
        keep = ~ended & (at >= 0)
        out = np.maximum(np.round(self._draw(self.output_tokens, total, rng)), 1).astype(np.int64)
        order = np.flatnonzero(keep)[np.argsort(at[keep], kind="stable")][:n]
        if len(order) < n:
            raise ValueError(f"the session model gave {len(order)} of {n} requests: `max_tokens` "
                             f"({self.max_tokens}) ends most sessions at their first prompt")  # fmt: skip
        blocks = self._blocks(sid[order], length[order], np.repeat(system, turns)[order], order)
        return Requests(at[order] * 1000.0, length[order], out[order], blocks=blocks, session=sid[order], warm=lead)

    def _draw(self, quantiles: tuple[float, ...], n: int, rng: np.random.Generator) -> np.ndarray:
        q = np.asarray(quantiles, dtype=float)
        return np.interp(rng.random(n), np.linspace(0.0, 1.0, len(q)), q)

    def _systems(self, sessions: int, rng: np.random.Generator) -> np.ndarray:
        """Each session's system prompt (-1: none)."""
        if not self.system_prompts or not self.system_tokens:
            return np.full(sessions, -1)
        w = np.arange(1, self.system_prompts + 1, dtype=float) ** -self.system_zipf
        return rng.choice(self.system_prompts, sessions, p=w / w.sum())

    def _blocks(self, sid: np.ndarray, length: np.ndarray, system: np.ndarray, req: np.ndarray) -> PrefixBlocks:
        """The prompts' block ids: a system prompt's whole blocks shared, a session's whole blocks its own, a
        prompt's partial last block its own."""
        bt = self.block_tokens
        shared = self.system_tokens // bt  # whole blocks of a system prompt
        span = self.max_tokens // bt + 1  # block positions a prompt can have
        count = -(-length // bt)
        start = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
        pos = np.arange(int(start[-1])) - np.repeat(start[:-1], count)  # each block's position in its prompt
        owner = np.repeat(np.arange(len(length)), count)
        whole = (pos + 1) * bt <= length[owner]
        sys_of = system[owner]
        base_session = self.system_prompts * max(shared, 1)
        base_partial = base_session + (int(sid.max(initial=0)) + 1) * span
        ids = np.where(
            (sys_of >= 0) & (pos < shared) & whole, sys_of * max(shared, 1) + pos,
            np.where(whole, base_session + sid[owner] * span + pos, base_partial + req[owner]))
        return PrefixBlocks(ids.astype(np.int64), start, bt)

    # --- fitting to a trace ---------------------------------------------------------------------------------------

    @staticmethod
    def fit(input_tokens: np.ndarray, output_tokens: np.ndarray, arrival_s: np.ndarray,
            blocks: PrefixBlocks) -> tuple[SessionModel, dict[str, float]]:  # fmt: skip
        """The model of a timed trace that names its prompts' prefix blocks (module docstring), and what the fit
        found (requests, sessions, the continuations' share, the system prompt's blocks, the sessions' rate)."""
        n = len(input_tokens)
        if n < 2 or blocks is None or len(blocks) != n:
            raise ValueError("fitting a session model needs a timed trace of two requests at least, with its blocks")
        bt = blocks.block_tokens
        parent, system_depth = next_turns(blocks)
        cont = parent >= 0
        roots = ~cont
        t = np.asarray(arrival_s, dtype=float)
        ins = np.asarray(input_tokens, dtype=float)
        gap = t[cont] - t[parent[cont]]
        growth = ins[cont] - ins[parent[cont]]
        sys_depth = int(np.median(system_depth[roots])) if roots.any() else 0
        sys_tokens = sys_depth * bt
        first = np.maximum(ins[roots] - sys_tokens, 1.0)
        qs = np.linspace(0.0, 100.0, QUANTILES)

        def quant(x: np.ndarray, low: float) -> tuple[float, ...]:
            x = x[x >= low]
            return tuple(float(v) for v in np.round(np.percentile(x, qs), 1)) if len(x) else (low, low)

        model = SessionModel(
            turns_mean=n / max(int(roots.sum()), 1), think_s=quant(gap, 0.0),
            first_tokens=quant(first, 1.0), growth_tokens=quant(growth, 1.0),
            output_tokens=quant(np.asarray(output_tokens, dtype=float), 1.0), max_tokens=int(ins.max()),
            system_prompts=1 if sys_depth else 0, system_tokens=sys_tokens, system_zipf=1.0, block_tokens=bt)
        span = float(t.max() - t.min())
        # the turns per session the detector misses (a turn after a prompt of the system prompt and one partial block
        # looks like a new session) and the trace's window cuts: the mean whose sessions, generated at the trace's
        # rate and read by the same detector, show the trace's share of next turns (indirect inference)
        lo, hi = 1.0, 4.0 * model.turns_mean
        for _ in range(FIT_STEPS):
            mid = (lo + hi) / 2
            probe = dataclasses.replace(model, turns_mean=mid).requests(n, (n - 1) / span, seed=0, warm=False)
            assert probe.blocks is not None
            lo, hi = (mid, hi) if (next_turns(probe.blocks)[0] >= 0).mean() < cont.mean() else (lo, mid)
        model = dataclasses.replace(model, turns_mean=round((lo + hi) / 2, 3))
        # ... and the first messages: the detector takes a window's cut sessions' later turns for first ones, which
        # lengthens them; each quantile scaled by how far the same detector's reading of the model's sessions is
        # from the trace's
        for _ in range(FIT_STEPS // 5):
            probe = model.requests(n, (n - 1) / span, seed=0, warm=False)
            assert probe.blocks is not None
            seen = np.maximum(probe.input_len[next_turns(probe.blocks)[0] < 0] - sys_tokens, 1.0)
            scale = np.asarray(quant(first, 1.0)) / np.maximum(np.asarray(quant(seen.astype(float), 1.0)), 1.0)
            fixed = np.maximum.accumulate(np.maximum(np.asarray(model.first_tokens) * scale, 1.0))
            model = dataclasses.replace(model, first_tokens=tuple(float(v) for v in np.round(fixed, 1)))
        found = {"requests": float(n), "sessions": float(roots.sum()), "continuations": float(cont.mean()),
                 "shrunk": float((growth < 1).mean()) if len(growth) else 0.0, "system_blocks": float(sys_depth),
                 "sessions_per_s": float(roots.sum() / span) if span > 0 else 0.0,
                 "request_rate": float((n - 1) / span) if span > 0 else 0.0}  # fmt: skip
        return model, found


def next_turns(blocks: PrefixBlocks) -> tuple[np.ndarray, np.ndarray]:
    """Each request's last turn (-1: a session's first) and its leading system-prompt blocks: a request whose
    leading blocks extend an earlier request's (all but that one's last, partial block), past the blocks so many
    requests share they are a system prompt's, is that request's next turn."""
    n = len(blocks)
    ids = [blocks.of(i).tolist() for i in range(n)]
    touched: dict[int, int] = {}
    for row in ids:
        for b in row:
            touched[b] = touched.get(b, 0) + 1
    hot = max(SYSTEM_MIN_TOUCHES, SYSTEM_SHARE * n)
    system_depth = np.array([_leading(row, lambda b: touched[b] > hot) for row in ids], dtype=np.int64)
    last_at: dict[int, int] = {}  # block -> the latest request holding it
    parent = np.full(n, -1)
    for i, row in enumerate(ids):
        depth, p = 0, -1
        for b in row:
            if b not in last_at:
                break
            depth, p = depth + 1, last_at[b]
        if p >= 0 and depth > system_depth[i] and depth >= len(ids[p]) - 1:
            parent[i] = p
        for b in row:
            last_at[b] = i
    return parent, system_depth


def _leading(row: list[int], hot: object) -> int:
    k = 0
    for b in row:
        if not hot(b):  # type: ignore[operator]
            break
        k += 1
    return k


def _cumsum_by(x: np.ndarray, first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Running sums of `x` restarting at each group (groups of `counts`, starting at `first`)."""
    c = np.cumsum(x)
    before = np.where(first > 0, c[np.maximum(first - 1, 0)], 0.0)
    return c - np.repeat(before, counts)


def _quantile_mean(q: tuple[float, ...]) -> float:
    """The mean of the distribution linear between its quantiles."""
    v = np.asarray(q, dtype=float)
    return float(((v[1:] + v[:-1]) / 2).mean())

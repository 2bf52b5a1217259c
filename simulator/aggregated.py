"""Aggregated engines: prefill and decode on the same GPUs, in mixed steps with chunked prefill.

An engine admits waiting requests in order while it has a sequence slot and KV room for the
request's whole context (prompt + answer, reserved on admission: no preemption). Each step it runs
every decoding sequence one token and up to `chunk` prompt tokens of the admitted requests still in
prefill, in order (a prompt longer than the chunk takes several steps). A step takes the decode
step's time at the running sequences and their mean context plus the chunk's prefill as one forward
over the engine's ranks (`PrefillTiming.forward_ms`: what grows with the tokens once, each piece's
attention over its prompt up to the chunk's end). A request whose prompt completes in a step has its first token
when the step ends; each later step gives it one more, and it leaves with its last.

An engine polls for new requests after every step (`recv_interval` 1, SGLang's default) or, launched with
`--scheduler-recv-interval N`, only once N decode-only steps have passed since its last poll, and after any step that
prefilled (sglang's `SchedulerRecvSkipper`: a decode step weighs 1, a prefill step the whole interval). An idle engine
takes a request at once. A request that arrives in between waits in the engine's inbox, unseen: its wait is TTFT.

With a prefix cache (`simulator.cache`), an engine keeps the blocks of the prompts it prefilled in the KV memory its
admitted requests leave (each reserving its whole context, its cached prefix too: the cache is not counted as shared
with them, so it is sized on the safe side), and an admitted prompt starts its chunks after its cached prefix.

Arrivals are open (the requests' own times) or a closed loop of `concurrency` users, as in
`simulator.core`; a request goes to the engine with the fewest requests waiting or running.
`AggregatedSimulation.r` has the same record as `Simulation.r`, so `simulator.metrics.benchmark_metrics`
reads it.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

from simulator.cache import CacheStats, PrefixCache, cached_tokens
from simulator.core import ARRIVE, STEP, Arrivals, check_concurrency
from simulator.requests import Requests
from simulator.timing import DecodeTiming, PrefillTiming


@dataclass
class AggregatedEngine:
    index: int
    decode: DecodeTiming  # step time at (running sequences, mean context); sequence slots and KV tokens
    prefill: PrefillTiming  # one prompt's prefill time up to a length
    chunk: int  # prompt tokens per step (chunked prefill size)
    recv_interval: int = 1  # decode-only steps between polls for new requests (SGLang's --scheduler-recv-interval)
    cache: PrefixCache | None = None  # prefix cache in the KV memory the admitted requests leave (None: none)
    stats: CacheStats = field(default_factory=CacheStats)
    inbox: list[int] = field(default_factory=list)  # arrived, not yet seen by the engine's scheduler
    unpolled: int = 0  # decode-only steps since the last poll
    waiting: deque[int] = field(default_factory=deque)  # not yet admitted
    filling: dict[int, int] = field(default_factory=dict)  # admitted, prompt tokens prefilled so far (in order)
    running: dict[int, int] = field(default_factory=dict)  # decoding: tokens generated so far
    reserved: int = 0  # KV tokens reserved by admitted requests
    context: int = 0  # KV tokens of the decoding sequences
    stepping: bool = False

    @property
    def load(self) -> int:
        return len(self.inbox) + len(self.waiting) + len(self.filling) + len(self.running)

    def poll(self) -> None:
        """The scheduler takes every request that has arrived."""
        self.waiting.extend(self.inbox)
        self.inbox.clear()
        self.unpolled = 0


class AggregatedSimulation(Arrivals):
    def __init__(
        self, requests: Requests, engines: list[AggregatedEngine], concurrency: int | None = None,
        affinity: float | None = None,
    ) -> None:
        """`affinity`: a request goes to the engine whose prefix cache holds most of its prompt among those with at
        most this multiple of the mean load (+1) requests (bounded loads; None: the least loaded)."""
        if not engines:
            raise ValueError("an aggregated simulation needs at least one engine")
        check_concurrency(concurrency)
        for e in engines:
            if e.chunk < 1:
                raise ValueError(f"engine {e.index}: the prefill chunk must be at least 1 token, got {e.chunk}")
            if e.recv_interval < 1:
                raise ValueError(f"engine {e.index}: the steps between polls must be at least 1, got {e.recv_interval}")
        self.r, self.engines, self.concurrency, self.affinity = requests, engines, concurrency, affinity
        self.front_ms = max(e.prefill.front_ms for e in engines)
        self.events: list[tuple[float, int, int, int]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.released = 0
        self.step_of: dict[int, list[tuple[int, int, int]]] = {}  # engine -> the step's prefill pieces

    def push(self, t: float, kind: int, who: int) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, who))

    def run(self) -> None:
        self._arrivals()
        while self.events:
            t, _, kind, who = heapq.heappop(self.events)
            self.now = t
            if kind == ARRIVE:
                self._arrive(who)
            else:
                self._step_done(self.engines[who])

    def _arrive(self, req: int) -> None:
        e = min(self.engines, key=lambda x: (x.load, x.index))
        if self.affinity is not None and self.r.blocks is not None and len(self.engines) > 1:
            cap = self.affinity * (sum(x.load for x in self.engines) / len(self.engines) + 1)
            ids = self.r.blocks.of(req)
            held = {x.index: x.cache.match(ids) for x in self.engines if x.cache is not None and x.load <= cap}
            best = max(held, key=lambda i: (held[i], -self.engines[i].load, -i), default=None)
            if best is not None and held[best]:
                e = self.engines[best]
        self.r.prefill_engine[req] = self.r.decode_engine[req] = e.index
        e.inbox.append(req)
        if not e.stepping:
            self._start(e)

    def _admit(self, e: AggregatedEngine) -> None:
        while e.waiting and len(e.filling) + len(e.running) < e.decode.max_seqs:
            req = e.waiting[0]
            need = int(self.r.input_len[req] + self.r.output_len[req])
            if need > e.decode.kv_tokens:
                raise ValueError(f"request {req} needs {need} KV tokens, more than engine {e.index} holds "
                                 f"({e.decode.kv_tokens})")  # fmt: skip
            if e.reserved + need > e.decode.kv_tokens:
                return  # head of line waits for a finishing request to free room
            e.waiting.popleft()
            e.reserved += need
            cached = 0
            if e.cache is not None and self.r.blocks is not None:
                n, bt = int(self.r.input_len[req]), self.r.blocks.block_tokens
                cached = cached_tokens(e.cache.match(self.r.blocks.of(req)), bt, n)
                e.cache.resize((e.decode.kv_tokens - e.reserved) // bt)  # the admitted requests' memory first
            self.r.cached[req] = cached
            e.filling[req] = cached  # the cached prefix is not prefilled again

    def _start(self, e: AggregatedEngine) -> None:
        self._admit(e)
        if not e.filling and not e.running and e.inbox:  # nothing to run: the idle engine polls at once
            e.poll()
            self._admit(e)
        if not e.filling and not e.running:
            e.stepping = False
            return
        ms = e.decode.step_ms(len(e.running), e.context / len(e.running)) if e.running else 0.0
        budget, pieces = e.chunk, []
        for req, done in e.filling.items():
            if budget == 0:
                break
            take = min(int(self.r.input_len[req]) - done, budget)
            pieces.append((req, done, take))
            budget -= take
        if pieces:
            ms += e.prefill.forward_ms((done, take) for _, done, take in pieces)
        self.step_of[e.index] = pieces
        e.stepping = True
        self.push(self.now + ms, STEP, e.index)

    def _step_done(self, e: AggregatedEngine) -> None:
        prefilled = bool(self.step_of.get(e.index))
        e.unpolled = e.recv_interval if prefilled else e.unpolled + 1
        if e.unpolled >= e.recv_interval:
            e.poll()
        for req in list(e.running):
            e.running[req] += 1
            e.context += 1
            if e.running[req] >= self.r.output_len[req]:
                self._finish(e, req, int(self.r.input_len[req]) + e.running.pop(req))
        for req, done, take in self.step_of.pop(e.index, []):
            if done + take < self.r.input_len[req]:
                e.filling[req] = done + take
                continue
            del e.filling[req]
            self.r.first_token[req] = self.now  # the prompt's last chunk emits the first token
            e.stats.prompt_tokens += int(self.r.input_len[req])
            e.stats.cached_tokens += int(self.r.cached[req])
            if e.cache is not None and self.r.blocks is not None:
                e.cache.insert(self.r.blocks.of(req))
            if self.r.output_len[req] == 1:
                self._finish(e, req, 0)
            else:
                e.running[req] = 1
                e.context += int(self.r.input_len[req]) + 1
        self._start(e)

    def _finish(self, e: AggregatedEngine, req: int, context: int) -> None:
        self.r.finish[req] = self.now
        e.context -= context
        e.reserved -= int(self.r.input_len[req] + self.r.output_len[req])
        if e.cache is not None and self.r.blocks is not None:
            e.cache.resize((e.decode.kv_tokens - e.reserved) // self.r.blocks.block_tokens)
        self._next_user()

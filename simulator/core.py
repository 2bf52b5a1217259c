"""Discrete-event, request-level simulation of a plan: prefill engines -> KV transfer -> decode engines.

Events are (time ms, sequence, kind, engine or request). A request arrives, a router picks a
prefill engine, the engine's scheduler orders its queue; a prefill batch (up to a token
budget) finishes together and emits every request's first token; the KV cache then moves to a
decode engine the router picks (size from the model, bandwidth from the prefill GPUs' NICs);
decode engines run continuous batching with paged KV memory: a request is admitted when a
sequence slot (the engine's max running requests) and its KV tokens are free (the client's first
token comes from the decode engine when the KV has arrived, or, with every slot taken, when it is
admitted), and when the growing contexts no longer fit, the most recently admitted request is
preempted and later recomputed (its prompt and the tokens generated so far are prefilled again on
the decode engine before it resumes).

Arrivals are open (the requests' own times) or a closed loop of `concurrency` users (a benchmark
client's `--max-concurrency`): the first `concurrency` requests arrive at 0 and each finish releases
the next request at once, in order; their arrival times are written as they happen.

Per step a decode engine does O(1) work plus O(log n) per finishing request: contexts are
tracked as a running sum and finishing steps in a heap, so a million tokens cost a million
arithmetic operations, not a million Python objects.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import numpy as np

from simulator.cache import CacheStats, PrefixCache, cached_tokens
from simulator.requests import Requests
from simulator.schedulers import Scheduler
from simulator.timing import DecodeTiming, PrefillTiming

ARRIVE, PREFILL_DONE, KV_READY, STEP = 0, 1, 2, 3
PENDING = -2.0  # a first token not yet streamed: the request waits for a decode engine's running slot


class PrefillEngine:
    def __init__(
        self, index: int, island: int, timing: PrefillTiming, token_budget: int, cache: PrefixCache | None = None
    ) -> None:
        """`cache`: the engine's prefix cache (None: none; a prompt is prefilled whole)."""
        self.index, self.island, self.timing, self.token_budget = index, island, timing, token_budget
        self.queue: list[int] = []  # waiting request ids, in the scheduler's order
        self.busy_until = 0.0  # when the batch under way is done
        self.batch: list[int] = []
        self.queued_tokens = 0  # prompt tokens waiting: the load routers compare
        self.queued_new = 0  # ... of them not in the cache when they arrived: the work the cache-aware routers see
        self.cache = cache
        self.stats = CacheStats()
        # block id -> prompts queued here or in the batch that hold it: the cache holds it once they are prefilled
        self.coming: dict[int, int] = {}

    def holds(self, ids: np.ndarray) -> int:
        """How many leading blocks of `ids` the engine's cache holds, or will once the prompts queued and prefilling
        here are done (0 without a cache): what a prompt sent here now finds when its turn comes, its engine taking
        prompts first come, first served."""
        c, n = self.cache, 0
        if c is None:
            return 0
        for b in ids.tolist():
            if b not in c.blocks and b not in c.host and b not in self.coming:
                break
            n += 1
        return n


class DecodeEngine:
    def __init__(self, index: int, island: int, timing: DecodeTiming, recompute: PrefillTiming) -> None:
        self.index, self.island, self.timing = index, island, timing
        self.recompute = recompute  # prefill timing of this engine's GPUs, for rebuilding a preempted KV
        self.waiting: list[int] = []  # KV arrived, not yet admitted (FCFS)
        self.step = 0  # steps taken
        self.running: dict[int, tuple[int, int, int]] = {}  # id -> (step admitted, context then, admission no.)
        self.finishing: list[tuple[int, int, int]] = []  # heap of (step it finishes at, id, admission no.)
        self.admissions = 0
        self.admitted: list[int] = []  # admission order (stale entries skipped): the preemption victim is last
        self.context_sum = 0  # Σ current context of the running requests = KV tokens in use
        self.stepping = False
        self.stall_ms = 0.0  # recompute time to add to the next step
        self.kv_peak = 0
        self.reserved: dict[int, int] = {}  # KV tokens set aside per running request (no-preempt scheduling)
        self.reserved_sum = 0

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)


class Router:
    """Picks an engine for a request; told when a request leaves prefill and when it finishes."""

    def prefill(self, sim: Simulation, req: int) -> int:
        raise NotImplementedError

    def decode(self, sim: Simulation, req: int) -> int:
        raise NotImplementedError

    def prefilled(self, sim: Simulation, req: int) -> None:
        """`req` left its prefill engine."""

    def finished(self, sim: Simulation, req: int) -> None:
        """`req` produced its last token."""


class Arrivals:
    """Open or closed-loop arrivals (module docstring) for a simulation with `r`, `now`, `push` and `concurrency`:
    `_arrivals()` schedules them when it starts, `_next_user()` sends a closed loop's next request after a finish."""

    r: Requests
    now: float
    concurrency: int | None
    released: int  # closed loop: requests released so far (in order)
    front_ms: float = 0.0  # a request's fixed time before it reaches a prefill queue (PrefillTiming.front_ms)

    def push(self, t: float, kind: int, who: int) -> None:
        raise NotImplementedError

    def _arrivals(self) -> None:
        if self.concurrency is None:
            for i, t in enumerate(self.r.arrival):
                self.push(float(t) + self.front_ms, ARRIVE, i)
        else:
            self.r.arrival[:] = -1.0  # written as each request is released
            for _ in range(min(self.concurrency, len(self.r))):
                self._release()

    def _release(self) -> None:
        req = self.released
        self.released += 1
        self.r.arrival[req] = self.now
        self.push(self.now + self.front_ms, ARRIVE, req)

    def _next_user(self) -> None:
        if self.concurrency is not None and self.released < len(self.r):
            self._release()  # the user whose request finished sends the next


def check_concurrency(concurrency: int | None) -> None:
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"a closed loop needs at least one user, got concurrency={concurrency}")


class Simulation(Arrivals):
    def __init__(
        self,
        requests: Requests,
        prefill: Sequence[PrefillEngine],
        decode: Sequence[DecodeEngine],
        router: Router,
        scheduler: Scheduler | None = None,
        *,
        record_kv_every_ms: float = 1000.0,
        concurrency: int | None = None,
    ) -> None:
        if not prefill or not decode:
            raise ValueError("a simulation needs at least one prefill and one decode engine")
        check_concurrency(concurrency)
        self.concurrency, self.released = concurrency, 0
        self.r, self.prefill, self.decode, self.router = requests, list(prefill), list(decode), router
        self.front_ms = max((e.timing.front_ms for e in self.prefill), default=0.0)
        self.scheduler = scheduler or Scheduler()
        self.events: list[tuple[float, int, int, int]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.kv_trace: list[tuple[float, float]] = []  # (time, KV tokens in use / capacity), all decode engines
        self.record_every = record_kv_every_ms
        self.next_record = 0.0
        self.kv_capacity = sum(e.timing.kv_tokens for e in self.decode)
        self.progress: dict[int, int] = {}  # tokens generated by preempted requests when they were preempted
        self.new_work: dict[int, int] = {}  # queued prompts' tokens not cached when they arrived (`queued_new`)

    # --- the event loop ----------------------------------------------------------------------

    def push(self, t: float, kind: int, who: int) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, who))

    def run(self) -> None:
        self._arrivals()
        handlers = (self._arrive, self._prefill_done, self._kv_ready, self._step)
        while self.events:
            t, _, kind, who = heapq.heappop(self.events)
            if t < self.now:
                raise AssertionError(f"time went backwards: {t} < {self.now}")
            self.now = t
            handlers[kind](who)
            if t >= self.next_record:
                used = sum(e.context_sum for e in self.decode)
                self.kv_trace.append((t, used / self.kv_capacity if self.kv_capacity else 0.0))
                self.next_record = t + self.record_every

    def _finished(self, req: int) -> None:
        self.r.finish[req] = self.now
        self.router.finished(self, req)
        self._next_user()

    # --- prefill -----------------------------------------------------------------------------

    def _arrive(self, req: int) -> None:
        e = self.prefill[self.router.prefill(self, req)]
        self.r.prefill_engine[req] = e.index
        e.queue.append(req)
        n = int(self.r.input_len[req])
        e.queued_tokens += n
        if e.cache is not None and self.r.blocks is not None:
            ids = self.r.blocks.of(req)
            self.new_work[req] = n - cached_tokens(e.holds(ids), self.r.blocks.block_tokens, n)
            e.queued_new += self.new_work[req]
            for b in ids.tolist():
                e.coming[b] = e.coming.get(b, 0) + 1
        if not e.batch:
            self._start_prefill(e)

    def _start_prefill(self, e: PrefillEngine) -> None:
        tokens, ms, pieces = 0, 0.0, []
        if len(e.queue) > 1:
            self.scheduler.order(self, e.queue, "prefill")
        prompts = 0
        while e.queue:
            req = e.queue[0]
            n = int(self.r.input_len[req])
            c = self._cached(e, req, n)
            if e.batch and tokens + n - c > e.token_budget:  # the budget counts the tokens computed
                break
            e.queue.pop(0)
            e.batch.append(req)
            tokens, prompts = tokens + n - c, prompts + n
            self.r.cached[req] = c
            # a batch is one forward (PrefillTiming.forward_ms), a prefix in the host tier loaded first
            pieces.append((c, n - c))
            if c:
                host = self._on_host(e, req, c)
                e.stats.host_tokens += host
                ms += e.timing.host_load_ms(host)
        if e.batch:
            ms += e.timing.forward_ms(pieces)
            e.queued_tokens -= prompts
            e.queued_new -= sum(self.new_work.pop(q, 0) for q in e.batch)
            e.busy_until = self.now + ms
            self.push(e.busy_until, PREFILL_DONE, e.index)

    def _cached(self, e: PrefillEngine, req: int, n: int) -> int:
        """The prompt tokens of `req` engine `e`'s prefix cache holds (0 without a cache or the prompt's blocks)."""
        if e.cache is None or self.r.blocks is None:
            return 0
        return cached_tokens(e.cache.match(self.r.blocks.of(req)), self.r.blocks.block_tokens, n)

    def _on_host(self, e: PrefillEngine, req: int, cached: int) -> int:
        """The tokens of `req`'s `cached` that engine `e`'s host tier holds (loaded back before its prefill)."""
        if e.cache is None or not e.cache.host or self.r.blocks is None:
            return 0
        bt = self.r.blocks.block_tokens
        ids = self.r.blocks.of(req)
        matched = -(-cached // bt)
        return min(e.cache.on_host(ids, matched) * bt, cached)

    def _prefill_done(self, index: int) -> None:
        e = self.prefill[index]
        for req in e.batch:
            if e.cache is not None and self.r.blocks is not None:  # the prompt's blocks stay in the cache
                ids = self.r.blocks.of(req)
                e.cache.insert(ids)
                for b in ids.tolist():
                    if e.coming[b] == 1:
                        del e.coming[b]
                    else:
                        e.coming[b] -= 1
            e.stats.prompt_tokens += int(self.r.input_len[req])
            e.stats.cached_tokens += int(self.r.cached[req])
            self.r.first_token[req] = self.now  # the prefill computes the first token (the client's, if it ends here)
            self.router.prefilled(self, req)
            if self.r.output_len[req] == 1:
                self._finished(req)  # nothing left to decode
                continue
            self.r.decode_engine[req] = self.router.decode(self, req)
            self.push(self.now + e.timing.transfer_ms(float(self.r.input_len[req])), KV_READY, req)
        e.batch = []
        self._start_prefill(e)

    # --- decode ------------------------------------------------------------------------------

    def _kv_ready(self, req: int) -> None:
        d = self.decode[int(self.r.decode_engine[req])]
        if self._generated(req) == 1:  # the client gets the first token from the decode engine, which streams
            # every token: once the KV has arrived there, if a running slot is free for it (the engine's
            # max running requests); else once the engine admits it
            free = len(d.running) + len(d.waiting) < d.timing.max_seqs
            self.r.first_token[req] = self.now if free else PENDING
        d.waiting.append(req)
        if d.stepping:
            return  # joins the batch at the next step boundary
        self._admit(d)
        if d.running:
            d.stepping = True
            self.push(self.now + self._step_ms(d), STEP, d.index)

    def _admit(self, d: DecodeEngine) -> None:
        cap, sched = d.timing, self.scheduler
        if len(d.waiting) > 1:
            sched.order(self, d.waiting, "decode")
        while d.waiting and len(d.running) < cap.max_seqs:
            req = d.waiting[0]
            done = self._generated(req)  # tokens already generated (> 1 after a preemption)
            ctx = int(self.r.input_len[req]) + done
            need = sched.reserve(self, req, ctx)
            in_use = d.context_sum if sched.preemptive else d.reserved_sum
            if in_use + need > cap.kv_tokens and d.running:
                return  # no room yet; a finishing request will free some (head of line waits)
            if need > cap.kv_tokens:
                raise ValueError(
                    f"request {req} needs {need} KV tokens, more than decode engine {d.index} holds ({cap.kv_tokens})"
                )
            d.waiting.pop(0)
            if self.r.first_token[req] == PENDING:  # it waited for a running slot: its first token now
                self.r.first_token[req] = self.now
            d.reserved[req] = need
            d.reserved_sum += need
            if done > 1:  # a preempted request: its KV was dropped, recompute it before it resumes
                d.stall_ms += d.recompute.prefill_ms(ctx)
            d.admissions += 1
            d.running[req] = (d.step, ctx, d.admissions)
            d.context_sum += ctx
            heapq.heappush(d.finishing, (d.step + int(self.r.output_len[req]) - done, req, d.admissions))
            d.admitted.append(req)
        d.kv_peak = max(d.kv_peak, d.context_sum)

    def _generated(self, req: int) -> int:
        """Tokens of `req` generated so far: 1 from prefill, more if it was preempted mid-decode."""
        return self.progress.get(req, 1)

    def _step_ms(self, d: DecodeEngine) -> float:
        n = len(d.running)
        ms = d.timing.step_ms(n, d.context_sum / n) + d.stall_ms
        d.stall_ms = 0.0
        return ms

    def _step(self, index: int) -> None:
        d = self.decode[index]
        d.step += 1
        d.context_sum += len(d.running)  # every running request gained one token
        while d.finishing and d.finishing[0][0] <= d.step:
            _, req, serial = heapq.heappop(d.finishing)
            if req not in d.running or d.running[req][2] != serial:
                continue  # preempted since: a stale entry
            step0, ctx0, _ = d.running.pop(req)
            d.context_sum -= ctx0 + (d.step - step0)
            d.reserved_sum -= d.reserved.pop(req)
            self._finished(req)
        while self.scheduler.preemptive and d.context_sum > d.timing.kv_tokens and len(d.running) > 1:
            self._preempt(d)
        self._admit(d)
        if d.running:
            self.push(self.now + self._step_ms(d), STEP, d.index)
        else:
            d.stepping = False

    def _preempt(self, d: DecodeEngine) -> None:
        while d.admitted[-1] not in d.running:
            d.admitted.pop()
        req = d.admitted.pop()
        step0, ctx0, _ = d.running.pop(req)
        ctx = ctx0 + (d.step - step0)
        d.context_sum -= ctx
        d.reserved_sum -= d.reserved.pop(req)
        self.progress[req] = ctx - int(self.r.input_len[req])
        self.r.preemptions[req] += 1
        d.waiting.insert(0, req)  # first in line once memory frees up

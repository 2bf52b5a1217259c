"""Requests for a simulation: lengths from a trace or from its length distributions, and arrivals.

- `trace`: the trace's own requests on its own time scale at `rate_scale` times its rate (`replayed`): each
  request kept with probability `rate_scale` below 1, copied about `rate_scale` times above it, the copies
  spread over the gap to the trace's next request and given the lengths of the requests after it; a minute of
  the trace lasts a minute, so its bursts last as long as they did. Past the trace's end it starts again.
- `trace_compressed`: the trace's own timestamps divided by `rate_scale` (2 = twice the request rate, every
  burst half as long); lengths are the trace's own, request by request.
- `poisson`: exponential gaps at `rate` req/s; `constant`: gaps of exactly 1 / `rate`.
- `workload`: the workload's own arrival model, fitted to its trace: a Cox process (a Poisson process
  whose rate varies in time; Cox 1955) whose rate in each `PROFILE_BIN_S`-second bin is `rate` times
  the trace's requests in that bin over their mean (`rate_profile`). Bursts keep the trace's time scale
  (a burst lasts as long at any mean rate) and their height relative to the mean; the profile is
  walked from a random bin and wraps around past the trace's end. Bins the trace left empty stay empty.
Lengths are drawn independently from the input and output length distributions (a shipped histogram
has no joint lengths).
"""

from __future__ import annotations

import numpy as np

from simulator.cache import PrefixBlocks
from simulator.requests import Requests

ARRIVALS = ("poisson", "constant", "trace", "trace_compressed", "workload")
MAX_COPIES = 10_000  # copies `replayed` makes of one request of a trace
MAX_WALK = 50_000_000  # requests of a trace `replayed` walks through for one simulation (about 5 s)
WALK_CHUNK = 1 << 20  # ... at most this many at a time, each stretch within one pass or over whole passes
PROFILE_BIN_S = 1.0  # the rate profile's bin: the code trace clumps within seconds, and a 2-s TTFT budget sees it
# (docs/simulator.md: at 10-s bins its 1-s p99 fell to 7.2 x the mean from 10.8, and the rate stated for its bursts
# missed the SLOs when the trace was replayed on its own clock)


def rate_profile(arrival_s: np.ndarray, bin_s: float = PROFILE_BIN_S) -> np.ndarray:
    """The trace's requests in each `bin_s`-second bin over their mean (mean 1): its rate over time, relative."""
    t = np.asarray(arrival_s, dtype=float)
    counts = np.bincount(((t - t.min()) // bin_s).astype(int)).astype(float)
    return counts / counts.mean()


def arrivals_ms(
    kind: str, n: int, rate_req_s: float, rng: np.random.Generator, profile: np.ndarray | None = None
) -> np.ndarray:
    if not rate_req_s > 0:
        raise ValueError(f"the request rate must be > 0 req/s, got {rate_req_s}")
    if kind == "poisson":
        return np.cumsum(rng.exponential(1000.0 / rate_req_s, n))
    if kind == "constant":
        return np.arange(1, n + 1) * (1000.0 / rate_req_s)
    if kind == "workload" and profile is not None:
        return modulated_ms(n, rate_req_s, profile, rng)
    raise ValueError(f"arrivals={kind!r}: choose poisson or constant (trace and workload arrivals need a trace's)")


def modulated_ms(n: int, rate_req_s: float, profile: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`n` arrival times (ms) of the Cox process at mean `rate_req_s` over `profile` (`PROFILE_BIN_S` bins)."""
    prof = np.asarray(profile, dtype=float)
    chunks: list[np.ndarray] = []
    got, start, t0 = 0, int(rng.integers(len(prof))), 0.0
    while got < n:
        bins = max(int(1.2 * (n - got) / (rate_req_s * PROFILE_BIN_S)) + 1, 16)
        counts = rng.poisson(rate_req_s * PROFILE_BIN_S * prof[(start + np.arange(bins)) % len(prof)])
        k = int(counts.sum())
        times = t0 + np.repeat(np.arange(bins), counts) * PROFILE_BIN_S + rng.uniform(0.0, PROFILE_BIN_S, k)
        chunks.append(np.sort(times))
        got, start, t0 = got + k, start + bins, t0 + bins * PROFILE_BIN_S
    return np.concatenate(chunks)[:n] * 1000.0


def sampled(
    n: int,
    inputs: tuple[np.ndarray, np.ndarray],
    outputs: tuple[np.ndarray, np.ndarray],
    kind: str,
    rate_req_s: float,
    seed: int,
    profile: np.ndarray | None = None,
) -> Requests:
    """`n` requests with lengths drawn from (values, counts) histograms and `kind` arrivals (`profile`: the
    workload's rate profile, for `workload` arrivals)."""
    rng = np.random.default_rng(seed)
    draw = [np.maximum(rng.choice(v, n, p=c / c.sum()), 1).astype(int) for v, c in (inputs, outputs)]
    return Requests(arrivals_ms(kind, n, rate_req_s, rng, profile), draw[0], draw[1])


def in_order(
    input_len: np.ndarray, output_len: np.ndarray, blocks: PrefixBlocks, kind: str, n: int, rate_req_s: float,
    seed: int, profile: np.ndarray | None = None,
) -> Requests:
    """`n` requests of a trace that names its prompts' prefix blocks, in the trace's order (so a conversation's turns
    follow one another and can find their prefixes cached), at `kind` arrivals. Past the trace's end it starts again,
    each pass's block ids renamed into a namespace of its own: a pass reuses what the trace reuses, never a prompt of
    an earlier pass."""
    rng = np.random.default_rng(seed)
    at = arrivals_ms(kind, n, rate_req_s, rng, profile)
    size = len(input_len)
    idx = np.arange(n) % size
    mine = blocks.take(idx)
    span = int(blocks.ids.max(initial=-1)) + 1
    ids = mine.ids + np.repeat(np.arange(n) // size, np.diff(mine.start)) * span
    return Requests(at, np.maximum(input_len[idx], 1), np.maximum(output_len[idx], 1),
                    blocks=PrefixBlocks(ids, mine.start, blocks.block_tokens))  # fmt: skip


def from_trace(
    arrival_s: np.ndarray, input_len: np.ndarray, output_len: np.ndarray, rate_scale: float, n: int | None = None,
    blocks: PrefixBlocks | None = None,
) -> Requests:
    """The trace's requests in order, its timestamps divided by `rate_scale` (`blocks`: their prompts' prefix blocks,
    kept with them)."""
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    k = len(arrival_s) if n is None else min(n, len(arrival_s))
    t = (arrival_s[:k] - arrival_s[0]) * 1000.0 / rate_scale
    order = np.argsort(t, kind="stable")
    return Requests(t[order], np.maximum(input_len[:k][order], 1), np.maximum(output_len[:k][order], 1),
                    blocks=None if blocks is None else blocks.take(order))  # fmt: skip


def replay_refusal(rate_scale: float, n: int, size: int) -> str:
    """Why `replayed` refuses `n` requests of a `size`-request trace at `rate_scale` x its rate ("" if it does not):
    more than `MAX_COPIES` copies of one request, or more than `MAX_WALK` of the trace's requests walked through
    (below 1 each is kept with probability `rate_scale`), both in proportion to the time and memory it takes."""
    if rate_scale > MAX_COPIES:
        return (f"{rate_scale:.3g} x the trace's rate copies each of its requests {rate_scale:.3g} times, over the "
                f"{MAX_COPIES:,} a replay makes: its {size:,} requests are too few for this rate")  # fmt: skip
    if n / rate_scale > MAX_WALK:
        return (f"{rate_scale:.3g} x the trace's rate keeps 1 of its requests in {1 / rate_scale:,.0f}, so "
                f"{n:,} requests walk {n / rate_scale:.3g} of them, {n / rate_scale / size:.3g} times over its "
                f"{size:,} (at most {MAX_WALK:,}): the trace is too dense for this rate")  # fmt: skip
    return ""


def replayed(
    arrival_s: np.ndarray, input_len: np.ndarray, output_len: np.ndarray, rate_scale: float, n: int, seed: int = 0,
    blocks: PrefixBlocks | None = None,
) -> tuple[Requests, float]:
    """`n` requests of the trace at `rate_scale` x its rate on its own time scale, and how many times over the
    trace they run (below 1: the share of its span they cover).

    Request i of the trace gets floor(k) + Bernoulli(k - floor(k)) copies (k = `rate_scale`; below 1 it is
    kept or dropped): the first at its own time, the others uniform over the gap to request i + 1, copy j with
    the lengths of request i + j, so lengths keep their place in the day. The rate in any window longer than
    the trace's gaps is k times the trace's; within a gap the copies are spread evenly. Past the trace's end
    the replay starts again from its first request, one mean gap later.

    `blocks` (the prompts' prefix blocks): copy j of pass p takes its request's blocks renamed into a namespace of
    its own (j, p), so a copy reuses what the copies of its kind reuse and never another copy's prompt: copying a
    trace makes no prefix reuse it does not have."""
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    order = np.argsort(arrival_s, kind="stable")
    t = (np.asarray(arrival_s, dtype=float)[order] - float(np.min(arrival_s))) * 1000.0
    size = len(t)
    if size < 2 or t[-1] <= 0:
        raise ValueError("a trace replayed on its own time scale needs requests at two different times at least")
    if refusal := replay_refusal(rate_scale, n, size):
        raise ValueError(refusal)
    ins, outs = np.maximum(input_len[order], 1), np.maximum(output_len[order], 1)
    gap = np.diff(t, append=t[-1] + t[-1] / (size - 1))
    period = t[-1] + gap[-1]
    rng = np.random.default_rng(seed)
    times, which, worlds = [], [], []
    got, pos = 0, 0  # pos: the next request of the trace repeated end to end (pass pos // size)
    while got < n:  # in time order, a stretch of the trace at a time: as much as n still needs, and a little more
        take = min(max(size - pos % size, WALK_CHUNK), int((n - got) / rate_scale * 1.1) + 16)
        walk = pos + np.arange(take)
        i = walk % size
        copies = int(rate_scale) + (rng.random(take) < rate_scale - int(rate_scale))
        src = np.repeat(i, copies)
        j = np.arange(len(src)) - np.repeat(np.cumsum(copies) - copies, copies)
        spread = np.where(j > 0, rng.uniform(0.0, 1.0, len(src)) * gap[src], 0.0)
        times.append(t[src] + spread + np.repeat(walk // size, copies) * period)
        which.append((src + j) % size)
        worlds.append(np.repeat(walk // size, copies) * (int(rate_scale) + 1) + j)
        got, pos = got + len(src), pos + take
    at, idx, world = np.concatenate(times), np.concatenate(which), np.concatenate(worlds)
    first = np.argsort(at, kind="stable")[:n]
    at, idx, world = at[first], idx[first], world[first]
    renamed = None
    if blocks is not None:
        mine = blocks.take(order).take(idx)
        span = int(blocks.ids.max(initial=-1)) + 1  # ids of world w: id + w x span
        ids = mine.ids + np.repeat(world, np.diff(mine.start)) * span
        renamed = PrefixBlocks(ids, mine.start, blocks.block_tokens)
    return Requests(at, ins[idx], outs[idx], blocks=renamed), float((at[-1] + gap.mean()) / period)

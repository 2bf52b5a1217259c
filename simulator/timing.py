"""Step times and KV capacity of one engine, as lookup tables built once from the cost model.

An island of a plan runs `dp` engine instances (`docs/costmodel.md`, "What batch counts"):

- prefill: an engine is one DP rank of `tp` GPUs; it prefills one prompt of s tokens in
  `prefill_time_ms(s, tp, dp)` (the time for the island's dp ranks to prefill dp prompts at
  once), so an engine serving prompts one at a time reproduces the plan's b^P exactly; the prompts
  it batches are one forward (`PrefillTiming.forward_ms`, `formulas.prefill_chunk_ms`);
- decode: an engine is one EP group of `ep` GPUs, made of `ep / tp` attention-DP ranks; a step
  (one token for every running sequence) takes `decode_step_ms(context, batch per rank, tp, ep)`.

Tables are evaluated on grids (prompt length; batch per rank x mean context) and interpolated,
so a simulated step costs a few arithmetic operations, not a cost-model call.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from costmodel.formulas import (
    DecodeRun,
    decode_step_ms,
    kv_bytes_per_seq,
    kv_link_gb_s,
    max_batch,
    prefill_parts,
    request_overheads_ms,
)
from costmodel.settings import CostSettings
from costmodel.specs import GPU, Model

# KV capacity is counted in sequences of this many tokens (each layer keeping what it keeps of them: a sliding
# layer its window), then in tokens (`kv_tokens`)
KV_SEQUENCE_TOKENS = 1024

# the shares of a prompt found in a prefix cache the cached prefill table is evaluated at (interpolated between)
HITS = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.995])
_HITS = HITS.tolist()


def interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """`float(np.interp(x, xs, ys))` for one point, bit for bit (the same search, the same arithmetic), without
    NumPy's call overhead: a simulation asks for a step time at every step of every engine."""
    j = bisect_right(xs, x) - 1
    if j < 0:
        return float(ys[0])
    if j >= len(xs) - 1 or xs[j] == x:
        return float(ys[j])
    return float((ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j]) * (x - xs[j]) + ys[j])


def grid_position(x: float, xs: Sequence[float]) -> tuple[int, float]:
    """(i, f): `x` lies a fraction f of the way from grid point i to i + 1 (clamped to the grid's ends)."""
    n = len(xs)
    j = bisect_right(xs, x) - 1
    if j < 0:
        return 0, 0.0
    if j >= n - 1:
        return n - 2, 1.0
    if xs[j] == x:
        return j, 0.0
    b = 1 / (xs[j + 1] - xs[j]) * (x - xs[j]) + j  # `interp(x, xs, range(n))`, inlined: a step asks twice
    i = min(int(b), n - 2)
    return i, float(b - i)


@dataclass(frozen=True)
class PrefillTiming:
    lengths: np.ndarray  # grid of prompt lengths (tokens)
    ms: np.ndarray  # prefill time of one prompt at each grid length
    kv_bytes_per_token: float  # KV bytes one token of a prompt moves to decode (whole model)
    link_gb_s: float  # the engine's KV transfer bandwidth (its GPUs' NICs, derated: kv_link_gb_s)
    front_ms: float = 0.0  # a request's fixed time before its prefill (costmodel.formulas.request_overheads_ms)
    handoff_ms: float = 0.0  # ... and from its prefill to decode, beside its KV bytes
    # a prefix cache's: the prefill time at each grid length (rows) and share of it cached (`HITS`, columns), and the
    # KV tokens one engine holds beside nothing else (prefill_timing(..., cached=True); None, 0: not built)
    cached_ms: np.ndarray | None = None
    kv_tokens: int = 0
    # its host tier (`host_cache_tokens`): blocks past the GPU's room kept in host memory, and the GB/s they load
    # back at (0: none)
    host_tokens: int = 0
    host_gb_s: float = 0.0
    # the attention kernel's share of `ms` at each grid length (prefill_parts' `Attention`; None: not built, a chunk of
    # several prompts then costs what they cost one by one), and the attention ranks an engine spreads a chunk over
    attention: np.ndarray | None = None
    ranks: int = 1

    # the grids as Python lists, for `interp`
    _lengths: list[float] = field(init=False, repr=False, compare=False)
    _ms: list[float] = field(init=False, repr=False, compare=False)
    _attention: list[float] | None = field(init=False, repr=False, compare=False)
    _cached: list[list[float]] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lengths", [float(v) for v in self.lengths])
        object.__setattr__(self, "_ms", [float(v) for v in self.ms])
        attention = None if self.attention is None else [float(v) for v in self.attention]
        object.__setattr__(self, "_attention", attention)
        cached = None if self.cached_ms is None else np.asarray(self.cached_ms, dtype=float).tolist()
        object.__setattr__(self, "_cached", cached)

    def prefill_ms(self, tokens: float) -> float:
        return interp(tokens, self._lengths, self._ms)

    def forward_ms(self, pieces: Iterable[tuple[int, int]]) -> float:
        """One forward prefilling `pieces`, each (tokens of its prompt before it: cached or prefilled by an earlier
        chunk, its tokens), spread over the engine's `ranks` (`formulas.prefill_chunk_ms`): what grows with the
        tokens, the fixed times and the weight streaming once, at the chunk's tokens a rank, and each piece's
        attention over its prompt so far (and a cached prefix's cost beside its tokens: `prefill_cached_ms`). A
        whole prompt alone on one rank costs `prefill_ms`, one after a cached prefix `prefill_cached_ms`."""
        pieces = list(pieces)
        if self.attention is None:  # one by one
            return sum(self._alone_ms(done, take) for done, take in pieces) / self.ranks
        total = sum(take for _, take in pieces)
        if not total:
            return 0.0
        own = 0.0
        for done, take in pieces:
            if done and self.cached_ms is not None:  # a cached prefix, as the prefix-cache table prices it
                own += self.prefill_cached_ms(done + take, done) - self.prefill_ms(take) + self.attention_ms(take)
            else:  # its attention over the tokens before it and its own
                own += self.attention_ms(done + take) - self.attention_ms(done)
        per_rank = total / self.ranks
        return self.prefill_ms(per_rank) - self.attention_ms(per_rank) + own / self.ranks

    def _alone_ms(self, done: int, take: int) -> float:
        """A piece as a forward of its own: a prompt's tokens after `done` of it."""
        if not done:
            return self.prefill_ms(take)
        if self.cached_ms is not None:
            return self.prefill_cached_ms(done + take, done)
        return max(self.prefill_ms(done + take) - self.prefill_ms(done), 0.0)

    def attention_ms(self, tokens: float) -> float:
        """The attention kernel's share of one prompt's prefill of `tokens` (0 for none)."""
        if self._attention is None or not tokens:
            return 0.0
        return interp(tokens, self._lengths, self._attention)

    def prefill_cached_ms(self, tokens: float, cached: float) -> float:
        """One prompt of `tokens` whose first `cached` are in the prefix cache: the cost model's prefill at that
        hit rate (`prefill_time_ms`'s `cache_hit`: the rest computed, attending to the whole prompt)."""
        if not cached or self._cached is None:
            return self.prefill_ms(tokens)
        i, f = grid_position(tokens, self._lengths)  # bilinear in (length, hit)
        h = min(cached / tokens, _HITS[-1])
        lo, hi = (interp(h, _HITS, self._cached[j]) for j in (i, i + 1))
        return (1 - f) * lo + f * hi

    def host_load_ms(self, tokens: float) -> float:
        """Loading `tokens` of a prompt's cached prefix from host memory back to the GPU (`host_load_ms`)."""
        return host_load_ms(tokens, self.kv_bytes_per_token, self.host_gb_s) if tokens and self.host_gb_s else 0.0

    def transfer_ms(self, tokens: float) -> float:
        return tokens * self.kv_bytes_per_token / (self.link_gb_s * 1e9) * 1e3 + self.handoff_ms


@dataclass(frozen=True)
class DecodeTiming:
    batches: np.ndarray  # grid of sequences per attention rank
    contexts: np.ndarray  # grid of mean context (tokens)
    ms: np.ndarray  # (batches, contexts) step time
    ranks: int  # attention-DP ranks (batch units) of the engine
    max_seqs: int  # running sequences the engine admits (plan batch x ranks)
    kv_tokens: int  # KV capacity of the engine in tokens (all its ranks)
    # the grids as Python lists, for `grid_position`
    _batches: list[float] = field(init=False, repr=False, compare=False)
    _contexts: list[float] = field(init=False, repr=False, compare=False)
    _ms: list[list[float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_batches", [float(v) for v in self.batches])
        object.__setattr__(self, "_contexts", [float(v) for v in self.contexts])
        object.__setattr__(self, "_ms", np.asarray(self.ms, dtype=float).tolist())

    def step_ms(self, running: int, mean_context: float) -> float:
        per_rank = -(-running // self.ranks)  # ceil: the busiest rank sets the step
        i0, fb = grid_position(per_rank, self._batches)
        j0, fc = grid_position(mean_context, self._contexts)
        lo, hi = self._ms[i0], self._ms[i0 + 1]
        return (1 - fb) * ((1 - fc) * lo[j0] + fc * lo[j0 + 1]) + fb * ((1 - fc) * hi[j0] + fc * hi[j0 + 1])


def prefill_timing(
    gpu: GPU, model: Model, tp: int, dp: int, max_len: int, cost: CostSettings, *, cached: bool = False,
    ranks: int = 1, chunk: int = 0,
) -> PrefillTiming:
    """`cached`: also the tables a prefix cache needs (`PrefillTiming.cached_ms`, `kv_tokens`); its prompts' hit
    rates then come from the cache, not from the cost settings' `cache_hit`. `ranks`: the attention ranks an engine
    spreads a chunk over (`forward_ms`); `chunk`: the most tokens a forward prefills (the tables reach it)."""
    lengths = np.unique(np.geomspace(1, max(max_len, -(-chunk // ranks), 2), 96).round())
    kv = kv_bytes_per_token(gpu, model, cost)
    link = float(kv_link_gb_s(gpu, cost.profile)) * tp
    overheads = request_overheads_ms(cost.profile)
    # without a cache, one column at the cost settings' hit rate; with one, every hit rate of the grid (0 first)
    ll, hh = np.meshgrid(lengths, HITS if cached else np.array([cost.cache_hit]), indexing="ij")
    parts = prefill_parts(gpu, model, ll, np.full_like(ll, tp), np.full_like(ll, dp), cache_hit=hh,
                          profile=cost.profile, draft_layers=cost.draft_layers)  # fmt: skip
    table = np.asarray(parts["Sum"], dtype=float)
    # a flat hit rate (`cost.cache_hit`, no cache tables) prices every prompt with it: chunks stay one by one there;
    # else the first column is every prompt whole (hit 0), its attention's share the forward leaves to each prompt
    attention = None if cost.cache_hit and not cached else np.asarray(parts["Attention"][:, 0], dtype=float)
    if not cached:
        return PrefillTiming(lengths, table[:, 0], kv, link, *overheads, attention=attention, ranks=ranks)
    return PrefillTiming(lengths, table[:, 0], kv, link, *overheads, cached_ms=table,
                         kv_tokens=prefill_kv_tokens(gpu, model, tp, dp, cost),
                         host_tokens=host_cache_tokens(gpu, model, tp, cost), host_gb_s=gpu.host_link_gb_s,
                         attention=attention, ranks=ranks)  # fmt: skip


def kv_bytes_per_token(gpu: GPU, model: Model, cost: CostSettings) -> float:
    """KV bytes one token of a prompt holds (the whole model's), in the cost settings' KV format."""
    return float(kv_bytes_per_seq(gpu, model, np.array([1.0]), np.array([1.0]), cost.profile, cost.draft_layers,
                                  cost.engine.kv_dtype)[0])  # fmt: skip


def host_load_ms(tokens: np.ndarray | float, kv_bytes: float, host_gb_s: float) -> np.ndarray | float:
    """Loading `tokens` of cached KV from host memory back to a GPU over its host link (added to the prefill: the
    engines overlap some of it with compute, so this is the bound)."""
    return tokens * kv_bytes / (host_gb_s * 1e9) * 1e3


def host_cache_tokens(gpu: GPU, model: Model, tp: int, cost: CostSettings) -> int:
    """KV tokens the host tier of one attention rank holds: `host_cache_gb` per GPU over a token's KV bytes there
    (an MLA rank's GPUs each keep the whole latent KV, as in GPU memory; other attention splits it over tp)."""
    if not cost.engine.host_cache_gb:
        return 0
    per_gpu = cost.engine.host_cache_gb * 1e9 / kv_bytes_per_token(gpu, model, cost)
    return int(per_gpu if model.attention == "mla" else per_gpu * tp)


def prefill_kv_tokens(gpu: GPU, model: Model, tp: int, dp: int, cost: CostSettings) -> int:
    """KV tokens one attention rank of a prefill engine holds (its tp GPUs' memory share beside the weights, the
    island's experts spread over its tp x dp GPUs): what its prefix cache and the batch in flight share."""
    routed = np.ceil(model.n_routed_experts / (tp * dp))
    seqs = max_batch(gpu, model, np.array([float(KV_SEQUENCE_TOKENS)]), 0.0, np.array([float(tp)]),
                     np.array([routed]),
                     profile=cost.profile, draft_layers=cost.draft_layers, mem_fraction=cost.engine.mem_fraction,
                     kv_dtype=cost.engine.kv_dtype)[0]  # fmt: skip
    return int(max(float(seqs), 0.0) * KV_SEQUENCE_TOKENS)


def decode_timing(
    gpu: GPU,
    model: Model,
    tp: int,
    ep: int,
    batch: int,
    max_context: int,
    cost: CostSettings,
    *,
    expert_imbalance: float = 1.0,
    draft_tokens: int | None = None,
    accepted: float | None = None,
    moe_tp: bool = False,
) -> DecodeTiming:
    """`batch` is the plan's decode batch per rank (sequences per attention rank, or per GPU under shallowsim);
    `expert_imbalance` is the expert placement's busiest-over-mean GPU load (1 = perfectly even).

    Speculative decoding (MTP): a step verifies `draft_tokens` more tokens per sequence (default: the cost
    settings' drafts) and yields 1 + `accepted` of them on average (default: the settings'); it is simulated as
    1 + `accepted` steps of one token each, of its time divided by that (the same tokens per second and per
    sequence, with the KV cache growing a token at a time).

    `moe_tp`: the routed experts split by tensor parallelism over the `ep` GPUs (costmodel.formulas.decode_parts)."""
    draft_tokens = cost.drafts if draft_tokens is None else draft_tokens
    accepted = cost.accepted if accepted is None else accepted
    if not 0 <= accepted <= draft_tokens:
        raise ValueError(f"`0 <= accepted <= draft_tokens` must hold, got accepted={accepted}, drafts={draft_tokens}")
    profile = cost.profile
    ranks = ep // tp if profile.batch_per_attention_rank else ep
    batches = np.unique(np.geomspace(1, max(batch, 2), 24).round())
    contexts = np.unique(np.geomspace(16, max(max_context, 32), 24).round())
    bb, cc = np.meshgrid(batches, contexts, indexing="ij")
    tp_ep = np.full_like(bb, tp), np.full_like(bb, ep)
    run = DecodeRun(cost.engine.fp8_combine, expert_imbalance, draft_tokens, moe_tp, cost.engine.kv_dtype)
    step = decode_step_ms(gpu, model, cc, bb, *tp_ep, profile=profile, run=run)
    ms = step / (1.0 + accepted)  # an MTP step's time per token it yields
    # KV capacity: sequences of KV_SEQUENCE_TOKENS that fit beside the weights (and the MTP module's), per rank, in
    # tokens
    routed = np.ceil(model.n_routed_experts / ep)
    mtp = 1 if draft_tokens else 0
    per_rank = float(
        max_batch(
            gpu,
            model,
            np.array([float(KV_SEQUENCE_TOKENS)]),
            0.0,
            np.array([float(tp)]),
            np.array([routed]),
            profile=profile,
            draft_layers=mtp,
            mem_fraction=cost.engine.mem_fraction,
            kv_dtype=cost.engine.kv_dtype,
        )[0]
    )
    kv_tokens = int(max(per_rank, 0.0) * KV_SEQUENCE_TOKENS * ranks)
    return DecodeTiming(batches, contexts, np.asarray(ms, dtype=float), ranks, batch * ranks, kv_tokens)

"""Island benchmark (thesis 4.6.1-4.6.2): best prefill and decode configuration of one island.

For an island of n GPUs of one type, every parallel configuration is evaluated at every
representative input length s in one vectorised call per phase:

    prefill  configs (tp, dp), tp·dp = n;   b^P(s) = dp · 1000 / t_prefill(s)            [req/s]
    decode   configs (tp, dp), dp | n, tp | n/dp; EP group G = n/dp GPUs with ceil(E/G)
             routed experts each; batch(s) = max batch for s + max decode length, rounded
             down to a multiple of 8 and capped at 1024;
             b^D(s) = (sequences decoding at once on the island) · 1000 / Σ_{k=1..d} t_step(s+k)
             (with MTP, `cost.drafts`: every step verifies the drafts and yields 1 + the accepted
             ones, so each token costs t_step / (1 + accepted); prefill and memory carry the MTP module)

"Sequences decoding at once" is batch · n / tp under `batch_per_attention_rank` (the batch is
per attention-DP rank, i.e. per TP group: DeepSeek-style serving) and batch · n under
shallowsim (its memory rule and MoE terms read the batch per GPU). One configuration per phase
is chosen by the workload-weighted relative deviation from the per-length best:
    δ(c, s) = (R*(s) − R(s, c)) / R*(s),   c* = argmin_c Σ_s δ(c, s) · w(s),
where with SLOs R(s, c) is the rate c serves within them: its throughput times its utilisation cap
(`utilisation_caps`), so a configuration that queues past the TTFT target at any load is not chosen
over one that meets it.
A configuration that cannot hold the weights plus one request's KV cache at length s has zero
throughput there; optional SLOs also zero it (TTFT: prefill time) or shrink its batch (TPOT:
mean decode step time).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from costmodel.formulas import (
    DecodeRun,
    decode_steps_sum_ms,
    max_batch,
    prefill_forward_ms,
    prefill_own_ms,
    prefill_parts,
    prefill_time_ms,
    request_overheads_ms,
)
from costmodel.queueing import RateProfile, mix_moments, mix_quantile, modulated_cap, tpot_step_cap_ms
from costmodel.queueing import utilisation_caps as utilisation_caps_for_wait
from costmodel.settings import CostSettings
from costmodel.specs import GPU, Model, SpecError

MAX_DECODE_BATCH = 1024
SEARCH_ELEMENTS = 2048  # batches priced at once per round of _shrink_to_tpot
BATCH_ALIGN = 8


@dataclass(frozen=True)
class PhaseTable:
    """Every configuration of one phase: rows = configs, columns = lengths."""

    tp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray  # EP group size (prefill: the whole island)
    req_s: np.ndarray  # (configs, lengths) throughput of the whole island
    time_ms: np.ndarray  # prefill time, or mean decode step time
    batch: np.ndarray  # decode batch per batch unit (prefill: dp sequences at once)
    deviation: np.ndarray  # (configs,) workload-weighted relative deviation
    chosen: int  # row index, -1 when no configuration is feasible anywhere
    reason: str  # why the phase is infeasible ("" when it is not)
    chunk: np.ndarray | None = None  # aggregated: prompt tokens per attention rank a mixed step takes


@dataclass(frozen=True)
class IslandBenchmark:
    gpu: str
    size: int
    model: str
    profile: str
    lengths: np.ndarray
    prefill: PhaseTable
    decode: PhaseTable
    aggregated: PhaseTable | None = None  # with `cost.engine.aggregated`: the island as aggregated engines

    def _pick(self, table: PhaseTable, attr: str) -> np.ndarray:
        if table.chosen < 0:
            return np.zeros(len(self.lengths))
        return getattr(table, attr)[table.chosen]

    @property
    def prefill_req_s(self) -> np.ndarray:
        return self._pick(self.prefill, "req_s")

    @property
    def decode_req_s(self) -> np.ndarray:
        return self._pick(self.decode, "req_s")

    @property
    def aggregated_req_s(self) -> np.ndarray:
        """Requests/s the island serves whole (prefill and decode) as aggregated engines; zeros without them."""
        return self.req_s("aggregated")

    def table(self, role: str) -> PhaseTable | None:
        return {"prefill": self.prefill, "decode": self.decode, "aggregated": self.aggregated}[role]

    def req_s(self, role: str) -> np.ndarray:
        """The chosen configuration's requests/s per length in `role` (zeros where the role has none)."""
        t = self.table(role)
        return np.zeros(len(self.lengths)) if t is None else self._pick(t, "req_s")

    def config(self, phase: str) -> dict[str, int] | None:
        t = self.table(phase)
        if t is None or t.chosen < 0:
            return None
        return {"tp": int(t.tp[t.chosen]), "dp": int(t.dp[t.chosen]), "ep": int(t.ep[t.chosen])}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def prefill_configs(n: int) -> list[tuple[int, int]]:
    return [(tp, n // tp) for tp in divisors(n)]


def decode_configs(n: int, model: Model | None = None) -> list[tuple[int, int]]:
    """(tp, dp): dp replicas of G = n/dp GPUs each, tp dividing G. A dense `model` has no experts to spread over an
    EP group: its replicas are its TP groups (G = tp), each decoding on its own."""
    if model is not None and model.dense:
        return prefill_configs(n)
    return [(tp, dp) for dp in divisors(n) for tp in divisors(n // dp)]


def runnable(configs: list[tuple[int, int]], model: Model, cost: CostSettings) -> list[tuple[int, int]]:
    """The (tp, dp) configurations an engine can run: attention TP must divide the attention heads
    (`cost.engine.runnable_only`; off for the thesis's free configurations, search.shapes=any). TP 1 always can."""
    if not cost.engine.runnable_only:
        return configs
    return [(tp, dp) for tp, dp in configs if model.n_heads % tp == 0]


def _chosen(table: PhaseTable, caps: np.ndarray, weights: np.ndarray, cover: bool | None = None) -> PhaseTable:
    """`table` with its configuration chosen by the rate each serves within the SLOs: its throughput times its
    utilisation cap (`utilisation_caps`; 1 without targets). A configuration with the most throughput may queue
    too long to meet TTFT at any load (two engines prefilling long prompts), where another with less meets it.
    With targets, among the configurations that serve the most of the workload within them (by weight) first, so
    an island never gives up lengths it can serve (a range no island serves stops the whole plan).
    `cover`: choose among those serving the most (default: when some cap is below 1)."""
    usable = table.req_s * caps[:, None]
    if (caps < 1.0).any() if cover is None else cover:
        served = (usable > 0) @ weights
        usable = np.where((served >= served.max() - 1e-12)[:, None], usable, 0.0)
    dev, chosen = _choose(usable, weights)
    return replace(table, deviation=dev, chosen=chosen)


def _choose(req_s: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, int]:
    best = req_s.max(axis=0)
    safe = np.where(best > 0, best, 1.0)
    dev = np.where(best > 0, (best - req_s) / safe, 0.0)
    score = dev @ weights
    if not (best > 0).any():
        return score, -1
    return score, int(np.argmin(score))


def aligned_batch(mb: np.ndarray) -> np.ndarray:
    """Max batch rounded down to a multiple of 8 and capped at 1024 (thesis 4.6.2).

    Below 8 the thesis clamps up to 8, which would overrun memory; we keep floor(mb) instead
    (0 = not even one request fits).
    """
    mb = np.floor(np.maximum(mb, 0.0))
    aligned = np.minimum(mb - mb % BATCH_ALIGN, MAX_DECODE_BATCH)
    return np.where(mb >= BATCH_ALIGN, aligned, mb)


def running_cap(batch: np.ndarray, units: np.ndarray | float, cost: CostSettings) -> np.ndarray:
    """`batch` per batch unit, at most what `cost.engine.max_running_requests` leaves each of an engine's `units`
    (the engine's requests at once over its attention ranks, rounded down): what memory and the launch allow."""
    cap = cost.engine.max_running_requests
    if cap is None:
        return batch
    return np.minimum(batch, np.floor(cap / np.asarray(units, dtype=float)))


@dataclass(frozen=True)
class _Island:
    """What every phase of one island's benchmark is priced with: its GPU, how many, the model, the settings."""

    gpu: GPU
    size: int
    model: Model
    cost: CostSettings

    def prefill_ms(self, s: np.ndarray, tp: np.ndarray, dp: np.ndarray) -> np.ndarray:
        """prefill_time_ms with the MTP module run over the prompt for the first draft (`cost.draft_layers`)."""
        cost = self.cost
        return prefill_time_ms(self.gpu, self.model, s, tp, dp, cache_hit=cost.cache_hit, profile=cost.profile,
                               draft_layers=cost.draft_layers)  # fmt: skip

    def prefill_attention_ms(self, s: np.ndarray, tp: np.ndarray, dp: np.ndarray) -> np.ndarray:
        """The attention kernel's share of prefilling prompts of `s` tokens (prefill_parts' `Attention`)."""
        return prefill_parts(self.gpu, self.model, s, tp, dp, profile=self.cost.profile,
                             draft_layers=self.cost.draft_layers)["Attention"]  # fmt: skip

    def prefill_forward_ms(self, tokens: np.ndarray, tp: np.ndarray, dp: np.ndarray) -> np.ndarray:
        """formulas.prefill_forward_ms: a forward of `tokens` a rank, less any prompt's own attention."""
        return prefill_forward_ms(self.gpu, self.model, tokens, tp, dp, profile=self.cost.profile,
                                  draft_layers=self.cost.draft_layers)  # fmt: skip

    def decode_tokens_ms(
        self, s: np.ndarray, d: int, batch: np.ndarray, tp: np.ndarray, ep: np.ndarray
    ) -> np.ndarray:
        return decode_tokens_ms(self.gpu, self.model, s, d, batch, tp, ep, cost=self.cost)

    def max_batch(self, s: np.ndarray, decode: float, tp: np.ndarray, experts: np.ndarray | float) -> np.ndarray:
        """max_batch with the MTP module held beside the weights."""
        return max_batch(self.gpu, self.model, s, decode, tp, experts, profile=self.cost.profile,
                         draft_layers=self.cost.draft_layers, mem_fraction=self.cost.engine.mem_fraction,
                         kv_dtype=self.cost.engine.kv_dtype)  # fmt: skip


def benchmark_island(
    gpu: GPU,
    size: int,
    model: Model,
    lengths: np.ndarray,
    weights: np.ndarray,
    mean_decode: float,
    max_decode: int,
    *,
    cost: CostSettings | None = None,
    output_pmf: np.ndarray | None = None,
    only: tuple[tuple[int, int], ...] | None = None,
) -> IslandBenchmark:
    """Benchmark island (gpu, size): per-length throughput of every configuration, and the choice.

    `only` = ((prefill tp, dp), (decode tp, dp)[, (aggregated tp, dp)]) benchmarks just those configurations (each
    row is computed on its own, so it is the row the full benchmark has for them): re-scoring a
    chosen configuration at every input length costs one row, not one per configuration.

    With a TPOT target and the workload's output-length distribution (`output_pmf`), the decode
    batch is sized so its mean step leaves room for the wait at a step boundary that short
    answers carry (`costmodel.queueing.tpot_step_cap_ms`); without it, so the mean step meets TPOT.
    """
    cost = cost or CostSettings()
    _check(gpu, size, model, cost)
    isl = _Island(gpu, size, model, cost)
    s = np.asarray(lengths, dtype=float)[None, :]
    w = np.asarray(weights, dtype=float)
    w = w / w.sum() if w.sum() > 0 else np.full(len(s[0]), 1.0 / len(s[0]))
    d = max(round(mean_decode), 1)

    # Prefill: every (tp, dp) with tp·dp = size.
    cfg = np.array([only[0]] if only else runnable(prefill_configs(size), model, cost), dtype=float)
    prefill = _prefill_table(isl, s, w, cfg=cfg)
    # Decode: dp replicas of an EP group of size/dp GPUs, tp | size/dp (a dense model: dp replicas of tp GPUs).
    cfg = np.array([only[1]] if only else runnable(decode_configs(size, model), model, cost), dtype=float)
    tpot_ms = cost.slo.tpot_ms
    step_cap = tpot_ms
    if tpot_ms and output_pmf is not None:
        step_cap = tpot_step_cap_ms(tpot_ms, cost.slo.tpot_percentile / 100, output_pmf)
    decode = _decode_table(isl, s, w, mean_decode, max_decode, step_cap=step_cap, cfg=cfg)
    aggregated = None
    if cost.engine.aggregated:
        cfg_a = np.array([only[2]] if only and len(only) > 2 else runnable(decode_configs(size, model), model, cost))
        aggregated = _aggregated(isl, s[0], w, d, max_decode, step_cap=step_cap, cfg=cfg_a)
    return IslandBenchmark(gpu.name, size, model.name, cost.profile.name, np.asarray(lengths), prefill, decode,
                           aggregated)  # fmt: skip


def _check(gpu: GPU, size: int, model: Model, cost: CostSettings) -> None:
    """Reject an island the cost model cannot price as asked, in one line that says what to change."""
    p = cost.profile
    if size < 1:
        raise SpecError(f"`size >= 1` must hold for an island, got {size=}")
    if not p.precision_per_gpu and not gpu.has_fp8:
        raise SpecError(
            f"GPU {gpu.name} has no FP8; profile {p.name!r} assumes FP8 weights everywhere: "
            "use the corrected profile (precision_per_gpu)"
        )
    if cost.drafts and not model.mtp_layers:
        raise SpecError(f"model {model.name} has no MTP module (mtp_layers 0): MTP decoding needs one; set "
                        "costmodel.mtp.drafts=0")  # fmt: skip
    if not p.weights_from_config and (model.attention != "mla" or model.index_topk or model.dense):
        kind = ("MLA with DeepSeek's sparse indexer" if model.index_topk else "no experts (dense)" if model.dense
                else f"{model.attention.upper()} attention")  # fmt: skip
        raise SpecError(
            f"model {model.name} uses {kind}; profile {p.name!r} sizes weights with DeepSeek-V3's hard-coded "
            "constants: use the corrected profile (weights_from_config)"
        )


def _prefill_table(isl: _Island, s: np.ndarray, w: np.ndarray, *, cfg: np.ndarray) -> PhaseTable:
    """Every prefill configuration `cfg` (tp, dp) of the island at the lengths `s` (1, L), and the choice."""
    gpu, size, model, cost = isl.gpu, isl.size, isl.model, isl.cost
    p, ttft_ms = cost.profile, cost.slo.ttft_ms
    tp, dp = cfg[:, :1], cfg[:, 1:]
    e_pre = np.ceil(model.n_routed_experts / size) if p.whole_experts_per_gpu else model.n_routed_experts / size
    fits = isl.max_batch(s, 0.0, tp, e_pre) >= 1.0
    t_pre = isl.prefill_ms(s, tp, dp)
    ok = fits
    if ttft_ms:
        # A configuration serves the lengths it prefills within TTFT on an idle island; when the
        # ones it cannot are rarer than the percentile allows (a few of the longest prompts), it
        # serves those too, as misses, rather than leave them without an island. The queueing
        # caps then keep the percentile for the mix each island is given.
        meets = t_pre <= ttft_ms
        rare = (fits & ~meets) @ w < 1.0 - cost.slo.ttft_percentile / 100
        ok = fits & (meets | rare[:, None])
    r_pre = np.where(ok, dp * 1000.0 / t_pre, 0.0)
    prefill = PhaseTable(
        tp[:, 0],
        dp[:, 0],
        np.full(len(cfg), size),
        r_pre,
        t_pre,
        np.broadcast_to(dp, r_pre.shape).copy(),
        np.zeros(len(cfg)),
        -1,
        "",
    )
    prefill = _chosen(prefill, _prefill_caps(prefill, s[0], w, cost), w)
    if prefill.chosen < 0:
        prefill = replace(prefill, reason=_reason("prefill", fits.any(), ttft_ms, gpu, size, model))
    return prefill


def _decode_table(
    isl: _Island,
    s: np.ndarray,
    w: np.ndarray,
    mean_decode: float,
    max_decode: int,
    *,
    step_cap: float | None,
    cfg: np.ndarray,
) -> PhaseTable:
    """Every decode configuration `cfg` (tp, dp) of the island at the lengths `s` (1, L), its batch sized so the
    mean step meets `step_cap` (the TPOT target, or the room it leaves: `benchmark_island`), and the choice."""
    size, cost = isl.size, isl.cost
    d = max(round(mean_decode), 1)
    tp, dp = cfg[:, :1], cfg[:, 1:]
    ep = size / dp
    routed = np.ceil(isl.model.n_routed_experts / ep)
    unit = size / tp if cost.profile.batch_per_attention_rank else float(size)  # batch units on the island
    batch = running_cap(aligned_batch(isl.max_batch(s, float(max_decode), tp, routed)), unit / dp, cost)
    fits = batch >= 1
    run = np.maximum(batch, 1.0)
    total_ms = isl.decode_tokens_ms(s, d, run, tp, ep)
    if step_cap:
        run, total_ms = _shrink_to_tpot(isl, s, d, run, tp, ep, tpot_ms=step_cap, total_ms=total_ms)
    ok = fits & (run >= 1) & ((total_ms / d <= step_cap) if step_cap else True)
    r_dec = np.where(ok, run * unit * 1000.0 / total_ms, 0.0)
    decode = PhaseTable(tp[:, 0], dp[:, 0], ep[:, 0], r_dec, total_ms / d, np.where(ok, run, 0.0), np.zeros(len(cfg)),
                        -1, "")  # fmt: skip
    decode = _chosen(decode, _decode_caps(decode, w, mean_decode, cost), w)
    if decode.chosen < 0:
        decode = replace(decode, reason=_reason("decode", fits.any(), cost.slo.tpot_ms, isl.gpu, size, isl.model))
    return decode


CHUNKS = 24  # prompt tokens an aggregated engine prefills a step: this many sizes tried, 16 to its largest


@dataclass(frozen=True)
class _MixedSteps:
    """What an aggregated engine's mixed step costs beside its chunk, per configuration (rows, (tp, dp) of
    `_aggregated`) and prompt length (columns): the quantities every chunk size is priced from."""

    lengths: np.ndarray  # (L,) prompt lengths
    w: np.ndarray  # (L,) their weights
    step_cap: float | None  # the TPOT target a step (with its chunk) meets, or None
    tp: np.ndarray  # (configs, 1)
    dp: np.ndarray
    ep: np.ndarray
    ranks_e: np.ndarray  # attention ranks of one engine
    unit_e: np.ndarray  # batch units of one engine
    slots: np.ndarray  # (configs, L) sequences per unit memory holds
    fits: np.ndarray  # slots >= 1
    tokens: np.ndarray  # (1, L) prompt tokens prefilled (beside the cache hits)
    own: np.ndarray  # (configs, L) engine ms a chunk's token of a prompt of each length adds to the chunk's forward:
    # its prompt's attention (and cached prefix) over its tokens (`formulas.prefill_chunk_ms`)
    deepest: float  # the longest prompt
    a_deepest: np.ndarray  # (configs, 1) the attention of the longest prompt on a rank
    yield_: float  # tokens a decode step yields
    steps: float  # decode steps a request takes
    most: np.ndarray  # (configs, 1) tokens an engine prefills a step at most
    mid: np.ndarray  # (1, L) a decode step's mean context (s + 1 ... s + d)


def _mixed_steps(
    isl: _Island,
    lengths: np.ndarray,
    w: np.ndarray,
    d: int,
    max_decode: int,
    *,
    step_cap: float | None,
    cfg: np.ndarray,
) -> _MixedSteps:
    p, cost = isl.cost.profile, isl.cost
    s = lengths[None, :]
    tp, dp = cfg[:, :1].astype(float), cfg[:, 1:].astype(float)
    ep = isl.size / dp
    ranks_e = ep / tp  # attention ranks of one engine
    unit_e = ranks_e if p.batch_per_attention_rank else ep  # batch units of one engine
    routed = np.ceil(isl.model.n_routed_experts / ep)
    slots = running_cap(aligned_batch(isl.max_batch(s, float(max_decode), tp, routed)), unit_e, cost)  # per unit
    one, tokens = prefill_own_ms(isl.gpu, isl.model, s, tp, ranks_e, cache_hit=cost.cache_hit, profile=p,
                                 draft_layers=cost.draft_layers)  # fmt: skip
    own = one / ranks_e / tokens  # engine ms
    deepest = float(lengths.max())
    yield_ = 1.0 + cost.accepted  # tokens a decode step yields
    return _MixedSteps(
        lengths, w, step_cap, tp, dp, ep, ranks_e, unit_e, slots, slots >= 1, tokens, own, deepest,
        a_deepest=isl.prefill_attention_ms(np.array([[deepest]]), tp, ranks_e),
        yield_=yield_,
        steps=d / yield_,
        most=cost.engine.prefill_batch_tokens * ranks_e,
        mid=s + (d - 1) / 2.0,  # a decode step at its mean context: step time is linear in context
    )  # fmt: skip


def _aggregated(
    isl: _Island,
    lengths: np.ndarray,
    w: np.ndarray,
    d: int,
    max_decode: int,
    *,
    step_cap: float | None,
    cfg: np.ndarray,
) -> PhaseTable:
    """Every decode configuration (tp, dp) as aggregated engines: dp engines of an EP group of size/dp GPUs,
    attention TP tp, each prefilling and decoding its own requests in mixed steps (`simulator.aggregated`).

    A mixed step runs one decode step of the engine's running sequences plus a chunk of E prompt tokens (spread
    over its ranks, several short prompts or a piece of a long one), and takes the decode step's time plus the
    chunk's prefill time, the chunk one forward (`formulas.prefill_chunk_ms`), as the simulator times it. In the
    steady state of an engine whose prompts keep it busy, with prompts of s tokens:

        rate   λ = E / (T s)                       prompts finish as fast as the chunks eat them
        running N = λ x steps x T = E x steps / s   (Little; steps = d / (1 + accepted MTP drafts))
        step   T = t_decode(N) + t_prefill(E)

    so N and T follow from E alone, and λ(E) = dp E / (T s) for the island. E is chosen per configuration
    from CHUNKS sizes (at most `cost.engine.prefill_batch_tokens` per attention rank) to serve the workload best,
    subject to: N within the sequences memory holds; with a TPOT target, the step with the chunk where it
    costs most (the end of the longest prompt, whose attention reads it all) within the target; and the
    prompts' queue within TTFT (`utilisation_caps`: dp servers, a prompt taking ceil(s / E) steps). The rate is
    the island's requests/s within the SLOs; `time_ms` is its TPOT there, `batch` the sequences per rank an
    engine admits (those whose step beside the costliest chunk still meets the target), `chunk` E per rank.
    """
    mx = _mixed_steps(isl, lengths, w, d, max_decode, step_cap=step_cap, cfg=cfg)
    n_cfg = len(cfg)
    best = [np.full((n_cfg, len(lengths)), -1.0), *(np.zeros((n_cfg, len(lengths))) for _ in range(4))]
    best_score = np.full(n_cfg, -1.0)
    best_e = np.full((n_cfg, 1), 16.0)

    def consider(size_e: np.ndarray) -> None:
        """Price every configuration at about `size_e` (configs, 1) prompt tokens a step; keep what serves best."""
        score, row, e = _chunk_priced(isl, mx, size_e, best_score)
        for k in np.flatnonzero(score > best_score):
            best_score[k], best_e[k] = score[k], e[k]
            for target, value in zip(best, row, strict=True):
                target[k] = value[k]

    coarse = np.unique(np.geomspace(16.0, float(mx.most.max()), CHUNKS).round())
    for x in coarse:
        consider(np.full((n_cfg, 1), x))
    step_up = float(coarse[1] / coarse[0]) if len(coarse) > 1 else 2.0
    around = best_e.copy()
    for f in np.geomspace(1.0 / step_up, step_up, 9):  # finer, around each configuration's best
        consider(around * f)
    req_s, tpot, running, chunk, deep = (np.maximum(x, 0.0) for x in best)
    b = np.where(req_s > 0, mx.slots, 0.0)
    if step_cap:  # admit no more sequences than a step beside the costliest chunk allows
        full = np.maximum(mx.slots, 1.0)
        cap = np.maximum(step_cap - deep / mx.yield_, 1e-9)
        total_ms = isl.decode_tokens_ms(mx.mid, 1, full, mx.tp, mx.ep)
        b, _ = _shrink_to_tpot(isl, mx.mid, 1, full, mx.tp, mx.ep, tpot_ms=cap, total_ms=total_ms)
        b = np.where(req_s > 0, np.maximum(b, running), 0.0)
    table = PhaseTable(mx.tp[:, 0], mx.dp[:, 0], mx.ep[:, 0], req_s, tpot, b, np.zeros(n_cfg), -1, "",
                       np.round(chunk))  # fmt: skip
    table = _chosen(table, np.ones(n_cfg), w, cover=isl.cost.slo.any)
    if table.chosen < 0:
        table = replace(table, reason=_reason("aggregated", mx.fits.any(), step_cap, isl.gpu, isl.size, isl.model))
    return table


def _chunk_priced(
    isl: _Island, mx: _MixedSteps, size_e: np.ndarray, best_score: np.ndarray
) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
    """Every configuration's mixed steps with a chunk of about `size_e` (configs, 1) prompt tokens: its score
    (`_score`), its row (rate, TPOT, running sequences per unit, chunk per attention rank, the costliest chunk's
    time) and the chunk E. Only a configuration whose rate before the TTFT cap beats `best_score` is capped
    (the cap only lowers it); the others score 0."""
    cost, ranks_e, tokens, w = isl.cost, mx.ranks_e, mx.tokens, mx.w
    e = np.maximum(np.floor(size_e / ranks_e), 1.0) * ranks_e  # whole tokens per attention rank
    n = np.maximum(np.ceil(e * mx.steps / (tokens * mx.unit_e)), 1.0)  # running sequences per unit
    t_dec = isl.decode_tokens_ms(mx.mid, 1, n, mx.tp, mx.ep) * mx.yield_  # one decode step
    # the chunk is one forward of its e tokens over the ranks (`formulas.prefill_chunk_ms`): what grows with its
    # tokens once, and each prompt's own attention; where it costs most it ends the longest prompt, its attention
    # over the whole prompt (a chunk longer than that prompt holds whole ones, and the end of one more)
    forward = isl.prefill_forward_ms(e / ranks_e, mx.tp, ranks_e)
    whole, rest = np.divmod(e, mx.deepest)
    before = isl.prefill_attention_ms(mx.deepest - rest, mx.tp, ranks_e) * (rest > 0)
    deep = forward + ((whole + (rest > 0)) * mx.a_deepest - before) / ranks_e
    period = t_dec + forward + mx.own * e
    ok = mx.fits & (n <= mx.slots) & (e <= mx.most)
    if mx.step_cap:
        ok &= (t_dec + deep) / mx.yield_ <= mx.step_cap
    rate = np.where(ok, mx.dp * e * 1000.0 / (period * tokens), 0.0)
    if cost.slo.any:  # the prompts' queue within TTFT: dp engines, a prompt ceil(s / e) steps
        # (only where the rate before the cap could beat the best so far: the cap only lowers it)
        k = np.flatnonzero(_score(rate, w) > best_score)
        service = np.ceil(tokens / e) * period
        pre = PhaseTable(mx.tp[k, 0], mx.dp[k, 0], mx.ep[k, 0], rate[k], service[k], np.zeros_like(rate[k]),
                         np.zeros(len(k)), -1, "")  # fmt: skip
        capped = np.zeros_like(rate)
        capped[k] = rate[k] * _prefill_caps(pre, mx.lengths, w, cost, batching=False)[:, None]
        rate = capped
    row = (rate, period / mx.yield_, np.where(ok, n, 0.0), np.broadcast_to(e / ranks_e, rate.shape),
           np.broadcast_to(deep, rate.shape))  # fmt: skip
    return _score(rate, w), row, e


def _score(rate: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per configuration (rows): the most of the workload served first, then the rate at which one island serves
    all of it (the harmonic mean of its rates by the weights)."""
    covered = (rate > 0) @ w
    inverse = np.where(rate > 0, w / np.where(rate > 0, rate, 1.0), 0.0).sum(axis=-1)
    return np.round(covered, 9) * 1e9 + np.where(inverse > 0, 1.0 / np.where(inverse > 0, inverse, 1.0), 0.0)


def decode_tokens_ms(
    gpu: GPU,
    model: Model,
    s: np.ndarray,
    d: int,
    batch: np.ndarray,
    tp: np.ndarray,
    ep: np.ndarray,
    *,
    cost: CostSettings,
) -> np.ndarray:
    """Time (ms) for every sequence of the batch to get its d tokens after a prompt of s: d steps, or with MTP steps
    verifying `cost.drafts` drafts that yield 1 + `cost.accepted` tokens each (each step's time spread over
    the tokens it yields, as simulator.timing.decode_timing runs them)."""
    total = decode_steps_sum_ms(
        gpu,
        model,
        s,
        d,
        batch,
        tp,
        ep,
        profile=cost.profile,
        run=DecodeRun.of(cost),
    )
    return total / (1.0 + cost.accepted)


def _shrink_to_tpot(
    isl: _Island,
    s: np.ndarray,
    d: int,
    batch: np.ndarray,
    tp: np.ndarray,
    ep: np.ndarray,
    *,
    tpot_ms: float | np.ndarray,
    total_ms: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Largest batch <= the memory batch whose mean step time meets the TPOT cap, and its time.

    The step time rises with the batch, so each round prices `ways` evenly spaced batches of every interval
    still open in one evaluation and keeps the part between the last that meets the cap and the first that
    does not: two rounds of 32 settle 1,024 batches where bisection takes eleven, and an evaluation's cost is
    mostly numpy's per-call time until its arrays grow to thousands of elements (`SEARCH_ELEMENTS`)."""
    good = total_ms / d <= tpot_ms
    lo = np.where(good, batch, 0.0)  # meets the cap (0 = no batch does)
    hi = np.where(good, batch, batch - 1.0)  # the largest batch not yet ruled out
    ways = int(np.clip(SEARCH_ELEMENTS // max(batch.size, 1), 2, 32))
    step = np.arange(1, ways + 1) / ways
    cap = np.asarray(tpot_ms, dtype=float)
    cap = cap[..., None] if cap.ndim else cap  # a cap per configuration and length, or one
    while np.any(hi > lo):
        cand = lo[..., None] + np.ceil((hi - lo)[..., None] * step)  # the last one is hi
        t = isl.decode_tokens_ms(s[..., None], d, np.maximum(cand, 1.0), tp[..., None], ep[..., None])
        ok = t / d <= cap
        n = np.where(ok.all(axis=-1), ways, np.argmin(ok, axis=-1))  # candidates meeting the cap, from the first
        open_ = hi > lo
        below = np.take_along_axis(cand, np.maximum(n - 1, 0)[..., None], axis=-1)[..., 0]
        above = np.take_along_axis(cand, np.minimum(n, ways - 1)[..., None], axis=-1)[..., 0]
        lo, hi = (np.where(open_ & (n > 0), below, lo), np.where(open_ & (n < ways), above - 1.0, hi))
    final = isl.decode_tokens_ms(s, d, np.maximum(lo, 1.0), tp, ep)
    return lo, final


def _reason(phase: str, fits_somewhere: bool, cap: float | None, gpu: GPU, size: int, model: Model) -> str:
    if not fits_somewhere:
        return (
            f"{size} x {gpu.name} cannot hold {model.name}'s weights plus one request's KV cache "
            f"in any {phase} configuration: use a larger island or a GPU with more memory"
        )
    slo = "TTFT" if phase == "prefill" else "TPOT"
    return f"no {phase} configuration of {size} x {gpu.name} meets the {slo} cap of {cap} ms"


def utilisation_caps(
    bench: IslandBenchmark,
    weights: np.ndarray,
    mean_decode: float,
    cost: CostSettings,
    arrivals: RateProfile | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per length (as benchmarked), the share of its time each phase of the island may be busy and
    still meet the SLO percentiles (`costmodel/queueing.py`) under Poisson arrivals, or under `arrivals`, a
    rate that varies in time (`queueing.modulated_cap`: the percentiles over all its arrivals); ones without SLOs.

    Prefill: c = dp engines, service time t(s) per prompt, the service mix that of the workload
    over the lengths the island can prefill (weights); the island meets TTFT at the percentile q
    when W_q + S_q <= TTFT minus a request's fixed times outside the GPUs (`request_overhead`: the
    front end's and the disaggregated hand-off's; the KV bytes' few ms are left out) (S_q: the mix's
    q-quantile). One cap for the whole island: a cap per
    length would let an island mixing short and long prompts run at the short ones' load, where
    its long ones miss the target (measured: benchmarks/slo_bench.py). An engine batches queued
    prompts up to `cost.engine.prefill_batch_tokens` and emits their first tokens together, so a queued
    prompt also waits for those batched behind it (the batch term of `queueing.utilisation_caps`,
    a full batch costed at the mix's mean time per token). Decode: c = the
    sequence slots (batch x attention ranks x dp), service = the whole decode of a request; a
    request that waits for a slot stalls between its first and second token, so the cap keeps
    P(wait) <= 1 - the TPOT percentile (no wait at that percentile). The decode batch itself is
    already sized so its step meets TPOT (`benchmark_island`).
    """
    n = len(bench.lengths)
    pre, dec = bench.prefill, bench.decode
    u_pre = (np.full(n, _prefill_caps(pre, bench.lengths, weights, cost, arrivals=arrivals, only=pre.chosen)
                     [pre.chosen]) if pre.chosen >= 0 else np.ones(n))  # fmt: skip
    u_dec = (np.full(n, _decode_caps(dec, weights, mean_decode, cost, arrivals, only=dec.chosen)[dec.chosen])
             if dec.chosen >= 0 else np.ones(n))  # fmt: skip
    return u_pre, u_dec


def _prefill_caps(
    t: PhaseTable,
    lengths: np.ndarray,
    weights: np.ndarray,
    cost: CostSettings,
    batching: bool = True,
    arrivals: RateProfile | None = None,
    only: int | None = None,
) -> np.ndarray:
    """`utilisation_caps`' prefill cap of every configuration of the table (1 without a TTFT target, 0 where a
    configuration serves no length). `batching=False`: prompts start as they come (an aggregated engine's chunks
    take them), not after a batch of `cost.engine.prefill_batch_tokens` behind them. `arrivals`: bursty ones.
    `only`: that configuration's cap alone is worked out (the others left at 1)."""
    caps = np.ones(len(t.tp))
    if cost.slo.ttft_ms is None:
        return caps
    w = np.asarray(weights, dtype=float)
    q = cost.slo.ttft_percentile / 100
    fixed_s = sum(request_overheads_ms(cost.profile)) / 1e3  # the front end and the hand-off, outside the GPUs
    for k in range(len(caps)) if only is None else (only,):
        ok = t.req_s[k] > 0
        if not ok.any():
            caps[k] = 0.0
            continue
        service_s = t.time_ms[k] / 1e3
        ww = w[ok] if w[ok].sum() > 0 else np.ones(ok.sum())
        mean, cs2 = mix_moments(service_s[ok], ww)
        budget = cost.slo.ttft_ms / 1e3 - fixed_s - mix_quantile(service_s[ok], ww, q)
        tokens = float(ww @ np.asarray(lengths, dtype=float)[ok] / ww.sum())
        batch_s = (
            mean / tokens * max(cost.engine.prefill_batch_tokens - tokens, 0.0) if batching else 0.0
        )  # a full batch
        caps[k] = (
            utilisation_caps_for_wait(int(t.dp[k]), mean, cs2, np.array([budget]), q, batch_s)[0]
            if arrivals is None
            else modulated_cap(int(t.dp[k]), mean, cs2, budget, q, arrivals, batch_s)
        )
    return caps


def _decode_caps(
    t: PhaseTable, weights: np.ndarray, mean_decode: float, cost: CostSettings, arrivals: RateProfile | None = None,
    only: int | None = None,
) -> np.ndarray:
    """`utilisation_caps`' decode cap of every configuration of the table (1 without a TPOT target, 0 where a
    configuration serves no length). `arrivals`: bursty ones; `only`: that configuration's cap alone."""
    caps = np.ones(len(t.tp))
    if cost.slo.tpot_ms is None:
        return caps
    w = np.asarray(weights, dtype=float)
    d = max(round(mean_decode), 1)
    for k in range(len(caps)) if only is None else (only,):
        ok = t.req_s[k] > 0
        if not ok.any():
            caps[k] = 0.0
            continue
        service_s = t.time_ms[k] * d / 1e3
        slots = t.req_s[k] * service_s  # sequences decoding at once on the island
        ww = w[ok] if w[ok].sum() > 0 else np.ones(ok.sum())
        mean, cs2 = mix_moments(service_s[ok], ww)
        c = max(int(np.floor(ww @ slots[ok] / ww.sum())), 1)
        q = cost.slo.tpot_percentile / 100
        caps[k] = (utilisation_caps_for_wait(c, mean, cs2, np.zeros(1), q)[0] if arrivals is None
                   else modulated_cap(c, mean, cs2, 0.0, q, arrivals))  # fmt: skip
    return caps

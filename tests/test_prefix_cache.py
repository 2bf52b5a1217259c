"""Prefix caches (simulator/cache.py), the routers that keep them (simulator/routers.py) and the traces that name
their prompts' blocks (pipeline/planning/traces.py): hand-worked cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.errors import WorkloadError
from pipeline.planning.traces import load_trace
from simulator.cache import PrefixBlocks, PrefixCache, cached_tokens
from simulator.core import DecodeEngine, PrefillEngine, Simulation
from simulator.requests import Requests
from simulator.routers import CacheAffinity, PlanRouter
from simulator.timing import HITS, DecodeTiming, PrefillTiming

LENGTHS = np.array([1.0, 1e6])


def linear_prefill() -> PrefillTiming:
    """A prompt of n tokens, c of them cached: n - c ms (computed tokens only, 1 ms each)."""
    table = LENGTHS[:, None] * (1.0 - HITS[None, :])
    return PrefillTiming(LENGTHS, LENGTHS.copy(), 1.0, 1e3, cached_ms=table, kv_tokens=10**6)


def flat_decode() -> DecodeTiming:
    return DecodeTiming(LENGTHS, LENGTHS, np.full((2, 2), 5.0), 1, 8, 100_000)


def blocks(*prompts: list[int]) -> PrefixBlocks:
    return PrefixBlocks.of_lists(list(prompts), 100)


def test_two_sessions_on_one_engine_with_an_eviction_by_hand() -> None:
    """One prefill engine, a cache of 4 blocks of 100 tokens, prefill 1 ms a computed token. Session A's first turn
    (blocks 1 2, 200 tokens) and B's (10 11) fill the cache: [2 1 11 10], least recent first (a prompt's blocks are
    touched last to first). A's second turn (1 2 3, 300 tokens) finds 1 2: 200 tokens cached, 100 computed (100
    ms); storing 3 2 1 evicts the least recent block, B's leaf 11, not its head 10. B's second turn (10 11 12) then
    finds 10 alone: 100 cached, 200 computed (200 ms). The engine's hit rate: 300 of 1,000 prompt tokens."""
    r = Requests(np.array([0.0, 1000.0, 2000.0, 3000.0]), np.array([200, 200, 300, 300]), np.full(4, 2),
                 blocks=blocks([1, 2], [10, 11], [1, 2, 3], [10, 11, 12]))  # fmt: skip
    pre = [PrefillEngine(0, 0, linear_prefill(), 10**6, PrefixCache(4))]
    dec = [DecodeEngine(0, 1, flat_decode(), linear_prefill())]
    sim = Simulation(r, pre, dec, PlanRouter(np.array([10**6]), {"prefill": np.ones((1, 1)), "decode": np.ones((1, 1))},
                                            {"prefill": [[0]], "decode": [[0]]}))  # fmt: skip
    sim.run()
    assert list(r.cached) == [0, 0, 200, 100]
    assert list(r.first_token - r.arrival) == pytest.approx([200.0, 200.0, 100.0, 200.0])
    # B's second turn stored 12 11 10 and evicted A's 3 and 2, the least recent: A keeps its head block 1
    cache = pre[0].cache
    assert cache is not None and list(cache.blocks) == [1, 12, 11, 10] and cache.evicted == 3
    assert pre[0].stats.prompt_tokens == 1000 and pre[0].stats.hit_rate == pytest.approx(0.3)


def test_the_cache_evicts_leaves_before_the_heads_they_hang_from() -> None:
    c = PrefixCache(3)
    c.insert(np.array([1, 2, 3]))  # touched 3, 2, 1: the head most recent
    c.insert(np.array([1, 4]))  # 4 then 1: evicts the least recent, the leaf 3
    assert list(c.blocks) == [2, 4, 1] and c.evicted == 1
    assert c.match(np.array([1, 2, 3])) == 2 and c.match(np.array([5, 1])) == 0  # a prefix from the first block
    c.resize(1)
    assert list(c.blocks) == [1]
    assert cached_tokens(5, 512, 2000) == 1999 and cached_tokens(2, 512, 2000) == 1024 and cached_tokens(0, 512, 9) == 0


def test_blocks_follow_their_requests_when_taken() -> None:
    b = blocks([1, 2], [], [3], [4, 5, 6])
    t = b.take(np.array([3, 0, 2]))
    assert [t.of(i).tolist() for i in range(3)] == [[4, 5, 6], [1, 2], [3]]
    r = Requests(np.arange(4.0), np.full(4, 300), np.full(4, 2), blocks=b).take(np.array([1, 3]))
    assert r.blocks is not None and [r.blocks.of(i).tolist() for i in range(2)] == [[], [4, 5, 6]]
    with pytest.raises(ValueError, match="one entry per request"):
        Requests(np.arange(3.0), np.full(3, 300), np.full(3, 2), blocks=b)


def stand_in(caches: list[list[int]], queued: list[int]) -> Simulation:
    """Three prefill engines of one island and one of another (engine 3), their caches holding `caches`, their
    queues `queued` tokens; one request of blocks 1 2 3 (300 tokens) to route."""
    r = Requests(np.zeros(1), np.array([300]), np.array([2]), blocks=blocks([1, 2, 3]))
    pre: list[PrefillEngine] = []
    for i, (held, q) in enumerate(zip(caches, queued, strict=True)):
        c = PrefixCache(10)
        c.insert(np.array(held, dtype=np.int64))
        e = PrefillEngine(i, 0 if i < 3 else 1, linear_prefill(), 10**6, c)
        e.queued_tokens = e.queued_new = q  # new tokens queued
        pre.append(e)
    a = routing()
    return Simulation(r, pre, [DecodeEngine(0, 2, flat_decode(), linear_prefill())],
                      PlanRouter(a["range_end"], a["shares"], a["engines_of"]))  # fmt: skip


def routing() -> dict[str, Any]:
    """Every prompt length routed to island 0 (engines 0-2) for prefill; island 1 (engine 3) takes none."""
    return {"range_end": np.array([10**6]), "shares": {"prefill": np.array([[1.0, 0.0]]), "decode": np.ones((1, 1))},
            "engines_of": {"prefill": [[0, 1, 2], [3]], "decode": [[0]]}}  # fmt: skip


def test_the_plans_router_sends_a_prompt_where_it_is_prefilled_soonest_its_cache_counted() -> None:
    """Prefill 1 ms a computed token on every engine. A prompt of 300 tokens (blocks 1 2 3 of 100): engine 0 holds
    none of it (300 ms of new work), engine 1 blocks 1 2 (100 ms), engine 2 block 1 (200 ms). With empty queues it
    goes to engine 1; with 150 new tokens queued there (250 ms), to engine 2 (200); with 150 at both, to engine 1
    (250 against 300 and 350); with 250 and 150, to engine 0 (300 against 350 and 350). Without a cached block
    anywhere, to the least queued work, as `plan`. Engine 3, of an island the prompt's length does not route to,
    holds all of it (299 tokens cached: 1 ms): `plan` never chooses it; `cache`, free of the plan's ranges,
    does while its queue is short (50 tokens: 51 ms against 100), not when it is long (200: 201 ms)."""
    a = routing()
    plan = PlanRouter(a["range_end"], a["shares"], a["engines_of"])
    held = [[9], [1, 2], [1], [1, 2, 3]]
    assert plan.prefill(stand_in(held, [0, 0, 0, 0]), 0) == 1
    assert plan.prefill(stand_in(held, [0, 150, 0, 0]), 0) == 2
    assert plan.prefill(stand_in(held, [0, 150, 150, 0]), 0) == 1
    assert plan.prefill(stand_in(held, [0, 250, 150, 0]), 0) == 0
    assert plan.prefill(stand_in([[9], [8], [7], [1, 2, 3]], [300, 200, 100, 0]), 0) == 2
    length = PlanRouter(a["range_end"], a["shares"], a["engines_of"], cache_aware=False)  # `length`: no cache
    assert length.prefill(stand_in(held, [100, 150, 150, 0]), 0) == 0
    affinity = CacheAffinity(a["range_end"], a["shares"], a["engines_of"])
    assert affinity.prefill(stand_in(held, [0, 0, 0, 50]), 0) == 3
    assert affinity.prefill(stand_in(held, [0, 0, 0, 200]), 0) == 1


def test_at_load_the_plans_router_weighs_the_work_a_prompt_adds_by_the_prompts_queued_behind_it() -> None:
    """As above, 150 new tokens of work queued at engine 1 and none elsewhere. With no prompt counted in the
    island's queues (none expected behind it), the prompt's own wait alone weighs, and it goes to engine 2 (200 ms
    against 250). With two prompts waiting at each engine of the island (two will wait behind it, Little's law), its
    own work counts three times: engine 1 150 + 3 x 100 = 450, engine 2 3 x 200 = 600, engine 0 3 x 300 = 900: to
    engine 1, whose cache saves the most work."""
    a = routing()
    held = [[9], [1, 2], [1], [1, 2, 3]]
    plan = PlanRouter(a["range_end"], a["shares"], a["engines_of"])
    assert plan.prefill(stand_in(held, [0, 150, 0, 0]), 0) == 2
    sim = stand_in(held, [0, 150, 0, 0])
    for e in sim.prefill[:3]:
        e.queue = [7, 8]  # two prompts waiting (their work is in `queued_new`)
    assert plan.prefill(sim, 0) == 1


def test_a_prompt_queued_behind_the_one_it_extends_finds_it_cached_by_hand() -> None:
    """Two prefill engines of one island, 1 ms a computed token. Request 0 (blocks 1 2, 200 tokens) arrives at 0
    and goes to engine 0 (both idle, the first). Request 1 (1 2 3, 300 tokens) arrives at 1 ms, while engine 0
    prefills request 0: engine 0 holds nothing yet but will hold blocks 1 2 once request 0 is done
    (`PrefillEngine.holds`), so there it costs its 100 new tokens after the batch under way (101), against 300 on
    idle engine 1: it queues on engine 0, finds 200 tokens cached when its turn comes at 200 ms, and is prefilled
    by 300 ms (on engine 1, reading the caches alone, it would have computed all 300 by 301 ms)."""
    r = Requests(np.array([0.0, 1.0]), np.array([200, 300]), np.full(2, 2), blocks=blocks([1, 2], [1, 2, 3]))
    pre = [PrefillEngine(i, 0, linear_prefill(), 10**6, PrefixCache(10)) for i in range(2)]
    dec = [DecodeEngine(0, 1, flat_decode(), linear_prefill())]
    shares = {"prefill": np.ones((1, 1)), "decode": np.ones((1, 1))}
    sim = Simulation(r, pre, dec, PlanRouter(np.array([10**6]), shares, {"prefill": [[0, 1]], "decode": [[0]]}))
    assert pre[0].holds(np.array([1, 2, 3])) == 0
    sim.run()
    assert list(r.prefill_engine) == [0, 0] and list(r.cached) == [0, 200]
    assert list(r.first_token) == pytest.approx([200.0, 300.0])
    assert not pre[0].coming and not pre[1].coming  # every prompt prefilled: nothing left to come


def test_the_plans_router_keeps_a_prefix_on_its_island_within_a_bound_of_the_plans_share() -> None:
    """Two islands share the one range half and half: island 0 is engines 0-2, island 1 is engine 3, which holds
    the prompt's blocks 1 2 3 (300 tokens). It goes there while the tokens sent to island 1 before it stay within
    1.25 x its half of the range's, this prompt's counted (bounded loads, an island taking at least one prompt past
    its share, as consistent hashing with bounded loads rounds up): after 100 and 700 tokens sent, 700 is over 1.25
    x 550: the prompt goes to island 0, to its least queued engine; after 600 and 300, 300 is within 1.25 x 600: to
    engine 3. Held
    nowhere, a prompt goes by the plan's draw, the bound aside: with island 0 over it, still to island 0 on the
    draws that pick it."""
    a = routing()
    shares = {"prefill": np.array([[0.5, 0.5]]), "decode": np.ones((1, 1))}
    held = [[9], [8], [7], [1, 2, 3]]
    for sent, queued, engine in (((100, 700), [50, 0, 20, 0], 1), ((600, 300), [0, 0, 0, 0], 3)):
        router = PlanRouter(a["range_end"], shares, a["engines_of"])
        router.sent[0] = np.array(sent, dtype=float)
        assert router.prefill(stand_in(held, queued), 0) == engine
        assert router.sent[0].sum() == sum(sent) + 300
    router = PlanRouter(a["range_end"], shares, a["engines_of"], seed=1)
    picks = set()
    for _ in range(40):
        router.sent[0] = np.array([3000.0, 0.0])
        picks.add(router.prefill(stand_in([[9], [8], [7], [6]], [0, 0, 0, 0]), 0))
    assert picks == {0, 3}


def test_the_reuse_model_keeps_a_conversation_on_its_island_within_the_routers_bound() -> None:
    """Blocks of 100 tokens. Request 0 (blocks 1 2, 200 tokens, range 0) is prefilled on island A, range 0's only
    island; request 1, its next turn (1 2 3, 300 tokens, range 1), is wanted back on A, which holds both its blocks,
    but range 1 is shared half and half with island B: A may take 1.25 x 150 = 187.5 of its 300 tokens (5/8 of the
    turn), the rest is drawn to B. On A the turn finds 200 of 300 tokens (2/3); on B nothing (its blocks are A's
    alone). Shared 80 / 20, A takes the whole turn: 2/3 on A, B gets none of it."""
    from costmodel.reuse import Reuse

    b = blocks([1, 2], [1, 2, 3])
    r = Reuse.of(b.ids, b.start, 100, np.array([200, 300]))
    assert list(r.chain) == [-1, 0] and not r.hot.any()  # type: ignore[union-attr]
    ranges = np.array([0, 1])
    big = np.array([10**6, 10**6])
    h = r.hit_rates(ranges, 2, np.array([[1.0, 0.0], [0.5, 0.5]]), big, np.ones(2))
    assert h[1] == pytest.approx([2 / 3, 0.0]) and h[0] == pytest.approx([0.0, 0.0])
    h = r.hit_rates(ranges, 2, np.array([[1.0, 0.0], [0.8, 0.2]]), big, np.ones(2))
    assert h[1] == pytest.approx([2 / 3, 0.0])


def mooncake_lines(*rows: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_a_mooncake_trace_loads_in_time_order_with_its_blocks(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(mooncake_lines({"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [0, 2]},
                                {"timestamp": 1000, "input_length": 1024, "output_length": 7, "hash_ids": [0, 1]}))
    t = load_trace(f)
    assert list(t.input_tokens) == [1024, 600] and list(t.arrival_s) == [0.0, 2.0] and t.blocks is not None
    assert [t.blocks.of(i).tolist() for i in range(2)] == [[0, 1], [0, 2]] and t.blocks.block_tokens == 512


@pytest.mark.parametrize(
    "row, message",
    [
        ({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, "a"]},
         r"line 2: `hash_ids` must be a list of whole numbers"),
        ({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1.5]},
         r"line 2: `hash_ids` must be a list of whole numbers"),
        ({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1, 2]},
         r"line 2: 3 blocks of 512 tokens are longer than the prompt's 600 tokens \(at most 2 blocks\)"),
        ({"timestamp": 0, "input_length": 600, "output_length": 5}, r"line 2: missing field\(s\) \['hash_ids'\]"),
        ({"timestamp": -1, "input_length": 600, "output_length": 5, "hash_ids": []},
         r"line 2: `timestamp` must be milliseconds >= 0"),
        ({"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []},
         r"line 2: `input_length` must be a whole number of tokens"),
    ],
)  # fmt: skip
def test_a_bad_mooncake_trace_fails_whole_naming_the_line(tmp_path: Path, row: dict, message: str) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(mooncake_lines({"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [0]}, row))
    with pytest.raises(WorkloadError, match=message) as err:
        load_trace(f)
    assert str(f) in str(err.value)
    f.write_text('{"timestamp": 0,\n')
    with pytest.raises(WorkloadError, match="line 1: not a JSON object"):
        load_trace(f)


def test_an_aggregated_engine_prefills_only_what_its_cache_lacks_by_hand() -> None:
    """One aggregated engine, chunks of 100 tokens, prefill 1 ms a token, decode 5 ms a step, a cache of blocks of
    100 tokens in the KV memory its admitted requests leave. A (blocks 1 2, 200 tokens) prefills in two chunks, its
    first token at 200 ms; B (blocks 1 2 3, 300 tokens) arrives at 1,000 ms, finds 200 tokens cached and prefills
    one chunk: its first token 100 ms later. Without the cache, 300 ms."""
    from simulator.aggregated import AggregatedEngine, AggregatedSimulation

    ttft = {}
    for cache in (PrefixCache(10**6), None):
        r = Requests(np.array([0.0, 1000.0]), np.array([200, 300]), np.array([2, 2]), blocks=blocks([1, 2], [1, 2, 3]))
        engine = AggregatedEngine(0, flat_decode(), linear_prefill(), chunk=100, cache=cache)
        AggregatedSimulation(r, [engine]).run()
        ttft[cache is not None] = list(r.first_token - r.arrival)
        assert list(r.cached) == ([0, 200] if cache is not None else [0, 0])
    assert ttft == {True: pytest.approx([200.0, 100.0]), False: pytest.approx([200.0, 300.0])}
    assert engine.cache is None and engine.stats.prompt_tokens == 500


def test_a_plan_simulated_with_caching_off_or_nothing_to_reuse_is_simulated_as_before() -> None:
    """tiny_plan's engines on one stream of requests: without blocks (as before prefix caches), with blocks and
    `prefix_cache` off, and with blocks no two prompts share (caches on, nothing to find): the same run, time for
    time. With every prompt sharing its first block, the caches find it and the mean TTFT falls."""
    from helpers import tiny_plan
    from pipeline.planning.simulation import Runner, SimSettings

    plan = tiny_plan(rate=6.0)
    rng = np.random.default_rng(3)
    n = 300
    arrival = np.cumsum(rng.exponential(1000.0 / 3.0, n))
    ins, outs = rng.integers(100, 7000, n), rng.integers(2, 200, n)
    count = -(-ins // 512)
    unique = PrefixBlocks(np.arange(int(count.sum())), np.concatenate([[0], np.cumsum(count)]), 512)
    shared_ids = unique.ids.copy()
    shared_ids[unique.start[:-1]] = -1  # every prompt's first block is the same system prompt
    shared = PrefixBlocks(shared_ids, unique.start, 512)
    runs = {}
    cases = (("before", None, True), ("off", shared, False), ("nothing", unique, True), ("on", shared, True))
    for name, b, on in cases:
        runner = Runner(plan, plan.slo, SimSettings(prefix_cache=on))
        sim, m, _ = runner.simulate(Requests(arrival, ins, outs, blocks=b))
        runs[name] = (sim.r, m)
    before = runs["before"][0]
    for name in ("off", "nothing"):
        r = runs[name][0]
        assert np.array_equal(r.first_token, before.first_token) and np.array_equal(r.finish, before.finish), name
    assert "cache_hit_rate" not in runs["before"][1] and "cache_hit_rate" not in runs["off"][1]
    assert runs["nothing"][1]["cache_hit_rate"] == 0.0
    on, m = runs["on"]
    assert 0.0 < m["cache_hit_rate"] <= 512 * n / ins.sum() and (on.cached <= 512).all()
    assert (on.first_token - arrival).mean() < (before.first_token - arrival).mean()


def test_the_reuse_model_is_an_lru_caches_hit_rate_by_hand_and_on_mooncakes_trace() -> None:
    """Blocks of 100 tokens, each prompt's touched last to first. Request 0 stores 1 2 (2 at position 0, 1 at 1);
    request 1 stores 5 6 7 (7, 6, 5 at 2-4); request 2 (1 2 9, 300 tokens) finds 1 and 2. Since block 1 was last
    touched, 7 6 5 were stored: its distance is 300 tokens; since block 2, 1 7 6 5: 400 (and the running maximum
    along the prefix is 300, 400). Each saves 100 tokens. A cache of 350 tokens holds block 1 and not 2: 100 of the
    800 prompt tokens found; 450 tokens hold both: 200; 250 neither. On the conversation trace the model's hit rate
    at 3, 10 and 30 M tokens is a replayed LRU cache's within 0.1 point."""
    from costmodel.reuse import Reuse
    from pipeline.planning.traces import DATA_DIR

    b = blocks([1, 2], [5, 6, 7], [1, 2, 9])
    r = Reuse.of(b.ids, b.start, 100, np.array([200, 300, 300]))
    assert list(r.request) == [2, 2] and list(r.gain) == [100, 100] and list(r.distance) == [300, 400]
    assert list(r.parent) == [0, 0] and r.unbounded == pytest.approx(200 / 800)
    one = np.zeros(3, dtype=np.int64)
    for capacity, saved in ((350, 100), (450, 200), (250, 0)):
        h = r.hit_rates(one, 1, np.ones((1, 1)), np.array([capacity]), np.ones(1))
        assert h[0, 0] == pytest.approx(saved / 800)
    # two engines each seeing half the stream hold what one engine twice their size holds
    assert r.hit_rates(one, 1, np.ones((1, 1)), np.array([225]), np.array([2]))[0, 0] == pytest.approx(200 / 800)
    # two islands sharing the range: the prompt goes to the one its parent went to, all the hits kept, on both
    assert r.hit_rates(one, 1, np.full((1, 2), 0.5), np.array([450, 450]), np.ones(2))[0] == pytest.approx(
        [200 / 800, 200 / 800])
    # its parent's range on island 1 alone, its own on island 0 alone: nothing found where it goes
    apart = np.array([1, 1, 0])  # request 2 in range 0, its parent (request 0) in range 1
    assert r.hit_rates(apart, 2, np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([450, 450]), np.ones(2)).max() == 0
    # timed: request 2 arrives 2 s after its parent (the trace's own rate: 1 req/s). A prefill of 1 s is done by
    # then; one of 3 s is not; at twice the trace's rate the gap is 1 s, and one of 1.5 s is not done either. Its
    # conversation's own blocks are found all the same: the router sends it home, where it queues behind its parent
    # (`simulator.core.PrefillEngine.holds`), and the parent is prefilled first
    timed = Reuse.of(b.ids, b.start, 100, np.array([200, 300, 300]), np.array([0.0, 1.0, 2.0]))
    assert list(timed.gap_s) == [2.0, 2.0] and timed.rate_req_s == pytest.approx(1.0)  # type: ignore[arg-type]
    for ready, rate in ((1.0, 1.0), (3.0, 1.0), (1.5, 2.0), (0.9, 2.0)):
        h = timed.hit_rates(one, 1, np.ones((1, 1)), np.array([10**6]), np.ones(1), np.full((1, 1), ready), rate)
        assert h[0, 0] == pytest.approx(200 / 800), (ready, rate)
    t = load_trace(DATA_DIR / "mooncake_conversation.npz")
    assert t.blocks is not None
    model = Reuse.of(t.blocks.ids, t.blocks.start, 512, t.input_tokens)
    for capacity in (3e6, 1e7, 3e7):
        cache, hit = PrefixCache(int(capacity // 512)), 0
        for i in range(len(t)):
            ids = t.blocks.of(i)
            hit += cached_tokens(cache.match(ids), 512, int(t.input_tokens[i]))
            cache.insert(ids)
        want = hit / t.input_tokens.sum()
        got = model.hit_rates(np.zeros(len(t), dtype=np.int64), 1, np.ones((1, 1)), np.array([capacity]),
                              np.ones(1))[0, 0]  # fmt: skip
        assert got == pytest.approx(want, abs=1e-3)


def test_a_turn_sent_home_leaves_its_engine_when_the_batch_under_way_outlasts_its_saving_by_hand() -> None:
    """The trace above, one island: request 2's 300-token prompt finds 200 tokens its conversation left (2/3 of it)
    at home. Its engine is busy half the time with prompts of 3 s: a third of the way into one, 2 s are left, what
    the turn's cache saves (2/3 of its own 3 s), so with more left (a chance of 1/3 while busy: 1/6) the router
    sends it to another engine of the island, where its blocks are not: 5/6 x 200 found. With one prompt queued
    behind it, its saving counts twice (4 s, more than any batch has left): all 200. A second kind of prompt, 12 s
    long and busy 30 % of the time, has more than 2 s left 5/6 of its service: 1/6 + 0.3 x 5/6 = 5/12 away."""
    from costmodel.reuse import Reuse

    b = blocks([1, 2], [5, 6, 7], [1, 2, 9])
    r = Reuse.of(b.ids, b.start, 100, np.array([200, 300, 300]))
    one = np.zeros(3, dtype=np.int64)

    def found(busy: list[list[float]], behind: float, ranges: np.ndarray = one, n: int = 1) -> float:
        share, big = np.ones((n, 1)), np.array([10**6])
        return float(r.hit_rates(ranges, n, share, big, np.ones(1), busy=np.array(busy)[:, None, :],
                                 behind=np.array([behind]))[ranges[2], 0])  # fmt: skip

    assert found([[0.5, 3.0]], 0.0) == pytest.approx(5 / 6 * 200 / 800)
    assert found([[0.5, 3.0]], 1.0) == pytest.approx(200 / 800)
    assert found([[0.0, 3.0]], 0.0) == pytest.approx(200 / 800)  # never busy: always home
    # request 2 in range 0 (3 s), the others in range 1 (12 s, 30 % busy): its range's hit rate, 200 of its 300
    two = found([[0.5, 3.0], [0.3, 12.0]], 0.0, np.array([1, 1, 0]), 2)
    assert two == pytest.approx((1 - 5 / 12) * 200 / 300)


def test_a_prefix_traces_check_runs_on_one_pass_of_it_at_most() -> None:
    """A trace that names its prompts' blocks replays in order, each further pass renamed and cold (its first turns'
    conversations found nowhere): the check after a search simulates at most one pass, where it would otherwise
    take 3,000 requests (its least) of a 200-request trace; `pipeline.simulate` notes the passes it is asked for."""
    from helpers import tiny_plan
    from pipeline.planning.check import REQUESTS, check

    mix = prefix_mix(200)
    v = check(tiny_plan(rate=6.0), mix)
    assert REQUESTS[0] > 200 and v.requests == 200 and all(w.requests <= 200 for w in v.windows)
    # pipeline.simulate says so where a user asks for more: 500 requests are 2.5 passes, 200 one
    note = mix.coverage(500, 6.0, "poisson")
    assert "2.5 times over" in note and "requests=200 keeps one pass" in note
    assert mix.coverage(200, 6.0, "poisson") == ""


def prefix_mix(n: int) -> Any:
    """A RequestMix of a hand-made trace of `n` prompts (100-7,000 tokens) naming their blocks, none shared."""
    from pipeline.planning.simulation import RequestMix
    from pipeline.planning.traces import Trace

    rng = np.random.default_rng(5)
    ins, outs = rng.integers(100, 7000, n), rng.integers(2, 100, n)
    count = -(-ins // 512)
    b = PrefixBlocks(np.arange(int(count.sum())), np.concatenate([[0], np.cumsum(count)]), 512)
    return RequestMix("t", (ins, np.ones(n)), (outs, np.ones(n)), Trace("t", "hand", ins, outs, np.arange(float(n)), b))


def test_a_prefix_trace_replays_in_order_with_each_pass_in_its_own_namespace() -> None:
    from simulator.arrivals import in_order

    b = blocks([1, 2], [1, 3], [4])
    r = in_order(np.array([200, 200, 100]), np.array([5, 6, 7]), b, "poisson", 7, 10.0, 0)
    assert list(r.input_len) == [200, 200, 100, 200, 200, 100, 200] and list(r.output_len[:3]) == [5, 6, 7]
    assert r.blocks is not None
    ids = [r.blocks.of(i).tolist() for i in range(7)]
    assert ids[:3] == [[1, 2], [1, 3], [4]] and ids[3:6] == [[6, 7], [6, 8], [9]] and ids[6] == [11, 12]
    assert (np.diff(r.arrival) >= 0).all()


MOONCAKE = ("workload=mooncake_conversation", "slo=mooncake", "search.spare_hosts=0")


def test_a_plan_priced_with_the_traces_prefix_caches_states_its_islands_hit_rates_and_the_simulator_finds_them(
    tmp_path: Path,
) -> None:
    """tiny_hetero's exact layout for Mooncake's conversation trace: priced with its prefix caches (the default) it
    states more than priced without (search.prefix_cache=false), each prefill island carrying the hit rate its
    prefill was priced at, decode islands none; without, no island carries one. Simulated on the trace's own
    requests in order at half the stated rate (caches warming from empty, as the model's replay does), each prefill
    island's simulated hit rate is within 5 points of the expected (islands of at least 5 % of the prompt tokens:
    tiny_hetero's H20 island takes a few of the longest prompts)."""
    import plan as plans
    from helpers import plan_of
    from pipeline.planning.simulation import Runner, island_caches, request_mix

    with_caches = plans.load(plan_of(tmp_path, *MOONCAKE)[0])
    without = plans.load(plan_of(tmp_path, *MOONCAKE, "search.prefix_cache=false")[0])
    assert with_caches.rate_req_s > 1.05 * without.rate_req_s > 0
    # what the caches add to the layout it chose: the same layout priced without them (report.md's diagnostics row)
    free = with_caches.rates.cache_free_req_s
    assert free is not None and 0 < free < with_caches.rate_req_s and without.rates.cache_free_req_s is None
    assert all(isl.cache_hit_expected is None for isl in without.serving)
    pre = {k: isl for k, isl in enumerate(with_caches.serving) if isl.role == "prefill"}
    assert pre and all(0.0 < isl.cache_hit_expected < 0.5 for isl in pre.values())  # type: ignore[operator]
    assert all(isl.cache_hit_expected is None for isl in with_caches.serving if isl.role != "prefill")
    mix = request_mix(with_caches.workload, with_caches.spec_of_workload)
    req = mix.requests(12_031, with_caches.rate_req_s / 2, "poisson", 0)
    sim, _, _ = Runner(with_caches, with_caches.slo).simulate(req)
    simulated = island_caches(with_caches, sim)
    total = sum(st.prompt_tokens for st in simulated.values())
    for k, isl in pre.items():  # an island of a few prompts measures nothing: those of at least 5 % of the tokens
        expected, st = isl.cache_hit_expected, simulated[k]
        assert expected is not None
        if st.prompt_tokens >= 0.05 * total:
            assert abs(st.hit_rate - expected) < 0.05, (k, st.hit_rate, expected)
    assert max(st.prompt_tokens for st in simulated.values()) >= 0.5 * total  # the check bears on most of them


def test_a_flat_cache_hit_beside_a_traces_prefix_caches_is_refused_in_one_line(tmp_path: Path) -> None:
    from helpers import in_process
    from pipeline.search.run import execute

    r = in_process(execute, "search", "+inventory=tiny_hetero", *MOONCAKE, "costmodel.cache_hit=0.3",
                   f"out_root={tmp_path}/out")  # fmt: skip
    assert r.returncode == 2 and "costmodel.cache_hit=0.3 assumes a hit rate" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1

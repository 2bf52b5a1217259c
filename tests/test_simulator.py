"""The request-level simulator: conservation, memory, time, routing, and agreement with a plan's Λ."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from costmodel.catalog import load_gpu
from helpers import tiny_plan
from plan import PlanError
from simulator.build import build
from simulator.core import DecodeEngine, PrefillEngine, Simulation
from simulator.metrics import summary
from simulator.requests import Requests
from simulator.routers import PlanRouter, PowerOfTwo, RoundRobin
from simulator.timing import DecodeTiming, PrefillTiming


def flat_prefill(ms: float = 10.0) -> PrefillTiming:
    """Every prompt takes `ms`; KV moves at 1 byte per token over 1 GB/s (negligible)."""
    return PrefillTiming(np.array([1.0, 1e6]), np.array([ms, ms]), 1.0, 1.0)


def flat_decode(step_ms: float = 5.0, max_seqs: int = 8, kv_tokens: int = 10_000) -> DecodeTiming:
    return DecodeTiming(np.array([1.0, 1e6]), np.array([1.0, 1e6]), np.full((2, 2), step_ms), 1, max_seqs, kv_tokens)


def engines(n_pre: int = 1, n_dec: int = 1, **dec: float) -> tuple[list[PrefillEngine], list[DecodeEngine]]:
    pre = [PrefillEngine(i, i, flat_prefill(), 10**9) for i in range(n_pre)]
    d = [DecodeEngine(i, i, flat_decode(**dec), flat_prefill(1.0)) for i in range(n_dec)]  # type: ignore[arg-type]
    return pre, d


def check_conservation(sim: Simulation) -> None:
    r = sim.r
    assert (r.finish >= r.first_token).all() and (r.first_token >= r.arrival).all()
    for d in sim.decode:  # every request left; the KV in use went back to zero
        assert not d.running and not d.waiting and d.context_sum == 0
        assert d.kv_peak <= d.timing.kv_tokens


def test_one_request_by_hand() -> None:
    # arrives at 0, prefilled in 10 ms (first token), 4 more tokens at 5 ms a step: done at 30 ms
    r = Requests(np.array([0.0]), np.array([100]), np.array([5]))
    pre, dec = engines()
    sim = Simulation(r, pre, dec, RoundRobin())
    sim.run()
    assert r.first_token[0] == pytest.approx(10.0, abs=1e-3)
    assert r.finish[0] == pytest.approx(30.0, abs=1e-3)
    check_conservation(sim)


def test_a_request_waiting_for_a_running_slot_gets_its_first_token_when_admitted() -> None:
    """A decode engine admitting one request at a time (max running requests 1): two prompts prefilled together
    by 10 ms; the first streams its first token then and 4 more at 5 ms a step (done at 30 ms); the second's KV
    waits for the slot, so its first token comes when it is admitted, at 30 ms, and it finishes at 50 ms: its
    wait is TTFT, not TPOT, as a client of an engine at its limit measures."""
    r = Requests(np.array([0.0, 0.0]), np.array([100, 100]), np.array([5, 5]))
    pre, dec = engines(max_seqs=1)
    sim = Simulation(r, pre, dec, RoundRobin())
    sim.run()
    assert r.first_token[0] == pytest.approx(10.0, abs=1e-3) and r.finish[0] == pytest.approx(30.0, abs=1e-3)
    assert r.first_token[1] == pytest.approx(30.0, abs=1e-3) and r.finish[1] == pytest.approx(50.0, abs=1e-3)
    check_conservation(sim)


def test_time_never_goes_backwards() -> None:
    rng = np.random.default_rng(2)
    n = 300
    r = Requests(np.cumsum(rng.exponential(2.0, n)), rng.integers(50, 400, n), rng.integers(1, 200, n))
    pre, dec = engines(2, 2, max_seqs=64, kv_tokens=3000)
    sim = Simulation(r, pre, dec, RoundRobin())
    seen: list[float] = []
    handlers = (sim._arrive, sim._prefill_done, sim._kv_ready, sim._step)
    for name, h in zip(("_arrive", "_prefill_done", "_kv_ready", "_step"), handlers, strict=True):
        setattr(sim, name, lambda who, h=h: (seen.append(sim.now), h(who))[1])
    sim.run()
    assert len(seen) > 4 * n and (np.diff(seen) >= 0).all()


def test_every_request_finishes_once_and_memory_stays_within_capacity() -> None:
    rng = np.random.default_rng(1)
    n = 400
    r = Requests(np.cumsum(rng.exponential(2.0, n)), rng.integers(50, 400, n), rng.integers(1, 200, n))
    pre, dec = engines(2, 2, max_seqs=64, kv_tokens=3000)  # tight memory: preemptions must happen
    sim = Simulation(r, pre, dec, RoundRobin())
    sim.run()
    check_conservation(sim)
    assert r.preemptions.sum() > 0
    # a request's end-to-end time covers at least its own decode steps
    assert ((r.finish - r.first_token) >= (r.output_len - 1) * 5.0 - 1e-6).all()


def test_p2c_sends_to_the_less_loaded_of_two() -> None:
    pre, dec = engines(2, 2)
    sim = Simulation(Requests(np.array([0.0]), np.array([10]), np.array([2])), pre, dec, RoundRobin())
    pre[0].queued_tokens, pre[1].queued_tokens = 500, 20
    dec[0].waiting, dec[1].waiting = [1, 2, 3], []
    p2c = PowerOfTwo(seed=3)
    assert {p2c.prefill(sim, 0) for _ in range(20)} == {1}
    assert {p2c.decode(sim, 0) for _ in range(20)} == {1}


def test_plan_routing_respects_the_fractions_over_many_requests() -> None:
    pre, dec = engines(3, 2)
    n = 6000
    lengths = np.where(np.arange(n) % 2 == 0, 50, 150)  # half in range [0, 100), half in [100, 200)
    r = Requests(np.arange(n) * 100.0, lengths, np.full(n, 2))
    # range 0: prefill islands 0/1/2 get 0.2/0.8/0; range 1: 0/0/1. Decode: range 0 -> island 0, range 1 -> 0.5/0.5
    shares = {
        "prefill": np.array([[0.2, 0.8, 0.0], [0.0, 0.0, 1.0]]),
        "decode": np.array([[1.0, 0.0], [0.5, 0.5]]),
    }
    router = PlanRouter(np.array([100, 200]), shares, {"prefill": [[0], [1], [2]], "decode": [[0], [1]]}, seed=0)
    sim = Simulation(r, pre, dec, router)
    sim.run()
    short, long = lengths == 50, lengths == 150
    assert np.mean(r.prefill_engine[short] == 0) == pytest.approx(0.2, abs=0.03)
    assert (r.prefill_engine[long] == 2).all() and (r.decode_engine[short] == 0).all()
    assert np.mean(r.decode_engine[long] == 1) == pytest.approx(0.5, abs=0.03)


def test_well_below_saturation_throughput_equals_the_offered_rate() -> None:
    gpus = {g: load_gpu(g) for g in ("H200", "H20")}
    pre, dec, router = build(tiny_plan(), gpus, max_len=4096)
    rng = np.random.default_rng(0)
    n, rate = 3000, 2.0  # req/s: far below what 16 GPUs of prefill serve at these lengths
    r = Requests(np.cumsum(rng.exponential(1000 / rate, n)), rng.integers(100, 4000, n), rng.integers(2, 100, n))
    sim = Simulation(r, pre, dec, router)
    sim.run()
    check_conservation(sim)
    s = summary(sim, warmup_ms=float(r.arrival[n // 10]))
    assert s["throughput_req_s"] == pytest.approx(s["offered_req_s"], rel=0.03)
    assert s["ttft_ms_p50"] > 0 and s["tpot_ms_p50"] > 0 and s["preemptions"] == 0


@pytest.mark.parametrize("span_ms", [1500.0, 3000.0, 6000.0])
def test_the_ramp_deficit_is_what_a_run_starting_empty_misses(span_ms: float) -> None:
    """Without queueing every request takes as long however full the engines are, so the estimate of
    what starting empty costs the measured throughput is exact: evenly spaced arrivals, answers of 2-399
    tokens at 5 ms a step (up to 2 s), windows of 0.75, 1.5 and 3 s."""
    from simulator.metrics import steady_state_note

    n = 4000
    r = Requests(np.linspace(0.0, span_ms, n), np.full(n, 50), 2 + (np.arange(n) * 37) % 398)
    pre = [PrefillEngine(0, 0, flat_prefill(0.01), 10**9)]
    dec = [DecodeEngine(0, 0, flat_decode(5.0, n, 10**8), flat_prefill(1.0))]
    sim = Simulation(r, pre, dec, RoundRobin())
    sim.run()
    m = summary(sim)
    assert m["throughput_req_s"] / m["offered_req_s"] == pytest.approx(1 - m["ramp_deficit"], abs=0.002)
    assert {1500.0: 0.15, 3000.0: 0.002, 6000.0: 0.0}[span_ms] <= m["ramp_deficit"] <= 0.25
    assert bool(steady_state_note(m)) == (m["ramp_deficit"] > 0.01 or 1.5 * m["e2e_ms_p99"] > m["window_s"] * 1e3)
    assert bool(steady_state_note(m)) == (span_ms < 6000.0)


def test_a_window_just_past_a_filling_runs_p99_request_is_too_short() -> None:
    """A decode step slows as its batch fills (1 ms a step alone, 10 ms at 4,000 sequences; some 360 run at once),
    so a run that has not filled up measures its requests shorter than they take once it has. Over a window just
    past that run's own p99 request (answers of one length: no chance in it), throughput falls 2.5 % short of the
    offered rate: the window is flagged as too short. A run four times as long sustains the same rate."""
    from simulator.metrics import steady_state_note

    def run(span_ms: float) -> dict[str, float]:
        n = int(span_ms * 0.5)  # 500 req/s, 400 tokens each
        r = Requests(np.linspace(0.0, span_ms, n), np.full(n, 50), np.full(n, 400))
        filling = DecodeTiming(np.array([1.0, 4000.0]), np.array([1.0, 1e6]), np.array([[1.0, 1.0], [10.0, 10.0]]),
                               1, 10**6, 10**9)  # fmt: skip
        sim = Simulation(r, [PrefillEngine(0, 0, flat_prefill(0.01), 10**9)],
                         [DecodeEngine(0, 0, filling, flat_prefill(1.0))], RoundRobin())  # fmt: skip
        sim.run()
        return summary(sim)

    short = run(1600.0)
    assert short["e2e_ms_p99"] < short["window_s"] * 1e3 < 1.5 * short["e2e_ms_p99"]
    assert short["throughput_req_s"] < 0.98 * short["offered_req_s"] and short["ramp_deficit"] < 0.01
    assert steady_state_note(short)
    long = run(6400.0)
    assert not steady_state_note(long)
    assert long["throughput_req_s"] == pytest.approx(long["offered_req_s"], rel=0.01)


def test_a_plan_without_a_decode_island_is_refused() -> None:
    with pytest.raises(PlanError, match="a rate of 4 req/s needs a prefill and a decode island"):
        dataclasses.replace(tiny_plan(), islands=tiny_plan().islands[:2])


def test_requests_must_be_sorted_and_positive() -> None:
    with pytest.raises(ValueError, match="sorted"):
        Requests(np.array([2.0, 1.0]), np.array([1, 1]), np.array([1, 1]))
    with pytest.raises(ValueError, match="output_len >= 1"):
        Requests(np.array([0.0]), np.array([1]), np.array([0]))


def scripted(arrival: list[float], prompt: list[int], output: list[int], n_pre: int = 1, n_dec: int = 2) -> Simulation:
    r = Requests(np.array(arrival), np.array(prompt), np.array(output))
    pre, dec = engines(n_pre, n_dec)
    return Simulation(r, pre, dec, RoundRobin())


def test_sjf_takes_the_shortest_prompt_first_and_promotes_the_aged() -> None:
    from simulator.schedulers import SJFAging

    sim = scripted([0.0, 100.0, 200.0, 300.0], [900, 50, 400, 10], [2, 2, 2, 2])
    q = [0, 1, 2, 3]
    sim.now = 1000.0  # nobody has waited 5 s: shortest prompt first
    SJFAging(5000.0).order(sim, q, "prefill")
    assert q == [3, 1, 2, 0]
    sim.now = 5150.0  # request 0 (arrived at 0) and 1 (at 100) have now waited >= 5 s: oldest first, then SJF
    SJFAging(5000.0).order(sim, q, "prefill")
    assert q == [0, 1, 3, 2]


def test_larry_orders_by_its_score() -> None:
    from simulator.schedulers import Larry

    # score = alpha * waited s - queue length * prompt tokens, highest first
    sim = scripted([0.0, 0.0, 9000.0], [300, 100, 200], [2, 2, 2])
    sim.now = 10_000.0
    q = [0, 1, 2]
    Larry(alpha=1.0).order(sim, q, "decode")  # scores: 10-900, 10-300, 1-600
    assert q == [1, 2, 0]
    Larry(alpha=1000.0).order(sim, q, "decode")  # 10000-900, 10000-300, 1000-600: waiting dominates
    assert q == [1, 0, 2]


def test_srpt_orders_decode_by_tokens_left() -> None:
    from simulator.schedulers import SRPT

    sim = scripted([0.0, 0.0, 0.0], [10, 10, 10], [50, 20, 40])
    sim.progress[0] = 45  # request 0 was preempted after 45 of its 50 tokens: 5 left
    q = [2, 1, 0]
    SRPT().order(sim, q, "decode")  # tokens left: 5, 19, 39
    assert q == [0, 1, 2]


def test_no_preempt_reserves_the_longest_response_and_never_preempts() -> None:
    from simulator.schedulers import NoPreempt

    rng = np.random.default_rng(1)
    n = 300
    r = Requests(np.cumsum(rng.exponential(2.0, n)), rng.integers(50, 400, n), rng.integers(1, 200, n))
    pre, dec = engines(2, 2, max_seqs=64, kv_tokens=3000)  # the memory that forces preemptions under FCFS
    sim = Simulation(r, pre, dec, RoundRobin(), NoPreempt(int(r.output_len.max())))
    sim.run()
    check_conservation(sim)
    assert r.preemptions.sum() == 0


def test_sal_weighs_memory_shortfall_against_queued_tokens() -> None:
    from simulator.routers import SAL

    sim = scripted([0.0, 0.0, 0.0], [1000, 500, 500], [2, 2, 2])
    a, b = sim.decode
    a.context_sum = 9_500  # 500 tokens free of 10,000
    b.waiting = [1, 2]  # 1,000 prompt tokens queued, all memory free
    # request 0 (1,000 tokens): a: max(beta*(1000-500), 1000/1024); b: max(beta*(1000-8000), 2000/1024)
    assert SAL(beta=1.0, max_tokens_per_batch=1024).decode(sim, 0) == 1
    assert SAL(beta=0.001, max_tokens_per_batch=1024).decode(sim, 0) == 0  # memory barely counts: shorter queue wins


def test_mapper_minimises_the_largest_workload() -> None:
    from simulator.routers import Mapper

    sim = scripted([0.0] * 3, [100, 100, 100], [10, 10, 10], n_pre=3)
    m = Mapper(mean_output=10, std_output=0)
    m.loads["prefill"] = np.array([50.0, 0.0, 0.0])
    m.tokens["prefill"] = np.zeros(3)
    # every prompt costs 10 ms anywhere: engines 1 and 2 tie on the largest load (50); the lower index wins
    assert m.prefill(sim, 0) == 1
    assert m.prefill(sim, 1) == 2
    assert m.prefill(sim, 2) == 1  # 20 on either, below 50: the smaller resulting load, then the lower index
    m.prefilled(sim, 0)  # request 0 left engine 1: its 10 ms come off
    assert m.loads["prefill"].tolist() == pytest.approx([50.0, 10.0, 10.0])


def test_dp_select_goes_to_the_least_used_engine_only_when_one_is_saturated() -> None:
    from simulator.routers import DPSelect

    sim = scripted([0.0], [100], [10], n_dec=3)
    sel = DPSelect()
    assert [sel.decode(sim, 0) for _ in range(3)] == [0, 1, 2]  # round robin while nothing is saturated
    sim.decode[0].context_sum = 9_500  # 95 % used
    sim.decode[1].context_sum = 2_000
    assert sel.decode(sim, 0) == 2  # usage spread >= 0.1: the least-used engine


def test_arrivals_keep_their_rate_and_a_trace_its_order() -> None:
    from simulator.arrivals import arrivals_ms, from_trace, sampled

    rng = np.random.default_rng(0)
    t = arrivals_ms("poisson", 20000, 50.0, rng)
    assert len(t) / (t[-1] / 1e3) == pytest.approx(50.0, rel=0.03) and (np.diff(t) >= 0).all()
    assert np.allclose(np.diff(arrivals_ms("constant", 5, 4.0, rng)), 250.0)
    r = sampled(1000, (np.array([10, 20]), np.array([1, 3])), (np.array([5]), np.array([1])), "constant", 10.0, 0)
    assert set(r.input_len.tolist()) <= {10, 20} and np.mean(r.input_len == 20) == pytest.approx(0.75, abs=0.05)
    tr = from_trace(np.array([0.0, 1.0, 3.0]), np.array([7, 8, 9]), np.array([1, 2, 3]), rate_scale=2.0)
    assert tr.arrival.tolist() == [0.0, 500.0, 1500.0] and tr.input_len.tolist() == [7, 8, 9]
    with pytest.raises(ValueError, match="rate must be > 0"):
        arrivals_ms("poisson", 3, 0.0, rng)


def test_the_workload_arrival_model_keeps_its_traces_rate_bin_by_bin() -> None:
    """A trace with 5, 40, 0 and 15 requests in its four profile bins has the profile 1/3, 8/3, 0, 1. The model's
    arrivals at 100 req/s (from a random bin, round and round the profile) hold the mean rate, come in each bin
    at that bin's share, and never in the empty one."""
    from simulator.arrivals import PROFILE_BIN_S, modulated_ms, rate_profile

    within = np.linspace(0, 0.99, 5), np.linspace(0, 0.99, 40), np.linspace(0, 0.99, 15)
    trace = PROFILE_BIN_S * np.concatenate([within[0], 1 + within[1], 3 + within[2]])
    prof = rate_profile(trace)
    assert np.allclose(prof, [1 / 3, 8 / 3, 0.0, 1.0])
    t = modulated_ms(200_000, 100.0, prof, np.random.default_rng(1)) / 1e3
    assert (np.diff(t) >= 0).all() and len(t) == 200_000
    cycles = int(t[-1] // (4 * PROFILE_BIN_S))  # whole cycles of the profile
    whole = t[t < cycles * 4 * PROFILE_BIN_S]
    assert len(whole) / (cycles * 4 * PROFILE_BIN_S) == pytest.approx(100.0, rel=0.02)
    per_bin = np.bincount((whole // PROFILE_BIN_S).astype(int) % 4, minlength=4) / (cycles * PROFILE_BIN_S * 100.0)
    shift = int(np.argmax(per_bin)) - 1  # the walk's start: the busiest bin is the profile's second
    assert np.allclose(np.roll(per_bin, -shift), prof, atol=0.05)
    assert (per_bin == 0).sum() == 1  # the bin the trace left empty gets nothing


def test_a_replayed_trace_keeps_its_time_scale_at_any_rate() -> None:
    """arrivals=trace: the trace at 0, 1, 3 and 3.5 s (mean gap 7/6 s, so its day is 14/3 s) at twice its rate is
    each request at its own time and one copy in the gap after it, with the next request's lengths; at half its
    rate requests are dropped, never moved, and past the trace's end it starts again a mean gap after its last."""
    from simulator.arrivals import replayed

    t, ins, outs = np.array([0.0, 1.0, 3.0, 3.5]), np.array([10, 20, 30, 40]), np.array([1, 2, 3, 4])
    r, passes = replayed(t, ins, outs, 2.0, 8)
    own = np.isin(r.arrival, [0.0, 1000.0, 3000.0, 3500.0])
    assert own.sum() == 4 and r.input_len[own].tolist() == [10, 20, 30, 40]
    copies = r.arrival[~own] / 1e3
    gaps = [(0.0, 1.0), (1.0, 3.0), (3.0, 3.5), (3.5, 3.5 + 7 / 6)]  # each copy in the gap after its request
    assert all(lo < c < hi for c, (lo, hi) in zip(copies, gaps, strict=True))
    assert r.input_len[~own].tolist() == [20, 30, 40, 10] and r.output_len[~own].tolist() == [2, 3, 4, 1]
    assert passes == pytest.approx((r.arrival[-1] / 1e3 + 7 / 6) / (14 / 3))
    half, passes = replayed(t, ins, outs, 0.5, 40, seed=3)
    day_ms = 14 / 3 * 1e3
    place = half.arrival - np.floor(half.arrival / day_ms + 1e-9) * day_ms
    assert np.isclose(place[:, None], [0.0, 1000.0, 3000.0, 3500.0], atol=1e-6).any(axis=1).all()
    assert len(half.arrival) == 40 and (np.diff(half.arrival) > 0).all()
    assert passes == pytest.approx(20, rel=0.25)  # 40 requests at half of 4 a day: about 20 days


def test_a_replay_walks_many_passes_of_a_short_trace_at_once_and_refuses_past_its_limits() -> None:
    """A trace spanning 1.5 us replayed at 500 req/s keeps 1 request in 4,000 of 3: thousands of passes, walked
    a million requests at a time (not one pass per step), each request at its own place in the pass. Past
    `MAX_WALK` requests walked, or `MAX_COPIES` copies of one request, the replay is refused before it starts."""
    from simulator.arrivals import MAX_COPIES, MAX_WALK, replay_refusal, replayed

    t, ins, outs = np.array([0.0, 0.5e-6, 1e-6]), np.array([10, 20, 30]), np.array([1, 2, 3])
    scale = 500.0 / (3 / 1.5e-6)
    r, passes = replayed(t, ins, outs, scale, 500, seed=1)
    assert len(r.arrival) == 500 and (np.diff(r.arrival) >= 0).all()
    assert passes == pytest.approx(500 / scale / 3, rel=0.1)
    place = np.round((r.arrival % 1.5e-3) / 0.5e-3) % 3  # the request of the pass each arrival is (ms: 0.5e-3 apart)
    assert (r.input_len == ins[place.astype(int)]).all()
    assert replay_refusal(scale, 500, 3) == ""
    with pytest.raises(ValueError, match=rf"walk 1e\+08 of them, 3.33e\+07 times over its 3 \(at most {MAX_WALK:,}\)"):
        replayed(t, ins, outs, 1e-5, 1000)
    with pytest.raises(ValueError, match=rf"copies each of its requests 1e\+05 times, over the {MAX_COPIES:,}"):
        replayed(t, ins, outs, 1e5, 1000)


def test_the_code_trace_replayed_at_a_hundred_times_its_rate_keeps_its_bursts() -> None:
    """The Azure code trace (its 60-s rate reaches 3.8 x its mean for the p99 window) replayed at 100 x its rate:
    the rate in 10- and 60-s windows over the mean is the trace's own; compressing its timestamps by 100 instead
    (arrivals=trace_compressed) squeezes its hour into 36 s and leaves no 60-s burst at all."""
    from helpers import SHARED
    from pipeline.planning.traces import load_trace
    from simulator.arrivals import replayed

    trace = load_trace(SHARED / "data" / "traces" / "AzureLLMInferenceTrace_code.csv")

    def peaks(t_s: np.ndarray, window: float) -> float:
        c = np.bincount((t_s // window).astype(int)).astype(float)
        return float(np.percentile(c, 99) / c.mean())

    r, passes = replayed(trace.arrival_s, trace.input_tokens, trace.output_tokens, 100.0, 100 * len(trace))
    assert passes == pytest.approx(1.0, abs=0.01)
    for window in (10.0, 60.0):
        assert peaks(r.arrival / 1e3, window) == pytest.approx(peaks(trace.arrival_s, window), rel=0.03)
    assert peaks(trace.arrival_s, 60.0) > 3.5 and peaks(trace.arrival_s / 100, 60.0) == 1.0


def test_dp_select_keeps_a_user_on_their_engine_until_memory_saturates() -> None:
    from simulator.routers import DPSelect

    r = Requests(np.zeros(4), np.full(4, 100), np.full(4, 10), user=np.array([7, 7, -1, 7]))
    pre, dec = engines(1, 3)
    sim = Simulation(r, pre, dec, RoundRobin())
    sel = DPSelect()
    first = sel.decode(sim, 0)
    assert sel.decode(sim, 1) == first  # user 7 again: same engine, not the round-robin next
    assert sel.decode(sim, 2) != first  # no user: round robin moves on
    dec[first].context_sum = 9_500  # the user's engine is now saturated: affinity yields to the least used
    assert sel.decode(sim, 3) != first


def test_a_closed_loop_of_one_user_by_hand() -> None:
    """One user, four requests of 100 in / 5 out: each is sent when the previous finishes; 10 ms of prefill then
    4 steps of 5 ms, so every request takes 30 ms and the run 120 ms; the benchmark's metrics follow."""
    from simulator.metrics import benchmark_metrics

    r = Requests(np.zeros(4), np.full(4, 100), np.full(4, 5))
    pre, dec = engines()
    sim = Simulation(r, pre, dec, RoundRobin(), concurrency=1)
    sim.run()
    assert r.arrival == pytest.approx([0.0, 30.0, 60.0, 90.0], abs=1e-3)
    assert r.finish == pytest.approx([30.0, 60.0, 90.0, 120.0], abs=1e-3)
    m = benchmark_metrics(sim.r, gpus=2)
    assert m["median_ttft"] == pytest.approx(0.010, abs=1e-6) and m["median_tpot"] == pytest.approx(0.005, abs=1e-6)
    assert m["median_intvty"] == pytest.approx(200.0, rel=1e-3) and m["median_e2el"] == pytest.approx(0.030, abs=1e-6)
    assert m["tput_per_gpu"] == pytest.approx(4 * 105 / 0.120 / 2, rel=1e-4)  # 1,750 tokens/s per GPU
    assert m["output_tput_per_gpu"] == pytest.approx(4 * 5 / 0.120 / 2, rel=1e-4)
    check_conservation(sim)


def test_a_closed_loop_never_has_more_requests_in_flight_than_users() -> None:
    rng = np.random.default_rng(5)
    n, users = 400, 16
    r = Requests(np.zeros(n), rng.integers(50, 400, n), rng.integers(1, 100, n))
    pre, dec = engines(2, 2, max_seqs=8, kv_tokens=4000)
    sim = Simulation(r, pre, dec, RoundRobin(), concurrency=users)
    sim.run()
    check_conservation(sim)
    assert (np.diff(r.arrival) >= 0).all() and (r.arrival[:users] == 0).all()
    # each later request is sent the moment an earlier one finished, so `users` are always in flight until the end
    assert set(np.round(r.arrival[users:], 6)) <= set(np.round(r.finish, 6))
    for t in r.arrival:
        assert int(((r.arrival <= t) & (r.finish > t)).sum()) <= users
    with pytest.raises(ValueError, match="at least one user"):
        Simulation(r, pre, dec, RoundRobin(), concurrency=0)


def test_an_aggregated_engine_polls_for_requests_as_launched_by_hand() -> None:
    """SGLang's --scheduler-recv-interval N: while it decodes, an engine takes new requests only once N decode-only
    steps have passed since its last poll, and right after a step that prefilled; idle, it takes one at once. Decode
    5 ms a step, prefill 1 ms a token: A (10 tokens) arrives at 0 on an idle engine and prefills in [0, 10); B (10
    tokens) arrives at 12 ms. Polling every step, B is taken at 15 and prefilled beside A's decode in [15, 30): TTFT
    18 ms. Every 4 steps, the steps ending at 15, 20, 25, 30 pass before the poll at 30: B's step is [30, 45), TTFT
    33 ms, and after that prefill the engine polls again at once."""
    from simulator.aggregated import AggregatedEngine, AggregatedSimulation

    linear = PrefillTiming(np.array([1.0, 1e6]), np.array([1.0, 1e6]), 1.0, 1.0)  # n tokens: n ms
    ttft = {}
    for every in (1, 4):
        r = Requests(np.array([0.0, 12.0]), np.array([10, 10]), np.array([100, 2]))
        engine = AggregatedEngine(0, flat_decode(5.0), linear, chunk=100, recv_interval=every)
        AggregatedSimulation(r, [engine]).run()
        assert r.first_token[0] == pytest.approx(10.0)
        ttft[every] = r.first_token[1] - r.arrival[1]
        assert not engine.inbox
    assert ttft == pytest.approx({1: 18.0, 4: 33.0})
    with pytest.raises(ValueError, match="steps between polls must be at least 1"):
        AggregatedSimulation(Requests(np.zeros(1), np.array([10]), np.array([2])),
                             [AggregatedEngine(0, flat_decode(), linear, chunk=100, recv_interval=0)])  # fmt: skip


def test_an_aggregated_engine_by_hand() -> None:
    """One aggregated engine, chunk 100 tokens, prefill 1 ms a token (linear), decode 5 ms a step: a request of 250
    prompt tokens and 3 output tokens takes 3 chunked steps (100, 100, 50 tokens: 100, 100, 50 ms), its first token
    at 250 ms, then 2 decode steps of 5 ms: done at 260 ms. A second user's request admitted meanwhile shares the
    steps: its prefill pieces add to them, its decode steps run beside the first's."""
    from simulator.aggregated import AggregatedEngine, AggregatedSimulation
    from simulator.metrics import benchmark_metrics

    linear = PrefillTiming(np.array([1.0, 1e6]), np.array([1.0, 1e6]), 1.0, 1.0)  # n tokens: n ms
    r = Requests(np.zeros(1), np.array([250]), np.array([3]))
    engine = AggregatedEngine(0, flat_decode(5.0, max_seqs=8, kv_tokens=10_000), linear, chunk=100)
    sim = AggregatedSimulation(r, [engine], concurrency=1)
    sim.run()
    assert r.first_token[0] == pytest.approx(250.0) and r.finish[0] == pytest.approx(260.0)
    assert engine.reserved == 0 and engine.context == 0 and not engine.running
    # two users: B (100 tokens, 2 out) arrives with A (250, 3) at 0; chunk 100 goes to A first (FIFO):
    # step 1 [0, 100): A 0-100; step 2 [100, 200): A 100-200; step 3 [200, 300): A 200-250 + B 0-50 (50 + 50 ms);
    # A's first token at 300; step 4: A decodes (5 ms) + B 50-100 (50 ms) -> 355, B's first token; step 5: both
    # decode -> 360: A done (3 tokens); step 6: B decodes -> 365: B done... B needs 2 tokens: first at 355, one
    # more at 360 -> B done at 360 too.
    r2 = Requests(np.zeros(2), np.array([250, 100]), np.array([3, 2]))
    engine2 = AggregatedEngine(0, flat_decode(5.0, max_seqs=8, kv_tokens=10_000), linear, chunk=100)
    AggregatedSimulation(r2, [engine2], concurrency=2).run()
    assert list(r2.first_token) == pytest.approx([300.0, 355.0]) and list(r2.finish) == pytest.approx([360.0, 360.0])
    m = benchmark_metrics(r2, gpus=1)
    assert m["median_ttft"] == pytest.approx((0.300 + 0.355) / 2) and m["duration_s"] == pytest.approx(0.360)
    with pytest.raises(ValueError, match="more than engine 0 holds"):
        small = AggregatedEngine(0, flat_decode(5.0, max_seqs=8, kv_tokens=100), linear, chunk=100)
        AggregatedSimulation(Requests(np.zeros(1), np.array([250]), np.array([3])), [small]).run()


def quadratic_prefill(ranks: int = 1) -> PrefillTiming:
    """A prompt of s tokens: a forward's fixed 20 ms, 1 ms a token, and attention s^2 / 1000 ms (its share)."""
    s = np.array([1.0, 50.0, 100.0, 150.0, 200.0, 250.0, 300.0, 400.0])
    return PrefillTiming(s, 20.0 + s + s**2 / 1000, 1.0, 1.0, attention=s**2 / 1000, ranks=ranks)


def test_a_chunk_of_several_prompts_is_one_forward_by_hand() -> None:
    """A chunk is one forward: its fixed time once, its tokens' work at the chunk's tokens, each prompt's attention
    its own (fixed 20 ms, 1 ms a token, attention s^2 / 1000 ms). Four prompts of 100 tokens in a chunk of 400: 20 +
    400 + 4 x 10 = 460 ms, not 4 x 130 = 520. A 250-token prompt in chunks of 100: 130, then 100 tokens attending to
    200 (20 + 100 + 40 - 10 = 150), then 50 attending to 250 (20 + 50 + 62.5 - 40 = 92.5): its first token at 372.5
    ms. Spread over 2 ranks, the four prompts are 200 tokens a rank: 20 + 200 + 4 x 10 / 2 = 240 ms. Simulated, the
    first arrival finds the engine idle and goes alone (130 ms), the three queued behind it in one forward of 300
    tokens (20 + 300 + 30 = 350), an aggregated engine's beside a decode step, a disaggregated one's (budget 400)
    alone."""
    from simulator.aggregated import AggregatedEngine, AggregatedSimulation

    timing = quadratic_prefill()
    assert timing.forward_ms([(0, 100)] * 4) == pytest.approx(460.0)
    assert timing.forward_ms([(0, 100)]) == pytest.approx(timing.prefill_ms(100)) == pytest.approx(130.0)
    assert quadratic_prefill(ranks=2).forward_ms([(0, 100)] * 4) == pytest.approx(240.0)
    assert dataclasses.replace(timing, attention=None).forward_ms([(0, 100)] * 4) == pytest.approx(520.0)

    r = Requests(np.zeros(4), np.full(4, 100), np.full(4, 2))
    engine = AggregatedEngine(0, flat_decode(5.0), timing, chunk=400)
    AggregatedSimulation(r, [engine]).run()
    # the first arrival finds the engine idle and starts alone; the other three share the next step's chunk, beside
    # its decode (5 ms): 130 + 5 + (20 + 300 + 30)
    assert list(r.first_token) == pytest.approx([130.0, 485.0, 485.0, 485.0])
    assert list(r.finish) == pytest.approx([485.0, 490.0, 490.0, 490.0])
    r = Requests(np.zeros(1), np.array([250]), np.array([2]))
    AggregatedSimulation(r, [AggregatedEngine(0, flat_decode(5.0), timing, chunk=100)]).run()
    assert r.first_token[0] == pytest.approx(372.5)

    r = Requests(np.zeros(4), np.full(4, 100), np.full(4, 1))
    sim = Simulation(r, [PrefillEngine(0, 0, timing, 400)], [DecodeEngine(0, 1, flat_decode(), timing)], RoundRobin())
    sim.run()
    assert list(r.first_token) == pytest.approx([130.0, 480.0, 480.0, 480.0])


def test_a_dense_models_plan_keeps_up_with_its_rate_and_no_more(tmp_path) -> None:
    """Llama-3.3-70B on tiny_hetero (no SLOs): its islands simulated as replicas of their TP group (a prefill island
    of dp engines, every one prefilling apart) keep up with 0.9 x the plan's rate and fall behind at 1.3 x."""
    import plan as plans
    from helpers import kept_at, plan_of
    path, _ = plan_of(tmp_path, "model=llama_3_3_70b", "costmodel=calibrated", "slo.ttft_ms=null", "slo.tpot_ms=null")
    kept = kept_at(plans.load(path), (0.9, 1.3))
    assert kept[0.9] > 0.95 and kept[1.3] < 0.9, kept


def test_the_step_tables_interpolate_as_numpy_does_bit_for_bit() -> None:
    """`timing.interp` and `grid_position` (plain Python, called at every simulated step) give what `np.interp`
    gives, to the last bit: below, at and beyond a grid's ends, on its points and between them, ints and floats."""
    from simulator.timing import grid_position, interp

    rng = np.random.default_rng(5)
    for k in range(300):
        xs = np.unique(np.geomspace(1, rng.integers(2, 10**6), rng.integers(2, 60)).round() if k % 2
                       else rng.random(rng.integers(2, 60)) * 1000)  # fmt: skip
        if len(xs) < 2:
            continue
        ys = rng.normal(size=len(xs)) * 100
        grid, values = xs.tolist(), ys.tolist()
        points = [*(rng.random(40) * xs[-1] * 1.2 - 1).tolist(), *xs.tolist(), *rng.integers(0, int(xs[-1]) + 2, 20)]
        for x in points:
            assert interp(x, grid, values) == float(np.interp(x, xs, ys))
            b = np.interp(x, xs, np.arange(len(xs)))
            i = min(int(b), len(xs) - 2)
            assert grid_position(x, grid) == (i, b - i)

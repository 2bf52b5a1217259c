"""Each strategy family's contract, run over every registered member: a new sampler, layout
generator, router or scheduler is one file plus one registry line, and inherits these tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest

from costmodel.catalog import load_gpu
from helpers import island, plan_with
from pipeline.errors import ConfigError
from pipeline.search.samplers import SAMPLERS, make_sampler
from pipeline.search.space import GENERATORS, Space
from plan import Plan
from simulator.build import build
from simulator.core import Simulation
from simulator.requests import Requests
from simulator.routers import ROUTERS
from simulator.schedulers import SCHEDULERS, make_scheduler
from solvers.layouts import LayoutRejected

INVENTORY = (("H200", 16), ("H800", 16), ("H20", 32))
MINS = (("H200", 2), ("H800", 2), ("H20", 4))


def space(generator: str) -> Space:
    return Space(generator, INVENTORY, MINS, skew_range=3.0, max_islands=8, k_slots=4, repair=True)


def proposals(name: str, seed: int, n: int = 11) -> list[dict[str, Any]]:
    """`n` proposals, each told before the next: the model-based samplers (tpe, gp, saasbo) start with
    10 independent ones, so the 11th comes from the fitted model (for saasbo, a NUTS fit of ~7 s)."""
    sp = space("divider")
    try:
        sampler = make_sampler(name, seed, sp)
    except ConfigError as err:  # an optional extra this machine lacks: the message says which
        pytest.skip(str(err))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    out = []
    for k in range(n):
        t = study.ask(sp.distributions())
        study.tell(t, float(sum(v for v in t.params.values())) + k)  # any deterministic score
        out.append(dict(t.params))
    return out


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_sampler_proposes_inside_the_space_and_repeats_under_a_seed(name: str) -> None:
    dists = space("divider").distributions()
    first = proposals(name, 3)
    for params in first:
        assert set(params) == set(dists)
        for k, v in params.items():
            assert dists[k]._contains(dists[k].to_internal_repr(v)), (k, v)
    assert proposals(name, 3) == first


@pytest.mark.parametrize("node", [None, 8, 4], ids=["any", "node8", "node4"])
@pytest.mark.parametrize("generator", GENERATORS)
def test_generator_layouts_fit_the_inventory_and_are_deterministic(generator: str, node: int | None) -> None:
    sp = space(generator)
    if node is not None:  # node-aligned shapes: every island a divisor of a host or whole hosts
        sp = Space(generator, INVENTORY, MINS, skew_range=3.0, max_islands=8, k_slots=4, repair=True,
                   node=tuple((g, node) for g, _ in INVENTORY))  # fmt: skip
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    counts, mins = dict(INVENTORY), dict(MINS)
    made = 0
    for _ in range(60):
        params = study.ask(sp.distributions()).params
        try:
            layout = sp.layout(params)
        except LayoutRejected:
            continue
        made += 1
        assert layout == sp.layout(params)
        for gpu, count in counts.items():
            sizes = [n for g, n in layout if g == gpu]
            assert sum(sizes) <= count and all(n >= mins[gpu] for n in sizes), (gpu, layout)
            if node is not None:
                assert all(node % n == 0 or n % node == 0 for n in sizes), (gpu, layout)
                assert set(sizes) <= set(sp.sizes(gpu))  # the reference's classes hold every proposed size
    assert made >= 30


def plan() -> Plan:
    ranges = [(0, 2000, 0.5), (2000, 8000, 0.5)]
    return plan_with([
        island("H200", 8, "prefill", 8, 1, 8, 1, ranges),
        island("H200", 8, "prefill", 4, 2, 8, 2, ranges),
        island("H200", 16, "decode", 1, 2, 8, 32, [(0, 2000, 1.0), (2000, 8000, 1.0)]),
    ])  # fmt: skip


def simulate(router: str, scheduler: str, check_order: bool = False) -> Simulation:
    rng = np.random.default_rng(0)
    n = 400
    r = Requests(np.cumsum(rng.exponential(50.0, n)), rng.integers(50, 6000, n), rng.integers(2, 200, n),
                 rng.integers(0, 20, n), session=rng.integers(0, 60, n))  # users and sessions, for the routers of them
    stats = {"mean_input": r.input_len.mean(), "mean_output": r.output_len.mean(), "std_output": r.output_len.std()}
    gpus = {g: load_gpu(g) for g in ("H200", "H20")}
    pre, dec, rt = build(plan(), gpus, router=router, max_len=6000, max_context=6200, stats=stats)
    sched = make_scheduler(scheduler, max_output=200)
    if check_order:
        original = sched.order

        def order(sim: Simulation, queue: list[int], phase: str) -> None:
            before = sorted(queue)
            original(sim, queue, phase)
            assert sorted(queue) == before, "a scheduler must reorder its queue, never drop or add to it"

        sched.order = order  # type: ignore[method-assign]
    sim = Simulation(r, pre, dec, rt, sched)
    sim.run()
    return sim


@pytest.mark.parametrize("router", ROUTERS)
def test_router_sends_every_request_to_a_valid_engine_and_loses_none(router: str) -> None:
    sim = simulate(router, "fcfs")
    r = sim.r
    assert ((r.prefill_engine >= 0) & (r.prefill_engine < len(sim.prefill))).all()
    assert ((r.decode_engine >= 0) & (r.decode_engine < len(sim.decode))).all()
    assert np.isfinite(r.finish).all() and (r.finish >= r.first_token).all()


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_scheduler_keeps_its_queue_a_permutation_and_loses_no_request(scheduler: str) -> None:
    sim = simulate("round_robin", scheduler, check_order=True)
    assert np.isfinite(sim.r.finish).all() and (sim.r.first_token >= sim.r.arrival).all()
    for d in sim.decode:
        assert not d.running and not d.waiting and d.context_sum == 0


def test_registries_fail_with_the_valid_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"search.sampler='annealing' is unknown: choose from \['tpe'"):
        make_sampler("annealing", 0, space("divider"))
    with pytest.raises(ValueError, match=r"scheduler='lifo' is unknown: choose from \['fcfs'"):
        make_scheduler("lifo", max_output=1)

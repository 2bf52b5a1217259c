"""The suite every engine adapter of `deployment.engines.ENGINES` passes: its command for every engine host of every
plan (the Table 5.1 plans, the tests' own plan, and the tests' plans with MTP, with decode islands priced with one
micro-batch, with an aggregated island, on B200s) is accepted by the engine's own settings resolution and checks, and
every row of the parameter table it takes reads back as the plan priced it; what an engine cannot run is refused
before a launch file is written, with the fix. The engines' own checks need their code: SGLang installed, vLLM's
pinned source (deployment.engines.vllm.args.vllm_source)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import plan as plans
from deployment.deployable import engines
from deployment.engines import ENGINES, adapter
from deployment.engines.base import Adapter, EngineArgsMissing, EngineRefused
from deployment.errors import DeployError
from deployment.options import DeployOptions
from deployment.parameters import PARAMETERS, taken
from helpers import REPO, plan_of

PLANS = sorted((REPO / "tests" / "data" / "plans").glob("*.json"))
B200 = ("~inventory.gpus.H800", "~inventory.gpus.H20", "~inventory.gpus.H200", "+inventory.gpus.DGX-B200=16")
# the tests' own plans (tests/helpers.py plan_of): as built, with MTP, priced with one micro-batch where faster, and on
# B200s with the experts in FP8 (vLLM's launch files load them so; SGLang's FP4 path: tests/test_sglang_check.py)
MADE = {"tiny": (), "mtp": ("costmodel.mtp.drafts=1",), "serving": ("costmodel=serving",),
        "b200": (*B200, "costmodel=serving", "+costmodel.fixes.experts_fp8=true")}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest) -> Adapter:
    """Each adapter, its engine's own check loaded (once per test process)."""
    a = ENGINES[request.param]
    try:
        if a.name == "vllm":
            from deployment.engines.vllm import check

            check._vllm()
        else:
            from deployment.engines.sglang import check  # type: ignore[no-redef]

            check.resolve(["--model-path", "m", "--tp-size", "8"], "H20")
    except EngineArgsMissing as err:
        pytest.fail(f"{a.title}'s own check needs its code here: {err}")
    return a


def off_plan(a: Adapter, plan: Any) -> list[str]:
    """What the engine refuses, or resolves otherwise than the plan priced, on every host of every engine of `plan`
    (the leader's command and a worker's): one line each."""
    out = []
    for e in engines(plan):
        for rank in (0, 1) if e.nnodes > 1 else (0,):
            try:
                rows = a.check(plan, e, rank, DeployOptions(engine=a.name))
            except EngineRefused as err:
                out.append(f"{e.name} rank {rank} ({e.gpus} x {e.gpu}, TP {e.attn_tp} x DP {e.attn_dp}): {err}")
                continue
            out += [f"{e.name} rank {rank}: {r.name} resolves to {r.resolved}, the plan has {r.plan}"
                    for r in rows if not r.holds]  # fmt: skip
            named = {r.name for r in rows}
            for p, flags in taken(a.name):  # every row the engine takes, read back
                if p.planned(e, DeployOptions(engine=a.name, engine_options=a.Options())) is not None:
                    assert (flags.label or p.name) in named, (e.name, p.name)
    return out


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_every_engine_of_the_table_plans_runs_what_they_priced(engine: Adapter, path: Path) -> None:
    off = off_plan(engine, plans.load(path))
    assert not off, "\n".join([f"{engine.title}:", *off])


@pytest.mark.parametrize("made", sorted(MADE))
def test_every_engine_of_the_tests_plans_runs_what_they_priced(engine: Adapter, tmp_path: Path, made: str) -> None:
    plan = plans.load(plan_of(tmp_path, *MADE[made])[0])
    off = off_plan(engine, plan)
    assert not off, "\n".join([f"{engine.title}:", *off])
    if made == "mtp":
        assert all(e.drafts == 1 for e in engines(plan))
    if made == "serving":  # decode islands priced with one micro-batch where that is faster at their batch
        assert plan.cost.profile.overlap_chosen
    if made == "b200":  # on a compute-capability 10.0 device probe
        assert {e.gpu for e in engines(plan)} == {"DGX-B200"}


def test_an_aggregated_island_runs_what_it_priced(engine: Adapter, tmp_path: Path) -> None:
    from test_aggregated import one_island_plan

    plan = plans.load(one_island_plan(tmp_path))
    assert [e.role for e in engines(plan)] == ["aggregated"] * len(engines(plan))
    off = off_plan(engine, plan)
    assert not off, "\n".join([f"{engine.title}:", *off])


def test_a_departure_from_the_plan_is_read_back_as_one(engine: Adapter) -> None:
    """The read-back can fail: an engine record changed after its command was written resolves otherwise."""
    plan = plans.load(PLANS[0])
    e = next(e for e in engines(plan) if e.role == "decode")
    opts = DeployOptions(engine=engine.name)
    changed = dataclasses.replace(e, decode_batch=e.decode_batch + 1, overlap=not e.overlap, kv_dtype="bf16")
    assert all(r.holds for r in engine.check(plan, e, 0, opts))
    launch = engine.command(e, 0, engine.own(opts))
    from deployment.launch import example_argv, example_env

    argv = example_argv(launch, 0)[len(engine.program) :]
    off = {
        r.name for r in engine.settings(plan, changed, argv, example_env(launch, 0), engine.own(opts)) if not r.holds
    }
    assert len(off) >= 3, off  # the batch (and what follows from it), the overlap and the KV format


def test_every_row_names_what_each_engine_writes_and_reads() -> None:
    """The table is whole: every row has a planned value and, for every engine, a writer and a read-back; every
    engine takes every row."""
    assert PARAMETERS
    for p in PARAMETERS:
        assert set(p.engines) == set(ENGINES), p.name
        for name, flags in p.engines.items():
            assert callable(flags.write) and callable(flags.read), (p.name, name)


def test_an_unknown_engine_is_refused_with_the_choices() -> None:
    with pytest.raises(DeployError, match=r"engine='tgi': unknown engine; choose from \['sglang', 'vllm'\]"):
        adapter("tgi")


def test_what_an_engine_cannot_run_is_refused_before_any_file(engine: Adapter) -> None:
    """FP4 experts: SGLang requantizes the FP8 checkpoint's experts as they load; vLLM's launch files would load them
    in FP8, so its adapter refuses, naming the fix."""
    plan = plans.load(PLANS[0])
    e = dataclasses.replace(engines(plan)[0], experts="fp4")
    opts = DeployOptions(engine=engine.name)
    if engine.name == "vllm":
        with pytest.raises(DeployError, match=r"priced with FP4 routed experts.*experts_fp8=true"):
            engine.command(e, 0, opts)
    else:
        assert "--quantization" in engine.command(e, 0, opts).argv


def test_an_engine_takes_only_its_own_options(engine: Adapter) -> None:
    other = next(a for a in ENGINES.values() if a.name != engine.name)
    with pytest.raises(DeployError, match=f"engine={engine.name} takes {engine.Options.__name__} options"):
        engine.own(DeployOptions(engine=engine.name, engine_options=other.Options()))
    assert isinstance(engine.own(DeployOptions(engine=engine.name)).engine_options, engine.Options)

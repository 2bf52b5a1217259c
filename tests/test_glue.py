"""The glue's contract with its user: one cost-settings record end to end, a journal that survives
kills, logging that never loses or doubles a trial, and one clear line for every bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from costmodel.catalog import CONF_DIR
from costmodel.profile import CostProfile
from costmodel.settings import CostSettings
from costmodel.specs import SpecError
from pipeline.records.journal import Journal, write_json

REPO = Path(__file__).resolve().parents[1]
SMALL = ["+inventory=tiny_hetero", "ranges.width=1000", "search.batch=4", "ray.num_cpus=2"]


def cli(module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> Any:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def one_line(r: Any, start: str, code: int = 2) -> None:
    assert r.returncode == code, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), r.stderr


# --- one cost-settings record ---------------------------------------------------------------------


def test_cost_settings_round_trip_whole() -> None:
    cost = CostSettings(CostProfile.corrected().with_fixes(causal_attention=False), 0.3, True, 2000.0, None)
    back = CostSettings.from_json(json.loads(json.dumps(cost.to_json())), "plan.json")
    assert back == cost and back.profile.name == "corrected[-causal_attention]"
    with pytest.raises(SpecError, match=r"plan\.json: `cost\.switches` must give every cost-model fix"):
        CostSettings.from_json({**cost.to_json(), "switches": {"warp": True}}, "plan.json")
    with pytest.raises(SpecError, match=r"`0 <= cache_hit < 1` must hold"):
        CostSettings.from_json({**cost.to_json(), "cache_hit": 1.5}, "plan.json")


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("search", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def plan_of(tmp: Path, *overrides: str) -> tuple[Path, Any]:
    """A plan.json as the search writes it, for the exact layout of tiny_hetero under `overrides`."""
    from pipeline.records.report import build_plan
    from pipeline.search.reference import exact_layout, reference
    from pipeline.search.settings import inventory_of, settings_from_cfg

    cfg = compose(["+inventory=tiny_hetero", "ranges.width=1000", f"out_root={tmp}/out", *overrides])
    settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    layout = exact_layout(reference(settings, ctx, ctx.planner))
    assert layout is not None
    plan = build_plan(ctx.planner, layout, 10.0)
    plan.update(model=ctx.planner.model.name, cost_profile=ctx.planner.profile.name, workload="azure_code")
    path = tmp / "plan.json"
    write_json(path, plan)
    return path, ctx.planner


def test_a_plan_with_a_fix_switched_off_is_simulated_with_exactly_that_model(tmp_path: Path) -> None:
    # regression: the profile name `corrected[-causal_attention]` was rejected by pipeline.simulate
    path, planner = plan_of(tmp_path, "+costmodel.fixes.causal_attention=false")
    r = cli("pipeline.simulate", f"plan={path}", "requests=300", f"out_root={tmp_path}/sim",
            f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db")  # fmt: skip
    assert r.returncode == 0, r.stderr
    from pipeline.simulate import plan_model

    _, cost = plan_model(json.loads(path.read_text()), path)
    assert cost == planner.cost and not cost.profile.causal_attention


def test_a_shallowsim_plan_is_simulated_with_its_cache_hit(tmp_path: Path) -> None:
    # regression: a shallowsim plan (cache_hit 0.563) was simulated with cache_hit 0
    from costmodel.catalog import load_gpu
    from pipeline.simulate import plan_model
    from simulator.timing import prefill_timing

    path, planner = plan_of(tmp_path, "costmodel=shallowsim")
    model, cost = plan_model(json.loads(path.read_text()), path)
    assert cost == planner.cost and cost.cache_hit == pytest.approx(0.563) and cost.profile.name == "shallowsim"
    gpu = load_gpu("H200")
    with_hit = prefill_timing(gpu, model, 8, 1, 4096, cost)
    without = prefill_timing(gpu, model, 8, 1, 4096, CostSettings(cost.profile))
    from costmodel.formulas import prefill_time_ms

    s = with_hit.lengths
    expected = prefill_time_ms(gpu, model, s, np.full_like(s, 8), np.ones_like(s), 0.563, cost.profile)
    assert np.allclose(with_hit.ms, expected, rtol=1e-12)  # the plan's cache hit, exactly
    assert (with_hit.ms[s > 100] < without.ms[s > 100]).all()


# --- journal and atomic writes --------------------------------------------------------------------


def test_a_torn_journal_line_is_dropped_on_every_later_resume(tmp_path: Path) -> None:
    j = Journal(tmp_path / "trials.jsonl")
    j.append({"trial": 0})
    with j.path.open("a") as f:
        f.write('{"trial": 1, "sc')  # a kill mid-write
    assert j.load() == [{"trial": 0}]
    j.append({"trial": 1})  # the resumed run re-does trial 1 on a line of its own
    j.append({"trial": 2})
    assert j.load() == [{"trial": 0}, {"trial": 1}, {"trial": 2}]
    assert Journal(j.path).load() == j.load()  # and the next resume reads the same


def test_a_batch_journalled_after_a_torn_line_loads_whole(tmp_path: Path) -> None:
    j = Journal(tmp_path / "trials.jsonl")
    j.append({"trial": 0})
    with j.path.open("a") as f:
        f.write('{"trial": 1, "sc')  # a kill mid-write
    j.extend([{"trial": 1}, {"trial": 2}, {"trial": 3}])
    assert j.load() == [{"trial": k} for k in range(4)]


def test_write_json_replaces_whole_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    p = tmp_path / "state.json"
    write_json(p, {"a": 1})
    write_json(p, {"b": [1, 2]})
    assert json.loads(p.read_text()) == {"b": [1, 2]} and [x.name for x in tmp_path.iterdir()] == ["state.json"]


# --- logging never loses or doubles a trial -------------------------------------------------------


class FlakyTracker:
    """A store that refuses the first `down` writes (locked), then takes everything; with `bulk`, a
    write is a whole batch, all or none (a SQL store), else one child run."""

    def __init__(self, down: int, bulk: bool = False) -> None:
        self.down, self.bulk, self.logged = down, bulk, []

    def children(self, runs: Any) -> None:
        assert self.bulk or len(runs) == 1
        if self.down > 0:
            self.down -= 1
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        self.logged += [(c.name, c.failed) for c in runs]


@pytest.mark.parametrize("bulk", [False, True], ids=["one-by-one", "bulk"])
def test_a_locked_store_neither_fails_nor_doubles_a_finished_trial(tmp_path: Path, bulk: bool) -> None:
    from pipeline.search.settings import inventory_of, settings_from_cfg
    from pipeline.tune.driver import SearchRun

    cfg = compose([*SMALL, f"out_root={tmp_path}/out", "search.iterations=1"])
    settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    tracker = FlakyTracker(down=2, bulk=bulk)
    run = SearchRun(settings, ctx, tracker)
    ok = {"status": "optimal", "score": 1.0, "islands": "H200x8", "note": ""}
    run.add_batch([({"n_H200": 0}, ok, None)])  # refused
    run.add_batch([({"n_H200": 1}, ok, None)])  # refused
    run.add_batch([({"n_H200": k}, ok, None) for k in (2, 3)])  # a batch back together: one write
    assert [r["status"] for r in run.journal.load()] == ["optimal"] * 4  # journalled once each, none failed
    assert [r["trial"] for r in run.journal.load()] == [0, 1, 2, 3] == [r["trial"] for r in run.records]
    assert tracker.logged == [(f"trial-{k:04d}", False) for k in range(4)]  # caught up, in order, once
    # a resume logs exactly the journalled trials MLflow does not have
    run.reconcile({"trial-0000", "trial-0002"})
    assert [r["trial"] for r in run.unlogged] == [1, 3]


def test_a_reference_stopped_by_its_time_limit_bounds_the_gap(tmp_path: Path) -> None:
    """A reference with a layout but no proof: the gap is against its proven bound, and says so."""
    from pipeline.records.report import report
    from pipeline.search.settings import inventory_of, settings_from_cfg
    from pipeline.tune.driver import SearchRun
    from solvers.exact import ExactResult

    cfg = compose([*SMALL, f"out_root={tmp_path}/out", "search.iterations=1"])
    settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    run = SearchRun(settings, ctx, FlakyTracker(down=0))
    run.ref = ExactResult("optimal", 100.0, 1.0, (), 1.0, 1, 100.0)
    assert not run.gap_is_bound and run.gap(95.0) == pytest.approx(0.05) and run.gap_text(0.05) == "gap 5.00%"
    run.ref = ExactResult("feasible", 90.0, 1.0, (), 1.0, 1, 120.0)  # incumbent 90, optimum <= 120
    assert run.gap_is_bound and run.gap(96.0) == pytest.approx(0.2)  # against the bound, not the incumbent
    assert run.gap_text(0.2) == "gap <= 20.00%"
    plan = {"rate_req_s": 96.0, "output_tok_s": 1.0, "evaluated_req_s": 96.0, "cost_per_hour": 1.0,
            "rate_per_dollar": 96.0, "searched_req_s": 96.0, "reference_optimum_req_s": 90.0, "gap": 0.2,
            "gap_is_bound": True, "reference_bound_req_s": 120.0, "trials": 1, "prefill_islands": 0,
            "decode_islands": 0, "islands": []}  # fmt: skip
    text = report(plan, pd.DataFrame(), "# plan")
    assert (
        "| gap to it | at most 20.00% (the reference stopped at its time limit; the optimum is at most 120.00" in text
    )
    assert "| the exact reference, stopped at its time limit: its layout | 90.00 req/s |" in text  # not "optimum"


def test_identical_islands_side_by_side_share_a_row_of_the_report(tmp_path: Path) -> None:
    """A 10,000-GPU plan has hundreds of identical islands: report.md gives each run of them one row, (xN)
    counting them, and the node map the hosts they cover."""
    from pipeline.records.report import report

    path, _ = plan_of(tmp_path)
    plan = json.loads(path.read_text())
    first = next(isl for isl in plan["islands"] if isl["role"] != "idle")
    copies = [{**first, "nodes": [10 + k], "placement": f"{first['gpu']} node {10 + k}"} for k in range(3)]
    plan["islands"] = copies + [isl for isl in plan["islands"] if isl is not first]
    plan["trials"] = 1
    text = report(plan, pd.DataFrame(), "# plan")
    name = f"{first['size']} x {first['gpu']}"
    islands_table = text.split("Node map")[0]
    assert islands_table.count(f"| {name} (x3) | {first['role']} |") == 1
    assert f"| {first['gpu']} nodes 10-12 | {name} (x3) | {first['role']} |" in text
    assert text.count(f"{name} (x3)") == 2  # one row in each table


def test_once_jax_is_loaded_the_reference_runs_in_a_fork_server_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JAX (the saasbo sampler's fits) must not be forked: the reference's MILP then starts from a
    fork server, and solves to the same optimum."""
    import types

    from pipeline.search import reference as ref_mod
    from pipeline.search.settings import inventory_of, settings_from_cfg

    cfg = compose(["+inventory=tiny_hetero", "ranges.width=1000", f"out_root={tmp_path}/out"])
    settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
    methods: list[str] = []
    real = ref_mod.mp.get_context
    monkeypatch.setattr(ref_mod.mp, "get_context", lambda method: methods.append(method) or real(method))
    monkeypatch.setitem(sys.modules, "jax", sys.modules.get("jax") or types.ModuleType("jax"))
    served = ref_mod.reference(settings, ctx, ctx.planner)
    assert methods == ["forkserver"]
    monkeypatch.setattr(ref_mod, "interruptible", lambda fn, *args, tick=None, **kw: fn(*args, **kw))
    here = ref_mod.reference(settings, ctx, ctx.planner)  # the same MILP in this process
    assert served.status == here.status == "optimal" and served.islands == here.islands
    assert served.rate_req_s == pytest.approx(here.rate_req_s, rel=1e-9)


# --- bad inputs: one line, exit 2 -----------------------------------------------------------------


def search(tmp: Path, *args: str, timeout: float = 180) -> Any:
    own = [a for a in (f"out_root={tmp}/out", f"mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db")
           if not any(x.startswith(a.partition("=")[0] + "=") for x in args)]  # fmt: skip
    return cli("pipeline.search", *args, *own, timeout=timeout)


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["search.skew_range=abc"], "error: search.skew_range must be a number >= 0, got search.skew_range='abc'"),
        (["ray.cpus_per_trial=0"], "error: ray.cpus_per_trial must be a number >= 0.01, got ray.cpus_per_trial=0"),
        (["search.inner_time_limit_s=-1"], "error: search.inner_time_limit_s must be a number >= 0.001, got"),
        (["ranges.width=100000"], "error: ranges.width=100000 cuts workload azure_code's input lengths 0..7437 into"),
        (["out_root=/proc/x"], "error: out_root=/proc/x: cannot create the folder"),
        (["out_root=/etc/passwd/x"], "error: out_root=/etc/passwd/x: cannot create the folder"),
        (["mlflow.tracking_uri=bogus://nowhere"], "error: mlflow.tracking_uri=bogus://nowhere: MLflow does not know"),
        (
            ["mlflow.tracking_uri=sqlite:////etc/passwd/x.db"],
            "error: mlflow.tracking_uri=sqlite:////etc/passwd/x.db: cannot create the folder",
        ),
        (
            ["mlflow.tracking_uri=http://127.0.0.1:9"],
            "error: mlflow.tracking_uri=http://127.0.0.1:9: no tracking server",
        ),
        (["ray.address=127.0.0.1:1"], "error: ray.address=127.0.0.1:1: no Ray cluster answers at 127.0.0.1:1"),
        (["+inventory=nope"], "error: inventory=nope: there is no config 'nope' in group 'inventory'"),
        (["+search.skew_rang=3"], "error: search.skew_rang is not a search setting (a typo?)"),
    ],
)
def test_search_bad_input_is_one_line_before_any_work(tmp_path: Path, args: list[str], start: str) -> None:
    overrides = [a for a in SMALL if not a.startswith(tuple(x.partition("=")[0] + "=" for x in args))]
    if any(a.startswith("+inventory") for a in args):
        overrides = [a for a in overrides if not a.startswith("+inventory")]
    r = search(tmp_path, *overrides, *args, timeout=60)
    one_line(r, start)
    assert not list((tmp_path / "out").glob("*/*/trials.jsonl"))  # refused before any trial


def test_ray_that_does_not_answer_leaves_no_mlflow_run_running(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    r = search(tmp_path, *SMALL, "ray.address=127.0.0.1:1", timeout=60)
    one_line(r, "error: ray.address=127.0.0.1:1")
    if (tmp_path / "mlflow.db").exists():
        client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert all(run.info.status != "RUNNING" for run in runs)


def user_conf(tmp: Path, inventory: str) -> Path:
    d = tmp / "myconf"
    (d / "inventory").mkdir(parents=True)
    (d / "inventory" / "mine.yaml").write_text(inventory)
    return d


def test_an_inventory_in_the_users_own_config_dir_is_found_and_its_errors_are_clear(tmp_path: Path) -> None:
    d = user_conf(tmp_path, "gpus: {H200: 16, H20: 16}\n")
    r = search(tmp_path, f"--config-dir={d}", "+inventory=mine", "ranges.width=1000", "search.iterations=1",
               "search.batch=2", "search.reference=false", "ray.num_cpus=2", "search.verify=false",
               "search.band_draws=0")  # fmt: skip
    assert r.returncode == 0, r.stderr
    plan = json.loads(next((tmp_path / "out").glob("*/*/plan.json")).read_text())
    assert plan["inventory"] == {"name": "mine", "gpus": {"H200": 16, "H20": 16}, "cost_per_hour": pytest.approx(
        plan["inventory"]["cost_per_hour"])}  # fmt: skip
    (d / "inventory" / "broken.yaml").write_text("gpus: {H200: 16\n")
    r = search(tmp_path, f"hydra.searchpath=[file://{d}]", "+inventory=broken")
    one_line(r, "error: ")
    assert "broken.yaml" in r.stderr or "while parsing" in r.stderr, r.stderr


def test_a_gpu_file_with_a_bad_figure_is_named_not_called_unknown(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    text = (conf / "gpu" / "H20.yaml").read_text()
    (conf / "gpu" / "H20.yaml").write_text("\n".join(
        "mem_gb: 0" if ln.startswith("mem_gb:") else ln for ln in text.splitlines()) + "\n")  # fmt: skip
    r = cli("pipeline.search", *SMALL, f"out_root={tmp_path}/out", env={"ARCHIPELAGO_CONF": str(conf)})
    one_line(r, "error: ")
    assert "H20.yaml" in r.stderr and "mem_gb" in r.stderr and "unknown GPU" not in r.stderr, r.stderr


def test_other_commands_bad_input_is_one_line(tmp_path: Path) -> None:
    one_line(cli("pipeline.island", "gpu=H9000"), "error: gpu=H9000: there is no config 'H9000' in group 'gpu'")
    one_line(cli("pipeline.solve_layout", "+layout=nope"), "error: layout=nope: there is no config 'nope'")
    bad = tmp_path / "bad.yaml"
    bad.write_text("islands: [\n")
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,5,3\n")
    one_line(cli("pipeline.traces", "derive", str(trace), "/proc/x/o.npz"), "error: /proc/x/o.npz: cannot write it")
    prob = tmp_path / "p.json"
    base = {"islands": [{"gpu": "H200", "size": 8}], "ranges": [{"start": 0, "end": 10, "p": 1.0}],
            "prefill_req_s": [[1.0]], "decode_req_s": [[1.0]]}  # fmt: skip
    for extra, start in (({"roles": 5}, "`roles` must list"), ({"time_limit_s": -1}, "`time_limit_s` must be")):
        prob.write_text(json.dumps({**base, **extra}))
        one_line(cli("solvers.inner", str(prob)), f"error: {prob}: {start}")
    a, w = tmp_path / "a.npy", tmp_path / "w.npy"
    np.save(a, np.ones((3, 8)))
    np.save(w, np.ones((5, 7)))
    r = cli("solvers.expert_placement", str(a), str(w), "--gpus", "2", "--method", "heuristic")
    one_line(r, f"error: {w}: the traffic matrix must be experts x experts (8 x 8")


def test_the_thesis_objective_at_its_time_limit_is_a_status_not_a_crash() -> None:
    # `pywraplp.Solver` has no time_limit(): the old status check raised AttributeError here
    from ortools.linear_solver import pywraplp

    from solvers.inner import _status

    class Stopped:
        def wall_time(self) -> int:
            return 1000  # ms

    assert _status(Stopped(), pywraplp.Solver.NOT_SOLVED, 1.0) == "time_limit"
    with pytest.raises(RuntimeError, match="NOT_SOLVED"):
        _status(Stopped(), pywraplp.Solver.NOT_SOLVED, 10.0)


# --- faults ---------------------------------------------------------------------------------------


def out_of_time(ctx: Any, params: Any) -> dict[str, Any]:
    """Every inner solve out of time: what a too-small search.inner_time_limit_s gives on a big inventory."""
    from pipeline.search.trial import unscored

    return {**unscored("time_limit", "inner max_rate solve: time_limit after 10 ms", 0.0), "islands": "H200x8"}


def dies_twice(ctx: Any, params: Any) -> dict[str, Any]:
    """The real trial, but the first two attempts of the search take their Ray worker down (a node
    lost twice): as many deaths as a batch survives, whether they hit the trainable or a task."""
    from pipeline.search.trial import run_trial

    for k in range(2):
        try:
            os.close(os.open(Path(os.environ["ARCHIPELAGO_TEST_DIR"]) / f"died-{k}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        os._exit(1)
    return run_trial(ctx, params)


def run_search(tmp: Path, trial_fn: Any, *extra: str) -> int:
    from ray import cloudpickle

    from pipeline.search.run import execute

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import tests/
    cfg = compose([*SMALL, "search.iterations=1", "search.sampler=random", "search.reference=false",
                   f"out_root={tmp}/out", f"mlflow.tracking_uri=sqlite:///{tmp}/mlflow.db", *extra])  # fmt: skip
    return execute(cfg, trial_fn=trial_fn)


def test_a_search_without_any_layout_says_why_and_exits_nonzero(tmp_path: Path, capsys: Any) -> None:
    from mlflow.tracking import MlflowClient

    assert run_search(tmp_path, out_of_time) == 1
    err = capsys.readouterr().err
    assert "error: no plan: inner solves ran out of time (4 time_limit); raise search.inner_time_limit_s" in err
    (d,) = [p.parent for p in (tmp_path / "out").glob("*/*/trials.jsonl")]
    assert not (d / "plan.json").exists() and len(Journal(d / "trials.jsonl").load()) == 4
    parent = json.loads((d / "state.json").read_text())["parent_run_id"]
    assert MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(parent).info.status == "FAILED"


def test_a_trial_whose_worker_dies_is_retried_not_lost(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("ARCHIPELAGO_TEST_DIR", str(tmp_path))
    assert run_search(tmp_path, dies_twice) == 0
    (d,) = [p.parent for p in (tmp_path / "out").glob("*/*/trials.jsonl")]
    recs = Journal(d / "trials.jsonl").load()
    assert len(recs) == 4 and all(r["status"] == "optimal" for r in recs)  # each died attempt ran again
    assert len(list(tmp_path.glob("died-*"))) == 2


def notes_its_runtime_env(ctx: Any, params: Any) -> dict[str, Any]:
    import ray

    from pipeline.search.trial import run_trial

    env = ray.get_runtime_context().runtime_env.get("env_vars", {})
    return {**run_trial(ctx, params), "note": json.dumps(env, sort_keys=True)}


def test_every_trial_runs_in_the_runtime_env_the_prewarmed_workers_start_in(tmp_path: Path) -> None:
    """The driver starts the other workers' processes early in `trainable_env()`; Ray reuses them for
    the trainable's tasks only if that is the env Ray Tune gives the trainable (its tasks inherit it)."""
    from pipeline.tune.batch import trainable_env

    assert run_search(tmp_path, notes_its_runtime_env, "search.verify=false", "search.band_draws=0") == 0
    (d,) = [p.parent for p in (tmp_path / "out").glob("*/*/trials.jsonl")]
    notes = {r["note"] for r in Journal(d / "trials.jsonl").load()}
    assert notes == {json.dumps(trainable_env()["env_vars"], sort_keys=True)}, notes


def test_a_fraction_of_a_cpu_per_trial_gives_more_workers_and_every_trial_runs(tmp_path: Path) -> None:
    """ray.cpus_per_trial=0.5 on 2 CPUs: 4 bundles of half a CPU, each worker's task sized to one."""
    from pipeline.search.trial import run_trial

    assert run_search(tmp_path, run_trial, "ray.cpus_per_trial=0.5", "search.verify=false", "search.band_draws=0") == 0
    (d,) = [p.parent for p in (tmp_path / "out").glob("*/*/trials.jsonl")]
    recs = Journal(d / "trials.jsonl").load()
    assert len(recs) == 4 and all(r["status"] != "error" for r in recs), [r.get("note") for r in recs]


def dies_first_or_always(ctx: Any, params: Any) -> dict[str, Any]:
    """Layout `once` takes its Ray worker down on its first attempt, layout `always` on every one."""
    marker = Path(os.environ["ARCHIPELAGO_TEST_DIR"]) / f"task-died-{params['layout']}"
    if params["layout"] == "always" or not marker.exists():
        marker.touch()
        os._exit(1)
    return {"status": "optimal", "score": 1.0}


def test_a_share_whose_worker_dies_runs_again_then_is_recorded_failed(tmp_path: Path, monkeypatch: Any) -> None:
    import ray
    from ray import cloudpickle

    from pipeline.tune import worker as tune_worker

    monkeypatch.setenv("ARCHIPELAGO_TEST_DIR", str(tmp_path))  # before Ray starts: its workers inherit it
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        ctx_ref = [ray.put("context")]
        shares = [[{"layout": "once"}], [{"layout": "always"}]]
        refs = [tune_worker.score_share("k", ctx_ref, dies_first_or_always, share) for share in shares]
        (once,), (always,) = [tune_worker.collect(ref, share) for ref, share in zip(refs, shares, strict=True)]
    finally:
        ray.shutdown()
    assert once["status"] == "optimal" and once["score"] == 1.0  # its task ran again on a new worker
    assert always["status"] == "error" and always["score"] == 0.0
    assert always["note"].startswith(f"the trial's Ray worker failed {tune_worker.RETRIES + 1} times")


def test_a_gpu_type_that_cannot_hold_the_model_is_named_in_the_plan(tmp_path: Path) -> None:
    from pipeline.search.trial import run_trial

    assert run_search(tmp_path, run_trial, "+inventory.gpus.L40S=4") == 0
    (d,) = [p.parent for p in (tmp_path / "out").glob("*/*/plan.json")]
    plan = json.loads((d / "plan.json").read_text())
    assert plan["notes"] and plan["notes"][0].startswith("no island of L40S (not even all 4 of them) can hold")
    assert "Note: no island of L40S" in (d / "report.md").read_text()


def test_ctrl_c_during_the_exact_reference_exits_130_without_a_traceback(tmp_path: Path) -> None:
    import signal
    import time

    # free sizes without SLOs: a reference of about a minute, so the signal lands inside it (the
    # default reference of this cell is solved in about a second)
    cmd = [sys.executable, "-m", "pipeline.search", "+inventory=hetero_b", "workload=azure_conv",
           "search.shapes=any", "slo=null",
           f"out_root={tmp_path}/out", f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.time() + 120
    for line in proc.stdout:
        if "solving the exact reference MILP" in line or time.time() > deadline:
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted"), err


def test_a_trace_longer_than_the_models_context_is_refused_when_planning(tmp_path: Path) -> None:
    trace = tmp_path / "long.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,40000,2000\n"
                     "2023-11-16 18:17:04,100,20\n")  # fmt: skip
    r = search(tmp_path, *SMALL, "model=qwen3_30b_a3b", "workload=trace", f"workload.path={trace}", "ranges.width=100")
    one_line(r, "error: workload trace: its longest prompt (40000 tokens) plus its longest output (2000) is 42000 "
             "tokens, over qwen3_30b_a3b's context of 40960")  # fmt: skip


def test_a_locked_store_is_refused_before_any_work(tmp_path: Path) -> None:
    import sqlite3

    from pipeline.records.tracking import Tracker

    db = tmp_path / "mlflow.db"
    Tracker(f"sqlite:///{db}", "archipelago")  # the store exists ...
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")  # ... and another process holds it
    try:
        r = search(tmp_path, *SMALL, timeout=120)
    finally:
        con.close()
    one_line(r, f"error: mlflow.tracking_uri=sqlite:///{db}: cannot open the tracking store for writing")
    assert "database is locked" in r.stderr and not (tmp_path / "out").exists()


def test_a_store_locked_only_briefly_is_waited_for(tmp_path: Path) -> None:
    import sqlite3
    import threading

    from pipeline.records.tracking import LOCK_WAIT_S, Tracker

    db = tmp_path / "mlflow.db"
    Tracker(f"sqlite:///{db}", "archipelago")
    con = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    con.execute("BEGIN EXCLUSIVE")  # another writer, done within a second
    release = threading.Timer(min(1.0, LOCK_WAIT_S / 2), lambda: (con.execute("COMMIT"), con.close()))
    release.start()
    try:
        tracker = Tracker(f"sqlite:///{db}", "archipelago")
    finally:
        release.join()
    assert tracker.start_parent("after the lock", {"a": 1})

"""The search (pipeline/search/): end to end through real Ray Tune, Optuna, OR-Tools and MLflow on a small
inventory, and its parts: the exact reference, minimum island sizes, samplers, polish and the trial."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import plan as plans
from helpers import compose


def run_dirs(tmp: Path) -> list[Path]:
    return sorted(p.parent for p in (tmp / "out").glob("*/*/trials.jsonl"))


def child_runs(tmp: Path, parent_id: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    exp = client.get_experiment_by_name("archipelago")
    return client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'", max_results=1000)


@pytest.mark.xdist_group("finished_search")
def test_search_end_to_end_writes_plan_trials_and_mlflow_runs(finished_search: tuple[Path, Any]) -> None:
    # conftest's FINISHED_SEARCH: 3 x 4 trials; the polish expectation below was worked out throughput-only on
    # free island sizes
    tmp_path, r = finished_search
    assert r.returncode == 0, r.stderr
    (d,) = run_dirs(tmp_path)
    raw = json.loads((d / "plan.json").read_text())
    assert raw["schema"] == plans.SCHEMA and set(raw) >= {"rates", "islands", "model", "cost", "search", "reference"}
    plan = plans.load(d / "plan.json")
    assert plan.search is not None and plan.reference is not None and plan.inventory is not None
    assert plan.search.trials == 12 and plan.search.sampler == "tpe" and plan.workload == "azure_code"
    # the exact reference bounds every layout the divider can propose
    gap, optimum = plan.reference.gap, plan.reference.optimum_req_s
    assert gap is not None and optimum is not None
    assert gap >= -1e-6 and plan.rate_req_s <= optimum * (1 + 1e-6)
    # the proven optimum's own layout scores this much more, and the report and console point to it
    ahead = plan.reference.layout_ahead
    assert ahead == pytest.approx(gap / (1 - gap), abs=1e-9)
    text = (d / "report.md").read_text()
    pointed = "the exact reference's own layout" in text
    assert pointed == ("the exact reference's own layout scores" in r.stdout) == (ahead > 1e-4)
    # report.md's top layouts: each layout once, with how many of the 12 trials scored it
    top = [row.split(" | ") for row in text.split("Top layouts")[1].splitlines() if row.startswith("| ") and
           not row.startswith("| trial")]  # fmt: skip
    assert top and len({row[-1] for row in top}) == len(top) and sum(int(row[1]) for row in top) <= 12
    assert plan.rate_req_s > 0 and plan.rates.output_tok_s > plan.rate_req_s
    used = {g: 0 for g, _ in plan.inventory.gpus}
    for isl in plan.islands:
        used[isl.gpu] += isl.size
        if isl.serving:  # prefill: dp replicas of tp GPUs; decode: dp EP groups of ep GPUs (docs/costmodel.md)
            assert isl.ep_group * (1 if isl.role == "prefill" else isl.dp) == isl.size and isl.ranges
            assert all(0 < rg.fraction <= 1 + 1e-9 for rg in isl.ranges)
    assert used == dict(plan.inventory.gpus)  # the divider uses every GPU
    trials = pd.read_parquet(d / "trials.parquet")
    assert len(trials) == 12 and trials["trial"].tolist() == list(range(12))
    assert trials["score"].max() == pytest.approx(plan.rate_req_s, rel=1e-6)
    assert (trials["gap"] >= -1e-6).all()
    for f in ("convergence.png", "report.md", "reference.json"):
        assert (d / f).stat().st_size > 0
    parent = json.loads((d / "state.json").read_text())["parent_run_id"]
    assert len(child_runs(tmp_path, parent)) == 12
    # the default cost model is fitted to measured serving: the plan carries that calibration and a range over its draws
    cal = plan.cost.profile.calibration
    assert cal is not None and cal.name == "serving" and plan.profile_name == "corrected+serving"
    band = plan.band
    assert band is not None and band.draws == 32 and 0 < band.p10_req_s <= band.p50_req_s <= band.p90_req_s
    assert "range over the calibration" in (d / "report.md").read_text()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(parent)
    assert run.data.params["calibration"] == ("serving (published.csv, inferencex_dsr1.csv (239 rows of h200, b200, "
                                              "mi300x); residuals serving_residuals.csv)")
    assert run.data.metrics["band_p10_req_s"] == pytest.approx(band.p10_req_s, rel=1e-5)  # 6 significant digits
    # one headline: the rate to plan with, its range, the worst host lost, the workload's own arrivals, in that order,
    # on the console's last line, report.md's first block and the parent run's first metrics
    from pipeline.records.report import Headline

    head = Headline.of(plan)
    v, losses = plan.verification, plan.host_losses
    assert v is not None and losses is not None and plan.rates.bursty_req_s is None  # (slo=null: no SLO caps to burst)
    assert head.rate_req_s == pytest.approx(plan.rate_req_s if v.sustained else v.sustained_req_s)
    last = [ln for ln in r.stdout.splitlines() if ln.startswith("[search]")][-1]
    assert last == "[search] " + " ".join(head.sentences)
    assert [s.split(" ")[0] for s in head.sentences] == ["Plan", "Its", "With", "No"]
    assert f"{losses.worst.gpu} node {losses.worst.node}" in head.sentences[2]
    assert (d / "report.md").read_text().splitlines()[4:8] == [f"{k}. {t}" for k, t in enumerate(head.sentences, 1)]
    assert list(head.metrics) == ["plan_req_s", "plan_range_p10_req_s", "plan_range_p90_req_s", "plan_host_lost_req_s"]
    assert head.sentences[3].startswith("No rate under the workload's own arrivals: that needs")
    for key, value in head.metrics.items():
        assert run.data.metrics[key] == pytest.approx(value, rel=1e-5)
    assert run.data.metrics["gap"] == (0.0 if abs(gap) < 1e-9 else pytest.approx(gap, rel=1e-5))
    # what the MLflow UI shows: the experiment opens on its runs, described; the parent has the plan's
    # numbers, a best-so-far curve and each setting once; a child has a short layout key, not the islands
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development" and exp.tags["mlflow.note.content"]
    assert {"output_tok_s", "cost_per_hour", "usd_per_m_output_tokens"} <= set(run.data.metrics)
    curve = [m.value for m in sorted(client.get_metric_history(parent, "best_so_far"), key=lambda m: m.step)]
    assert len(curve) == 12 and curve == sorted(curve) and curve[-1] == pytest.approx(trials["score"].max(), rel=1e-5)
    assert "generator" in run.data.params and "search.generator" not in run.data.params
    assert f"{plan.rate_req_s:.2f} req/s" in run.data.tags["mlflow.note.content"]
    child = child_runs(tmp_path, parent)[0]
    assert "islands" not in child.data.params and len(child.data.params["layout_id"]) == 10
    assert child.data.tags["islands"] and child.data.tags["mlflow.note.content"].startswith("Trial ")
    assert (tmp_path / "out" / "latest").resolve() == d.resolve()  # the newest finished plan
    assert (d / "routing.png").stat().st_size > 0
    assert "[search] 12/12 trials" in r.stdout
    # search.polish=0.2 by default: through Ray Tune, the last 2 trials step from the best of the first 8
    assert "(the last 2 polish the best)" in r.stdout
    recs = [json.loads(x) for x in (d / "trials.jsonl").read_text().splitlines()]
    _, ctx = small_context(tmp_path, "slo=null", "search.shapes=any")
    best = max(recs[:8], key=lambda r: r["score"])
    around = [ctx.space.layout_key(m) for m in ctx.space.neighbours(best["params"])]
    assert sum(ctx.space.layout_key(r["params"]) in around for r in recs[8:]) >= 2


def small_context(tmp: Path, *extra: str) -> tuple[Any, Any]:
    from pipeline.search.settings import inventory_of, settings_from_cfg

    cfg = compose(["+inventory=tiny_hetero", "ranges.width=1000", f"out_root={tmp}/out", *extra])
    return settings_from_cfg(cfg, *inventory_of(cfg))


def test_once_jax_is_loaded_the_reference_runs_in_a_fork_server_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JAX (the saasbo sampler's fits) must not be forked: the reference's MILP then starts from a
    fork server, and solves to the same optimum."""
    import types

    from pipeline.search import reference as ref_mod

    settings, ctx = small_context(tmp_path)
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


@pytest.mark.parametrize("objective", ["max_rate", "rate_per_dollar"])
def test_exact_reference_bounds_every_sampled_layout(tmp_path: Path, objective: str) -> None:
    import optuna

    from pipeline.search.reference import reference
    from pipeline.search.trial import run_trial

    settings, ctx = small_context(tmp_path, f"search.objective={objective}")
    ref = reference(settings, ctx, ctx.planner)
    assert ref.status == "optimal"
    best = ref.rate_per_dollar if objective == "rate_per_dollar" else ref.rate_req_s
    sampler = optuna.samplers.RandomSampler(seed=1)
    study = optuna.create_study(sampler=sampler, direction="maximize")
    scores = []
    for _ in range(25):
        t = study.ask(ctx.space.distributions())
        out = run_trial(ctx, t.params)
        study.tell(t, out["score"])
        scores.append(out["score"])
    assert max(scores) > 0
    assert max(scores) <= best * (1 + 1e-5)
    # the reference's own layout, solved by the inner loop, reaches it
    from pipeline.planning.planner import Layout

    layout = Layout.of([(g, n) for g, n, _ in ref.islands])
    _, sol = ctx.planner.solve(layout)
    assert sol.rate_req_s == pytest.approx(ref.rate_req_s, rel=1e-5)


def test_exact_reference_limited_to_given_layouts_is_their_best(tmp_path: Path) -> None:
    # constraint (6): one multiset per type -> the exact MILP is the inner solve of that layout;
    # several -> the best of them, and never above the unrestricted optimum
    import optuna

    from pipeline.search.reference import reference
    from pipeline.search.trial import run_trial

    settings, ctx = small_context(tmp_path, "search.reference_time_limit_s=120", "search.spare_hosts=0")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=4))
    points = [study.ask(ctx.space.distributions()).params for _ in range(3)]
    scores, per_type = [], []
    for params in points:
        layout = ctx.space.layout(params)
        per_type.append(
            {g: tuple(sorted((n for h, n in layout if h == g), reverse=True)) for g, _ in ctx.space.inventory}
        )
        scores.append(run_trial(ctx, params)["score"])
        only = reference(settings, ctx, ctx.planner, {g: (m,) for g, m in per_type[-1].items()})
        assert only.status == "optimal" and only.rate_req_s == pytest.approx(scores[-1], rel=1e-5)
    layouts = {g: tuple({p[g] for p in per_type}) for g, _ in ctx.space.inventory}
    some = reference(settings, ctx, ctx.planner, layouts)  # any mix of the three, per type
    assert some.rate_req_s >= max(scores) * (1 - 1e-6)
    assert some.rate_req_s <= reference(settings, ctx, ctx.planner).rate_req_s * (1 + 1e-6)


def test_min_island_auto_is_the_smallest_island_that_runs_the_model_and_loses_no_optimum(tmp_path: Path) -> None:
    from pipeline.search.reference import reference

    settings, ctx = small_context(tmp_path, "search.shapes=any")  # the default: search.min_island=auto
    mins = dict(ctx.space.min_island)
    # with node-aligned islands (the default) the minimum is the smallest host shape at least that large
    _, nodes = small_context(tmp_path)
    assert dict(nodes.space.min_island) == {
        g: next(x for x in (1, 2, 4, 8, 16, 24, 32) if x >= m) for g, m in mins.items()
    }

    def runs(gpu: str, n: int) -> bool:
        b = ctx.planner.benchmark(gpu, n)
        return b.prefill.chosen >= 0 or b.decode.chosen >= 0

    for gpu, m in mins.items():
        assert runs(gpu, m) and not any(runs(gpu, n) for n in range(1, m)), (gpu, m)
    assert min(mins.values()) > 2  # DeepSeek-V3's weights alone need more than two of any of these GPUs
    from pipeline.search.settings import recorded

    assert recorded(settings, ctx)["search"]["min_island_by_type"] == mins  # config.json has `auto` resolved
    assert "min_island_by_type" not in settings.config["search"]  # reading the config benchmarks nothing
    space = ctx.space.distributions()
    assert space["n_H20"].high == 32 // mins["H20"]  # no island count that forces islands too small to run
    # islands below the minimum would only idle: the exact optimum is the same with min_island=1
    one, ctx_one = small_context(tmp_path, "search.min_island=1", "search.shapes=any")
    assert reference(settings, ctx, ctx.planner).rate_req_s == pytest.approx(
        reference(one, ctx_one, ctx_one.planner).rate_req_s, rel=1e-6
    )
    _, mixed = small_context(
        tmp_path, "search.min_island=2", "search.min_island_per_type={H20:auto}", "search.shapes=any"
    )
    assert dict(mixed.space.min_island) == {"H200": 2, "H800": 2, "H20": mins["H20"]}


def test_grid_search_longer_than_its_grid_revisits_points_instead_of_failing(tmp_path: Path) -> None:
    # Optuna's GridSampler calls study.stop() once the grid is exhausted, which raises outside
    # Study.optimize (homo_c's grid of 16 points failed every 240-trial grid search)
    from pipeline.search.samplers import make_sampler
    from pipeline.search.trial import ask_tell

    _, ctx = small_context(tmp_path, "search.grid_points=2")
    points = ctx.space.grid_size()
    out = ask_tell(ctx, make_sampler("grid", 0, ctx.space), points + 6, 4)
    assert len(out) == points + 6 and all(r["status"] != "error" for r in out)
    assert len({tuple(sorted(r["params"].items())) for r in out}) == points  # every point, then repeats


def test_direct_proposals_over_the_inventory_are_rejected_or_repaired(tmp_path: Path) -> None:
    from pipeline.search.trial import run_trial

    over = {f"slot_{g}_{k}": 0 for g in ("H200", "H800", "H20") for k in range(4)}
    over.update({"slot_H200_0": 16, "slot_H200_1": 8, "slot_H800_0": 16, "slot_H20_0": 32})
    _, ctx = small_context(tmp_path, "search=direct", "search.k_slots=4")
    out = run_trial(ctx, over)
    assert out["status"] == "rejected" and out["score"] == 0 and "sum to 24 > 16" in out["note"]
    _, ctx = small_context(tmp_path, "search=direct", "search.k_slots=4", "search.on_violation=repair",
                           "search.spare_hosts=0")  # (the repaired layout serves, but not with a host lost)
    out = run_trial(ctx, over)
    assert out["status"] == "optimal" and out["score"] > 0


def test_saasbo_proposes_from_its_fitted_model_after_the_random_start(tmp_path: Path) -> None:
    pytest.importorskip("botorch")
    pytest.importorskip("numpyro")
    pytest.importorskip("optuna_integration")
    from pipeline.search.samplers import make_sampler
    from pipeline.search.trial import ask_tell

    _, ctx = small_context(tmp_path)
    sampler = make_sampler("saasbo", 0, ctx.space)
    fits = []
    cands = sampler._candidates_func
    original = type(cands).__call__

    def counting(self: Any, *args: Any) -> Any:
        before = self.fitted
        out = original(self, *args)
        fits.append(self.fitted is not before)
        return out

    type(cands).__call__ = counting  # type: ignore[method-assign]
    try:
        results = ask_tell(ctx, sampler, 14, 2)  # 10 random start-up trials, then 2 batches of 2
    finally:
        type(cands).__call__ = original  # type: ignore[method-assign]
    assert len(results) == 14 and all(r["status"] in ("optimal", "feasible", "empty") for r in results)
    # 4 model-based proposals, one NUTS fit per batch: the second of each batch reuses the model
    assert fits == [True, False, True, False]


def test_an_in_process_search_records_a_raising_trial_and_goes_on(tmp_path: Path, monkeypatch: Any) -> None:
    import optuna

    import pipeline.search.trial as trial

    _, ctx = small_context(tmp_path)
    real, calls = trial.run_trial, []

    def flaky(c: Any, params: Mapping[str, Any]) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("inner solver (HIGHS) ended with status UNKNOWN_STATUS")
        return real(c, params)

    monkeypatch.setattr(trial, "run_trial", flaky)
    results = trial.ask_tell(ctx, optuna.samplers.RandomSampler(seed=0), 6, 2)
    assert [r["status"] for r in results].count("error") == 1 and len(results) == 6
    assert "UNKNOWN_STATUS" in results[2]["note"] and results[2]["score"] == 0.0
    assert sum(r["status"] in ("optimal", "feasible") for r in results) >= 4


def test_a_layout_whose_host_loss_roles_run_out_of_time_is_a_time_limit_trial_not_a_zero(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The roles with a host lost found no solution within the trial's limit: the trial says so (status time_limit,
    its note naming the limit) and keeps its rate with every host up, where it used to score the layout as keeping
    nothing with a host lost; a solve that ends in time scores the rate it keeps."""
    import pipeline.search.trial as trial
    from pipeline.planning.planner import Layout
    from solvers.spare import SpareRoles

    _, ctx = small_context(tmp_path, "search.spare_hosts=1")
    layout = Layout.of([("H200", 8), ("H200", 8), ("H800", 8), ("H800", 8), ("H20", 16), ("H20", 16)])
    kept = trial.score_layout(ctx, layout)
    assert kept["status"] in trial.OK and kept["score"] == kept["spare_req_s"] > 0
    monkeypatch.setattr(trial, "spare_solve", lambda *a, **k: SpareRoles("time_limit", 0.0, ("prefill",) * 6, 5000.0))
    got = trial.score_layout(ctx, layout)
    assert got["status"] == "time_limit" and got["score"] == 0.0 and got["islands"] == layout.key
    assert "time_limit after 5000 ms" in got["note"] and "search.inner_time_limit_s" in got["note"]
    assert got["rate_req_s"] == pytest.approx(kept["rate_req_s"])


def test_polish_in_the_search_refines_the_real_layouts(tmp_path: Path) -> None:
    from pipeline.search.samplers import make_sampler
    from pipeline.search.trial import ask_tell

    # throughput-only (slo=null): the landscape this exact expectation was worked out on
    settings, ctx = small_context(tmp_path, "search.polish=0.5", "slo=null", "search.shapes=any")
    assert settings.search.polish == 0.5
    sampler = make_sampler("random", 0, ctx.space, settings.search.polish, 16)
    out = ask_tell(ctx, sampler, 16, 4)
    assert all(r["status"] == "optimal" for r in out)
    first = max(out[:8], key=lambda r: r["score"])
    tried = {ctx.space.layout_key(r["params"]) for r in out[:8]}
    untried = [m for m in ctx.space.neighbours(first["params"]) if ctx.space.layout_key(m) not in tried]
    assert [r["params"] for r in out[8:12]] == untried[:4]  # the first polish batch: the best's neighbours
    assert max(r["score"] for r in out) >= first["score"]


def test_the_tune_searcher_shows_the_sampler_what_the_in_process_loop_shows_it(tmp_path: Path) -> None:
    """One Tune trial per batch (pipeline/search/tune/batch.py): the same proposals, batch by batch, as
    `ask_tell`, with a failed trial told as failed; polish makes the proposals depend on what was told."""
    import optuna
    from ray.tune.search import Searcher

    from pipeline.search.samplers import make_sampler
    from pipeline.search.trial import ask_tell, guarded
    from pipeline.search.tune.batch import BatchSearcher

    settings, ctx = small_context(tmp_path, "search.polish=0.5", "search.shapes=any")
    expected = ask_tell(ctx, make_sampler("random", 0, ctx.space, settings.search.polish, 16), 16, 4)
    searcher = BatchSearcher(
        make_sampler("random", 0, ctx.space, settings.search.polish, 16), ctx.space.distributions(), 4, 16
    )
    seen: list[dict[str, Any]] = []
    for k in range(4):
        config = searcher.suggest(f"t{k}")
        assert isinstance(config, dict) and len(config["layouts"]) == 4
        assert searcher.suggest(f"t{k}-early") is None  # no proposal while a batch is out
        outs = [guarded(ctx, params) for params in config["layouts"]]
        searcher.on_trial_complete(f"t{k}", {"score": 0.0, "results": outs})
        seen += [{**o, "params": p} for o, p in zip(outs, config["layouts"], strict=True)]
    assert searcher.suggest("t-end") == Searcher.FINISHED
    assert [r["params"] for r in seen] == [r["params"] for r in expected]
    assert [r["score"] for r in seen] == pytest.approx([r["score"] for r in expected])

    # a batch whose Tune trial failed outright: every proposal of it is a failed trial to the sampler
    searcher = BatchSearcher(optuna.samplers.RandomSampler(seed=0), ctx.space.distributions(), 2, 4)
    first = searcher.suggest("a")
    searcher.on_trial_complete("a", None, error=True)
    assert isinstance(first, dict) and isinstance(searcher.suggest("b"), dict)
    states = [t.state for t in searcher.study.get_trials()]
    assert states[:2] == [optuna.trial.TrialState.FAIL] * 2

"""The search: island layouts proposed by an Optuna sampler, run as Ray Tune trials, solved exactly inside.

    python -m pipeline.search                                   # hetero_a, Azure code, divider + TPE
    python -m pipeline.search +inventory=hetero_b search.sampler=gp workload=azure_conv
    python -m pipeline.search search=direct search.k_slots=8
    python -m pipeline.search search.sampler=exact              # the exact MILP as the planner
    python -m pipeline.search search.resume=true                # continue the last interrupted run
    python -m pipeline.search -m +inventory=divider_bench search.skew_range=1,3,5 search.min_island=1,2,4

Each run writes `outputs/search/<inventory>-<workload>-<generator>-<sampler>-<objective>-<hash>/<time>/`:
plan.json, trials.parquet, trials.jsonl (the journal a resume reads), convergence.png,
report.md, reference.json; and one MLflow parent run with a child per trial.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from costmodel.catalog import CONF_DIR
from costmodel.formulas import DERATE
from pipeline.config import (
    ConfigError,
    choice,
    fraction,
    model_from_cfg,
    optional_positive,
    plain,
    positive_int,
    profile_from_cfg,
)
from pipeline.inventory import Inventory, inventory_from_cfg
from pipeline.planner import Layout, Planner
from pipeline.polish import with_polish
from pipeline.space import Space
from pipeline.workload import make_ranges, workload_from_cfg
from solvers.exact import ExactResult, TypeOptions, exact_optimum
from solvers.inner import BACKENDS
from solvers.layouts import LayoutRejected

SAMPLERS = ("tpe", "gp", "saasbo", "random", "grid", "qmc", "cmaes", "exact")
OBJECTIVES = ("max_rate", "rate_per_dollar", "thesis")
DEFAULT_INVENTORY = "hetero_a"


# --- what a trial needs, shipped once to every Ray worker ---------------------------------------


@dataclass(frozen=True)
class Context:
    planner: Planner  # shipped with the driver's cache; each worker process keeps the first copy it sees
    space: Space
    objective: str
    inner_time_limit_s: float
    key: str  # identity of the planner inputs (config hash)
    backend: str = "AUTO"  # inner MILP solver


_PLANNERS: dict[str, Planner] = {}  # per process: survives Ray Tune's actor reuse


def planner_for(ctx: Context) -> Planner:
    return _PLANNERS.setdefault(ctx.key, ctx.planner)


METRICS = (
    "score",
    "rate_req_s",
    "evaluated_req_s",
    "prefill_req_s",
    "decode_req_s",
    "deviation",
    "cost_per_hour",
    "rate_per_dollar",
    "solve_ms",
    "trial_ms",
    "n_islands",
)


def run_trial(ctx: Context, params: Mapping[str, Any]) -> dict[str, Any]:
    """Score one parameter set: layout -> inner solve -> full-resolution evaluation."""
    t0 = time.perf_counter()
    zero = dict.fromkeys(METRICS, 0.0)
    try:
        islands = ctx.space.layout(params)
    except LayoutRejected as err:
        return {**zero, "status": "rejected", "islands": "", "note": str(err), "trial_ms": _ms(t0)}
    if not islands:
        return {**zero, "status": "empty", "islands": "", "note": "no island fits", "trial_ms": _ms(t0)}
    return score_layout(ctx, Layout.of(islands), t0)


def score_layout(ctx: Context, layout: Layout, t0: float | None = None) -> dict[str, Any]:
    """Inner solve and full-resolution evaluation of one layout; `t0` is when the trial started."""
    t0 = time.perf_counter() if t0 is None else t0
    planner = planner_for(ctx)
    inner = "thesis" if ctx.objective == "thesis" else "max_rate"
    prob, sol = planner.solve(layout, inner, ctx.inner_time_limit_s, backend=ctx.backend)
    ev, _ = planner.evaluate(layout, prob, sol)
    in_use = _in_use(sol)
    cost = float(planner.cost_per_hour(layout)[in_use].sum())
    per_dollar = sol.rate_req_s / cost if cost > 0 else 0.0
    return {
        "status": sol.status,
        "score": per_dollar if ctx.objective == "rate_per_dollar" else sol.rate_req_s,
        "rate_req_s": sol.rate_req_s,
        "evaluated_req_s": ev.rate_req_s,
        "prefill_req_s": sol.prefill_req_s,
        "decode_req_s": sol.decode_req_s,
        "deviation": sol.deviation,
        "cost_per_hour": cost,
        "rate_per_dollar": per_dollar,
        "solve_ms": sol.solve_ms,
        "trial_ms": _ms(t0),
        "n_islands": float(len(layout.islands)),
        "islands": layout.key,
        "note": "",
    }


def _in_use(sol: Any) -> np.ndarray:
    """Islands that serve traffic (an island that cannot hold the model, or is left idle, costs nothing)."""
    return (sol.x_prefill.sum(axis=1) + sol.x_decode.sum(axis=1)) > 1e-9


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def _tune_trial(config: dict[str, Any], ctx: Context, trial_fn: Callable[[Context, Mapping[str, Any]], dict]) -> None:
    import ray
    from ray import tune

    out = trial_fn(ctx, config)
    out["node"] = ray.get_runtime_context().get_node_id()
    out["pid"] = os.getpid()
    tune.report(out)


# --- the settings of one search ------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    inventory: Inventory
    workload_name: str
    sampler: str
    generator: str
    iterations: int
    batch: int
    polish: float  # fraction of trials, at the end, that refine the best layout locally
    objective: str
    seed: int
    reference: bool
    reference_time_limit_s: float
    resume: bool
    run_root: Path  # outputs/search/<name>-<hash>
    ray_address: str | None
    ray_num_cpus: int | None
    cpus_per_trial: float
    mlflow_uri: str | None
    mlflow_experiment: str
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config, for the record

    @property
    def trials(self) -> int:
        return self.iterations * self.batch


def settings_from_cfg(cfg: Any, inventory_name: str, inv_cfg: Any) -> tuple[Settings, Context]:
    s = cfg.search
    inventory = inventory_from_cfg(inventory_name, plain(inv_cfg))
    sampler, objective, generator = str(s.sampler), str(s.objective), str(s.generator)
    if sampler not in SAMPLERS:
        raise ConfigError(f"search.sampler={sampler!r} is unknown: choose from {list(SAMPLERS)}")
    if objective not in OBJECTIVES:
        raise ConfigError(f"search.objective={objective!r} is unknown: choose from {list(OBJECTIVES)}")
    budget = optional_positive(s.budget_per_hour, "search.budget_per_hour")
    if objective == "thesis" and (budget is not None or bool(s.kv_transfer)):
        raise ConfigError("search.objective=thesis has no budget or KV-transfer constraint: drop those overrides")
    workload_name = choice("workload")
    workload = workload_from_cfg(workload_name, plain(cfg.workload))
    planner = Planner(
        model=model_from_cfg(choice("model"), cfg.model),
        workload=workload,
        ranges=make_ranges(workload, positive_int(cfg.ranges.width, "ranges.width")),
        profile=profile_from_cfg(cfg.costmodel),
        gpus={g.name: g for g in inventory.gpus},
        cache_hit=fraction(cfg.costmodel.cache_hit, "costmodel.cache_hit"),
        fp8_combine=bool(cfg.costmodel.fp8_combine),
        ttft_ms=optional_positive(cfg.slo.ttft_ms, "slo.ttft_ms"),
        tpot_ms=optional_positive(cfg.slo.tpot_ms, "slo.tpot_ms"),
        kv_transfer=bool(s.kv_transfer),
        budget_per_hour=budget,
    )
    mins = min_islands(s.min_island, plain(s.min_island_per_type) or {}, inventory, planner)
    space = Space(
        generator,
        tuple((g.name, n) for g, n in zip(inventory.gpus, inventory.counts, strict=True)),
        tuple(mins.items()),
        skew_range=float(s.skew_range),
        max_islands=positive_int(s.max_islands, "search.max_islands"),
        k_slots=positive_int(s.get("k_slots", 16), "search.k_slots"),
        repair=str(s.get("on_violation", "reject")) == "repair",
        counts_are_bounds=objective == "rate_per_dollar" or budget is not None,
        grid_points=positive_int(s.grid_points, "search.grid_points"),
    )
    if str(s.get("on_violation", "reject")) not in ("reject", "repair"):
        raise ConfigError(f"search.on_violation={s.on_violation!r}: choose reject or repair")
    if not (s.skew_range >= 0):
        raise ConfigError(f"search.skew_range must be >= 0, got {s.skew_range}")
    _check_some_island_fits(planner, inventory, mins)
    record = {k: plain(cfg[k]) for k in cfg if k != "hydra"}
    record["inventory"] = {"name": inventory_name, **plain(inv_cfg)}
    record["search"]["min_island_per_type"] = record["search"].get("min_island_per_type") or {}
    record["search"]["min_island_by_type"] = mins  # `auto` resolved
    digest = hashlib.sha1(json.dumps(run_identity(record), sort_keys=True, default=str).encode()).hexdigest()[:8]
    name = f"{inventory_name}-{workload_name}-{generator}-{sampler}-{objective}-{digest}"
    backend = str(s.inner_backend).upper()
    if backend not in BACKENDS:
        raise ConfigError(f"search.inner_backend={s.inner_backend!r}: choose from {list(BACKENDS)}")
    ctx = Context(planner, space, objective, float(s.inner_time_limit_s), digest, backend)
    settings = Settings(
        inventory=inventory,
        workload_name=workload_name,
        sampler=sampler,
        generator=generator,
        iterations=positive_int(s.iterations, "search.iterations"),
        batch=positive_int(s.batch, "search.batch"),
        polish=fraction(s.polish, "search.polish"),
        objective=objective,
        seed=int(s.seed),
        reference=bool(s.reference),
        reference_time_limit_s=float(s.reference_time_limit_s),
        resume=bool(s.resume),
        run_root=Path(str(cfg.out_root)) / name,
        ray_address=None if cfg.ray.address is None else str(cfg.ray.address),
        ray_num_cpus=None if cfg.ray.num_cpus is None else positive_int(cfg.ray.num_cpus, "ray.num_cpus"),
        cpus_per_trial=float(cfg.ray.cpus_per_trial),
        mlflow_uri=None if cfg.mlflow.tracking_uri is None else str(cfg.mlflow.tracking_uri),
        mlflow_experiment=str(cfg.mlflow.experiment),
        config=record,
    )
    return settings, ctx


def run_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """What decides a run's results: its config without where it runs, logs and writes, which MILP
    backend solves it (speed, not the model: a run resumes under another backend) and what follows
    from the rest (the resolved minimum island sizes)."""
    out = {k: v for k, v in config.items() if k not in ("ray", "mlflow", "out_root")}
    out["search"] = {
        k: v for k, v in config["search"].items() if k not in ("resume", "inner_backend", "min_island_by_type")
    }
    return out


def min_islands(everywhere: Any, per_type: Mapping[str, Any], inventory: Inventory, planner: Planner) -> dict[str, int]:
    """Minimum island size per GPU type: `search.min_island` (a number or `auto`), per-type overrides winning.

    `auto`: the smallest island of that type that can run the model in prefill or decode (its
    weights, KV cache and SLOs, as the cost model sees them). Smaller islands would only idle,
    so the search does not spend trials on them; a type on which no island fits gets its whole
    count as the minimum (one island, left idle by the inner solver).
    """
    unknown = sorted(set(per_type) - {g.name for g in inventory.gpus})
    if unknown:
        raise ConfigError(f"search.min_island_per_type names {unknown}, not in inventory {inventory.describe()}")
    out = {}
    for g, count in zip(inventory.gpus, inventory.counts, strict=True):
        value = per_type.get(g.name, everywhere)
        where = f"search.min_island_per_type.{g.name}" if g.name in per_type else "search.min_island"
        if value == "auto":
            out[g.name] = next((n for n in range(1, count + 1) if _runs(planner, g.name, n)), count)
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where} must be a whole number >= 1 or auto, got {value!r}: set {where}=N or =auto")
        else:
            out[g.name] = value
    return out


def _runs(planner: Planner, gpu: str, size: int) -> bool:
    b = planner.benchmark(gpu, size)
    return b.prefill.chosen >= 0 or b.decode.chosen >= 0


def _check_some_island_fits(planner: Planner, inventory: Inventory, mins: Mapping[str, int]) -> None:
    """An inventory where no island of any type can hold the model is a config error, not 0 req/s."""
    for g, n in zip(inventory.gpus, inventory.counts, strict=True):
        if n >= mins[g.name]:
            b = planner.benchmark(g.name, n)
            if b.prefill.chosen >= 0 and b.decode.chosen >= 0:
                return
    raise ConfigError(
        f"inventory {inventory.describe()}: not even an island of every GPU of one type can hold "
        f"{planner.model.name} for both prefill and decode ({planner.model.name} needs more memory): "
        "add GPUs or choose a smaller model"
    )


# --- the exact reference -------------------------------------------------------------------------


def reference(
    settings: Settings,
    ctx: Context,
    planner: Planner,
    layouts: Mapping[str, tuple[tuple[int, ...], ...]] | None = None,
    backend: str = "HIGHS",
) -> ExactResult:
    """The exact optimum over every layout of the inventory, or, per type in `layouts`, over those
    island multisets only (`solvers/exact.py`, (6))."""
    mins = dict(ctx.space.min_island)
    types = []
    for g, n in zip(settings.inventory.gpus, settings.inventory.counts, strict=True):
        sizes = np.arange(mins[g.name], n + 1)
        benches = [planner.benchmark(g.name, int(s)) for s in sizes]
        types.append(
            TypeOptions(
                g.name,
                n,
                g.price_per_hour,
                sizes,
                np.array([b.prefill_req_s for b in benches]),
                np.array([b.decode_req_s for b in benches]),
                g.scaleout_bw_gb_s * DERATE,
                None if layouts is None else layouts.get(g.name),
            )
        )
    kv = (
        planner.kv_gb_per_range(Layout.of([(g.name, 1) for g in settings.inventory.gpus]))
        if planner.kv_transfer
        else None
    )
    return exact_optimum(
        types,
        planner.ranges.p,
        objective="rate_per_dollar" if settings.objective == "rate_per_dollar" else "max_rate",
        budget_per_hour=planner.budget_per_hour,
        kv_gb=kv,
        time_limit_s=settings.reference_time_limit_s,
        backend=backend,
    )


# --- samplers ------------------------------------------------------------------------------------


def make_sampler(name: str, seed: int, space: Space, polish: float = 0.0, trials: int = 0) -> Any:
    """The sampler `name`; with `polish` > 0, its last `polish` of `trials` refine the best layout."""
    return with_polish(_sampler(name, seed, space), space, trials, polish)


def _sampler(name: str, seed: int, space: Space) -> Any:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, scramble=True, warn_independent_sampling=False)
    if name == "grid":
        return GridSampler(space.grid(), seed=seed)
    if name == "gp":
        _require("torch", "gp", "PyTorch")
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # deterministic_objective
            return optuna.samplers.GPSampler(seed=seed, deterministic_objective=True)
    if name == "saasbo":
        _require("botorch", "saasbo", "BoTorch")
        _require("optuna_integration", "saasbo", "optuna-integration")
        from pipeline.saasbo import saasbo_sampler

        return saasbo_sampler(seed)
    if name == "cmaes":
        _require("cmaes", "cmaes", "the cmaes package")
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    raise ConfigError(f"search.sampler={name!r} is unknown: choose from {list(SAMPLERS)}")


class GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, minus its `study.stop()` once every point is visited.

    That call only works inside `Study.optimize`; our ask/tell loop and Ray Tune's run outside it,
    where it raises. Trials past the grid's size re-visit points (same score), so a search keeps
    its trial count and its best is unchanged.
    """

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        pass


def ask_tell(ctx: Context, sampler: Any, evals: int, batch: int) -> list[dict[str, Any]]:
    """`evals` trials in one process, `batch` proposals asked and told back together.

    The sampler sees exactly what it sees under Ray Tune with ConcurrencyLimiter(batch=True);
    experiments that repeat whole searches run one of these per Ray task.
    """

    study = optuna.create_study(direction="maximize", sampler=sampler)
    dists = ctx.space.distributions()
    results: list[dict[str, Any]] = []
    while len(results) < evals:
        trials = [study.ask(dists) for _ in range(min(batch, evals - len(results)))]
        outs = [{**_guarded(ctx, t.params), "params": dict(t.params)} for t in trials]
        for t, out in zip(trials, outs, strict=True):
            if out["status"] == "error":
                study.tell(t, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(t, out["score"])
        results += outs
    return results


def _guarded(ctx: Context, params: Mapping[str, Any]) -> dict[str, Any]:
    """`run_trial`, with an exception recorded as a failed trial (as a failed Ray Tune trial is)."""
    t0 = time.perf_counter()
    try:
        return run_trial(ctx, params)
    except Exception as err:  # one layout's failure must not end the search
        note = f"{type(err).__name__}: {err}"[:500]
        return {**dict.fromkeys(METRICS, 0.0), "status": "error", "islands": "", "note": note, "trial_ms": _ms(t0)}


def _require(module: str, extra: str, what: str) -> None:
    """A sampler's optional dependency, or one line saying how to install it."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except ValueError:  # imported already, as a lazy module without a spec
        found = module in sys.modules
    if not found:
        raise ConfigError(
            f"search.sampler={extra} needs {what}, an optional extra: pip install -e '.[{extra}]' (or use tpe)"
        )


# --- the journal: every finished trial, one JSON line, flushed and synced ------------------------


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut short by a kill: everything before it is intact
        return out

    def append(self, rec: Mapping[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(rec, default=float) + "\n")
            f.flush()
            os.fsync(f.fileno())


# --- the driver ----------------------------------------------------------------------------------


class SearchRun:
    """One search: its folder, journal, MLflow runs, progress line, and the Ray Tune loop."""

    def __init__(self, settings: Settings, ctx: Context, tracker: Any) -> None:
        self.s, self.ctx, self.tracker = settings, ctx, tracker
        self.dir = self._run_dir()
        self.journal = Journal(self.dir / "trials.jsonl")
        self.records = self.journal.load()
        self.resumed = len(self.records)
        self.best: dict[str, Any] | None = max(
            (r for r in self.records if r["status"] in ("optimal", "feasible")), key=lambda r: r["score"], default=None
        )
        self.ref: ExactResult | None = None
        self.t0 = time.perf_counter()
        self.last_print = 0.0

    def _run_dir(self) -> Path:
        root = self.s.run_root
        if self.s.resume:
            runs = sorted(p for p in root.glob("*") if (p / "trials.jsonl").exists()) if root.exists() else []
            if not runs:
                raise ConfigError(f"search.resume=true: no earlier run of this exact config under {root}")
            return runs[-1]
        d = root / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        d.mkdir(parents=True)
        return d

    # trials -------------------------------------------------------------------------------------

    def add(self, params: Mapping[str, Any], result: Mapping[str, Any] | None, error: str | None) -> None:
        idx = len(self.records)
        rec: dict[str, Any] = {"trial": idx, "iteration": idx // self.s.batch, "params": dict(params)}
        if error is not None:
            rec.update(dict.fromkeys(METRICS, 0.0), status="error", islands="", note=error)
        else:
            assert result is not None
            rec.update({k: result.get(k) for k in (*METRICS, "status", "islands", "note", "node", "pid")})
        rec["gap"] = self.gap(rec["score"])
        self.journal.append(rec)
        self.records.append(rec)
        if rec["status"] in ("optimal", "feasible") and (self.best is None or rec["score"] > self.best["score"]):
            self.best = rec
        self.tracker.child(
            f"trial-{idx:04d}",
            {**rec["params"], "islands": rec["islands"], "status": rec["status"]},
            {k: rec[k] for k in (*METRICS, "gap") if isinstance(rec.get(k), (int, float))},
            failed=rec["status"] == "error",
        )
        if rec["status"] == "error":
            print(f"[search] trial {idx} failed: {rec['note']}", flush=True)
        self.progress()

    def gap(self, score: float) -> float:
        if self.ref is None or self.s.objective == "thesis":
            return float("nan")
        ref = self.ref.rate_per_dollar if self.s.objective == "rate_per_dollar" else self.ref.rate_req_s
        return 1.0 - score / ref if ref > 0 else float("nan")

    def progress(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last_print < 2.0 and len(self.records) < self.s.trials:
            return
        self.last_print = now
        done_here = len(self.records) - self.resumed
        rate = done_here / max(now - self.t0, 1e-9)
        best = self.best["score"] + 0.0 if self.best else 0.0
        unit = "req/s per $/h" if self.s.objective == "rate_per_dollar" else "req/s"
        gap = self.gap(best)
        gap_txt = f"  gap {gap:.2%}" if gap == gap else ""
        failed = sum(r["status"] == "error" for r in self.records)
        print(
            f"[search] {len(self.records)}/{self.s.trials} trials  best {best:.4g} {unit}{gap_txt}  "
            f"{rate:.2f} trials/s{f'  {failed} failed' if failed else ''}",
            flush=True,
        )

    # the loop -----------------------------------------------------------------------------------

    def run_tune(self, trial_fn: Callable[[Context, Mapping[str, Any]], dict]) -> bool:
        """Run the remaining trials through Ray Tune; False when interrupted."""
        remaining = self.s.trials - len(self.records)
        if remaining <= 0:
            return True
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy reporter honours verbose=0
        # Our journal, trials.parquet and MLflow hold every result, and a resume reads the journal:
        # Tune's per-trial JSON/CSV files and periodic experiment snapshots would only duplicate them.
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "3600")
        from ray import tune
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        searcher = OptunaSearch(
            self.ctx.space.distributions(),
            metric="score",
            mode="max",
            sampler=make_sampler(self.s.sampler, self.s.seed, self.ctx.space, self.s.polish, self.s.trials),
        )
        for r in self.records:  # a resumed search: the sampler learns what is done, nothing re-runs
            searcher.add_evaluated_point(r["params"], float(r["score"]), error=r["status"] == "error")
        run = self

        class Recorder(tune.Callback):
            def __init__(self) -> None:
                self.results: dict[str, dict[str, Any]] = {}

            def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
                self.results[trial.trial_id] = result

            def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
                run.add(trial.config, self.results.pop(trial.trial_id, trial.last_result), None)

            def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
                run.add(trial.config, None, _error_line(trial))

        trainable = tune.with_resources(
            tune.with_parameters(_tune_trial, ctx=self.ctx, trial_fn=trial_fn), {"cpu": self.s.cpus_per_trial}
        )
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=ConcurrencyLimiter(searcher, max_concurrent=self.s.batch, batch=True),
                num_samples=remaining,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name="tune",
                storage_path=str(self.dir),
                verbose=0,
                callbacks=[Recorder()],
                failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
            ),
        )
        tune_log = logging.getLogger("ray.tune")
        level = tune_log.level
        tune_log.setLevel(logging.CRITICAL)  # failed trials are reported one line each, by `add`
        try:
            tuner.fit()
        except KeyboardInterrupt:
            pass
        finally:
            tune_log.setLevel(level)
        return len(self.records) >= self.s.trials


def _error_line(trial: Any) -> str:
    """The trial's own exception as one line (Tune keeps it pickled beside the trial)."""
    try:
        from ray import cloudpickle

        if trial.pickled_error_file and Path(trial.pickled_error_file).exists():
            err = cloudpickle.loads(Path(trial.pickled_error_file).read_bytes())
            cause = getattr(err, "cause", None) or err  # a RayTaskError wraps the trial's exception
            return f"{type(cause).__name__}: {cause}"[:500]
        lines = [ln for ln in Path(trial.error_file).read_text().splitlines() if ln.strip()]
        return lines[-1][:500]
    except Exception:  # the record must be written whatever the error looks like
        return "trial failed (see the Ray Tune log)"


# --- one search, end to end ----------------------------------------------------------------------


def execute(cfg: Any, trial_fn: Callable[[Context, Mapping[str, Any]], dict] = run_trial) -> int:
    """Run the search `cfg` describes; returns the exit code (0 done, 130 interrupted)."""
    from omegaconf import OmegaConf

    from pipeline.plan import build_plan, convergence_plot, report, write_json, write_trials
    from pipeline.tracking import Tracker

    if "inventory" in cfg:
        inv_name, inv_cfg = choice("inventory"), cfg.inventory
    else:
        inv_name, inv_cfg = DEFAULT_INVENTORY, OmegaConf.load(CONF_DIR / "inventory" / f"{DEFAULT_INVENTORY}.yaml")
    settings, ctx = settings_from_cfg(cfg, inv_name, inv_cfg)
    tracker = Tracker(settings.mlflow_uri, settings.mlflow_experiment)
    run = SearchRun(settings, ctx, tracker)
    planner = ctx.planner
    polish = f" (the last {round(settings.polish * settings.trials)} polish the best)" if settings.polish else ""
    print(
        f"[search] {settings.inventory.describe()}; workload {settings.workload_name}; {settings.generator} "
        f"layouts, sampler {settings.sampler}, {settings.iterations} x {settings.batch} trials{polish}, objective "
        f"{settings.objective}; minimum island "
        + ", ".join(f"{g} {n}" for g, n in ctx.space.min_island)
        + f"\n[search] run folder {run.dir}"
        + (f"\n[search] resuming: {run.resumed} trials already done" if run.resumed else ""),
        flush=True,
    )
    ref_path = run.dir / "reference.json"
    if ref_path.exists():
        run.ref = ExactResult(**{**json.loads(ref_path.read_text()), "islands": ()})
    elif settings.reference or settings.sampler == "exact":
        run.ref = reference(settings, ctx, planner)
        print(
            f"[search] exact optimum {run.ref.rate_req_s:.2f} req/s at ${run.ref.cost_per_hour:,.0f}/h "
            f"({run.ref.status}, {run.ref.solve_ms / 1e3:.1f} s)",
            flush=True,
        )
        write_json(ref_path, {**run.ref.__dict__, "islands": [list(t) for t in run.ref.islands]})
    state_path = run.dir / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    params = {
        "inventory": settings.inventory.describe(),
        "workload": settings.workload_name,
        "model": planner.model.name,
        "cost_profile": planner.profile.name,
        "generator": settings.generator,
        "sampler": settings.sampler,
        "objective": settings.objective,
        "iterations": settings.iterations,
        "batch": settings.batch,
        "seed": settings.seed,
        "run_dir": str(run.dir),
        **{f"search.{k}": v for k, v in settings.config["search"].items() if k not in ("resume",)},
    }
    state["parent_run_id"] = tracker.start_parent(run.dir.parent.name, params, state.get("parent_run_id"))
    write_json(state_path, state)
    write_json(run.dir / "config.json", settings.config)

    t_start = time.perf_counter()
    complete = True
    if settings.sampler == "exact":
        best_layout = Layout.of([(g, n) for g, n, _ in _exact_islands(run, ref_path)])
    else:
        complete = _with_ray(settings, lambda: run.run_tune(trial_fn))
        run.progress(force=True)
        best_layout = Layout.of(ctx.space.layout(run.best["params"])) if run.best else None
    wall_s = time.perf_counter() - t_start

    df = write_trials(run.dir / "trials.parquet", run.records)
    unit = "req/s per $/h" if settings.objective == "rate_per_dollar" else "req/s"
    ref_score = None
    if run.ref is not None:
        ref_score = run.ref.rate_per_dollar if settings.objective == "rate_per_dollar" else run.ref.rate_req_s
    convergence_plot(
        run.dir / "convergence.png",
        run.records,
        settings.batch,
        ref_score if settings.objective != "thesis" else None,
        unit,
        f"{settings.inventory.name}, {settings.workload_name}: {settings.sampler} ({settings.generator})",
    )
    if best_layout is None:
        plan: dict[str, Any] = {"status": "no feasible layout", "rate_req_s": 0.0, "islands": []}
    else:
        plan = build_plan(planner, best_layout, ctx.inner_time_limit_s, ctx.backend)
    score = plan.get("rate_per_dollar" if settings.objective == "rate_per_dollar" else "rate_req_s", 0.0)
    plan.update(
        {
            "objective": settings.objective,
            "reference_optimum_req_s": None if run.ref is None else run.ref.rate_req_s,
            "reference_rate_per_dollar": None if run.ref is None else run.ref.rate_per_dollar,
            "gap": run.gap(score) if settings.objective != "thesis" else _thesis_gap(run, plan),
            "workload": settings.workload_name,
            "inventory": {
                "name": settings.inventory.name,
                "gpus": {g.name: n for g, n in zip(settings.inventory.gpus, settings.inventory.counts, strict=True)},
                "cost_per_hour": settings.inventory.cost_per_hour,
            },
            "model": planner.model.name,
            "cost_profile": planner.profile.name,
            "sampler": settings.sampler,
            "generator": settings.generator,
            "trials": len(run.records),
            "failed": sum(r["status"] == "error" for r in run.records),
            "rejected": sum(r["status"] == "rejected" for r in run.records),
            "complete": complete,
            "wall_s": wall_s,
        }
    )
    if best_layout is not None:
        write_json(run.dir / "plan.json", plan)
        (run.dir / "report.md").write_text(
            report(
                plan,
                df,
                f"# Search: {run.dir.parent.name}\n\n{settings.inventory.describe()}; workload "
                f"{settings.workload_name}; model {planner.model.name}, cost profile {planner.profile.name}; "
                f"{settings.generator} + {settings.sampler}, objective {settings.objective}",
            )
        )
    tracker.finish_parent(
        {
            "best_rate_req_s": plan.get("rate_req_s", 0.0),
            "best_rate_per_dollar": plan.get("rate_per_dollar", 0.0),
            "gap": plan["gap"] if plan["gap"] is not None else float("nan"),
            "reference_optimum_req_s": plan["reference_optimum_req_s"] or float("nan"),
            "wall_s": wall_s,
            "trials": float(len(run.records)),
        },
        [run.dir / f for f in ("plan.json", "report.md", "convergence.png", "trials.parquet", "reference.json")],
        status="FINISHED" if complete else "KILLED",
    )
    gap = plan["gap"]
    print(
        f"[search] best {plan.get('rate_req_s', 0.0):.2f} req/s (${plan.get('cost_per_hour', 0.0):,.0f}/h)"
        + (f", gap to the exact optimum {gap:.2%}" if gap is not None and gap == gap else "")
        + f"; wrote {run.dir}/ (plan.json, report.md, trials.parquet, convergence.png)",
        flush=True,
    )
    if not complete:
        print(
            f"[search] interrupted after {len(run.records)}/{settings.trials} trials; finished trials are kept. "
            "Continue with the same command plus search.resume=true",
            file=sys.stderr,
            flush=True,
        )
        return 130
    return 0


def _exact_islands(run: SearchRun, ref_path: Path) -> list[tuple[str, int, str]]:
    assert run.ref is not None
    if run.ref.islands:
        return list(run.ref.islands)
    return [tuple(t) for t in json.loads(ref_path.read_text())["islands"]]  # type: ignore[misc]


def _thesis_gap(run: SearchRun, plan: Mapping[str, Any]) -> float | None:
    """For the thesis objective: the best layout's max_rate Λ against the exact optimum of that model."""
    if run.ref is None or run.ref.rate_req_s <= 0 or "rate_req_s" not in plan:
        return None
    return 1.0 - float(plan["rate_req_s"]) / run.ref.rate_req_s


def _with_ray(settings: Settings, body: Callable[[], bool]) -> bool:
    import ray

    started = False
    if not ray.is_initialized():
        try:
            if settings.ray_address is None:
                ray.init(
                    num_cpus=settings.ray_num_cpus,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
            else:
                ray.init(address=settings.ray_address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise ConfigError(f"ray.address={settings.ray_address}: cannot reach a Ray cluster ({err})") from None
        started = True
    try:
        return body()
    finally:
        if started:
            ray.shutdown()


# --- command line --------------------------------------------------------------------------------

GROUPS = ("inventory", "workload", "model", "costmodel", "search")


def precheck(argv: list[str], groups: tuple[str, ...] = GROUPS) -> None:
    """Unknown config-group options as one line (Hydra's own message is a screenful)."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in groups:
            continue
        names = sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml"))
        for v in value.split(","):
            if v and v not in names:
                print(f"error: {key}={v}: there is no conf/{key}/{v}.yaml; choose from {names}", file=sys.stderr)
                sys.exit(2)


def _main() -> None:
    import hydra

    from pipeline.config import run_cli

    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="search")(run_cli(execute))()


if __name__ == "__main__":
    precheck(sys.argv[1:])
    _main()

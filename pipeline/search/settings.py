"""A search's settings: the composed config turned into validated, frozen objects, before any work.

`settings_from_cfg` is the one place a search config is read (`pipeline.search`,
`pipeline.experiment`, `pipeline.baseline` and the benchmarks all call it); `planner_from_cfg`
the one place a `Planner` is built from a config. Every value is checked here, with a message
that names the key and how to fix it, so nothing expensive starts on a config that cannot run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from costmodel.calibration import Calibration
from costmodel.catalog import CONF_DIR
from costmodel.specs import Model
from pipeline.checks import boolean, fraction, number, optional_positive, positive_int, whole_number
from pipeline.cli import choice, plain
from pipeline.errors import ConfigError
from pipeline.planning.config import cost_settings_from_cfg, model_from_cfg
from pipeline.planning.goodput import GoodputCheck
from pipeline.planning.inventory import Inventory, inventory_from_cfg
from pipeline.planning.planner import Planner
from pipeline.planning.workload import Workload, ranges_from_cfg, workload_from_cfg
from pipeline.search.features import BY_SETTING, Choices, check_features, excluded_by
from pipeline.search.samplers import SAMPLERS
from pipeline.search.space import GENERATORS, Space
from plan import Plan, node_spans
from solvers.inner import BACKENDS
from solvers.layouts import node_shapes, smallest_shape

OBJECTIVES = ("max_rate", "rate_per_dollar", "min_cost", "thesis", "goodput")
PRICED = ("rate_per_dollar", "min_cost")  # objectives that need every GPU type's price
SHAPES = ("nodes", "any")  # search.shapes: node-aligned islands (solvers/layouts.py) or any size
DEFAULT_INVENTORY = "hetero_a"
# every key a `conf/search/*.yaml` sets: anything else under `search.` is a typo, not a setting
SEARCH_KEYS = frozenset(k for p in (CONF_DIR / "search").glob("*.yaml") for k in (yaml.safe_load(p.read_text()) or {}))
SEARCH_KEYS = SEARCH_KEYS - {"defaults"}


@dataclass(frozen=True)
class SpaceSettings:
    """The layouts a search may propose, before the minimum island sizes are resolved (`context`)."""

    generator: str
    min_island: Any  # a size or `auto`
    min_island_per_type: Mapping[str, Any]
    skew_range: float
    max_islands: int | None
    k_slots: int
    repair: bool
    counts_are_bounds: bool
    grid_points: int
    node: tuple[tuple[str, int], ...] | None  # (GPU type, GPUs per host) with node-aligned shapes


@dataclass(frozen=True)
class SearchOptions:
    """The `search` group: how layouts are proposed and scored (the post-search steps read their own settings)."""

    sampler: str
    generator: str
    iterations: int
    batch: int
    polish: float  # fraction of trials, at the end, that refine the best layout locally
    objective: str
    seed: int
    resume: bool
    reference: bool  # solve the exact reference and give every trial's gap to it
    reference_spare: bool  # search.reference=spare: the reference is the optimum with the worst host lost
    reference_time_limit_s: float
    inner_time_limit_s: float
    backend: str  # the inner MILP's solver
    robust: bool  # plan at every calibration factor's 10th percentile
    spare_hosts: int  # score each layout by its lowest rate with any this many hosts lost (0: every host up)
    arrivals: str  # poisson, or workload: plan for the workload's own arrivals (its trace's bursts)
    goodput: GoodputCheck | None  # objective goodput: how each layout is simulated
    demand_req_s: float | None = None  # objective min_cost: the rate the cheapest fleet must serve

    @property
    def trials(self) -> int:
        return self.iterations * self.batch


@dataclass(frozen=True)
class Replanning:
    """search.from_plan: re-plan a running plan for this inventory and workload within few moves."""

    plan: Plan  # the running plan
    path: str
    max_moves: int  # a re-plan changes at most this many islands
    max_hosts: int | None  # and re-launches at most this many hosts (None: no bound)
    lost_hosts: tuple[tuple[str, int], ...]  # hosts of the running plan that are gone


@dataclass(frozen=True)
class RayOptions:
    """The `ray` block: a local Ray (address None) or a cluster's."""

    address: str | None
    num_cpus: int | None
    cpus_per_trial: float


@dataclass(frozen=True)
class MlflowOptions:
    """The `mlflow` block: the tracking store (None: outputs/mlflow.db) and the experiment."""

    tracking_uri: str | None
    experiment: str


@dataclass(frozen=True)
class Settings:
    """A search's settings, as the config's groups give them."""

    inventory: Inventory
    workload_name: str
    planning: Planner  # model, workload, ranges and cost settings (costmodel, slo): no island benchmarked yet
    calibration: Calibration | None  # the cost model's calibration (before robust's shift)
    search: SearchOptions
    replan: Replanning | None  # search.from_plan (None: a plan from scratch)
    space: SpaceSettings
    ray: RayOptions
    mlflow: MlflowOptions
    run_root: Path  # outputs/search/<name>-<hash>
    key: str  # the run's identity (config hash)
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config, for the record
    # each post-search step's own settings by its name (PlanStep.read; pipeline.search.steps.read_steps)
    steps: Mapping[str, Any] = field(default_factory=dict)
    spare_off: str = ""  # why search.spare_hosts=auto planned with every host up ("": it did not, or was not auto)

    @property
    def mode(self) -> str:
        """How the layout is found: `search` (trials), `exact` (the exact MILP) or `replan` (from a running plan)."""
        return "replan" if self.replan is not None else "exact" if self.search.sampler == "exact" else "search"


def inventory_of(cfg: Any) -> tuple[str, Any]:
    """The inventory the command names (`+inventory=NAME`), or the default one."""
    if "inventory" in cfg:
        return choice("inventory"), cfg.inventory
    from omegaconf import OmegaConf

    return DEFAULT_INVENTORY, OmegaConf.load(CONF_DIR / "inventory" / f"{DEFAULT_INVENTORY}.yaml")


def planner_from_cfg(
    cfg: Any, gpus: Mapping[str, Any], kv_transfer: bool = False, budget: float | None = None,
    prefix_cache: bool = False,
) -> Planner:
    """The planner of a config: model, workload, ranges and the one cost-settings record; `prefix_cache`: prefill
    priced at the expected hit rates of the workload's prefix reuse, where its trace names its blocks."""
    model = model_from_cfg(choice("model"), cfg.model)
    workload = workload_from_cfg(choice("workload"), plain(cfg.workload))
    check_context(workload, model)
    return Planner(
        reuse=workload.reuse if prefix_cache else None,
        model=model,
        workload=workload,
        ranges=ranges_from_cfg(workload, cfg.ranges.width, most=cfg.ranges.get("max")),
        cost=cost_settings_from_cfg(cfg, model.name),
        gpus=dict(gpus),
        kv_transfer=kv_transfer,
        budget_per_hour=budget,
    )


def check_context(workload: Workload, model: Any) -> None:
    """Every request of the workload must fit the model's context (its longest prompt plus the longest output)."""
    longest = len(workload.pmf) - 1 + workload.max_decode
    if model.max_context and longest > model.max_context:
        raise ConfigError(
            f"workload {workload.name}: its longest prompt ({len(workload.pmf) - 1} tokens) plus its longest "
            f"output ({workload.max_decode}) is {longest} tokens, over {model.name}'s context of "
            f"{model.max_context} (max_context in conf/model/{model.name}.yaml): drop or cut those requests"
        )


def settings_from_cfg(cfg: Any, inventory_name: str, inv_cfg: Any) -> tuple[Settings, Any]:
    """(Settings, trial Context) of a composed search config; ConfigError names the first bad value."""
    settings = read_settings(cfg, inventory_name, inv_cfg)
    return settings, context(settings)


def read_settings(cfg: Any, inventory_name: str, inv_cfg: Any) -> Settings:
    """The search settings of a composed config, every value checked, no island benchmarked yet (`context` does
    that): what can be refused cheaply is refused before anything expensive starts."""
    s = cfg.search
    unknown = sorted(set(s) - SEARCH_KEYS)
    if unknown:
        raise ConfigError(
            f"search.{unknown[0]} is not a search setting (a typo?): the settings are {sorted(SEARCH_KEYS)}"
        )
    inventory = inventory_from_cfg(inventory_name, plain(inv_cfg))
    budget = optional_positive(s.budget_per_hour, "search.budget_per_hour")
    kv_transfer = boolean(s.kv_transfer, "search.kv_transfer")
    planner = planner_from_cfg(cfg, {g.name: g for g in inventory.gpus}, kv_transfer, budget,
                               boolean(s.prefix_cache, "search.prefix_cache"))  # fmt: skip
    search = search_from_cfg(s)
    replanning = replanning_from_cfg(s, inventory, planner.model) if s.get("from_plan") is not None else None
    if replanning is None and plain(s.get("lost_hosts")):
        raise ConfigError("search.lost_hosts names hosts of a running plan that are gone: give that plan too "
                          "(search.from_plan=PATH), or drop search.lost_hosts")  # fmt: skip
    calibration = planner.profile.calibration
    if search.objective in PRICED:
        check_prices(inventory_name, inventory, search.objective)
    choices = Choices(
        objective=search.objective, sampler=search.sampler, workload=choice("workload"), budget=budget is not None,
        kv_transfer=kv_transfer,
        aggregated=planner.cost.engine.aggregated, arrivals=search.arrivals,
        trace=planner.workload.arrival_profile is not None, slo=planner.cost.slo.any, spare_hosts=search.spare_hosts,
        from_plan=replanning is not None, robust=search.robust,
        calibrated=calibration is not None and calibration.uncertain,
    )  # fmt: skip
    spare_off = ""
    if search.spare_hosts == SPARE_AUTO:  # one host lost where the search can plan for it, else every host up
        spare_off = spare_excluded(dataclasses.replace(choices, spare_hosts=1), inventory.hosts)
        search = dataclasses.replace(search, spare_hosts=0 if spare_off else 1)
        choices = dataclasses.replace(choices, spare_hosts=search.spare_hosts)
    check_features(choices)
    if search.reference_spare and search.spare_hosts != 1:
        raise ConfigError(f"search.reference=spare solves the optimum with one host lost; this search plans for "
                          f"{search.spare_hosts}: set search.spare_hosts=1, or search.reference=true")  # fmt: skip
    if search.spare_hosts:
        check_spare_hosts(search.spare_hosts, inventory)
    if search.robust:  # every factor at its 10th percentile
        from costmodel.calibration import Z10
        from pipeline.planning.band import redrawn

        planner = redrawn(planner, calibration.shifted(-Z10))
    if search.arrivals == "workload":  # every island's SLO caps under the workload's bursts
        planner = planner.bursty() or planner
    record = {k: plain(cfg[k]) for k in cfg if k != "hydra"}
    record["inventory"] = {"name": inventory_name, **plain(inv_cfg)}
    record["search"]["min_island_per_type"] = record["search"].get("min_island_per_type") or {}
    ident = {**run_identity(record), "calibration": calibration_identity(calibration)}
    digest = hashlib.sha1(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:8]
    workload_name = choice("workload")
    name = f"{inventory_name}-{workload_name}-{search.generator}-{search.sampler}-{search.objective}-{digest}"
    return Settings(
        inventory=inventory,
        workload_name=workload_name,
        planning=planner,
        calibration=calibration,
        search=search,
        replan=replanning,
        # (min_cost: every layout splits the whole inventory; the inner MILP leaves the islands it need not buy idle)
        space=space_from_cfg(s, inventory, bounds=search.objective == "rate_per_dollar" or budget is not None),
        ray=RayOptions(
            address=None if cfg.ray.address is None else str(cfg.ray.address),
            num_cpus=None if cfg.ray.num_cpus is None else positive_int(cfg.ray.num_cpus, "ray.num_cpus"),
            cpus_per_trial=number(cfg.ray.cpus_per_trial, "ray.cpus_per_trial", low=0.01),
        ),
        mlflow=MlflowOptions(
            tracking_uri=None if cfg.mlflow.tracking_uri is None else str(cfg.mlflow.tracking_uri),
            experiment=str(cfg.mlflow.experiment),
        ),
        run_root=Path(str(cfg.out_root)) / name,
        key=digest,
        config=record,
        spare_off=spare_off,
    )


def search_from_cfg(s: Any) -> SearchOptions:
    """The `search` group's values, each checked (ConfigError names the key)."""
    sampler, objective, generator = str(s.sampler), str(s.objective), str(s.generator)
    if sampler not in (*SAMPLERS, "exact"):
        raise ConfigError(f"search.sampler={sampler!r} is unknown: choose from {[*SAMPLERS, 'exact']}")
    if objective not in OBJECTIVES:
        raise ConfigError(f"search.objective={objective!r} is unknown: choose from {list(OBJECTIVES)}")
    if generator not in GENERATORS:
        raise ConfigError(f"search.generator={generator!r}: choose from {list(GENERATORS)}")
    backend = str(s.inner_backend).upper()
    if backend not in BACKENDS:
        raise ConfigError(f"search.inner_backend={s.inner_backend!r}: choose from {list(BACKENDS)}")
    arrivals = str(s.get("arrivals", "poisson"))
    if arrivals not in ("poisson", "workload"):
        raise ConfigError(f"search.arrivals={arrivals!r}: choose poisson, or workload (the arrival model fitted to "
                          "the workload's trace)")  # fmt: skip
    return SearchOptions(
        sampler=sampler,
        generator=generator,
        iterations=positive_int(s.iterations, "search.iterations"),
        batch=positive_int(s.batch, "search.batch"),
        polish=fraction(s.polish, "search.polish"),
        objective=objective,
        seed=whole_number(s.seed, "search.seed"),
        resume=boolean(s.resume, "search.resume"),
        reference=str(s.reference) == "spare" or _or_word(boolean, s.reference, "search.reference", "spare",
                                                         "the optimum with the worst host lost"),
        reference_spare=str(s.reference) == "spare",
        reference_time_limit_s=number(s.reference_time_limit_s, "search.reference_time_limit_s", low=0.001),
        inner_time_limit_s=number(s.inner_time_limit_s, "search.inner_time_limit_s", low=0.001),
        backend=backend,
        robust=boolean(s.get("robust", False), "search.robust"),
        spare_hosts=SPARE_AUTO if str(s.get("spare_hosts", 0)) == "auto"
        else _or_word(whole_number, s.get("spare_hosts", 0), "search.spare_hosts", "auto",
                      "one host where the search can plan for it"),
        arrivals=arrivals,
        goodput=goodput_from_cfg(s.get("goodput") or {}) if objective == "goodput" else None,
        demand_req_s=demand_from_cfg(s.get("demand_req_s"), objective),
    )


def demand_from_cfg(value: Any, objective: str) -> float | None:
    """search.demand_req_s: the sizing objective's demand, a finite rate > 0; with objective min_cost only."""
    if objective != "min_cost":
        if value is not None:
            raise ConfigError(f"search.demand_req_s={value!r} is the demand of the sizing objective: add "
                              "search.objective=min_cost (the cheapest fleet for it), or drop search.demand_req_s")
        return None
    if value is None:
        raise ConfigError("search.objective=min_cost finds the cheapest fleet for a demand: set search.demand_req_s "
                          "(requests/s, e.g. search.demand_req_s=300)")  # fmt: skip
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    if not ok:
        raise ConfigError(f"search.demand_req_s={value!r}: the demand must be a finite number of requests/s > 0")
    return float(value)


def check_prices(inventory_name: str, inventory: Inventory, objective: str) -> None:
    """A $ objective prices every GPU type of the inventory: one without a price (0) is refused."""
    free = [g.name for g in inventory.gpus if g.price_per_hour <= 0]
    if free:
        raise ConfigError(f"search.objective={objective} prices every GPU, and {free[0]} has none in inventory "
                          f"{inventory_name} (price_per_hour 0 in conf/gpu/{free[0]}.yaml): set "
                          f"prices: {{{free[0]}: <USD per GPU-hour>}} in the inventory, or drop {free[0]}")


def space_from_cfg(s: Any, inventory: Inventory, bounds: bool) -> SpaceSettings:
    """The layouts the search may propose (`search`: generator, shapes, island sizes, skew, slots); `bounds`: the
    inventory's counts are upper bounds (a $ objective or budget), not what every layout uses."""
    on_violation = str(s.get("on_violation", "reject"))
    if on_violation not in ("reject", "repair"):
        raise ConfigError(f"search.on_violation={on_violation!r}: choose reject or repair")
    shapes = str(s.shapes)
    if shapes not in SHAPES:
        raise ConfigError(
            f"search.shapes={shapes!r}: choose nodes (islands fit hosts) or any (the thesis's free sizes)"
        )
    per_type = plain(s.min_island_per_type) or {}
    if not isinstance(per_type, Mapping):
        raise ConfigError(f"search.min_island_per_type must map GPU names to sizes, got {per_type!r}")
    return SpaceSettings(
        generator=str(s.generator),
        min_island=plain(s.min_island),
        min_island_per_type=per_type,
        skew_range=number(s.skew_range, "search.skew_range", low=0),
        max_islands=None if str(s.max_islands) == "auto" else positive_int(s.max_islands, "search.max_islands"),
        k_slots=positive_int(s.get("k_slots", 16), "search.k_slots"),
        repair=on_violation == "repair",
        counts_are_bounds=bounds,
        grid_points=positive_int(s.grid_points, "search.grid_points"),
        node=tuple((g.name, g.node_gpus) for g in inventory.gpus) if shapes == "nodes" else None,
    )


def replanning_from_cfg(s: Any, inventory: Inventory, model: Model) -> Replanning:
    """search.from_plan (the running plan), search.lost_hosts (the hosts of it that are gone) and the re-plan's
    bounds, checked: the running plan is of this search's model and its islands run on GPUs of this inventory, and
    every lost host is one of the running plan's."""
    import plan as plans

    running = plans.load(str(s.from_plan), "search.from_plan")
    if running.model != model:
        raise ConfigError(f"search.from_plan={s.from_plan} runs {running.model.name}; this search plans {model.name}: "
                          f"re-plan with model={running.model.name}, or plan {model.name} from scratch")  # fmt: skip
    gpus = {g.name: g for g in inventory.gpus}
    lost = []
    for item in plain(s.get("lost_hosts")) or []:
        gpu, _, node = str(item).partition(":")
        if gpu not in gpus or not node.strip().isdigit():
            raise ConfigError(f"search.lost_hosts: {item!r} is not GPU:host with a GPU of the inventory "
                              f"({sorted(gpus)}) and a host number, e.g. H20:11")  # fmt: skip
        had = running_hosts(running, gpu)
        if int(node) not in had:
            raise ConfigError(f"search.lost_hosts: {item!r} is not a host of the running plan (its {gpu} hosts are "
                              f"{node_spans(had) or 'none'})")  # fmt: skip
        lost.append((gpu, int(node)))
    mixed = [k for k, isl in enumerate(running.islands) if isl.role == "aggregated"]
    if mixed:
        raise ConfigError(
            f"search.from_plan={s.from_plan}: island {mixed[0]} runs aggregated engines; a re-plan keeps prefill "
            "and decode islands only: plan from scratch (drop search.from_plan)"
        )
    unknown = sorted({isl.gpu for isl in running.islands if isl.serving} - set(gpus))
    if unknown:
        raise ConfigError(f"search.from_plan={s.from_plan}: its islands run on {unknown[0]}, which this "
                          f"inventory does not have ({sorted(gpus)}): re-plan with the inventory the plan runs on, "
                          "changed")  # fmt: skip
    max_hosts = None if s.get("max_hosts") is None else whole_number(s.max_hosts, "search.max_hosts")
    return Replanning(running, str(s.from_plan), positive_int(s.get("max_moves", 3), "search.max_moves"), max_hosts,
                      tuple(lost))  # fmt: skip


def running_hosts(running: Plan, gpu: str) -> tuple[int, ...]:
    """The hosts of GPU type `gpu` a running plan has: those of its inventory where it records one (numbered from 0),
    and every host an island of it runs on."""
    node = next((isl.hosts.node_gpus for isl in running.islands if isl.gpu == gpu and isl.hosts), None)
    counted = dict(running.inventory.gpus).get(gpu, 0) if running.inventory is not None else 0
    recorded = range(-(-counted // node)) if node else range(0)
    used = {h for isl in running.islands if isl.gpu == gpu and isl.hosts for h in isl.hosts.nodes}
    return tuple(sorted({*recorded, *used}))


def _or_word(read: Any, value: Any, key: str, word: str, meaning: str) -> Any:
    """`read(value, key)`, its error naming `word` too: a setting that takes a value or that word."""
    try:
        return read(value, key)
    except ConfigError as err:
        raise ConfigError(f"{err} (or {word}: {meaning})") from None


SPARE_AUTO = -1  # search.spare_hosts=auto before it is resolved (read_settings): 1 where the search can plan for it


def spare_excluded(choices: Choices, hosts: int) -> str:
    """Why search.spare_hosts=auto plans with every host up ("" where it plans for one host lost): a setting
    search.spare_hosts=1 cannot go with, or an inventory of one host."""
    from pipeline.planning.failures import COMBINATIONS

    if hosts <= 1:
        return f"the inventory has {hosts} host"
    if hosts > COMBINATIONS:
        return f"{hosts:,} hosts, more losses than a trial scores (at most {COMBINATIONS:,})"
    other = excluded_by(BY_SETTING["search.spare_hosts={spare_hosts}"], choices)
    return f"{other} cannot plan for it" if other else ""


def check_whole_hosts(space: Space, planner: Planner) -> None:
    """search.reference=spare scores a host lost as one island lost: every island size must be whole hosts."""
    for g, _ in space.inventory:
        node = planner.gpus[g].node_gpus
        part = [n for n in space.sizes(g) if n % node]
        if part:
            raise ConfigError(f"search.reference=spare: {g} islands of {part[0]} GPUs share a host of {node}, so a "
                              "host lost stops several islands, which the optimum with one host lost does not "
                              "model: use search.shapes=nodes with search.min_island at least a host, or "
                              "search.reference=true")  # fmt: skip


def check_spare_hosts(spare: int, inventory: Inventory) -> None:
    """search.spare_hosts=K is a score of the search's trials over every set of K hosts: refused where it would
    take too long (too many sets of hosts) or leave nothing to serve with."""
    from pipeline.planning.failures import COMBINATIONS

    hosts = inventory.hosts
    if spare >= hosts:
        raise ConfigError(f"search.spare_hosts={spare}: the inventory has {hosts} hosts; losing {spare} leaves "
                          "nothing to serve with. Use fewer")  # fmt: skip
    sets = math.comb(hosts, spare)
    if sets > COMBINATIONS:
        raise ConfigError(f"search.spare_hosts={spare}: {sets:,} sets of {spare} of the inventory's {hosts} hosts "
                          f"to score in every trial (at most {COMBINATIONS:,}): use a smaller K")  # fmt: skip


def context(settings: Settings) -> Any:
    """The search's trial context: the minimum island sizes resolved (`auto` benchmarks islands), the space of
    layouts, and the check that a plan exists at all (a prefill and a decode island at once)."""
    from pipeline.search.trial import Context

    inventory, planner, sp = settings.inventory, settings.planning, settings.space
    node = None if sp.node is None else dict(sp.node)
    mins = min_islands(sp.min_island, sp.min_island_per_type, inventory, planner, node)
    space = Space(
        sp.generator,
        inventory.named,
        tuple(mins.items()),
        skew_range=sp.skew_range,
        max_islands=sp.max_islands,
        k_slots=sp.k_slots,
        repair=sp.repair,
        counts_are_bounds=sp.counts_are_bounds,
        grid_points=sp.grid_points,
        node=sp.node,
    )
    check_a_plan_exists(planner, inventory, space)
    o = settings.search
    if o.reference_spare:
        check_whole_hosts(space, planner)
    return Context(planner, space, o.objective, o.inner_time_limit_s, settings.key, o.backend, o.goodput,
                   o.spare_hosts, o.demand_req_s, settings.inventory.cost_per_hour)  # fmt: skip


def recorded(settings: Settings, ctx: Any) -> dict[str, Any]:
    """The resolved config as config.json keeps it: the settings' record with the minimum islands resolved."""
    record = dict(settings.config)
    record["search"] = {**record["search"], "min_island_by_type": dict(ctx.space.min_island)}  # `auto` resolved
    return record


def goodput_from_cfg(g: Any) -> GoodputCheck:
    """`search.goodput`: seconds of arrivals per simulation (and at most, where that window is too short
    for a steady state) and simulations (bisection steps) per layout."""
    if not isinstance(g, Mapping):
        raise ConfigError(f"search.goodput must be a mapping (seconds, longest_s, steps), got {g!r}")
    unknown = sorted(set(g) - {"seconds", "longest_s", "steps"})
    if unknown:
        raise ConfigError(
            f"search.goodput.{unknown[0]} is not a goodput setting: choose from seconds, longest_s, steps"
        )
    default = GoodputCheck()
    seconds = number(g.get("seconds", default.seconds), "search.goodput.seconds", low=1)
    return GoodputCheck(
        seconds=seconds,
        longest_s=number(g.get("longest_s", max(default.longest_s, seconds)), "search.goodput.longest_s", low=seconds),
        steps=positive_int(g.get("steps", default.steps), "search.goodput.steps"),
    )


def calibration_identity(cal: Calibration | None) -> dict[str, Any] | None:
    """A calibration's content, for a run's identity: a calibration file refitted under the same name (a new
    release's `serving`) makes a new run, not the resume of one priced with the old factors."""
    return None if cal is None else cal.to_json()


def run_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """What decides a run's results: its config without where it runs, logs and writes, which MILP
    backend solves it (speed, not the model: a run resumes under another backend) and what follows
    from the rest (the resolved minimum island sizes)."""
    out = {k: v for k, v in config.items() if k not in ("ray", "mlflow", "out_root")}
    out["search"] = {
        k: v
        for k, v in config["search"].items()
        if k not in ("resume", "inner_backend", "min_island_by_type", "verify", "host_losses")
        and not (k == "goodput" and config["search"].get("objective") != "goodput")
    }
    return out


def min_islands(
    everywhere: Any,
    per_type: Mapping[str, Any],
    inventory: Inventory,
    planner: Planner,
    node: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Minimum island size per GPU type: `search.min_island` (a number or `auto`), per-type overrides winning.

    `auto`: the smallest island of that type that can run the model in prefill or decode (its
    weights, KV cache and SLOs, as the cost model sees them). Smaller islands would only idle,
    so the search does not spend trials on them; a type on which no island fits gets its largest
    island as the minimum (one island, left idle by the inner solver). A dense model's island is a pool of
    replicas of tp GPUs each, so `auto` rounds its minimum up to a whole host: islands of one GPU would multiply the
    islands a trial solves for (Llama-3.3-70B on hetero_a: 8 minutes against 41 s) for 0.5 % of the exact optimum
    (701.47 against 698.13 req/s). With node-aligned shapes
    (`node`: GPUs per host) the minimum is a shape: a number rounds up to the next one.
    """
    unknown = sorted(set(per_type) - {g.name for g in inventory.gpus})
    if unknown:
        raise ConfigError(f"search.min_island_per_type names {unknown}, not in inventory {inventory.describe()}")
    out = {}
    for g, count in inventory:
        value = per_type.get(g.name, everywhere)
        where = f"search.min_island_per_type.{g.name}" if g.name in per_type else "search.min_island"
        sizes = list(range(1, count + 1)) if node is None else list(node_shapes(node[g.name], count))
        if value == "auto":
            out[g.name] = next((n for n in sizes if runs(planner, g.name, n)), sizes[-1])
            if planner.model.dense:  # replicas of tp GPUs: an island of whole hosts holds as many as it fits
                out[g.name] = next((n for n in sizes if n >= max(out[g.name], g.gpus_per_node)), sizes[-1])
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where} must be a whole number >= 1 or auto, got {value!r}: set {where}=N or =auto")
        elif node is not None and value <= count and not smallest_shape(value, sizes):
            raise ConfigError(
                f"{where}={value}: no island of at least {value} {g.name} fits whole hosts of {node[g.name]} within "
                f"the {count} of the inventory: lower it, or set search.shapes=any"
            )
        else:
            out[g.name] = smallest_shape(value, sizes) if node is not None and value <= count else value
    return out


def runs(planner: Planner, gpu: str, size: int) -> bool:
    """Can an island of `size` GPUs of type `gpu` run the model in at least one phase?"""
    b = planner.benchmark(gpu, size)
    return b.prefill.chosen >= 0 or b.decode.chosen >= 0 or (b.aggregated is not None and b.aggregated.chosen >= 0)


def idle_types(planner: Planner, inventory: Inventory) -> list[str]:
    """GPU types of which not even one island of every GPU can run the model in either phase."""
    return [g.name for g, n in inventory if not runs(planner, g.name, n)]


def check_a_plan_exists(planner: Planner, inventory: Inventory, space: Space) -> None:
    """A plan needs a prefill island and a decode island at once, or an aggregated island: an inventory where no
    layout has either is a config error naming why (memory, or an SLO no configuration meets), not a search that
    ends at 0 req/s."""
    full = {g.name: planner.benchmark(g.name, n) for g, n in inventory}
    if planner.cost.engine.aggregated and any(
        (b := planner.benchmark(g.name, s)).aggregated is not None and b.aggregated.chosen >= 0
        for g in inventory.gpus
        for s in space.sizes(g.name)
    ):
        return
    pre = [g for g, b in full.items() if b.prefill.chosen >= 0]
    dec = [g for g, b in full.items() if b.decode.chosen >= 0]
    if any(p != d for p in pre for d in dec):
        return
    for g in set(pre) & set(dec):  # one type does both: is there room for an island of each?

        def smallest(phase: str, g: str = g) -> int:
            ok = (s for s in space.sizes(g) if getattr(planner.benchmark(g, s), phase).chosen >= 0)
            return next(ok, inventory.count(g) + 1)

        if smallest("prefill") + smallest("decode") <= inventory.count(g):
            return
    why = "; ".join(f"{b.prefill.reason or b.decode.reason}" for b in full.values() if b.prefill.reason or
                    b.decode.reason)  # fmt: skip
    raise ConfigError(
        f"inventory {inventory.describe()}: no layout of it serves {planner.model.name}: a plan needs a prefill "
        f"island and a decode island at once"
        + (" (or an aggregated island)" if planner.cost.engine.aggregated else "")
        + (f", and {why}" if why else ", and no type has room for both")
        + ": add GPUs, relax the SLOs (slo.ttft_ms, slo.tpot_ms)"
        + ("" if planner.cost.engine.aggregated else ", let islands aggregate (costmodel.aggregated=true)")
        + " or choose a smaller model"
    )

"""Check a plan request by request: `python -m pipeline.simulate plan=PATH/plan.json ...` (conf/simulate.yaml).

Modes:
- `run`: one simulation -> metrics (markdown + JSON), TTFT/TPOT CDFs, KV use over time, MLflow run;
- `saturate`: the offered rate swept as multiples of the plan's Λ; the highest rate whose queues
  stay bounded (throughput within `saturate.tolerance` of offered) and whose p99 TTFT meets the
  SLO, beside Λ;
- `compare`: every router x scheduler on the same requests, as one table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.catalog import CONF_DIR, CatalogError, load_gpu, load_model
from costmodel.settings import CostSettings
from costmodel.specs import SpecError
from pipeline import cli
from pipeline.config import choice, make_dir, number, optional_positive, plain, positive_int, slo_from_cfg
from pipeline.errors import ConfigError
from pipeline.journal import link_latest, write_json
from simulator.arrivals import ARRIVALS, from_trace, sampled
from simulator.core import Requests, Simulation
from simulator.metrics import steady_state_note, summary, verdict
from simulator.plan import build, islands_from_plan
from simulator.routers import ROUTERS
from simulator.schedulers import SCHEDULERS, make_scheduler

SHOWN = (
    "offered_req_s", "throughput_req_s", "goodput_req_s", "slo_attainment", "ttft_ms_p50", "ttft_ms_p99",
    "tpot_ms_p50", "tpot_ms_p99", "e2e_ms_p50", "e2e_ms_p99", "preemptions", "kv_peak_fraction",
)  # fmt: skip


def load_plan(path: Any) -> tuple[dict[str, Any], Path]:
    if path is None:
        raise ConfigError("plan=PATH is required: the plan.json a search wrote (outputs/search/<run>/<time>/plan.json)")
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError(f"plan={path}: no such file")
    try:
        plan = json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"plan={path}: not a plan.json: not valid JSON text ({str(err)[:120]})") from None
    if not isinstance(plan, dict):
        raise ConfigError(f"plan={path}: not a plan.json (expected a JSON object)")
    try:
        islands = islands_from_plan(plan, str(p))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    rate = plan.get("rate_req_s", 0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ConfigError(f"plan={path}: its rate_req_s is not positive: nothing to simulate")
    for k, isl in enumerate(islands):
        if isl.role == "decode" and isl.batch > MAX_PLAN_BATCH:
            raise ConfigError(
                f"plan={path}: islands[{k}] ({isl.size} x {isl.gpu}) has decode batch {isl.batch}, over "
                f"{MAX_PLAN_BATCH} sequences per rank, which no plan of pipeline.search writes: was the file edited?"
            )
    return plan, p


MAX_PLAN_BATCH = 1024  # the island benchmark caps a decode batch here (costmodel MAX_DECODE_BATCH)


def plan_model(plan: dict[str, Any], path: Path, islands: list[Any] | None = None) -> tuple[Any, CostSettings]:
    """The model and the cost-settings record the plan was made with, checked against each other."""
    where = f"plan={path}"
    name = plan.get("model")
    if not isinstance(name, str):
        raise ConfigError(f"{where}: no `model` name: is this a plan.json written by pipeline.search?")
    try:
        model = load_model(name)
    except CatalogError as err:
        raise ConfigError(f"{where}: {err}") from None
    if "cost" not in plan:
        raise ConfigError(
            f"{where}: no `cost` record (the cost-model settings the plan was made with): re-run the search "
            "that wrote it with this version"
        )
    try:
        cost = CostSettings.from_json(plan["cost"], where)
    except SpecError as err:
        raise ConfigError(str(err)) from None
    if plan.get("cost_profile", cost.profile.name) != cost.profile.name:
        raise ConfigError(f"{where}: cost_profile {plan['cost_profile']!r} disagrees with cost.profile "
                          f"{cost.profile.name!r}: was the file edited?")  # fmt: skip
    for k, isl in enumerate(islands if islands is not None else islands_from_plan(plan, str(path))):
        if isl.role == "decode" and (isl.ep % isl.tp or isl.ep * isl.dp != isl.size):
            raise ConfigError(f"{where}: islands[{k}]: decode ep {isl.ep} x dp {isl.dp} must be the size "
                              f"{isl.size}, with tp {isl.tp} dividing ep")  # fmt: skip
        if isl.role == "prefill" and isl.tp * isl.dp != isl.size:
            raise ConfigError(f"{where}: islands[{k}]: prefill tp {isl.tp} x dp {isl.dp} must be the size {isl.size}")
    spec = plan.get("model_spec")
    if spec != dataclasses.asdict(model):
        made_for = spec.get("name") if isinstance(spec, dict) else None
        raise ConfigError(
            f"{where}: the plan was made for model {made_for!r} with other dimensions than conf/model/{name}.yaml "
            f"now has (its `model_spec`): plan again with model={name}, or simulate the plan's own model"
        )
    return model, cost


def requests_from_cfg(cfg: Any, plan: dict[str, Any], rate: float, n: int) -> tuple[Requests, str]:
    """The requests to simulate and the workload's name."""
    from pipeline.traces import Columns, load_histogram, load_trace

    if cfg.get("workload") is not None:
        name, w = cfg.get("workload_name") or choice("workload"), plain(cfg.workload)
    else:
        name = str(plan.get("workload", ""))
        path = CONF_DIR / "workload" / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"the plan's workload {name!r} has no conf/workload file: pass +workload=NAME")
        from omegaconf import OmegaConf

        w = plain(OmegaConf.load(path))
    arrivals = str(cfg.arrivals)
    if arrivals not in ARRIVALS:
        raise ConfigError(f"arrivals={arrivals!r}: choose from {list(ARRIVALS)}")
    if w.get("kind") == "histogram":
        if arrivals == "trace":
            raise ConfigError(f"arrivals=trace needs timestamps; workload {name} is a histogram: use +workload=trace")
        h = load_histogram(str(w["histogram"]))
        inputs, outputs = (h["input_values"], h["input_counts"]), (h["output_values"], h["output_counts"])
        return sampled(n, inputs, outputs, arrivals, rate, int(cfg.seed)), name
    if w.get("kind") == "trace":
        cols = w.get("columns")
        trace = load_trace(str(w["path"]), str(w.get("format", "auto")), Columns(**cols) if cols else None, name)
        if arrivals == "trace":
            if trace.arrival_s is None:
                raise ConfigError(f"workload {name}: the trace has no timestamps; use arrivals=poisson")
            scale = rate / (len(trace) / max(float(trace.arrival_s.max() - trace.arrival_s.min()), 1e-9))
            return from_trace(trace.arrival_s, trace.input_tokens, trace.output_tokens, scale, n), name
        counts = [np.unique(a, return_counts=True) for a in (trace.input_tokens, trace.output_tokens)]
        return sampled(n, tuple(counts[0]), tuple(counts[1]), arrivals, rate, int(cfg.seed)), name  # type: ignore[arg-type]
    raise ConfigError(f"workload {name}: the simulator needs request lengths: use a histogram or trace workload")


class Runner:
    """Engines for one plan, rebuilt per simulation (they carry state)."""

    def __init__(self, cfg: Any, plan: dict[str, Any]) -> None:
        self.cfg, self.plan = cfg, plan
        self.islands = islands_from_plan(plan)
        self.model, self.cost = plan_model(plan, Path(str(cfg.plan)), self.islands)
        self.gpus = {g: load_gpu(g) for g in {i.gpu for i in self.islands}}
        # the prefill batch the plan was made for, unless the command overrides it
        budget = cfg.token_budget
        self.budget = self.cost.prefill_batch_tokens if budget is None else positive_int(budget, "token_budget")
        self.slo = slo_from_cfg(cfg)  # one meaning everywhere: the targets the search planned for
        self.tolerance = float(cfg.saturate.tolerance)

    def simulate(self, req: Requests, router: str, scheduler: str) -> tuple[Simulation, dict[str, float], float]:
        r = Requests(req.arrival, req.input_len, req.output_len, req.user)  # fresh outcome arrays
        stats = {
            "mean_input": float(r.input_len.mean()),
            "mean_output": float(r.output_len.mean()),
            "std_output": float(r.output_len.std()),
        }
        pre, dec, rt = build(
            self.islands, self.gpus, self.model, self.cost, router=router,
            max_len=int(r.input_len.max()), max_context=int((r.input_len + r.output_len).max()),
            token_budget=self.budget, seed=int(self.cfg.seed), stats=stats,
            expert_imbalance=float(self.cfg.expert_imbalance),
        )  # fmt: skip
        pol = self.cfg.policy
        sched = make_scheduler(
            scheduler,
            max_output=int(r.output_len.max()),
            theta_age_ms=float(pol.sjf_theta_age_ms),
            alpha=float(pol.larry_alpha),
        )
        sim = Simulation(r, pre, dec, rt, sched)
        t0 = time.perf_counter()
        sim.run()
        wall = time.perf_counter() - t0
        warm = float(r.arrival[int(len(r) * float(self.cfg.warmup_fraction))]) if len(r) else 0.0
        slo = self.slo
        m = summary(sim, warm, slo["ttft_ms"], slo["tpot_ms"], slo["ttft_percentile"], slo["tpot_percentile"])
        m["sustained"] = float(not verdict(m, slo["ttft_ms"], slo["tpot_ms"], self.tolerance))
        m["sim_wall_s"] = wall
        m["sim_req_per_s"] = len(r) / wall if wall > 0 else 0.0
        return sim, m, wall


def _cell(v: Any) -> str:
    """A number as a reader takes it in: thousands separated, no exponent, 3-4 significant digits."""
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v)
    if v != v:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1 or a == 0:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [_cell(row[k]) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cdf_plots(sim: Simulation, path: Path, title: str, slo: dict[str, Any]) -> None:
    """TTFT and TPOT CDFs with each SLO drawn (target: vertical, percentile: horizontal), KV use over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = sim.r
    fig, axs = plt.subplots(1, 3, figsize=(15, 4))
    ttft = np.sort(r.first_token - r.arrival)
    decoded = r.output_len > 1
    tpot = np.sort((r.finish - r.first_token)[decoded] / (r.output_len[decoded] - 1))
    for ax, xs, label, key in ((axs[0], ttft, "TTFT (ms)", "ttft"), (axs[1], tpot, "TPOT (ms)", "tpot")):
        if xs.size:
            ax.plot(xs, np.arange(1, xs.size + 1) / xs.size)
        target, pct = slo[f"{key}_ms"], slo[f"{key}_percentile"]
        if target is not None:
            ax.axvline(target, color="r", ls="--", lw=1, label=f"SLO: {target:g} ms")
            ax.axhline(pct / 100, color="r", ls=":", lw=1, label=f"p{pct:g}")
            ax.legend(fontsize=8, loc="lower right")
        ax.set(xlabel=label, ylabel="fraction of requests", xscale="log")
    if sim.kv_trace:
        t, u = zip(*sim.kv_trace, strict=True)
        axs[2].plot(np.array(t) / 1e3, u)
    axs[2].set(xlabel="time (s)", ylabel="KV in use / capacity (all decode engines)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _throughput_plot(rows: list[dict[str, Any]], lam: float, best: float, path: Path, title: str) -> None:
    """Served against offered rate, each point marked by whether the SLOs held; the plan's rate and the
    highest sustained rate as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    off = np.array([r["offered_req_s"] for r in rows])
    srv = np.array([r["throughput_req_s"] for r in rows])
    ok = np.array([bool(r["sustained"]) for r in rows])
    top = max(float(off.max()), float(srv.max()), lam) * 1.05
    ax.plot([0, top], [0, top], color="0.7", lw=1, label="served = offered")
    ax.plot(off, srv, color="0.4", lw=1)
    ax.scatter(off[ok], srv[ok], color="g", zorder=3, label="sustained within the SLOs")
    ax.scatter(off[~ok], srv[~ok], color="r", marker="x", zorder=3, label="not sustained")
    ax.axvline(lam, color="b", ls="--", lw=1, label=f"plan's rate {lam:.0f} req/s")
    if best > 0:
        ax.axvline(best, color="g", ls=":", lw=1, label=f"highest sustained {best:.0f} req/s")
    ax.set(xlabel="offered (req/s)", ylabel="served (req/s)", xlim=(0, top), ylim=(0, top), title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


VERIFY_SECONDS_OF_ARRIVALS = 90.0  # a plan is checked on this much simulated time at its stated rate ...
VERIFY_REQUESTS = (3000, 40000)  # ... within these bounds on the number of requests
VERIFY_LONGEST = (1_500_000, 600.0)  # where that window is too short for a steady state, again on more requests
# (pipeline.goodput.until_steady), up to these many and these seconds of arrivals
VERIFY_MARGIN = 0.95  # a plan whose SLOs hold here but break at its stated rate is within 5 % of it
VERIFY_PROBES = 4  # where the SLOs break at the stated rate: rates below it simulated, 0.95 x stated first ...
VERIFY_LOW = 0.5  # ... then bisection between the stated rate and this fraction of it


def verify(plan: dict[str, Any], plan_path: Path, search_cfg: Any, workload_name: str) -> dict[str, Any]:
    """Simulate `plan` at its stated rate with the search's workload and SLOs (the simulator's other
    settings at their conf/simulate.yaml defaults): what it sustains, its latencies, a verdict.

    The requests span `VERIFY_SECONDS_OF_ARRIVALS` within `VERIFY_REQUESTS`. Where the measuring
    window is then too short for a steady state (`steady_state_note`: a plan serving tens of
    thousands of requests a second fills its cap in a second, before decoding has filled up), the
    check runs again on more requests until the window is long enough, a longer window leaves the
    throughput as short as before (overloaded) or `VERIFY_LONGEST` is reached
    (`pipeline.goodput.until_steady`).
    `windows` lists each of these simulations, `requests` is the count the verdict rests on and
    `steady_state` says why its window fell short ("" when it did not).

    When the SLOs break there, the highest rate below it that the simulator sustains (`sustained_req_s`):
    0.95 x stated first (`holds_at_0_95`: the stated rate is then within 5 % of the sustainable one;
    a finite simulation at the edge lands on either side), then bisection between the highest rate
    that held and the lowest that broke, `VERIFY_PROBES` simulations in all, the same arrivals'
    seed and request count as the check at the stated rate. 0 if none of them held."""
    from omegaconf import OmegaConf

    from pipeline.goodput import sustainable_rate, until_steady

    cfg = OmegaConf.load(CONF_DIR / "simulate.yaml")
    cfg.plan = str(plan_path)
    cfg.slo = search_cfg.get("slo")
    cfg.workload = search_cfg.workload
    cfg.workload_name = workload_name
    rate = float(plan["rate_req_s"])
    n = int(np.clip(rate * VERIFY_SECONDS_OF_ARRIVALS, *VERIFY_REQUESTS))
    runner = Runner(cfg, plan)
    walls: list[float] = []

    def simulate(k: int) -> tuple[Simulation, dict[str, float]]:
        req, _ = requests_from_cfg(cfg, plan, rate, k)
        sim, m, wall = runner.simulate(req, "plan", "fcfs")
        walls.append(wall)
        return sim, m

    most = min(VERIFY_LONGEST[0], int(rate * VERIFY_LONGEST[1]))
    m, windows, steady = until_steady(simulate, n, rate, most, runner.tolerance)
    wall, n = sum(walls), int(windows[-1]["requests"])
    why = verdict(m, runner.slo["ttft_ms"], runner.slo["tpot_ms"], runner.tolerance)
    out = {
        "offered_req_s": m["offered_req_s"],
        "throughput_req_s": m["throughput_req_s"],
        "simulated_over_stated": m["throughput_req_s"] / rate,
        "ttft_ms_p50": m.get("ttft_ms_p50", float("nan")),
        "ttft_ms_p99": m.get("ttft_ms_p99", float("nan")),
        "tpot_ms_p99": m.get("tpot_ms_p99", float("nan")),
        "ttft_ms_at_slo": m["ttft_ms_at_slo"],
        "tpot_ms_at_slo": m["tpot_ms_at_slo"],
        "slo_attainment": m["slo_attainment"],
        "sustained": not why,
        "why_not": why,
        "steady_state": steady,
        "requests": n,
        "windows": windows,  # each simulation at the stated rate, the last one judged
        "sim_wall_s": wall,
        "slo": slo_text(runner.slo),
        "holds_at_0_95": None,  # checked only when the SLOs break at the stated rate
        "sustained_req_s": rate if not why else 0.0,
        "sustained_over_stated": 1.0 if not why else 0.0,
    }
    if why:  # how far off? Rates below the stated one, 0.95 x first

        def sustains(r: float) -> str:
            req, _ = requests_from_cfg(cfg, plan, r, n)
            _, mr, wall_r = runner.simulate(req, "plan", "fcfs")
            out["sim_wall_s"] += wall_r
            return verdict(mr, runner.slo["ttft_ms"], runner.slo["tpot_ms"], runner.tolerance)

        best, _ = sustainable_rate(sustains, VERIFY_MARGIN * rate, VERIFY_PROBES, VERIFY_LOW / VERIFY_MARGIN,
                                   1 / VERIFY_MARGIN)  # fmt: skip
        out["holds_at_0_95"] = best >= VERIFY_MARGIN * rate  # the first probe held: bisection went up from it
        out["sustained_req_s"], out["sustained_over_stated"] = best, best / rate
    return out


def slo_text(slo: dict[str, Any]) -> str:
    parts = [
        f"{k.upper()} p{slo[f'{k}_percentile']:g} <= {slo[f'{k}_ms']:g} ms"
        for k in ("ttft", "tpot")
        if slo[f"{k}_ms"] is not None
    ]
    return "SLO " + ", ".join(parts) if parts else "no SLO (slo=null)"


def check_numbers(cfg: Any) -> None:
    """Every numeric setting of conf/simulate.yaml, checked before any work (ConfigError names the key)."""
    number(cfg.rate_scale, "rate_scale", low=1e-6)
    number(cfg.expert_imbalance, "expert_imbalance", low=1.0)
    number(cfg.warmup_fraction, "warmup_fraction", low=0.0, high=0.9)
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise ConfigError(f"seed must be a whole number >= 0, got seed={cfg.seed!r}")
    number(cfg.saturate.tolerance, "saturate.tolerance", low=0.0, high=1.0)
    number(cfg.saturate.duration_s, "saturate.duration_s", low=1.0)
    scales = plain(cfg.saturate.scales)
    if not isinstance(scales, list) or not scales:
        raise ConfigError(f"saturate.scales must be a list of rate multiples, e.g. [0.5, 1.0], got {scales!r}")
    for k, x in enumerate(scales):
        number(x, f"saturate.scales[{k}]", low=1e-6)
    number(cfg.policy.larry_alpha, "policy.larry_alpha", low=0.0)
    number(cfg.policy.sjf_theta_age_ms, "policy.sjf_theta_age_ms", low=0.0)


def execute(cfg: Any) -> int:
    from pipeline.tracking import Tracker

    plan, plan_path = load_plan(cfg.plan)
    mode = str(cfg.mode)
    if mode not in ("run", "saturate", "compare"):
        raise ConfigError(f"mode={mode!r}: choose run, saturate or compare")
    for key, valid in (("router", ROUTERS), ("scheduler", SCHEDULERS)):
        if str(cfg[key]) not in valid:
            raise ConfigError(f"{key}={cfg[key]!r} is unknown: choose from {list(valid)}")
    check_numbers(cfg)
    lam = float(plan["rate_req_s"])
    rate = optional_positive(cfg.rate, "rate") or lam * float(cfg.rate_scale)
    n = positive_int(cfg.requests, "requests")
    runner = Runner(cfg, plan)
    base, workload = requests_from_cfg(cfg, plan, rate, n)
    tracker = Tracker(
        None if cfg.mlflow.tracking_uri is None else str(cfg.mlflow.tracking_uri),
        str(cfg.mlflow.experiment),
        "Archipelago simulations (`python -m pipeline.simulate plan=...`): each parent run simulates one plan "
        "(mode run, compare or saturate) with its router, scheduler, workload and offered rate as parameters and its "
        "throughput and latency percentiles as metrics; children are the compared policies or rate scales.",
        ("metrics.throughput_req_s", "metrics.offered_req_s", "metrics.ttft_ms_p99", "metrics.tpot_ms_p99",
         "metrics.slo_attainment", "params.router", "params.scheduler", "params.workload", "params.rate_scale"),
    )  # fmt: skip
    ident = hashlib.sha1(str(plan_path.resolve()).encode()).hexdigest()[:8]
    out = Path(str(cfg.out_root)) / f"{mode}-{workload}-{cfg.router}-{cfg.scheduler}-{ident}"
    out = out / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    make_dir(out, "out_root", cfg.out_root)
    params = {
        "plan": str(plan_path), "mode": mode, "router": cfg.router, "scheduler": cfg.scheduler, "workload": workload,
        "arrivals": cfg.arrivals, "offered_req_s": rate, "plan_rate_req_s": lam, "requests": len(base),
        "inventory": plan.get("inventory", {}).get("name", ""),
    }  # fmt: skip
    tracker.start_parent(out.parent.name, params, description=(
        f"Simulation ({mode}) of {plan_path}: router {cfg.router}, scheduler {cfg.scheduler}, workload {workload}, "
        f"{rate:.1f} req/s offered (the plan states {lam:.1f}), {len(base)} requests. Folder {out}"))  # fmt: skip
    policies = "every router x scheduler" if mode == "compare" else f"router {cfg.router}, scheduler {cfg.scheduler}"
    head = (
        f"# Simulation of {plan_path}\n\n{policies}; plan Λ = {lam:.1f} req/s; workload {workload}, {len(base)} "
        f"requests, {cfg.arrivals} arrivals; {slo_text(runner.slo)}\n\n"
    )
    own = str(plan.get("workload", ""))
    if own and workload != own:  # the offered rate is a multiple of a Λ planned for another mix
        note = (f"Note: the plan was made for workload {own}; the offered rate here is a multiple of its Λ "
                f"({lam:.1f} req/s), not a rate planned for {workload}.")  # fmt: skip
        head += note + "\n\n"
        print(f"[simulate] {note}", flush=True)
    if mode == "run":
        sim, m, _ = runner.simulate(base, str(cfg.router), str(cfg.scheduler))
        _cdf_plots(
            sim, out / "cdf.png", f"{cfg.router} + {cfg.scheduler}, {m['offered_req_s']:.0f} req/s offered", runner.slo
        )
        text = head + _table([{k: m[k] for k in SHOWN if k in m}], [k for k in SHOWN if k in m])
        why = verdict(m, runner.slo["ttft_ms"], runner.slo["tpot_ms"], runner.tolerance)
        text += f"\n{'Sustained' if not why else 'Not sustained'} at {m['offered_req_s']:.1f} req/s offered"
        text += f" ({why})\n" if why else " (throughput keeps up and the SLO percentiles hold)\n"
        note = steady_state_note(m)
        text += f"\nWarning: {note}\n" if note else ""
        write_json(out / "metrics.json", m)
        files = ["metrics.json", "metrics.md", "cdf.png"]
        rows = [m]
    elif mode == "compare":
        rows = []
        for router in ROUTERS:
            for sched in SCHEDULERS:
                _, m, _ = runner.simulate(base, router, sched)
                rows.append({"router": router, "scheduler": sched, **m})
                tracker.child(f"{router}+{sched}", {"router": router, "scheduler": sched}, m, failed=False)
                print(f"[simulate] {router} + {sched}: {m['throughput_req_s']:.1f} req/s, p99 TTFT "
                      f"{m.get('ttft_ms_p99', float('nan')):.0f} ms", flush=True)  # fmt: skip
        text = head + _table(rows, ["router", "scheduler", *[k for k in SHOWN if k in rows[0]]])
        write_json(out / "metrics.json", rows)
        files = ["metrics.json", "metrics.md"]
    else:
        rows, best = [], 0.0
        duration = float(cfg.saturate.duration_s)
        for scale in [float(x) for x in cfg.saturate.scales]:
            req, _ = requests_from_cfg(cfg, plan, lam * scale, max(n, int(lam * scale * duration)))
            _, m, _ = runner.simulate(req, str(cfg.router), str(cfg.scheduler))
            ok = not verdict(m, runner.slo["ttft_ms"], runner.slo["tpot_ms"], runner.tolerance)
            if ok:
                best = max(best, m["offered_req_s"])
            rows.append({"rate_scale": scale, "sustained": ok, **m})
            tracker.child(f"x{scale:g}", {"rate_scale": scale}, m, failed=False)
            print(
                f"[simulate] {scale:g} x Λ: offered {m['offered_req_s']:.1f}, served {m['throughput_req_s']:.1f} "
                f"req/s, p99 TTFT {m.get('ttft_ms_p99', float('nan')):.0f} ms -> {'ok' if ok else 'no'}",
                flush=True,
            )
            if note := steady_state_note(m):
                print(f"[simulate] warning: at {scale:g} x Λ {note} (saturate.duration_s)", file=sys.stderr, flush=True)
        m = {"sustained_req_s": best, "plan_rate_req_s": lam, "ratio": best / lam}
        _throughput_plot(
            rows, lam, best, out / "throughput.png", f"{cfg.router} + {cfg.scheduler}; {slo_text(runner.slo)}"
        )
        text = head + _table(rows, ["rate_scale", "sustained", *[k for k in SHOWN if k in rows[0]]])
        text += f"\nHighest sustained rate {best:.1f} req/s = {best / lam:.3f} x the plan's Λ.\n"
        write_json(out / "metrics.json", {"summary": m, "rows": rows})
        files = ["metrics.json", "metrics.md", "throughput.png"]
    (out / "metrics.md").write_text(text)
    tracker.finish_parent({k: v for k, v in m.items() if isinstance(v, (int, float))}, [out / f for f in files])
    link_latest(Path(str(cfg.out_root)), out)  # outputs/simulate/latest: the newest finished simulation
    print(text + f"[simulate] wrote {out}/", flush=True)
    return 0


if __name__ == "__main__":
    cli.main("simulate", execute, (ValueError,))

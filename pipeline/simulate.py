"""Check a plan request by request: `python -m pipeline.simulate plan=PATH/plan.json ...` (conf/simulate.yaml).

Modes:
- `run`: one simulation -> metrics (markdown + JSON), TTFT/TPOT CDFs, KV use over time, MLflow run;
- `saturate`: the offered rate swept as multiples of the plan's Λ; the highest rate whose queues
  stay bounded (throughput within `saturate.tolerance` of offered) and whose SLO percentiles hold,
  beside Λ;
- `compare`: every router x scheduler on the same requests, as one table.

The plan is judged by its own SLOs (the targets it was made for) unless the command gives others
(`slo.tpot_ms=30`, `slo=default`, `slo=null`); the output says which.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import plan as plans
from costmodel.catalog import CONF_DIR
from costmodel.settings import Slo
from pipeline import cli
from pipeline.checks import boolean, make_dir, number, optional_positive, positive_int, whole_number
from pipeline.cli import choice, plain
from pipeline.errors import ConfigError
from pipeline.fleet.config import is_fleet
from pipeline.planning.config import slo_from_cfg
from pipeline.planning.simulation import SIMULATED_REQ_S, RequestMix, Runner, SimSettings, request_mix
from pipeline.records.journal import link_latest, write_json
from pipeline.records.simulation_report import cdf_plots, table, throughput_plot
from plan import Plan
from simulator.metrics import steady_state_note
from simulator.requests import Requests
from simulator.routers import ROUTERS, SESSION_ROUTERS
from simulator.schedulers import SCHEDULERS

SHOWN = (
    "offered_req_s", "throughput_req_s", "goodput_req_s", "slo_attainment", "ttft_ms_p50", "ttft_ms_p99",
    "tpot_ms_p50", "tpot_ms_p99", "e2e_ms_p50", "e2e_ms_p99", "preemptions", "kv_peak_fraction", "cache_hit_rate",
)  # fmt: skip
LONG_RUN = 200_000  # requests above which the command says how long it expects to take


def settings_from_cfg(cfg: Any) -> SimSettings:
    """Every numeric setting of conf/simulate.yaml, checked before any work (ConfigError names the key)."""
    number(cfg.rate_scale, "rate_scale", low=1e-6)
    number(cfg.saturate.duration_s, "saturate.duration_s", low=1.0)
    scales = plain(cfg.saturate.scales)
    if not isinstance(scales, list) or not scales:
        raise ConfigError(f"saturate.scales must be a list of rate multiples, e.g. [0.5, 1.0], got {scales!r}")
    for k, x in enumerate(scales):
        number(x, f"saturate.scales[{k}]", low=1e-6)
    budget = cfg.token_budget
    return SimSettings(
        seed=whole_number(cfg.seed, "seed"),
        token_budget=None if budget is None else positive_int(budget, "token_budget"),
        expert_imbalance=number(cfg.expert_imbalance, "expert_imbalance", low=1.0),
        warmup_fraction=number(cfg.warmup_fraction, "warmup_fraction", low=0.0, high=0.9),
        tolerance=number(cfg.saturate.tolerance, "saturate.tolerance", low=0.0, high=1.0),
        larry_alpha=number(cfg.policy.larry_alpha, "policy.larry_alpha", low=0.0),
        sjf_theta_age_ms=number(cfg.policy.sjf_theta_age_ms, "policy.sjf_theta_age_ms", low=0.0),
        prefix_cache=boolean(cfg.get("prefix_cache", True), "prefix_cache"),
    )


def mix_from_cfg(cfg: Any, plan: Plan) -> RequestMix:
    """The workload the command names (`+workload=NAME`), or the one the plan was made for: as plan.json records it
    (with the overrides it was planned with), else its conf/workload file."""
    if cfg.get("workload") is not None:
        return request_mix(choice("workload"), plain(cfg.workload))
    if plan.spec_of_workload is not None:
        return request_mix(plan.workload, plan.spec_of_workload)
    path = CONF_DIR / "workload" / f"{plan.workload}.yaml"
    if not path.is_file():
        raise ConfigError(f"the plan's workload {plan.workload!r} has no conf/workload file: pass +workload=NAME")
    from omegaconf import OmegaConf

    return request_mix(plan.workload, plain(OmegaConf.load(path)))


@dataclass(frozen=True)
class Session:
    """One `pipeline.simulate` command once its settings are read: what every mode simulates and where it writes."""

    cfg: Any
    plan: Plan
    runner: Runner
    mix: RequestMix
    requests: Requests  # the command's requests at its offered rate
    rate: float  # the offered rate, req/s
    tracker: Any  # pipeline.records.tracking.Tracker: the parent run is open
    out: Path
    head: str  # metrics.md's heading
    slo: Slo

    @property
    def policy(self) -> tuple[str, str]:
        return str(self.cfg.router), str(self.cfg.scheduler)


Result = tuple[str, dict[str, Any], list[str]]  # metrics.md's text after the heading, the parent's metrics, files


def run_once(s: Session) -> Result:
    """mode=run: one simulation with the command's router and scheduler."""
    router, scheduler = s.policy
    sim, m, _ = s.runner.simulate(s.requests, router, scheduler)
    cdf_plots(sim, s.out / "cdf.png", f"{router} + {scheduler}, {m['offered_req_s']:.0f} req/s offered", s.slo)
    text = table([{k: m[k] for k in SHOWN if k in m}], [k for k in SHOWN if k in m])
    why = s.runner.verdict(m)
    text += f"\n{'Sustained' if not why else 'Not sustained'} at {m['offered_req_s']:.1f} req/s offered"
    text += f" ({why})\n" if why else " (throughput keeps up and the SLO percentiles hold)\n"
    note = steady_state_note(m)
    text += f"\nWarning: {note}\n" if note else ""
    write_json(s.out / "metrics.json", m)
    return text, m, ["metrics.json", "metrics.md", "cdf.png"]


def compare(s: Session) -> Result:
    """mode=compare: every router x scheduler on the same requests, a child run each."""
    rows = []
    for router in ROUTERS:
        if router in SESSION_ROUTERS and s.requests.session is None:
            print(f"[simulate] {router}: skipped, the requests name no sessions (a session workload's do)")
            continue
        for sched in SCHEDULERS:
            _, m, _ = s.runner.simulate(s.requests, router, sched)
            rows.append({"router": router, "scheduler": sched, **m})
            s.tracker.child(f"{router}+{sched}", {"router": router, "scheduler": sched}, m, failed=False)
            print(f"[simulate] {router} + {sched}: {m['throughput_req_s']:.1f} req/s, p99 TTFT "
                  f"{m.get('ttft_ms_p99', float('nan')):.0f} ms", flush=True)  # fmt: skip
    write_json(s.out / "metrics.json", rows)
    return table(rows, ["router", "scheduler", *[k for k in SHOWN if k in rows[0]]]), {}, ["metrics.json", "metrics.md"]


def saturate(s: Session) -> Result:
    """mode=saturate: the offered rate swept as multiples of the plan's rate; the highest one sustained."""
    cfg, lam, seed = s.cfg, s.plan.rate_req_s, s.runner.s.seed
    router, scheduler = s.policy
    rows, best = [], 0.0
    duration = float(cfg.saturate.duration_s)
    for scale in [float(x) for x in cfg.saturate.scales]:
        req = s.mix.requests(max(len(s.requests), int(lam * scale * duration)), lam * scale, str(cfg.arrivals), seed)
        _, m, _ = s.runner.simulate(req, router, scheduler)
        ok = not s.runner.verdict(m)
        if ok:
            best = max(best, m["offered_req_s"])
        rows.append({"rate_scale": scale, "sustained": ok, **m})
        s.tracker.child(f"x{scale:g}", {"rate_scale": scale}, m, failed=False)
        print(f"[simulate] {scale:g} x Λ: offered {m['offered_req_s']:.1f}, served {m['throughput_req_s']:.1f} "
              f"req/s, p99 TTFT {m.get('ttft_ms_p99', float('nan')):.0f} ms -> {'ok' if ok else 'no'}",
              flush=True)  # fmt: skip
        if note := steady_state_note(m):
            print(f"[simulate] warning: at {scale:g} x Λ {note} (saturate.duration_s)", file=sys.stderr, flush=True)
    m = {"sustained_req_s": best, "plan_rate_req_s": lam, "ratio": best / lam}
    throughput_plot(rows, lam, best, s.out / "throughput.png", f"{router} + {scheduler}; {s.slo.text()}")
    text = table(rows, ["rate_scale", "sustained", *[k for k in SHOWN if k in rows[0]]])
    text += f"\nHighest sustained rate {best:.1f} req/s = {best / lam:.3f} x the plan's Λ.\n"
    write_json(s.out / "metrics.json", {"summary": m, "rows": rows})
    return text, m, ["metrics.json", "metrics.md", "throughput.png"]


MODES: dict[str, Callable[[Session], Result]] = {"run": run_once, "saturate": saturate, "compare": compare}


def execute(cfg: Any) -> int:
    if cfg.plan is None:
        raise ConfigError("plan=PATH is required: the plan.json a search wrote (outputs/search/<run>/<time>/plan.json)")
    if is_fleet(cfg.plan):
        return simulate_fleet(cfg)
    plan = plans.load(cfg.plan)
    if not plan.serves:
        raise ConfigError(f"plan={cfg.plan}: its rate is 0 req/s (no island can run the model in a role): nothing "
                          "to simulate")  # fmt: skip
    mode = str(cfg.mode)
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r}: choose from {list(MODES)}")
    for key, valid in (("router", ROUTERS), ("scheduler", SCHEDULERS)):
        if str(cfg[key]) not in valid:
            raise ConfigError(f"{key}={cfg[key]!r} is unknown: choose from {list(valid)}")
    s = _session(cfg, plan, mode)
    text, m, files = MODES[mode](s)
    text = s.head + text
    (s.out / "metrics.md").write_text(text)
    s.tracker.finish_parent({k: v for k, v in m.items() if isinstance(v, (int, float))}, [s.out / f for f in files])
    link_latest(Path(str(cfg.out_root)), s.out)  # outputs/simulate/latest: the newest finished simulation
    print(text + f"[simulate] wrote {s.out}/", flush=True)
    return 0


def simulate_fleet(cfg: Any) -> int:
    """A fleet plan (fleet.json): every model's plan simulated on its own requests, at its own rate times the command's
    rate_scale, each an MLflow run and a folder as one plan's; then the fleet's table. The router sends a request by
    its model first and no island serves two models, so a mixed stream of the models' requests is these streams
    side by side: each model's engines see exactly its own."""
    from omegaconf import OmegaConf

    from pipeline.fleet.config import read_fleet
    from pipeline.records.journal import read_json

    path = Path(str(cfg.plan))
    record = read_fleet(path)
    if cfg.get("workload") is not None or cfg.rate is not None:
        raise ConfigError("a fleet's models each have their own workload and rate: drop +workload and rate (rate_scale "
                          "scales every model's rate)")  # fmt: skip
    rows = []
    for m in record["models"]:
        member = OmegaConf.merge(cfg, {"plan": str(path.parent / m["plan"])})
        print(f"[simulate] fleet {record.get('fleet')}: {m['model']}", flush=True)
        execute(member)
        metrics = read_json(Path(str(member.out_root)) / "latest" / "metrics.json", "") or {}
        if isinstance(metrics, dict) and "offered_req_s" in metrics:
            rows.append({"model": m["model"], "plan_rate_req_s": m["rate_req_s"],
                         **{k: metrics[k] for k in SHOWN if k in metrics}})  # fmt: skip
    if rows:
        print(f"# Fleet {record.get('fleet')}: every model simulated on its own requests\n\n"
              + table(rows, ["model", "plan_rate_req_s", *[k for k in SHOWN if k in rows[0]]]), flush=True)
    return 0


def _session(cfg: Any, plan: Plan, mode: str) -> Session:
    """The command's settings checked, its requests drawn, its run folder made and its MLflow parent run open."""
    from pipeline.records.tracking import Tracker

    settings = settings_from_cfg(cfg)
    slo, source = slo_from_cfg(cfg, own=plan.slo)
    lam, plan_path = plan.rate_req_s, Path(str(cfg.plan))
    rate = optional_positive(cfg.rate, "rate") or lam * float(cfg.rate_scale)
    n = positive_int(cfg.requests, "requests")
    mix = mix_from_cfg(cfg, plan)
    runner = Runner(plan, slo, settings)
    base = mix.requests(n, rate, str(cfg.arrivals), settings.seed)
    workload = mix.name
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
        "inventory": plan.inventory.name if plan.inventory else "", "slo": f"{slo.text()} ({source})",
    }  # fmt: skip
    tracker.start_parent(out.parent.name, params, description=(
        f"Simulation ({mode}) of {plan_path}: router {cfg.router}, scheduler {cfg.scheduler}, workload {workload}, "
        f"{rate:.1f} req/s offered (the plan states {lam:.1f}), {len(base)} requests. Folder {out}"))  # fmt: skip
    policies = "every router x scheduler" if mode == "compare" else f"router {cfg.router}, scheduler {cfg.scheduler}"
    judged = f"judged by {slo.text()} ({source})"
    head = (
        f"# Simulation of {plan_path}\n\n{policies}; plan Λ = {lam:.1f} req/s; workload {workload}, {len(base)} "
        f"requests, {cfg.arrivals} arrivals; {judged}\n\n"
    )
    print(f"[simulate] {len(base):,} requests at {rate:.1f} req/s, {judged}", flush=True)
    if len(base) > LONG_RUN:
        print(f"[simulate] {len(base):,} requests a simulation: expect about {len(base) / SIMULATED_REQ_S:,.0f} s "
              "each", flush=True)  # fmt: skip
    if note := mix.coverage(len(base), rate, str(cfg.arrivals)):  # how much of the trace's day the run covers
        head += f"Note: {note}\n\n"
        print(f"[simulate] Note: {note}", flush=True)
    if plan.workload and workload != plan.workload:  # the offered rate is a multiple of a Λ planned for another mix
        note = (f"Note: the plan was made for workload {plan.workload}; the offered rate here is a multiple of its Λ "
                f"({lam:.1f} req/s), not a rate planned for {workload}.")  # fmt: skip
        head += note + "\n\n"
        print(f"[simulate] {note}", flush=True)
    return Session(cfg, plan, runner, mix, base, rate, tracker, out, head, slo)


if __name__ == "__main__":
    cli.main("simulate", execute, (ValueError,))

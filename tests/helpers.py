"""What many test files share: the repository's paths, running a command as a user does (and checking its
one-line error), composing a config as the commands do, and plans made by hand or by the planner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from costmodel.catalog import CONF_DIR, load_gpu, load_model
from costmodel.formulas import priced_precision
from costmodel.settings import CostSettings
from plan import Hosts, Island, Plan, Precision, RangeShare, Rates, Role

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
# a small search: 64 GPUs of three types, 8 ranges, 4 trials a batch on a local Ray of two CPUs
SMALL = ["+inventory=tiny_hetero", "ranges.width=1000", "search.batch=4", "ray.num_cpus=2"]


def cli(module: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 180) -> Any:
    """`python -m module args...` from the checkout, as a user runs it."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})  # fmt: skip


def one_line(r: Any, start: str, code: int = 2) -> None:
    """The command ended with `code` and exactly one stderr line, starting with `start`."""
    assert r.returncode == code, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), r.stderr


def compose(overrides: Sequence[str], config: str = "search") -> Any:
    """`conf/<config>.yaml` composed with `overrides`, and Hydra's runtime set as a command's would be."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from pipeline.cli import respelled

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config, overrides=respelled(list(overrides)), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def flat_cost(cost: CostSettings) -> dict[str, Any]:
    """`cost` as plan.json schemas 1 and 2 wrote it: one flat record (the reader of earlier plans reads this)."""
    cal = cost.profile.calibration
    return {
        "profile": cost.profile.name, "switches": cost.profile.switches(), "cache_hit": cost.cache_hit,
        "fp8_combine": cost.engine.fp8_combine, "ttft_ms": cost.slo.ttft_ms, "tpot_ms": cost.slo.tpot_ms,
        "ttft_percentile": cost.slo.ttft_percentile, "tpot_percentile": cost.slo.tpot_percentile,
        "prefill_batch_tokens": cost.engine.prefill_batch_tokens, "engine_configs": cost.engine.runnable_only,
        "mtp_drafts": cost.drafts, "mtp_acceptance": cost.mtp.acceptance if cost.mtp else 0.85,
        "aggregated": cost.engine.aggregated, "calibration": None if cal is None else cal.to_json(),
    }  # fmt: skip


def island(gpu: str, size: int, role: str, tp: int, dp: int, ep: int, batch: int,
           ranges: Sequence[tuple[int, int, float]], node: int | None = None, first: int = 0) -> Island:  # fmt: skip
    """A serving island as the planner describes one: DeepSeek-V3's experts spread over its EP group, its
    precision as the cost model prices it, hosts numbered from `node` (None: no hosts)."""
    experts = load_model("deepseek_v3").n_routed_experts
    group = ep if Role(role).decodes else tp * dp
    per_gpu = -(-experts // group)
    g = load_gpu(gpu)
    hosts = None if node is None else Hosts(g.node_gpus, tuple(range(node, node + -(-(first + size) // g.node_gpus))),
                                            first)  # fmt: skip
    return Island(gpu, size, role, tp, dp, ep, batch, Precision(*priced_precision(g, CostSettings().profile)),
                  size * g.price_per_hour, tuple(RangeShare(a, b, f, f / 2) for a, b, f in ranges), hosts, per_gpu,
                  per_gpu * group - experts, 0.5, 0.5, chunk_tokens=512 if role == "aggregated" else 0)  # fmt: skip


def plan_with(islands: Sequence[Island], rate: float = 4.0, workload: str = "azure_conv",
              cost: CostSettings | None = None) -> Plan:  # fmt: skip
    """A plan of these islands at `rate` req/s, made for DeepSeek-V3 and `workload`."""
    rates = Rates(rate, rate, rate, rate, rate * 250.0)
    return Plan(tuple(islands), rates, load_model("deepseek_v3"), cost or CostSettings(), workload)


def tiny_plan(rate: float = 4.0, hosts: bool = False) -> Plan:
    """2 prefill islands of 8 H200 (TP 8, then TP 4 x DP 2), 1 decode island of 16 H20 (EP 16, batch 64)."""
    ranges = [(0, 2000, 0.5), (2000, 8000, 0.5)]
    return plan_with([
        island("H200", 8, "prefill", 8, 1, 8, 1, ranges, 0 if hosts else None),
        island("H200", 8, "prefill", 4, 2, 8, 2, ranges, 1 if hosts else None),
        island("H20", 16, "decode", 1, 1, 16, 64, [(0, 2000, 1.0), (2000, 8000, 1.0)], 0 if hosts else None),
    ], rate)  # fmt: skip


_PLANS: dict[tuple[str, ...], tuple[str, Any]] = {}  # per test process: plan_of's plans, made once each


def on_one_gpu(plan: Plan, gpu: str) -> Plan:
    """`plan` with every island on `gpu`: the islands of each earlier type moved onto hosts after the last one's, so
    that no GPU serves two islands (the plan records no inventory)."""
    import dataclasses

    moved, offset = [], 0
    for old in dict.fromkeys(i.gpu for i in plan.islands):
        mine = [i for i in plan.islands if i.gpu == old]
        for i in mine:
            hosts = i.hosts and dataclasses.replace(i.hosts, nodes=tuple(n + offset for n in i.hosts.nodes))
            moved.append((plan.islands.index(i), dataclasses.replace(i, gpu=gpu, hosts=hosts)))
        offset += 1 + max((n for i in mine if i.hosts for n in i.hosts.nodes), default=-1)
    return dataclasses.replace(plan, islands=tuple(i for _, i in sorted(moved, key=lambda m: m[0])), inventory=None)


def plan_of(tmp: Path, *overrides: str) -> tuple[Path, Any]:
    """(tmp/plan.json, the planner) of the exact layout of tiny_hetero under `overrides`, built as the search builds
    it; made once per test process and overrides (the planner is shared: its caches only grow)."""
    if overrides not in _PLANS:
        import plan as plans
        from pipeline.planning.build import build_plan
        from pipeline.search.reference import exact_layout, reference
        from pipeline.search.settings import inventory_of, settings_from_cfg

        cfg = compose(["+inventory=tiny_hetero", "ranges.width=1000", f"out_root={tmp}/out", *overrides])
        settings, ctx = settings_from_cfg(cfg, *inventory_of(cfg))
        layout = exact_layout(reference(settings, ctx, ctx.planner))
        assert layout is not None
        _PLANS[overrides] = (json.dumps(plans.to_json(build_plan(ctx.planner, layout, 10.0))), ctx.planner)
    text, planner = _PLANS[overrides]
    path = tmp / "plan.json"
    path.write_text(text)
    return path, planner


def kept_at(plan: Plan, factors: Sequence[float], n: int = 6000, seed: int = 2) -> dict[float, float]:
    """Throughput over offered load of `plan` simulated on `n` of its workload's requests at each factor x its rate
    (Poisson arrivals), by factor."""
    from pipeline.planning.simulation import RequestMix, Runner
    from pipeline.planning.workload import workload_from_cfg

    mix = RequestMix.of(workload_from_cfg(plan.workload, plan.spec_of_workload))
    runner = Runner(plan, plan.slo)
    kept = {}
    for f in factors:
        _, m, _ = runner.simulate(mix.requests(n, plan.rates.rate_req_s * f, seed=seed))
        kept[f] = m["throughput_req_s"] / m["offered_req_s"]
    return kept


def in_process(task: Any, config: str, *overrides: str, errors: tuple[type[Exception], ...] = ()) -> Any:
    """A Hydra command run in this process as `python -m` runs it (`pipeline.cli`: composition errors and the
    task's user errors as one `error:` line and exit 2), its output captured: what a subprocess would show,
    without the seconds a new interpreter takes to import the stack. `task`: the command's `execute`."""
    import io
    from contextlib import redirect_stderr, redirect_stdout
    from types import SimpleNamespace

    import yaml
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from pipeline.cli import fail, hydra_error_line, run_task

    out, err, code = io.StringIO(), io.StringIO(), 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            try:
                cfg = compose(overrides, config)
            except (HydraException, OmegaConfBaseException, yaml.YAMLError) as e:
                fail(hydra_error_line(e))
            run_task(task, errors)(cfg)
        except SystemExit as e:
            code = int(e.code or 0)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())

"""Launch files for a plan: `python -m pipeline.deploy plan=PATH/plan.json [engine=vllm] [target=k8s] [out=DIR]
[replace=true]`.

Per island and host the engine command (SGLang or vLLM), the router's routing.json, Kubernetes
manifests for target=k8s (llm-d model-service Helm values for target=llmd), and a README that says
what to fill in and how to start
(`deployment`, docs/deploy.md). Settings: conf/deploy.yaml. A folder that holds an earlier deploy is replaced whole
with replace=true, and refused without it.
"""

from __future__ import annotations

import shutil
from dataclasses import field, make_dataclass, replace
from pathlib import Path
from typing import Any

import plan as plans
from costmodel.codec import from_data
from deployment.engines import ENGINES, adapter
from deployment.folder import write
from deployment.options import DeployOptions
from deployment.targets import TARGETS, target
from pipeline import cli
from pipeline.errors import ConfigError
from pipeline.fleet.config import is_fleet

# the command's own settings and Hydra's, beside the deployment's
COMMAND = ("plan", "out", "replace", "model_paths", "hydra")
WHERE = "conf/deploy.yaml (or its overrides)"


DEFAULT_MODEL = "deepseek_v3"  # whose weights conf/deploy.yaml's default model_path names


def config_record() -> type:
    """conf/deploy.yaml as one record: the deployment's settings (`DeployOptions`'s), then a section per engine and
    per target of the registries, each its own options record; `costmodel.codec.from_data` reads it strictly."""
    own = [
        (name, cls, field(default_factory=cls))
        for name, cls in [
            *((a.name, a.Options) for a in ENGINES.values()),
            *((t.name, t.Options) for t in TARGETS.values()),
        ]
    ]
    base = DeployOptions()
    common = [(k, tp, field(default=getattr(base, k))) for k, tp in
              (("engine", str), ("target", str), ("model_path", str), ("ib_devices", str | None))]  # fmt: skip
    return make_dataclass("DeployConfig", [*common, *own], frozen=True)


def options_from_cfg(cfg: Any) -> DeployOptions:
    """The deploy options of a composed conf/deploy.yaml: every key known and every value of its type, each section
    read into its engine's or target's own record, the chosen engine and target known by name."""
    data = {k: cli.plain(cfg[k]) for k in cfg if k not in COMMAND}
    config = from_data(config_record(), data, WHERE)
    opts = DeployOptions(engine=config.engine, target=config.target, model_path=config.model_path,
                         ib_devices=config.ib_devices)  # fmt: skip
    engine, where = adapter(opts.engine), target(opts.target)
    merged = {k: v for s in where.sections for k, v in (data.get(s) or {}).items()}  # llmd: the cluster's, then its own
    return replace(opts, engine_options=getattr(config, engine.name),
                   target_options=from_data(where.Options, merged, WHERE))  # fmt: skip


def execute(cfg: Any) -> None:
    if cfg.plan is None:
        raise ConfigError("plan=PATH is required: the plan.json of a search (outputs/search/<run>/<time>/plan.json)")
    if is_fleet(cfg.plan):
        deploy_fleet(cfg)
        return
    plan = plans.load(cfg.plan)  # the command's input first: a plan it cannot read is the error to show
    opts = options_from_cfg(cfg)
    if plan.model.name != DEFAULT_MODEL and opts.model_path == DeployOptions().model_path:
        raise ConfigError(f"{WHERE}: model_path={opts.model_path} is the default, {DEFAULT_MODEL}'s weights, and "
                          f"this plan is for {plan.model.name}: give model_path=<its weights' folder on every host>")
    replacing = cli.plain(cfg.get("replace", False))
    if not isinstance(replacing, bool):
        raise ConfigError(f"{WHERE}: replace must be true or false, got {replacing!r:.80}")
    out = Path(str(cfg.out)) if cfg.out else Path(str(cfg.plan)).parent / f"deploy-{opts.engine}-{opts.target}"
    es = write(plan, opts, out, str(cfg.plan), replace=replacing)
    print(f"[deploy] {len(es)} engines on {sum(e.nnodes for e in es)} host slots; wrote {out}/ (README.md first)")


FLEET_MARK = "# Deployment of a fleet: "  # the first line of a fleet deploy's README.md


def deploy_fleet(cfg: Any) -> None:
    """A fleet's launch files: each model's in `<out>/<model>/` (its engines named `<model>-...`, its weights at
    `model_paths.<model>`), and one routing.json for the router, which sends a request by its `model` field."""
    import json

    from deployment.router.table import RoutingError, load_fleet
    from pipeline.fleet.config import read_fleet

    path = Path(str(cfg.plan))
    record = read_fleet(path)
    opts = options_from_cfg(cfg)
    paths = {k: v for k, v in (cli.plain(cfg.get("model_paths")) or {}).items() if v is not None}
    models = [str(m["model"]) for m in record["models"]]
    replacing = cli.plain(cfg.get("replace", False))
    if not isinstance(replacing, bool):
        raise ConfigError(f"{WHERE}: replace must be true or false, got {replacing!r:.80}")
    out = Path(str(cfg.out)) if cfg.out else path.parent / f"deploy-{opts.engine}-{opts.target}"
    _refuse_fleet_folder(out, replacing)
    member_plans = {name: plans.load(path.parent / m["plan"]) for name, m in zip(models, record["models"],
                                                                                strict=True)}  # fmt: skip
    member_opts = {}
    for name in models:
        weights = paths.get(name) or (opts.model_path if name == DEFAULT_MODEL else None)
        if weights is None:
            raise ConfigError(f"{WHERE}: the fleet serves {name}, whose weights' folder is not given: add "
                              f"model_paths.{name}=<its weights' folder on every host>")  # fmt: skip
        member_opts[name] = replace(opts, model_path=str(weights))  # (the path's grammar checked as it is made)
    if opts.target == "shell":
        _refuse_shared_hosts(member_plans)
    if out.exists() and replacing:
        shutil.rmtree(out)
    tables, aliases, total = {}, {}, 0
    for name in models:
        es = write(member_plans[name], member_opts[name], out / name, f"{path} ({name})",
                   prefix=f"{name.replace('_', '-')}-")  # fmt: skip
        total += len(es)
        tables[name] = json.loads((out / name / "routing.json").read_text())
        aliases[member_opts[name].model_path] = name
    fleet = {"models": tables, "aliases": aliases}
    try:
        load_fleet(fleet)
    except RoutingError as err:  # the launch files' own tables, put together: a fault here is ours
        raise RuntimeError(f"the fleet's routing.json does not load: {err}") from None
    (out / "routing.json").write_text(json.dumps(fleet, indent=1) + "\n")
    (out / "README.md").write_text(_fleet_readme(record, models, member_opts, str(path)))
    print(f"[deploy] fleet {record.get('fleet')}: {total} engines of {len(models)} models; wrote {out}/ "
          "(README.md first)")  # fmt: skip


def _refuse_fleet_folder(out: Path, replacing: bool) -> None:
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    readme = out / "README.md"
    ours = out.is_dir() and readme.exists() and readme.read_text(errors="replace").startswith(FLEET_MARK)
    if not ours:
        raise ConfigError(f"out={out}: holds files that are not an earlier fleet deploy: choose a new or empty folder")
    if not replacing:
        raise ConfigError(f"out={out}: holds an earlier fleet deploy; give replace=true to replace it whole, or "
                          "choose another out=")  # fmt: skip


def _refuse_shared_hosts(member_plans: dict[str, Any]) -> None:
    """target=shell starts every engine of a host on the same ports: two models' engines on one host cannot run."""
    from deployment.targets.shell import shared_host

    clash = shared_host((name, isl.gpu, isl.hosts.nodes) for name, plan in member_plans.items()
                        for isl in plan.islands if isl.serving and isl.hosts is not None)  # fmt: skip
    if clash is not None:
        one, other, gpu, h = clash
        raise ConfigError(f"{WHERE}: {one} and {other} both run engines on {gpu} host {h}, and target=shell starts "
                          "every engine of a host on the same ports: deploy the fleet with target=k8s (a pod per "
                          "engine)")  # fmt: skip


def _fleet_readme(record: dict[str, Any], models: list[str], member_opts: dict[str, DeployOptions],
                  source: str) -> str:  # fmt: skip
    lines = [
        f"{FLEET_MARK}{record.get('fleet')}, {len(models)} models on {record.get('inventory')}",
        "",
        f"Made by `python -m pipeline.deploy` from {source}. Each model's launch files are in its own folder, with "
        "its README (what to fill in, how to start its engines); its engines are named after it. Start every "
        "model's engines, then one router for all of them:",
        "",
        "```bash",
        "python -m deployment.router routing.json --host 0.0.0.0 --port 8000",
        "```",
        "",
        "It sends each request to the engines of the model its OpenAI `model` field names (the model's name, or "
        "the weights' path its engines serve it under), then by its prompt's length as that model's plan routes it.",
        "",
        "| model | folder | weights | rate (req/s) |",
        "|---|---|---|---|",
        *(f"| {m['model']} | `{m['model']}/` | `{member_opts[m['model']].model_path}` | {m['rate_req_s']:.2f} |"
          for m in record["models"]),
        "",
    ]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    cli.main("deploy", execute)

"""Launch files for a plan: `python -m pipeline.deploy plan=PATH/plan.json [engine=vllm] [target=k8s] [out=DIR]
[replace=true]`.

Per island and host the engine command (SGLang or vLLM), the router's routing.json, Kubernetes
manifests for target=k8s (llm-d model-service Helm values for target=llmd), and a README that says
what to fill in and how to start
(`deployment`, docs/deploy.md). Settings: conf/deploy.yaml. A folder that holds an earlier deploy is replaced whole
with replace=true, and refused without it.
"""

from __future__ import annotations

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

COMMAND = ("plan", "out", "replace", "hydra")  # the command's own settings and Hydra's, beside the deployment's
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


if __name__ == "__main__":
    cli.main("deploy", execute)

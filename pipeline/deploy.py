"""Launch files for a plan: `python -m pipeline.deploy plan=PATH/plan.json [engine=vllm] [target=k8s] [out=DIR]`.

Per island and host the engine command (SGLang or vLLM), the router's routing.json, Kubernetes
manifests for target=k8s (llm-d model-service Helm values for target=llmd), and a README that says
what to fill in and how to start
(`deployment`, docs/deploy.md). Settings: conf/deploy.yaml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plan as plans
from deployment.commands import DeployOptions
from deployment.folder import write
from pipeline import cli
from pipeline.errors import ConfigError


def options_from_cfg(cfg: Any) -> DeployOptions:
    return DeployOptions(
        engine=str(cfg.engine),
        target=str(cfg.target),
        model_path=str(cfg.model_path),
        image=None if cfg.image is None else str(cfg.image),
        router_image=str(cfg.router_image),
        transfer_backend=str(cfg.sglang.transfer_backend),
        gpu_label=str(cfg.k8s.gpu_label),
        ib_devices=None if cfg.ib_devices is None else str(cfg.ib_devices),
        expert_location=None if cfg.sglang.expert_location is None else str(cfg.sglang.expert_location),
        weights_pvc=None if cfg.k8s.weights_pvc is None else str(cfg.k8s.weights_pvc),
        rdma_resource=None if cfg.k8s.rdma_resource is None else str(cfg.k8s.rdma_resource),
        host_network=bool(cfg.k8s.host_network),
        router_replicas=int(cfg.k8s.router_replicas),
    )


def execute(cfg: Any) -> None:
    if cfg.plan is None:
        raise ConfigError("plan=PATH is required: the plan.json of a search (outputs/search/<run>/<time>/plan.json)")
    opts = options_from_cfg(cfg)
    plan = plans.load(cfg.plan)
    out = Path(str(cfg.out)) if cfg.out else Path(str(cfg.plan)).parent / f"deploy-{opts.engine}-{opts.target}"
    es = write(plan, opts, out, str(cfg.plan))
    print(f"[deploy] {len(es)} engines on {sum(e.nnodes for e in es)} host slots; wrote {out}/ (README.md first)")


if __name__ == "__main__":
    cli.main("deploy", execute)

"""target=k8s: Kubernetes manifests of a plan's engines and its router.

A Deployment per single-host engine, a LeaderWorkerSet per multi-host one (every pod gets the
leader's address and its index), a Service each; the router's ConfigMap, Deployment and Service.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from deployment.commands import BOOTSTRAP_PORT, ENGINE_PORT, ROUTER_PORT, WORKER, DeployOptions, command, shell_line
from deployment.engines import Engine
from plan import Plan

ROUTER_COMMAND = ["python3", "-m", "deployment.router", "/etc/archipelago/routing.json", "--port", str(ROUTER_PORT)]


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(docs: list[dict[str, Any]]) -> str:
    """The manifests as one multi-document YAML file (no anchors: each document reads alone)."""
    return yaml.dump_all(docs, Dumper=_NoAliases, sort_keys=False)


def manifests(plan: Plan, es: list[Engine], opts: DeployOptions, route: dict[str, Any]) -> list[dict[str, Any]]:
    """A Deployment per single-host engine, a LeaderWorkerSet per multi-host one, a Service each;
    the router's ConfigMap, Deployment and Service."""
    docs: list[dict[str, Any]] = []
    for e in es:
        labels = {"app.kubernetes.io/part-of": "archipelago", "archipelago/engine": e.name}
        ports = [{"containerPort": ENGINE_PORT, "name": "http"}]
        if e.role == "prefill" and opts.engine == "sglang":
            ports.append({"containerPort": BOOTSTRAP_PORT, "name": "bootstrap"})

        def container(rank: int, e: Engine = e, ports: list[dict[str, Any]] = ports) -> dict[str, Any]:
            cmd = [a.replace("$LEADER_ADDR", "$LWS_LEADER_ADDRESS") for a in command(e, rank, plan, opts)]
            if e.nnodes > 1:  # LeaderWorkerSet gives every pod the leader's address and its index
                cmd = ["/bin/sh", "-c", "exec " + shell_line(cmd)]
            per_pod = min(e.gpus, e.node_gpus)
            return {
                "name": "engine",
                "image": opts.engine_image,
                "command": cmd,
                "ports": ports if rank == 0 else [],
                "resources": {"limits": {"nvidia.com/gpu": per_pod}, "requests": {"nvidia.com/gpu": per_pod}},
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }

        def pod(rank: int, e: Engine = e, labels: dict[str, str] = labels) -> dict[str, Any]:
            return {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {opts.gpu_label: e.gpu},
                    "containers": [container(rank)],
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
                },
            }

        meta = {"name": e.name, "labels": labels}
        if e.nnodes == 1:
            docs.append(
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": meta,
                    "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": pod(0)},
                }
            )
        else:
            docs.append(
                {
                    "apiVersion": "leaderworkerset.x-k8s.io/v1",
                    "kind": "LeaderWorkerSet",
                    "metadata": meta,
                    "spec": {
                        "replicas": 1,
                        "leaderWorkerTemplate": {
                            "size": e.nnodes,
                            "leaderTemplate": pod(0),
                            "workerTemplate": pod(WORKER),
                        },
                    },
                }
            )
        selector = {**labels} if e.nnodes == 1 else {**labels, "role": "leader"}
        if e.nnodes > 1:
            docs[-1]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"] = dict(selector)
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": e.name, "labels": labels},
                "spec": {
                    "selector": selector,
                    "ports": [
                        {"name": p["name"], "port": p["containerPort"], "targetPort": p["containerPort"]} for p in ports
                    ],
                },
            }
        )
    router_labels = {"app.kubernetes.io/part-of": "archipelago", "archipelago/engine": "router"}
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "archipelago-routing"},
            "data": {"routing.json": json.dumps(route, indent=1)},
        }
    )
    docs.append(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "archipelago-router", "labels": router_labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": router_labels},
                "template": {
                    "metadata": {"labels": router_labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "router",
                                "image": opts.router_image,
                                "command": ROUTER_COMMAND,
                                "ports": [{"containerPort": ROUTER_PORT, "name": "http"}],
                                "volumeMounts": [{"name": "routing", "mountPath": "/etc/archipelago"}],
                            }
                        ],
                        "volumes": [{"name": "routing", "configMap": {"name": "archipelago-routing"}}],
                    },
                },
            },
        }
    )
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "archipelago-router", "labels": router_labels},
            "spec": {
                "selector": router_labels,
                "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": ROUTER_PORT}],
            },
        }
    )
    return docs

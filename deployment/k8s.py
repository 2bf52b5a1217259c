"""target=k8s: Kubernetes manifests of a plan's engines and its router.

A Deployment per single-host engine, a LeaderWorkerSet per multi-host one (every pod gets the
leader's address and its index), a Service each; the router's ConfigMap, Deployment and Service.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import yaml

from deployment.commands import BOOTSTRAP_PORT, ENGINE_PORT, ROUTER_PORT, WORKER, DeployOptions, command
from deployment.engines import Engine
from deployment.launch import HOST, Launch, Ref, k8s_command, k8s_escape, uses
from plan import Plan

# the router listens on the pod's address (loopback is its default); its API key, when the Secret
# `archipelago-router` holds one (`kubectl create secret generic archipelago-router --from-literal=api-key=...`)
ROUTER_COMMAND = ["python3", "-m", "deployment.router", "/etc/archipelago/routing.json", "--host", "0.0.0.0",
                  "--port", str(ROUTER_PORT)]  # fmt: skip
ROUTER_KEY = {
    "name": "ARCHIPELAGO_ROUTER_API_KEY",
    "valueFrom": {"secretKeyRef": {"name": "archipelago-router", "key": "api-key", "optional": True}},
}


# a 671B model's weights take many minutes to load: the startup probe allows an hour, then the engine
# must answer /health within 10 s every 10 s (ready) and not fail it 6 times in a row (alive)
STARTUP_PROBE_S = 3600


def probes() -> dict[str, Any]:
    check = {"httpGet": {"path": "/health", "port": ENGINE_PORT}, "timeoutSeconds": 10}
    return {
        "startupProbe": {**check, "periodSeconds": 30, "failureThreshold": STARTUP_PROBE_S // 30},
        "readinessProbe": {**check, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**check, "periodSeconds": 30, "failureThreshold": 6},
    }


def weights_volume(opts: DeployOptions) -> dict[str, Any]:
    """The weights: a PersistentVolumeClaim, or the same path on every node."""
    if opts.weights_pvc:
        return {"name": "weights", "persistentVolumeClaim": {"claimName": opts.weights_pvc, "readOnly": True}}
    return {"name": "weights", "hostPath": {"path": opts.model_path, "type": "Directory"}}


# RDMA memory registration: CAP_IPC_LOCK lifts the locked-memory limit (unlimited memlock)
IPC_LOCK = {"capabilities": {"add": ["IPC_LOCK"]}}
HOST_NETWORK = {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}  # k8s.host_network=true


def engine_labels(e: Engine) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "archipelago", "archipelago/engine": e.name}


def engine_ports(e: Engine, opts: DeployOptions) -> list[dict[str, Any]]:
    """The engine's HTTP port, and SGLang's bootstrap port on a prefill engine."""
    ports = [{"containerPort": ENGINE_PORT, "name": "http"}]
    if e.role == "prefill" and opts.engine == "sglang":
        ports.append({"containerPort": BOOTSTRAP_PORT, "name": "bootstrap"})
    return ports


def engine_volumes(opts: DeployOptions) -> list[dict[str, Any]]:
    """An engine pod's volumes: /dev/shm in memory and the weights."""
    return [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, weights_volume(opts)]


def engine_mounts(opts: DeployOptions) -> list[dict[str, Any]]:
    """Where an engine container mounts `engine_volumes`: the weights read-only at the model path."""
    return [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "weights", "mountPath": opts.model_path, "readOnly": True},
    ]


def pod_devices(e: Engine, opts: DeployOptions) -> dict[str, int]:
    """What one pod of engine `e` asks for: its GPUs (the engine's share of a host) and one RDMA device."""
    return {"nvidia.com/gpu": min(e.gpus, e.node_gpus), **({opts.rdma_resource: 1} if opts.rdma_resource else {})}


def env(launch: Launch) -> list[dict[str, Any]]:
    """The container's environment: literal values (escaped for Kubernetes' $(VAR) expansion) and the pod's IP."""
    out: list[dict[str, Any]] = []
    if HOST in uses(launch):
        out.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    for name, value in launch.env.items():
        if isinstance(value, Ref):
            assert value.what == HOST and not value.suffix, value  # the only host-known value an env var takes
            out.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        else:
            out.append({"name": name, "value": k8s_escape(value)})
    return out


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


_NoAliases.add_multi_representer(enum.Enum, lambda dumper, v: dumper.represent_data(v.value))  # a Role: its word


def dump(docs: list[dict[str, Any]]) -> str:
    """The manifests as one multi-document YAML file (no anchors: each document reads alone)."""
    return yaml.dump_all(docs, Dumper=_NoAliases, sort_keys=False)


def manifests(plan: Plan, es: list[Engine], opts: DeployOptions, route: dict[str, Any]) -> list[dict[str, Any]]:
    """A Deployment per single-host engine, a LeaderWorkerSet per multi-host one, a Service each;
    the router's ConfigMap, Deployment and Service."""
    docs: list[dict[str, Any]] = []
    for e in es:
        labels = engine_labels(e)
        ports = engine_ports(e, opts)

        def container(rank: int, e: Engine = e, ports: list[dict[str, Any]] = ports) -> dict[str, Any]:
            launch = command(e, rank, plan, opts)
            devices = pod_devices(e, opts)
            out: dict[str, Any] = {
                "name": "engine",
                "image": opts.engine_image,
                "command": k8s_command(launch),  # LeaderWorkerSet gives the leader's address and the pod's index
                "env": env(launch),
                "ports": ports if rank == 0 else [],
                "resources": {"limits": devices, "requests": devices},
                "securityContext": IPC_LOCK,
                "volumeMounts": engine_mounts(opts),
            }
            if rank == 0:  # the leader serves HTTP; workers of a multi-host engine have no endpoint to probe
                out.update(probes())
            return out

        def pod(rank: int, e: Engine = e, labels: dict[str, str] = labels) -> dict[str, Any]:
            spec: dict[str, Any] = {
                "nodeSelector": {opts.gpu_label: e.gpu},
                "containers": [container(rank)],
                "volumes": engine_volumes(opts),
            }
            if opts.host_network:
                spec.update(HOST_NETWORK)
            return {"metadata": {"labels": labels}, "spec": spec}

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
    return docs + router_manifests(opts, route)


def router_manifests(opts: DeployOptions, route: dict[str, Any]) -> list[dict[str, Any]]:
    """The router's ConfigMap (routing.json), Deployment and Service."""
    docs: list[dict[str, Any]] = []
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
                "replicas": opts.router_replicas,  # stateless: any replica serves any request
                "selector": {"matchLabels": router_labels},
                "template": {
                    "metadata": {"labels": router_labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "router",
                                "image": opts.router_image,
                                "command": ROUTER_COMMAND,
                                "env": [ROUTER_KEY],
                                "ports": [{"containerPort": ROUTER_PORT, "name": "http"}],
                                "readinessProbe": {
                                    "httpGet": {"path": "/health", "port": ROUTER_PORT},
                                    "periodSeconds": 5,
                                },
                                "livenessProbe": {"tcpSocket": {"port": ROUTER_PORT}, "periodSeconds": 10},
                                # the model's folder, for its tokenizer.json (exact prompt lengths)
                                "volumeMounts": [
                                    {"name": "routing", "mountPath": "/etc/archipelago"},
                                    {"name": "weights", "mountPath": opts.model_path, "readOnly": True},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "routing", "configMap": {"name": "archipelago-routing"}},
                            weights_volume(opts),
                        ],
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

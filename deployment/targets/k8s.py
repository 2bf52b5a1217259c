"""target=k8s: Kubernetes manifests of a plan's engines and its router.

A Deployment per single-host engine, a LeaderWorkerSet per multi-host one (every pod gets the
leader's address and its index), a Service each; the router's ConfigMap, Deployment and Service.
Its options (`K8s`: images, node label, weights, RDMA, host network, router replicas) are the
cluster's; target=llmd runs on the same cluster and reads them too.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

import yaml

from deployment.commands import command
from deployment.engines import adapter
from deployment.launch import ENGINE_PORT, HOST, ROUTER_PORT, WORKER, Launch, Ref, k8s_command, k8s_escape, uses
from deployment.options import IMAGE, LABEL_KEY, OBJECT_NAME, RESOURCE, Count, DeployOptions, TargetOptions, setting
from deployment.targets.base import Target
from plan import Engine, Plan

ROUTER_REPLICAS = Count(1, 1000)  # router pods: one passes ~2,400 req/s on a core, a thousand is far past any plan


@dataclass(frozen=True)
class K8s(TargetOptions):
    """target=k8s's own options (conf/deploy.yaml `k8s:`): what the cluster provides."""

    image: str | None = setting(None, IMAGE)  # the engine image (None: the release the commands are checked against)
    router_image: str = setting("archipelago:latest", IMAGE)  # an image with Archipelago installed (runs the router)
    gpu_label: str = setting("archipelago/gpu", LABEL_KEY)  # the node label whose value is the GPU type
    # a PersistentVolumeClaim holding the weights (None: model_path on each node)
    weights_pvc: str | None = setting(None, OBJECT_NAME)
    # the RDMA device plugin's resource each engine pod asks for (None: none)
    rdma_resource: str | None = setting("rdma/rdma_shared_device_a", RESOURCE)
    host_network: bool = False  # pods on their nodes' network (RDMA without a secondary network)
    router_replicas: int = setting(2, ROUTER_REPLICAS)  # router pods behind its Service (stateless; ~2,400 req/s each)


def cluster(opts: DeployOptions) -> K8s:
    """The cluster's options of a Kubernetes target (k8s, llmd; their defaults where `opts` has none)."""
    own = K8s() if opts.target_options is None else opts.target_options
    assert isinstance(own, K8s), own
    return own


def engine_image(opts: DeployOptions) -> str:
    """The engine's image: the cluster's choice, else the release the commands are checked against."""
    return cluster(opts).image or adapter(opts.engine).image


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
    if pvc := cluster(opts).weights_pvc:
        return {"name": "weights", "persistentVolumeClaim": {"claimName": pvc, "readOnly": True}}
    return {"name": "weights", "hostPath": {"path": opts.model_path, "type": "Directory"}}


# RDMA memory registration: CAP_IPC_LOCK lifts the locked-memory limit (unlimited memlock)
IPC_LOCK = {"capabilities": {"add": ["IPC_LOCK"]}}
HOST_NETWORK = {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}  # k8s.host_network=true


def engine_labels(e: Engine) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "archipelago", "archipelago/engine": e.name}


def engine_ports(e: Engine, opts: DeployOptions) -> list[dict[str, Any]]:
    """The ports the engine's leader serves (its HTTP port; SGLang's bootstrap port on a prefill engine)."""
    return [{"containerPort": port, "name": name} for name, port in adapter(opts.engine).ports(e).items()]


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
    assert e.placement is not None
    rdma = cluster(opts).rdma_resource
    return {"nvidia.com/gpu": min(e.gpus, e.placement.node_gpus), **({rdma: 1} if rdma else {})}


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
                "image": engine_image(opts),
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
                "nodeSelector": {cluster(opts).gpu_label: e.gpu},
                "containers": [container(rank)],
                "volumes": engine_volumes(opts),
            }
            if cluster(opts).host_network:
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
                "replicas": cluster(opts).router_replicas,  # stateless: any replica serves any request
                "selector": {"matchLabels": router_labels},
                "template": {
                    "metadata": {"labels": router_labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "router",
                                "image": cluster(opts).router_image,
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


def fill_in(opts: DeployOptions, files: str) -> list[str]:
    """A Kubernetes target's README lines on what to fill in: images, node labels, weights, RDMA, the router's key;
    `files` names what selects the nodes (the manifests, the values)."""
    k = cluster(opts)
    weights = f"the PersistentVolumeClaim `{k.weights_pvc}`" if k.weights_pvc else "the same path on every node"
    if k.rdma_resource:
        rdma = (f"- RDMA: each engine pod asks for one `{k.rdma_resource}` (the RDMA device plugin's resource; "
                "`k8s.rdma_resource=` to change, `null` for none)" + (
                    " and runs on its node's network;" if k.host_network else
                    "; `k8s.host_network=true` puts pods on their nodes' network when there is no secondary RDMA "
                    "network;"))  # fmt: skip
    else:
        rdma = "- RDMA: no device requested (`k8s.rdma_resource=null`);"
    return [
        f"- the engine image (now `{engine_image(opts)}`) and the router image (now `{k.router_image}`: an "
        "image with Archipelago installed);",
        f"- label each GPU node with its type: `kubectl label node NODE {k.gpu_label}=H20` (the {files} select "
        "nodes by it); multi-host engines need the LeaderWorkerSet controller (https://github.com/kubernetes-sigs/lws) "
        "installed;",
        f"- the weights: {weights}, mounted read-only at `{opts.model_path}`;",
        rdma,
        "- the router's API key: `kubectl create secret generic archipelago-router --from-literal=api-key=KEY` "
        "(without it the router asks for none).",
    ]


class K8sTarget(Target):
    """Kubernetes manifests: `kubectl apply -f manifests.yaml`."""

    name = "k8s"
    Options = K8s
    sections = ("k8s",)

    def files(self, plan: Plan, es: list[Engine], opts: DeployOptions, route: dict[str, Any]) -> dict[str, str]:
        return {"manifests.yaml": dump(manifests(plan, es, opts, route))}

    def readme(self, opts: DeployOptions) -> list[str]:
        return [
            *fill_in(opts, "manifests"),
            "",
            "## Start",
            "",
            "```bash",
            "kubectl apply -f manifests.yaml",
            f"kubectl port-forward svc/archipelago-router {ROUTER_PORT}   # then send OpenAI-compatible requests",
            "```",
        ]

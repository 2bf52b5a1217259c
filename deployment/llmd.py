"""target=llmd: one Helm values file per engine for llm-d's model-service chart, and the router's manifests.

Each engine is one release of `llm-d-modelservice` (CHART_VERSION): a Deployment for a single-host
engine, a LeaderWorkerSet for a multi-host one, running exactly the command the other targets run
(`modelCommand: custom`; the chart's LeaderWorkerSet has one pod template, so a multi-host engine's
pods pick the leader's or a worker's arguments by their index: `launch.k8s_shared_command`). A
decode engine's pods carry llm-d's routing sidecar (SIDECAR_PORT, in front of the engine), which
runs the prefill/decode exchange itself for a request that names its prefill engine in the
`x-prefiller-host-port` header. The router (routing.json's protocol "llmd") sets that header from
the plan's fractions, in place of llm-d's gateway and endpoint picker, which cannot express them
(docs/deploy.md, section 4). A Service per engine comes with its release (`extraObjects`).

The values are checked by the chart's own `values.schema.json` (what Helm checks on install), the
containers and volumes by the Pod schema, and the container's fields against what the chart's
template reads (tests/test_llmd.py, with the chart's files pinned in tests/data/llmd).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from deployment import k8s
from deployment.commands import BOOTSTRAP_PORT, ENGINE_PORT, WORKER, DeployOptions, command
from deployment.engines import DeployError, Engine
from deployment.launch import k8s_command, k8s_shared_command
from plan import Plan

CHART = "llm-d-modelservice"
CHART_REPO = "https://llm-d-incubation.github.io/llm-d-modelservice/"
CHART_VERSION = "v0.4.12"
SIDECAR_IMAGE = "ghcr.io/llm-d/llm-d-routing-sidecar:v0.8.0"  # llm-d/llm-d-inference-scheduler v0.8.0
SIDECAR_PORT = 8000  # the decode pods' routing sidecar; the engine behind it on ENGINE_PORT
CONNECTORS = {"sglang": "sglang", "vllm": "nixlv2"}  # the sidecar's P/D protocol per engine
LWS_LEADER = "leaderworkerset.sigs.k8s.io/worker-index"  # LeaderWorkerSet's label of a pod's index ("0": the leader)


def _leader_probe(period: int, failures: int) -> dict[str, Any]:
    """A probe of the leader's /health that workers (which serve no HTTP) pass: the pods share one template."""
    check = f"urllib.request.urlopen('http://127.0.0.1:{ENGINE_PORT}/health', timeout=8)"
    script = f'[ "${{LWS_WORKER_INDEX:-0}}" != 0 ] || exec python3 -c "import urllib.request; {check}"'
    return {"exec": {"command": ["/bin/sh", "-c", script]}, "timeoutSeconds": 10, "periodSeconds": period,
            "failureThreshold": failures}  # fmt: skip


def _probes(e: Engine) -> dict[str, Any]:
    """target=k8s's probes; a multi-host engine's on the same schedule, passed by its workers."""
    http = k8s.probes()
    if e.nnodes == 1:
        return http
    return {name: _leader_probe(p["periodSeconds"], p["failureThreshold"]) for name, p in http.items()}


def _untemplated(e: Engine, v: dict[str, Any]) -> dict[str, Any]:
    """The chart renders some values as Helm templates (a container's env, ports and extraConfig, a pod's
    extraConfig, extraObjects): a `{{` there would be run by Helm, so none may hold one."""
    pods = [v[r] for r in ("prefill", "decode") if v[r].get("create")]
    rendered = [v["extraObjects"], *(p.get("extraConfig") for p in pods)]
    rendered += [c.get(k) for p in pods for c in p["containers"] for k in ("env", "ports", "extraConfig")]
    for part in rendered:
        if "{{" in json.dumps(part):
            raise DeployError(f"{e.name}: a value holds '{{{{', which llm-d's chart would run as a Helm template: "
                              f"remove it ({json.dumps(part)[:200]})")  # fmt: skip
    return v


def values(plan: Plan, e: Engine, opts: DeployOptions) -> dict[str, Any]:
    """The Helm values of engine `e`'s release."""
    leader = command(e, 0, plan, opts)
    if e.nnodes == 1:
        argv = k8s_command(leader)
    else:
        argv = k8s_shared_command(leader, command(e, WORKER, plan, opts))
    labels = k8s.engine_labels(e)
    ports = k8s.engine_ports(e, opts)
    devices = k8s.pod_devices(e, opts)
    container = {
        "name": "engine",
        "image": opts.engine_image,
        "modelCommand": "custom",
        "command": argv,
        "env": k8s.env(leader),
        "ports": ports,
        "resources": {"limits": devices, "requests": devices},
        "mountModelVolume": False,  # the weights: target=k8s's volume (hostPath or a PVC), not the chart's download
        "volumeMounts": k8s.engine_mounts(opts),
        "extraConfig": {"securityContext": k8s.IPC_LOCK, **_probes(e)},
    }
    local = min(e.gpus, e.node_gpus)
    # sizes the pods: tensor x dataLocal GPUs a pod, `workers` pods a LeaderWorkerSet (the chart also exports them as
    # DP_SIZE, TP_SIZE, DP_SIZE_LOCAL, which neither engine reads); the engine's parallelism is its command's
    if opts.engine == "vllm":
        parallelism = {"tensor": e.attn_tp, "dataLocal": local // e.attn_tp, "data": e.attn_dp, "workers": e.nnodes}
    else:
        parallelism = {"tensor": local, "dataLocal": 1, "workers": e.nnodes}
    pod: dict[str, Any] = {
        "create": True,
        "replicas": 1,
        "parallelism": parallelism,
        "nodeSelector": {opts.gpu_label: e.gpu},
        "volumes": k8s.engine_volumes(opts),
        "containers": [container],
    }
    if opts.host_network:
        pod["extraConfig"] = dict(k8s.HOST_NETWORK)
    other = "decode" if e.role == "prefill" else "prefill"
    selector = {**labels, **({LWS_LEADER: "0"} if e.nnodes > 1 else {})}
    service_port = SIDECAR_PORT if e.role == "decode" else ENGINE_PORT
    service_ports = [{"name": "http", "port": service_port, "targetPort": service_port}]
    if e.role == "decode":  # the engine itself, for the router's health checks
        service_ports.append({"name": "engine", "port": ENGINE_PORT, "targetPort": ENGINE_PORT})
    if e.role == "prefill" and opts.engine == "sglang":
        service_ports.append({"name": "bootstrap", "port": BOOTSTRAP_PORT, "targetPort": BOOTSTRAP_PORT})
    return _untemplated(
        e,
        {
            "fullnameOverride": e.name,
            "multinode": e.nnodes > 1,
            # the name is only read by the chart's own commands (not used: modelCommand custom)
            "modelArtifacts": {"name": plan.model.name, "labels": labels},
            "routing": {
                "servicePort": SIDECAR_PORT,
                "proxy": {
                    "enabled": e.role == "decode",
                    "image": SIDECAR_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "targetPort": ENGINE_PORT,
                    "connector": CONNECTORS[opts.engine],
                    "secure": False,  # --secure-proxy=false: plain HTTP (the sidecar's default is HTTPS, self-signed)
                },
            },
            str(e.role): pod,
            other: {"create": False},
            "extraObjects": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": e.name, "labels": labels},
                    "spec": {"selector": selector, "ports": service_ports},
                }
            ],
        },
    )


def address(e: Engine) -> str:
    """Engine `e`'s URL for the router: a prefill engine itself, a decode engine's routing sidecar."""
    return f"http://{e.name}:{SIDECAR_PORT if e.role == 'decode' else ENGINE_PORT}"


def health(e: Engine) -> str | None:
    """Where the router asks a decode engine's health: the engine, not its sidecar (whose /health is always 200)."""
    return f"http://{e.name}:{ENGINE_PORT}" if e.role == "decode" else None


def files(plan: Plan, es: list[Engine], opts: DeployOptions, route: dict[str, Any]) -> dict[str, str]:
    """{path: text}: a values file per engine, the router's manifests, and install.sh that installs them."""
    out = {f"llmd/{e.name}.values.yaml": k8s.dump([values(plan, e, opts)]) for e in es}
    out["router.yaml"] = k8s.dump(k8s.router_manifests(opts, route))
    lines = [
        "#!/usr/bin/env bash",
        "# One llm-d model-service release per engine, then the router (README.md: what to fill in first).",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        f"helm repo add llm-d-modelservice {shlex.quote(CHART_REPO)} --force-update",
    ]
    for e in es:
        lines.append(f"helm upgrade --install {shlex.quote(e.name)} llm-d-modelservice/{CHART} --version "
                     f"{CHART_VERSION} -f {shlex.quote(f'llmd/{e.name}.values.yaml')}")  # fmt: skip
    lines += ["kubectl apply -f router.yaml", ""]
    out["install.sh"] = "\n".join(lines)
    return out

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
from dataclasses import dataclass
from typing import Any

import yaml

from deployment.commands import command
from deployment.engines import adapter
from deployment.errors import DeployError
from deployment.launch import ENGINE_PORT, ROUTER_PORT, WORKER, k8s_command, k8s_shared_command
from deployment.options import IMAGE, DeployOptions, setting, shown
from deployment.targets import k8s
from deployment.targets.base import Target
from plan import Engine, Plan, Role

CHART = "llm-d-modelservice"
CHART_REPO = "https://llm-d-incubation.github.io/llm-d-modelservice/"
CHART_VERSION = "v0.4.12"
SIDECAR_IMAGE = "ghcr.io/llm-d/llm-d-routing-sidecar:v0.8.0"  # llm-d/llm-d-inference-scheduler v0.8.0
SIDECAR_PORT = 8000  # the decode pods' routing sidecar; the engine behind it on ENGINE_PORT
CONNECTORS = {"sglang": "sglang", "vllm": "nixlv2"}  # the sidecar's P/D protocol per engine
PROXY_UNQUOTED = ("image", "imagePullPolicy", "targetPort", "connector", "secure")  # the sidecar's, as the chart writes
LWS_LEADER = "leaderworkerset.sigs.k8s.io/worker-index"  # LeaderWorkerSet's label of a pod's index ("0": the leader)


@dataclass(frozen=True)
class Llmd(k8s.K8s):
    """target=llmd's own options (conf/deploy.yaml `llmd:`) beside the cluster's it shares with target=k8s (`k8s:`)."""

    sidecar_image: str = setting(SIDECAR_IMAGE, IMAGE)  # llm-d's routing sidecar in front of every decode engine


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


def unquoted(v: dict[str, Any]) -> dict[str, Any]:
    """{path: value} of the values llm-d's chart writes into its YAML as they are, unquoted (`_helpers.tpl`:
    `image: {{ .container.image }}`, the routing sidecar's `--connector={{ .proxy.connector }}`, the release's names
    from `fullnameOverride`, ...; tests/test_deploy_settings.py renders those lines of the chart)."""
    proxy = v["routing"]["proxy"]
    out = {"fullnameOverride": v["fullnameOverride"], "routing.servicePort": v["routing"]["servicePort"]}
    out.update({f"routing.proxy.{k}": proxy[k] for k in PROXY_UNQUOTED})
    for role in ("prefill", "decode"):
        for j, c in enumerate(v[role].get("containers") or []):
            out.update({f"{role}.containers[{j}].{k}": c[k] for k in ("name", "image")})
    return out


def _reads_back(value: Any) -> bool:
    """Whether `value`, written unquoted after a key as a Go template prints it, reads back as itself: one scalar."""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        return yaml.safe_load(f"key: {text}") == {"key": value}
    except yaml.YAMLError:
        return False


def _untemplated(e: Engine, v: dict[str, Any]) -> dict[str, Any]:
    """The chart renders some values as Helm templates (a container's env, ports and extraConfig, a pod's
    extraConfig, extraObjects): a `{{` there would be run by Helm, so none may hold one. It writes others into its
    YAML unquoted (`unquoted`): each must read back as itself, or it would add keys to the pod."""
    pods = [v[r] for r in ("prefill", "decode") if v[r].get("create")]
    rendered = [v["extraObjects"], *(p.get("extraConfig") for p in pods)]
    rendered += [c.get(k) for p in pods for c in p["containers"] for k in ("env", "ports", "extraConfig")]
    for part in rendered:
        if "{{" in json.dumps(part):
            raise DeployError(f"{e.name}: a value holds '{{{{', which llm-d's chart would run as a Helm template: "
                              f"remove it ({json.dumps(part)[:200]})")  # fmt: skip
    for path, value in unquoted(v).items():
        if not _reads_back(value):
            raise DeployError(f"{e.name}: {path}={shown(value)}: llm-d's chart writes it into the pod's YAML "
                              "unquoted, where it would not read back as itself: give a plain name (an image: an OCI "
                              "reference)")  # fmt: skip
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
        "image": k8s.engine_image(opts),
        "modelCommand": "custom",
        "command": argv,
        "env": k8s.env(leader),
        "ports": ports,
        "resources": {"limits": devices, "requests": devices},
        "mountModelVolume": False,  # the weights: target=k8s's volume (hostPath or a PVC), not the chart's download
        "volumeMounts": k8s.engine_mounts(opts),
        "extraConfig": {"securityContext": k8s.IPC_LOCK, **_probes(e)},
    }
    assert e.placement is not None
    local = min(e.gpus, e.placement.node_gpus)
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
        "nodeSelector": {k8s.cluster(opts).gpu_label: e.gpu},
        "volumes": k8s.engine_volumes(opts),
        "containers": [container],
    }
    if k8s.cluster(opts).host_network:
        pod["extraConfig"] = dict(k8s.HOST_NETWORK)
    other = "decode" if e.role == "prefill" else "prefill"
    selector = {**labels, **({LWS_LEADER: "0"} if e.nnodes > 1 else {})}
    service_port = SIDECAR_PORT if e.role == "decode" else ENGINE_PORT
    service_ports = [{"name": "http", "port": service_port, "targetPort": service_port}]
    if e.role == "decode":  # the engine itself, for the router's health checks
        service_ports.append({"name": "engine", "port": ENGINE_PORT, "targetPort": ENGINE_PORT})
    service_ports += [
        {"name": name, "port": port, "targetPort": port}
        for name, port in adapter(opts.engine).ports(e).items()
        if name != "http"
    ]  # SGLang's prefill bootstrap port
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
                    "image": sidecar(opts),
                    "imagePullPolicy": "IfNotPresent",
                    "targetPort": ENGINE_PORT,
                    "connector": connector(opts.engine),
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


def connector(engine: str) -> str:
    """The routing sidecar's P/D protocol for `engine`'s engines; DeployError for an engine it has none for."""
    if engine not in CONNECTORS:
        raise DeployError(f"engine={engine}: llm-d's routing sidecar has no connector for it; target=llmd takes "
                          f"{sorted(CONNECTORS)}")  # fmt: skip
    return CONNECTORS[engine]


def sidecar(opts: DeployOptions) -> str:
    """The routing sidecar's image (`llmd.sidecar_image`)."""
    own = opts.target_options
    return own.sidecar_image if isinstance(own, Llmd) else SIDECAR_IMAGE


def install(es: list[Engine]) -> str:
    """install.sh: one `helm upgrade --install` per engine, then the router."""
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
    return "\n".join([*lines, "kubectl apply -f router.yaml", ""])


class LlmdTarget(Target):
    """llm-d's model-service chart: a Helm release per engine, the decode engines behind llm-d's routing sidecar,
    which runs the engines' prefill/decode exchange for the prefill engine the router names."""

    name = "llmd"
    Options = Llmd
    sections = ("k8s", "llmd")

    def refuse(self, plan: Plan, es: list[Engine], opts: DeployOptions) -> None:
        connector(opts.engine)
        mixed = [e.island for e in es if e.role is Role.AGGREGATED]
        if mixed:
            raise DeployError(
                f"plan island {mixed[0]} runs aggregated engines; llm-d's model service deploys prefill and decode "
                "pods only: use target=k8s or target=shell for this plan"
            )

    def launched(self, plan: Plan, es: list[Engine]) -> list[Engine]:
        """Every engine: `helm upgrade --install` leaves a release whose values did not change as it runs."""
        return es

    def address(self, e: Engine) -> str:
        """A prefill engine itself, a decode engine's routing sidecar."""
        return f"http://{e.name}:{SIDECAR_PORT if e.role == 'decode' else ENGINE_PORT}"

    def health(self, e: Engine) -> str | None:
        """A decode engine's health from the engine, not its sidecar (whose /health is always 200)."""
        return f"http://{e.name}:{ENGINE_PORT}" if e.role == "decode" else None

    def protocol(self, opts: DeployOptions) -> str:
        return "llmd"  # the sidecars run the engines' protocol, told the prefill engine by the router

    def routes(self, opts: DeployOptions) -> str:
        return ("sends the request to the decode engine's llm-d routing sidecar with the prefill engine's host:port in "
                "the `x-prefiller-host-port` header (the sidecar runs the engines' PD protocol).")  # fmt: skip

    def files(self, plan: Plan, es: list[Engine], opts: DeployOptions, route: dict[str, Any]) -> dict[str, str]:
        """A values file per engine, the router's manifests, and install.sh that installs them."""
        out = {f"llmd/{e.name}.values.yaml": k8s.dump([values(plan, e, opts)]) for e in es}
        out["router.yaml"] = k8s.dump(k8s.router_manifests(opts, route))
        out["install.sh"] = install(es)
        return out

    def readme(self, opts: DeployOptions) -> list[str]:
        return [
            *k8s.fill_in(opts, "values"),
            f"- Helm 3 and llm-d's model-service chart {CHART_VERSION} ({CHART_REPO}); each decode pod runs llm-d's "
            f"routing sidecar (`{sidecar(opts)}`, connector `{connector(opts.engine)}`) on port {SIDECAR_PORT} in "
            "front of its engine.",
            "",
            "## Start",
            "",
            "```bash",
            "./install.sh   # helm upgrade --install per engine (llmd/<engine>.values.yaml), then the router",
            f"kubectl port-forward svc/archipelago-router {ROUTER_PORT}   # then send OpenAI-compatible requests",
            "```",
            "",
            "The router sends each request to a decode engine's sidecar, naming the prefill engine the plan's "
            "fractions drew in the `x-prefiller-host-port` header; the sidecar runs the prefill/decode exchange. "
            "llm-d's gateway and endpoint picker are not used: they cannot express the plan's length ranges and "
            "fractions.",
        ]

"""Launch files for a plan: per island and host the engine command, the router, Kubernetes manifests.

    python -m pipeline.deploy plan=outputs/search/<run>/plan.json engine=sglang target=shell
    python -m pipeline.deploy plan=... engine=vllm target=k8s out=deploy/

A plan's serving island becomes engines (`engines`):
- a prefill island is one engine over all its GPUs: tensor size = the island, attention data
  parallel (DP attention) with the plan's attention TP, expert parallel over the island;
- a decode island is `dp` engines, each one EP group of `ep` GPUs, attention DP ranks of the
  plan's TP, admitting the plan's batch per rank (`--max-running-requests` = batch x ranks).
Every engine gets the redundant experts that make its routed experts divide over its GPUs,
and the plan's prefill batch (`--max-prefill-tokens`). An engine of whole hosts runs one
process set per host (node rank 0 the leader); an engine smaller than a host gets its GPUs of
the host (`CUDA_VISIBLE_DEVICES`).

The router (`pipeline/router.py`, aiohttp) enforces the plan's length routing: no existing
router or gateway routes by prompt length with per-range traffic fractions across prefill
and decode pools, so it pairs one prefill engine with one decode engine per request, by the
plan's fractions for the request's length range, in the engine's disaggregation protocol.

The folder's README.md says what to fill in (model path, host addresses, image) and how to start.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from costmodel.catalog import load_gpu
from pipeline import cli
from pipeline.config import ConfigError, positive_int
from pipeline.engine_args import SGLANG_VERSION, VLLM_VERSION
from pipeline.journal import write_text

ENGINES = ("sglang", "vllm")
TARGETS = ("shell", "k8s")
ENGINE_PORT = 30000
BOOTSTRAP_PORT = 8998  # SGLang's prefill bootstrap server (--disaggregation-bootstrap-port default)
DIST_PORT = 5000  # the leader's port for the engine's distributed init
ROUTER_PORT = 8000
WORKER = -1  # the rank of a Kubernetes worker pod: read from LeaderWorkerSet's LWS_WORKER_INDEX at start
# the engine releases whose argument definitions the commands are checked against (pipeline.engine_args)
IMAGES = {"sglang": f"lmsysorg/sglang:v{SGLANG_VERSION}", "vllm": f"vllm/vllm-openai:v{VLLM_VERSION}"}


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


@dataclass(frozen=True)
class Engine:
    """One engine instance of an island: its GPUs, parallelism and hosts."""

    name: str  # e.g. "i03-prefill-h20"
    island: int
    role: str
    gpu: str
    gpus: int  # world size
    attn_tp: int
    attn_dp: int
    max_running: int  # decode: sequences admitted (batch x attention ranks); prefill: 0
    redundant_experts: int
    hosts: tuple[int, ...]  # host indices of its GPU type
    gpu_slice: tuple[int, int] | None  # (first, last) GPU within its host when smaller than a host
    node_gpus: int

    @property
    def nnodes(self) -> int:
        return len(self.hosts)


def engines(plan: dict[str, Any]) -> list[Engine]:
    """The engines of every serving island, on the hosts plan.json's node map gives it."""
    out = []
    for k, isl in enumerate(plan["islands"]):
        if isl["role"] == "idle":
            continue
        if "nodes" not in isl:
            raise ConfigError(f"plan island {k} has no `nodes`: re-run the search that wrote it with this version")
        node = load_gpu(isl["gpu"]).node_gpus
        size = int(isl["size"])
        if not (size % node == 0 or node % size == 0):
            raise ConfigError(
                f"plan island {k} ({size} x {isl['gpu']}) is neither a divisor of a {node}-GPU host nor whole hosts: "
                "engines cannot be placed on it; plan with search.shapes=nodes (the default)"
            )
        tp = int(isl["tp"])
        heads = int(plan.get("model_spec", {}).get("n_heads", 0))
        if heads and heads % tp:
            raise ConfigError(
                f"plan island {k}: attention TP {tp} does not divide {plan.get('model')}'s {heads} attention heads: "
                "no engine shards attention that way"
            )
        group = size if isl["role"] == "prefill" else int(isl["ep"])
        copies = 1 if isl["role"] == "prefill" else int(isl["dp"])
        hosts = list(isl["nodes"])
        first = int(isl.get("first_gpu", 0))
        for c in range(copies):
            name = f"i{k:02d}-{isl['role']}-{isl['gpu'].lower()}" + (f"-{c}" if copies > 1 else "")
            if group >= node:  # whole hosts per engine
                per = group // node
                mine, gslice = tuple(hosts[c * per : (c + 1) * per]), None
            else:  # several engines per host
                at = first + c * group
                mine, gslice = (hosts[at // node - first // node],), (at % node, at % node + group - 1)
            out.append(
                Engine(
                    name,
                    k,
                    isl["role"],
                    isl["gpu"],
                    group,
                    tp,
                    group // tp,
                    int(isl["batch"]) * (group // tp) if isl["role"] == "decode" else 0,
                    int(isl.get("redundant_experts", 0)),
                    mine,
                    gslice,
                    node,
                )
            )
    return out


# --- engine commands -----------------------------------------------------------------------------


def sglang_command(e: Engine, rank: int, plan: dict[str, Any], cfg: Any) -> list[str]:
    """`python -m sglang.launch_server ...` for host `rank` of engine `e` (SGLang 0.5 flags)."""
    cmd = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(cfg.model_path),
        "--trust-remote-code",
        "--host",
        "0.0.0.0",
        "--port",
        str(ENGINE_PORT),
        "--disaggregation-mode",
        e.role,
        "--disaggregation-transfer-backend",
        str(cfg.sglang.transfer_backend),
        "--tp-size",
        str(e.gpus),
        "--ep-size",
        str(e.gpus),
        "--moe-a2a-backend",
        "deepep",
        "--deepep-mode",
        "normal" if e.role == "prefill" else "low_latency",
        "--max-prefill-tokens",
        str(plan["cost"]["prefill_batch_tokens"]),
    ]
    if e.attn_dp > 1:  # DP attention: SGLang 0.5.2x's --attn-dp-size (was --dp-size N --enable-dp-attention)
        # dense MLP and LM head split over the attention TP group, as the cost model counts them (tp_dense_layers)
        cmd += ["--attn-dp-size", str(e.attn_dp), "--moe-dense-tp-size", str(e.attn_tp), "--enable-dp-lm-head"]
    if e.redundant_experts:
        cmd += ["--ep-num-redundant-experts", str(e.redundant_experts)]
    if e.role == "prefill":
        cmd += ["--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)]
    else:
        cmd += ["--max-running-requests", str(e.max_running)]
    if e.nnodes > 1:
        node_rank = "$LWS_WORKER_INDEX" if rank == WORKER else str(rank)
        cmd += ["--nnodes", str(e.nnodes), "--node-rank", node_rank, "--dist-init-addr", f"$LEADER_ADDR:{DIST_PORT}"]
    return cmd


def vllm_command(e: Engine, rank: int, plan: dict[str, Any], cfg: Any) -> list[str]:
    """`vllm serve ...` for host `rank` of engine `e`: data parallel attention ranks of the plan's TP,
    experts parallel over the engine, the NIXL KV connector for disaggregation."""
    local = min(e.gpus, e.node_gpus) // e.attn_tp  # attention DP ranks on one host
    cmd = [
        "vllm",
        "serve",
        str(cfg.model_path),
        "--trust-remote-code",
        "--tensor-parallel-size",
        str(e.attn_tp),
        "--data-parallel-size",
        str(e.attn_dp),
        "--enable-expert-parallel",
        "--max-num-batched-tokens",
        str(plan["cost"]["prefill_batch_tokens"]),
        "--kv-transfer-config",
        json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}),
    ]
    if e.role == "decode":
        cmd += ["--max-num-seqs", str(max(e.max_running // e.attn_dp, 1))]  # vLLM counts sequences per DP rank
    if e.redundant_experts:
        cmd += ["--enable-eplb", "--eplb-config", json.dumps({"num_redundant_experts": e.redundant_experts})]
    if e.nnodes > 1:
        cmd += [
            "--data-parallel-size-local",
            str(local),
            "--data-parallel-address",
            "$LEADER_ADDR",
            "--data-parallel-rpc-port",
            str(DIST_PORT),
        ]
        if rank != 0:
            start = f"$((LWS_WORKER_INDEX * {local}))" if rank == WORKER else str(rank * local)
            cmd += ["--data-parallel-start-rank", start, "--headless"]
    if rank == 0:
        cmd += ["--port", str(ENGINE_PORT)]
    return cmd


COMMANDS = {"sglang": sglang_command, "vllm": vllm_command}


def shell_line(cmd: list[str]) -> str:
    """One shell line; `$LEADER_ADDR`, `$LWS_...` and `$((...))` values stay expandable."""
    return " ".join(a if "$" in a and "{" not in a else shlex.quote(a) for a in cmd)


# --- routing -------------------------------------------------------------------------------------


def routing(plan: dict[str, Any], es: list[Engine], engine: str, address: Any) -> dict[str, Any]:
    """The router's config: per phase, the length ranges with each serving island's share, and the
    islands' engine URLs (weights within an island: equal, its engines being identical)."""
    islands: dict[int, list[str]] = {}
    for e in es:
        islands.setdefault(e.island, []).append(address(e))
    phases: dict[str, dict[str, Any]] = {"prefill": {}, "decode": {}}
    for k, isl in enumerate(plan["islands"]):
        if isl["role"] == "idle":
            continue
        phases[isl["role"]][str(k)] = {
            "engines": islands[k],
            "ranges": [[r["start"], r["end"], r["fraction"]] for r in isl["ranges"]],
        }
    return {
        "protocol": engine,
        "bootstrap_port": BOOTSTRAP_PORT,
        "chars_per_token": 4.0,  # prompts given as text: a token is about 4 characters (set from your tokenizer)
        "islands": phases,
        "source_plan": {"rate_req_s": plan["rate_req_s"], "workload": plan.get("workload")},
    }


# --- the folder ----------------------------------------------------------------------------------


def write_shell(out: Path, plan: dict[str, Any], es: list[Engine], cfg: Any) -> list[Path]:
    paths = []
    for e in es:
        for rank, host in enumerate(e.hosts):
            env = []
            if e.nnodes > 1:
                env.append(f"export LEADER_ADDR=${{LEADER_ADDR:?set to the address of {e.gpu} host {e.hosts[0]}}}")
            if e.gpu_slice:
                env.append(
                    f"export CUDA_VISIBLE_DEVICES={','.join(map(str, range(e.gpu_slice[0], e.gpu_slice[1] + 1)))}"
                )
            line = shell_line(COMMANDS[cfg.engine](e, rank, plan, cfg))
            body = "\n".join(
                [
                    "#!/usr/bin/env bash",
                    f"# {e.name}: {e.role}, {e.gpus} x {e.gpu}, {e.gpu} host {host}"
                    + (f" (rank {rank} of {e.nnodes})" if e.nnodes > 1 else ""),
                    "set -euo pipefail",
                    *env,
                    f"exec {line}",
                    "",
                ]
            )
            path = out / "hosts" / f"{e.gpu.lower()}-host{host:03d}" / f"{e.name}.sh"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, body)
            path.chmod(0o755)
            paths.append(path)
    return paths


def k8s_manifests(plan: dict[str, Any], es: list[Engine], cfg: Any, route: dict[str, Any]) -> list[dict[str, Any]]:
    """A Deployment per single-host engine, a LeaderWorkerSet per multi-host one, a Service each;
    the router's ConfigMap, Deployment and Service."""
    docs: list[dict[str, Any]] = []
    for e in es:
        labels = {"app.kubernetes.io/part-of": "archipelago", "archipelago/engine": e.name}
        ports = [{"containerPort": ENGINE_PORT, "name": "http"}]
        if e.role == "prefill" and cfg.engine == "sglang":
            ports.append({"containerPort": BOOTSTRAP_PORT, "name": "bootstrap"})

        def container(rank: int, e: Engine = e, ports: list[dict[str, Any]] = ports) -> dict[str, Any]:
            cmd = [a.replace("$LEADER_ADDR", "$LWS_LEADER_ADDRESS") for a in COMMANDS[cfg.engine](e, rank, plan, cfg)]
            if e.nnodes > 1:  # LeaderWorkerSet gives every pod the leader's address and its index
                cmd = ["/bin/sh", "-c", "exec " + shell_line(cmd)]
            per_pod = min(e.gpus, e.node_gpus)
            return {
                "name": "engine",
                "image": str(cfg.image or IMAGES[cfg.engine]),
                "command": cmd,
                "ports": ports if rank == 0 else [],
                "resources": {"limits": {"nvidia.com/gpu": per_pod}, "requests": {"nvidia.com/gpu": per_pod}},
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }

        def pod(rank: int, e: Engine = e, labels: dict[str, str] = labels) -> dict[str, Any]:
            return {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {str(cfg.k8s.gpu_label): e.gpu},
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
                                "image": str(cfg.router_image),
                                "command": [
                                    "python3",
                                    "-m",
                                    "pipeline.router",
                                    "/etc/archipelago/routing.json",
                                    "--port",
                                    str(ROUTER_PORT),
                                ],
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


def readme(plan: dict[str, Any], es: list[Engine], cfg: Any, files: list[str]) -> str:
    hosts: dict[str, set[int]] = {}
    for e in es:
        hosts.setdefault(e.gpu, set()).update(e.hosts)
    v = plan.get("verification") or {}  # where the simulator sustains less than the stated rate, say so
    lower = v.get("sustained") is False and v.get("sustained_req_s")
    sim = f", {v['sustained_req_s']:.1f} in the simulator" if lower else ""
    lines = [
        f"# Deployment of a plan: {plan['rate_req_s']:.1f} req/s within the SLOs{sim} ({cfg.engine}, {cfg.target})",
        "",
        f"Made by `python -m pipeline.deploy` from {cfg.plan}. Hosts are numbered per GPU type, as the plan's "
        "report.md node map numbers them: " + "; ".join(f"{g}: {len(h)} hosts" for g, h in sorted(hosts.items())) + ".",
        "",
        f"The commands are written for, and checked against the argument definitions of, "
        f"{'SGLang ' + SGLANG_VERSION if cfg.engine == 'sglang' else 'vLLM ' + VLLM_VERSION}; "
        "another release may rename a flag.",
        "",
        "## Fill in",
        "",
        f"- the model weights' path on every host (now `{cfg.model_path}`: `model_path=` when deploying);",
    ]
    if cfg.target == "shell":
        lines += [
            "- for each multi-host engine, `LEADER_ADDR`: the address of its first host (the scripts stop if unset);",
            "- the router's `routing.json`: replace each `HOST-<gpu>-<n>` with that host's address.",
            "",
            "## Start",
            "",
            "On each host run its scripts (`hosts/<gpu>-host<NNN>/*.sh`, one per engine there; every rank of a",
            "multi-host engine must start), then the router anywhere that reaches the engines:",
            "",
            "```bash",
            f"python -m pipeline.router routing.json --port {ROUTER_PORT}   # OpenAI-compatible, on :{ROUTER_PORT}",
            "```",
        ]
    else:
        lines += [
            f"- the engine image (now `{cfg.image or IMAGES[cfg.engine]}`) and the router image "
            f"(now `{cfg.router_image}`: an image with "
            "this repository installed);",
            f"- label each GPU node with its type: `kubectl label node NODE {cfg.k8s.gpu_label}=H20` (the manifests "
            "select nodes by it); multi-host engines need the LeaderWorkerSet controller "
            "(https://github.com/kubernetes-sigs/lws) installed.",
            "",
            "## Start",
            "",
            "```bash",
            "kubectl apply -f manifests.yaml",
            f"kubectl port-forward svc/archipelago-router {ROUTER_PORT}   # then send OpenAI-compatible requests",
            "```",
        ]
    lines += [
        "",
        "## What enforces the routing",
        "",
        "`pipeline.router` (aiohttp): for each request it estimates the prompt's length (token ids when given, else "
        "characters / `chars_per_token`), finds its range, draws a prefill island and a decode island with the plan's "
        "fractions for that range, then an engine of each at random, and sends the request to both in the "
        + (
            "SGLang PD protocol (bootstrap host, port and room added to the request)."
            if cfg.engine == "sglang"
            else "vLLM NIXL protocol (prefill with max_tokens 1 returning kv_transfer_params, then decode with them)."
        ),
        "",
        "## Engines",
        "",
        "| engine | role | GPUs | hosts | attention TP x DP | redundant experts | max running |",
        "|---|---|---:|---|---|---:|---:|",
    ]
    for e in es:
        where = (
            f"{e.gpu} "
            + ",".join(map(str, e.hosts))
            + (f" (GPUs {e.gpu_slice[0]}-{e.gpu_slice[1]})" if e.gpu_slice else "")
        )
        lines.append(
            f"| {e.name} | {e.role} | {e.gpus} | {where} | {e.attn_tp} x {e.attn_dp} | {e.redundant_experts} | "
            f"{e.max_running or '-'} |"
        )
    lines += ["", "Files: " + ", ".join(f"`{f}`" for f in files), ""]
    return "\n".join(lines)


def execute(cfg: Any) -> None:
    if cfg.plan is None:
        raise ConfigError("plan=PATH is required: the plan.json of a search (outputs/search/<run>/<time>/plan.json)")
    for key, allowed in (("engine", ENGINES), ("target", TARGETS)):
        if cfg[key] not in allowed:
            raise ConfigError(f"{key}={cfg[key]!r}: choose from {list(allowed)}")
    path = Path(str(cfg.plan))
    if not path.is_file():
        raise ConfigError(f"plan={path}: no such file")
    try:
        plan = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"plan={path}: not JSON ({err})") from None
    if not isinstance(plan, dict) or "islands" not in plan or "cost" not in plan:
        raise ConfigError(f"plan={path}: not a plan.json of pipeline.search (no islands or cost record)")
    positive_int(ENGINE_PORT, "port")
    es = engines(plan)
    out = Path(str(cfg.out)) if cfg.out else path.parent / f"deploy-{cfg.engine}-{cfg.target}"
    out.mkdir(parents=True, exist_ok=True)
    if cfg.target == "shell":
        route = routing(plan, es, cfg.engine, lambda e: f"http://HOST-{e.gpu.lower()}-{e.hosts[0]}:{ENGINE_PORT}")
        scripts = write_shell(out, plan, es, cfg)
        files = ["routing.json", *(str(p.relative_to(out)) for p in scripts)]
    else:
        route = routing(plan, es, cfg.engine, lambda e: f"http://{e.name}:{ENGINE_PORT}")
        write_text(
            out / "manifests.yaml",
            yaml.dump_all(k8s_manifests(plan, es, cfg, route), Dumper=_NoAliases, sort_keys=False),
        )
        files = ["manifests.yaml", "routing.json"]
    write_text(out / "routing.json", json.dumps(route, indent=1) + "\n")
    write_text(out / "README.md", readme(plan, es, cfg, files))
    print(f"[deploy] {len(es)} engines on {sum(e.nnodes for e in es)} host slots; wrote {out}/ (README.md first)")


if __name__ == "__main__":
    cli.main("deploy", execute)

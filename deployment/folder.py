"""The launch folder of a plan: engine scripts or manifests, routing.json, and a README that says what to
fill in and how to start (`write`)."""

from __future__ import annotations

import json
from pathlib import Path

from deployment import k8s, llmd
from deployment.commands import ENGINE_PORT, ROUTER_PORT, VERSIONS, DeployOptions
from deployment.engines import DeployError, Engine, engines
from deployment.routing import routing
from deployment.shell import scripts
from plan import Plan


def files(plan: Plan, opts: DeployOptions, source: str) -> tuple[list[Engine], dict[str, str]]:
    """(the engines, {path in the folder: text}) of the launch files of `plan`; `source` names the plan."""
    es = engines(plan)
    # a re-plan (search.from_plan): the islands that run on unchanged need no launch; the router takes them all
    launch = es if plan.replan is None else [e for e in es if e.island not in set(plan.replan.kept)]
    out: dict[str, str] = {}
    if opts.target == "shell":
        route = routing(plan, es, opts.engine, lambda e: f"http://HOST-{e.gpu.lower()}-{e.hosts[0]}:{ENGINE_PORT}",
                        opts.model_path)  # fmt: skip
        out.update(scripts(plan, launch, opts))
    elif opts.target == "k8s":
        route = routing(plan, es, opts.engine, lambda e: f"http://{e.name}:{ENGINE_PORT}", opts.model_path)
        out["manifests.yaml"] = k8s.dump(k8s.manifests(plan, launch, opts, route))
    else:  # llm-d: the decode pods' sidecars run the engines' protocol, told the prefill engine by the router
        mixed = [e.island for e in es if e.role == "aggregated"]
        if mixed:
            raise DeployError(
                f"plan island {mixed[0]} runs aggregated engines; llm-d's model service deploys prefill and decode "
                "pods only: use target=k8s or target=shell for this plan"
            )
        route = routing(plan, es, "llmd", llmd.address, opts.model_path, llmd.health)
        out.update(llmd.files(plan, es, opts, route))
    out["routing.json"] = json.dumps(route, indent=1) + "\n"
    out["README.md"] = readme(plan, es, opts, source, sorted(out))
    return es, out


def write(plan: Plan, opts: DeployOptions, out: Path, source: str) -> list[Engine]:
    """Write the launch files of `plan` into the folder `out` (made if missing); the engines."""
    es, texts = files(plan, opts, source)
    try:
        for rel, text in texts.items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if rel.endswith(".sh"):
                path.chmod(0o755)
    except OSError as err:
        raise DeployError(f"out={out}: cannot write the launch files there ({err.strerror or err}): choose a "
                          "folder you can write") from None  # fmt: skip
    return es


def readme(plan: Plan, es: list[Engine], opts: DeployOptions, source: str, listed: list[str]) -> str:
    hosts: dict[str, set[int]] = {}
    for e in es:
        hosts.setdefault(e.gpu, set()).update(e.hosts)
    v = plan.verification  # where the simulator sustains less than the stated rate, say so
    sim = f", {v.sustained_req_s:.1f} in the simulator" if v is not None and not v.sustained and v.sustained_req_s \
        else ""  # fmt: skip
    lines = [
        f"# Deployment of a plan: {plan.rate_req_s:.1f} req/s within the SLOs{sim} ({opts.engine}, {opts.target})",
        "",
        f"Made by `python -m pipeline.deploy` from {source}. Hosts are numbered per GPU type, as the plan's "
        "report.md node map numbers them: " + "; ".join(f"{g}: {len(h)} hosts" for g, h in sorted(hosts.items())) + ".",
        "",
        f"The commands are written for {VERSIONS[opts.engine]} and checked by its own settings resolution, which "
        "the tests read back against the plan (docs/deploy.md, section 3); another release may rename a flag or "
        "resolve a setting otherwise: `python -m deployment.sglang_check PLAN` shows SGLang's resolution.",
        "",
        "## Fill in",
        "",
        f"- the model weights' path on every host (now `{opts.model_path}`: `model_path=` when deploying);",
    ]
    if plan.replan is not None:
        kept = sorted(set(plan.replan.kept))
        keep = "" if opts.target == "llmd" else (
            f" Islands {', '.join(str(i) for i in kept)} run on as they are: no launch files for them here; stop "
            "only the engines of the islands this folder launches anew before starting them.")  # fmt: skip
        lines[2:2] = [f"A re-plan of {plan.replan.from_plan}: {'; '.join(plan.replan.moves) or 'no move'} "
                      f"({plan.replan.hosts_relaunched} hosts re-launched).{keep}", ""]  # fmt: skip
    if opts.target == "shell":
        lines += [
            "- for each multi-host engine, `LEADER_ADDR`: the address of its first host (the scripts stop if unset);",
            "- where a script asks for `HOST_ADDR` (vLLM): the address other hosts reach this host at;",
            "- the router's `routing.json`: replace each `HOST-<gpu>-<n>` with that host's address.",
            "",
            "## Start",
            "",
            "On each host run its scripts (`hosts/<gpu>-host<NNN>/*.sh`, one per engine there; every rank of a",
            "multi-host engine must start), then the router anywhere that reaches the engines:",
            "",
            "```bash",
            "export ARCHIPELAGO_ROUTER_API_KEY=...   # clients send `Authorization: Bearer <key>`",
            f"python -m deployment.router routing.json --host 0.0.0.0 --port {ROUTER_PORT}",
            "```",
        ]
    else:
        weights = (
            f"the PersistentVolumeClaim `{opts.weights_pvc}`" if opts.weights_pvc else "the same path on every node"
        )
        lines += _cluster(opts, weights)
    lines += [
        "",
        "## What enforces the routing",
        "",
        "`deployment.router`: for each request it counts the prompt's tokens (token ids as given; text with the "
        f"model's tokenizer, `{opts.model_path}/tokenizer.json` as routing.json names it, or `--tokenizer`; without "
        "one it estimates characters / `chars_per_token` and says so when it starts), finds its range, draws a "
        "prefill island and a decode island with the plan's fractions for that range, then an engine of each that "
        "is up, and "
        + (
            "sends the request to the decode engine's llm-d routing sidecar with the prefill engine's host:port in the "
            "`x-prefiller-host-port` header (the sidecar runs the engines' PD protocol)."
            if opts.target == "llmd"
            else "sends the request to both in the SGLang PD protocol (bootstrap host, port and room added to the "
            "request)."
            if opts.engine == "sglang"
            else "sends the request to both in the vLLM NIXL protocol (prefill with max_tokens 1 returning "
            "kv_transfer_params, then decode with them)."
        )
        + (
            " Aggregated islands (they prefill and decode their own requests) are drawn first, against the prefill "
            "islands, with their fractions; an aggregated engine gets the request as sent and its answer is the "
            "client's."
            if any(e.role == "aggregated" for e in es)
            else ""
        ),
        "An engine that refuses connections or fails its health check (`GET /health`, every 2 s) is ejected and its "
        "requests go to the others of its island (503 when a range has none); one silent past `--timeout` is a 504 "
        "naming it. It admits up to twice the plan's requests in flight (`in_flight` in routing.json), serves "
        "Prometheus metrics on `/metrics`, listens on loopback unless given `--host`, asks for a Bearer key when "
        "given `--api-key` (or `ARCHIPELAGO_ROUTER_API_KEY`), and drains on SIGTERM (docs/deploy.md).",
        "",
        "## Engines",
        "",
        "| engine | role | GPUs | hosts | attention TP x DP | redundant experts | max running |",
        "|---|---|---:|---|---|---:|---:|",
    ]
    for e in es:
        lines.append(f"| {e.name} | {e.role} | {e.gpus} | {e.where} | {e.attn_tp} x {e.attn_dp} | "
                     f"{e.redundant_experts} | {e.max_running or '-'} |")  # fmt: skip
    lines += ["", "Files: " + ", ".join(f"`{f}`" for f in listed), ""]
    return "\n".join(lines)


def _cluster(opts: DeployOptions, weights: str) -> list[str]:
    """The README's fill-in and start sections for the Kubernetes targets (k8s, llmd)."""
    llm_d = opts.target == "llmd"
    lines = [
        f"- the engine image (now `{opts.engine_image}`) and the router image (now `{opts.router_image}`: an "
        "image with Archipelago installed);",
        f"- label each GPU node with its type: `kubectl label node NODE {opts.gpu_label}=H20` (the "
        + ("values" if llm_d else "manifests")
        + " select nodes by it); multi-host engines need the LeaderWorkerSet controller "
        "(https://github.com/kubernetes-sigs/lws) installed;",
        f"- the weights: {weights}, mounted read-only at `{opts.model_path}`;",
        f"- RDMA: each engine pod asks for one `{opts.rdma_resource}` (the RDMA device plugin's resource; "
        "`k8s.rdma_resource=` to change, `null` for none)"
        + (
            " and runs on its node's network;"
            if opts.host_network
            else "; `k8s.host_network=true` puts pods on their nodes' network when there is no secondary RDMA network;"
        )
        if opts.rdma_resource
        else "- RDMA: no device requested (`k8s.rdma_resource=null`);",
        "- the router's API key: `kubectl create secret generic archipelago-router --from-literal=api-key=KEY` "
        "(without it the router asks for none).",
    ]
    if llm_d:
        lines += [
            f"- Helm 3 and llm-d's model-service chart {llmd.CHART_VERSION} ({llmd.CHART_REPO}); each decode pod runs "
            f"llm-d's routing sidecar (`{llmd.SIDECAR_IMAGE}`, connector `{llmd.CONNECTORS[opts.engine]}`) on port "
            f"{llmd.SIDECAR_PORT} in front of its engine.",
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
    else:
        lines += [
            "",
            "## Start",
            "",
            "```bash",
            "kubectl apply -f manifests.yaml",
            f"kubectl port-forward svc/archipelago-router {ROUTER_PORT}   # then send OpenAI-compatible requests",
            "```",
        ]
    return lines

"""The price of deployability: the exact optimum with node-aligned islands against free island sizes.

For each cell (inventory x workload; default: the Table 5.1 cells) the exact reference MILP is
solved twice, `search.shapes=nodes` (every island a divisor of a host or whole hosts) and
`search.shapes=any` (the thesis's free sizes), under the same SLOs and minimum islands, and
the table prints both optima, what node alignment costs, and the solve times, side by side.

    python benchmarks/deploy_bench.py                          # default SLOs, min_island auto
    python benchmarks/deploy_bench.py --extra slo=null search.min_island=2   # the thesis's settings

Each node-aligned exact plan is also deployed (SGLang scripts and Kubernetes manifests, as
`python -m pipeline.deploy` writes them) and checked: every SGLang command against SGLang's own argument
definitions (`deployment.engines.sglang.args`, needs `pip install --no-deps sglang==0.5.23`), every vLLM
command against vLLM 0.33.0's (its sdist's argument definitions, fetched from PyPI:
`deployment.engines.vllm.args`), every manifest
against the Kubernetes 1.30 schemas (`kubernetes-validate`; LeaderWorkerSet pod templates as core
PodTemplates).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from common import context

from pipeline.planning.build import build_plan
from pipeline.search.reference import exact_layout, reference

CELLS = [f"{i}:{w}" for i in ("hetero_a", "hetero_b", "homo_c") for w in ("azure_code", "azure_conv")]


def optimum(inv: str, wl: str, shapes: str, extra: list[str], limit: float) -> tuple[float, str, float, Any]:
    settings, ctx = context([f"+inventory={inv}", f"workload={wl}", f"search.shapes={shapes}",
                             f"search.reference_time_limit_s={limit}", *extra])  # fmt: skip
    t0 = time.perf_counter()
    ref = reference(settings, ctx, ctx.planner)
    took = time.perf_counter() - t0
    layout = exact_layout(ref)
    plan = build_plan(ctx.planner, layout, 30.0) if shapes == "nodes" and layout is not None else None
    return ref.rate_req_s, ref.status, took, plan


def deployable(plan: Any) -> str:
    """Deploy the plan as `python -m pipeline.deploy` does and check every command and manifest; a short verdict."""
    import kubernetes_validate

    from deployment.commands import engine_argv
    from deployment.deployable import engines
    from deployment.engines.sglang.args import check_sglang
    from deployment.engines.vllm.args import check_vllm
    from deployment.options import DeployOptions
    from deployment.routing import routing
    from deployment.targets import k8s

    es = engines(plan)
    for e in es:
        for rank in range(e.nnodes):
            for engine, check, skip in (("sglang", check_sglang, 3), ("vllm", check_vllm, 2)):
                check(engine_argv(e, rank, plan, DeployOptions(engine=engine))[skip:])
    checked = 0
    for engine in ("sglang", "vllm"):
        opts = DeployOptions(engine=engine, target="k8s")
        route = routing(plan, es, engine, lambda e: f"http://{e.name}:30000", "/models/DeepSeek-V3")
        for d in k8s.manifests(plan, es, opts, route):
            lwt = d["spec"]["leaderWorkerTemplate"] if d["kind"] == "LeaderWorkerSet" else None
            tmpls = [d] if lwt is None else [
                {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": d["metadata"]["name"]}, "template": t}
                for t in (lwt["leaderTemplate"], lwt["workerTemplate"])
            ]  # fmt: skip
            for t in tmpls:
                kubernetes_validate.validate(t, "1.30", strict=True)
                checked += 1
    hosts = sum(e.nnodes for e in es)
    return f"{len(es)} engines on {hosts} hosts; SGLang and vLLM commands parse, {checked} manifests valid"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--extra", nargs="*", default=[], help="config overrides for every solve")
    ap.add_argument("--time-limit", type=float, default=600.0, help="per exact solve, s")
    args = ap.parse_args()
    print(f"overrides: {' '.join(args.extra) or '(defaults)'}")
    print(
        "| cell | exact, nodes (req/s) | exact, any (req/s) | price of deployability | solve s (nodes / any) | "
        "the nodes plan, deployed |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for cell in args.cells.split(","):
        inv, wl = cell.split(":")
        nodes, st_n, t_n, plan = optimum(inv, wl, "nodes", args.extra, args.time_limit)
        free, st_a, t_a, _ = optimum(inv, wl, "any", args.extra, args.time_limit)
        tag = "" if st_n == st_a == "optimal" else f" ({st_n} / {st_a})"
        try:
            verdict = deployable(plan) if plan is not None else "no plan"
        except Exception as err:  # a failed check is the result to report
            verdict = f"**fails**: {type(err).__name__}: {err}"[:200]
        print(
            f"| {cell} | {nodes:.2f} | {free:.2f} | {1 - nodes / free:.1%}{tag} | {t_n:.0f} / {t_a:.0f} | {verdict} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

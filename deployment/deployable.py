"""The engines a plan deploys as (`plan.engines_of`), and what no launch file can run: an island without hosts or
not on whole hosts or a slice of one, attention TP that does not divide the model's heads, FP4 experts on a GPU
without NVIDIA's NVFP4 path."""

from __future__ import annotations

from dataclasses import replace

from costmodel.catalog import CatalogError, load_gpu
from deployment.errors import DeployError
from plan import Engine, Plan, engines_of, island_engines


def _software(gpu: str) -> str:
    """The kernel stack of a GPU type of the catalog (cuda | rocm); CUDA for one the catalog does not have."""
    try:
        return load_gpu(gpu).software
    except CatalogError:
        return "cuda"


def engines(plan: Plan) -> list[Engine]:
    """The engines of every serving island, each placed on its hosts; DeployError for an island no launch file can
    place or run."""
    if not plan.serves:
        raise DeployError("the plan serves no requests (no island can run the model in a role): nothing to deploy")
    for k, isl in enumerate(plan.islands):
        if not isl.serving:
            continue
        if isl.hosts is None:
            raise DeployError(f"plan island {k} has no hosts: re-run the search that wrote it with this version")
        node = isl.hosts.node_gpus
        if not isl.hosts.aligned(isl.size):
            raise DeployError(
                f"plan island {k} ({isl.size} x {isl.gpu}) is neither a divisor of a {node}-GPU host nor whole hosts: "
                "engines cannot be placed on it; plan with search.shapes=nodes (the default)"
            )
        if isl.precision.experts == "fp4" and _software(isl.gpu) != "cuda":
            raise DeployError(
                f"plan island {k} ({isl.size} x {isl.gpu}) was priced with FP4 routed experts; the launch files "
                "requantize the FP8 checkpoint's experts to NVFP4 on load, an NVIDIA (CUDA) path only: plan with FP8 "
                "experts (+costmodel.fixes.experts_fp8=true)"
            )
        if plan.model.n_heads % isl.tp:
            raise DeployError(
                f"plan island {k}: attention TP {isl.tp} does not divide {plan.model.name}'s {plan.model.n_heads} "
                "attention heads: no engine shards attention that way"
            )
    return list(engines_of(plan))


def engine_of(plan: Plan, e: Engine) -> Engine:
    """`e`, an engine of `plan` (DeployError for a record of another plan, or one changed since); its name may carry
    a prefix (a fleet's engines are named per model: `folder.files`)."""
    ours = island_engines(plan, e.island) if 0 <= e.island < len(plan.islands) else ()
    if not any(e == replace(x, name=e.name) and e.name.endswith(x.name) for x in ours):
        raise DeployError(f"engine {e.name} is not an engine of this plan: launch the plan's own (deployable.engines)")
    return e

"""What the engines' own checks tell an engine about its GPUs: the GPU type's device facts, from the catalogue only
(conf/gpu/<GPU>.yaml's `device:` block), for a host of `node_gpus` of them."""

from __future__ import annotations

from costmodel.catalog import load_gpu
from costmodel.cli import UserError
from costmodel.specs import GPU


class NoDevice(UserError):
    """A GPU type without device facts: the engines' checks cannot say what it would report."""


def probed(gpu: str) -> GPU:
    """GPU type `gpu` of the catalogue, with its device facts; NoDevice (naming the file to add them to) where it has
    none, the catalogue's CatalogError where the type is unknown."""
    g = load_gpu(gpu)
    if g.device is None:
        raise NoDevice(
            f"{gpu}: conf/gpu/{gpu}.yaml has no `device:` block, so no engine's check can report its GPUs: add the "
            "name torch and NVML give, nvidia-smi's memory.total (MiB), the SMs and the compute capability there "
            "(conf/gpu/H20.yaml has one)"
        )
    return g

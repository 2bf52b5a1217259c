"""The exact reference's data for one GPU type: its candidate island sizes and their throughput per range
(solvers/exact.py builds its MILP over these; solvers/count_search.py moves between their counts)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TypeOptions:
    """One GPU type's candidate islands: sizes (S,), per-island throughput (S, J)."""

    gpu: str
    count: int
    price_per_gpu_hour: float
    sizes: np.ndarray
    prefill_req_s: np.ndarray
    decode_req_s: np.ndarray
    link_gb_s_per_gpu: float = 0.0
    layouts: tuple[tuple[int, ...], ...] | None = None  # (6): the type's islands are one of these multisets
    aggregated_req_s: np.ndarray | None = None  # (S, J) as aggregated engines (None: no aggregated role)
    node_gpus: int = 0  # GPUs per host (0: not known; a fleet planned for a host lost takes each island as one)

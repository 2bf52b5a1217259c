"""Where a plan extrapolates: each serving island's configuration against the measured serving the cost model was
fitted on.

A calibration fitted to end-to-end serving (`costmodel=serving`: InferenceX's rows of its fitting GPUs,
`costmodel.measured.FITTING_GPUS`) is measured where those rows ran and nowhere else. An island is inside when some
fitting row ran the same GPU type in the same role (a disaggregated prefill or decode worker, or an aggregated
engine) and the island's engine lies within what those rows ran:

- its engine's GPUs (a decode engine's EP group, a prefill engine's GPUs) between the smallest and the largest
  measured; attention data parallel (DP attention) or attention TP as measured;
- a decode engine's running sequences per attention rank between the fewest and the most measured;
- its prompts within the measured input lengths (each range it serves by its middle length: a range's edges
  are the planner's grid, not lengths it serves);
- its routed experts' format, and MTP drafting on or off, as measured.

Each way it lies outside is one reason (`Island.outside`, report.md "Where the plan extrapolates"); the rate band
spreads the model's own error once more on the GPU types of such islands (`Calibration.widened`). A plan priced by a
model not fitted to serving is not judged (`Island.outside` None): nothing in it was measured end to end.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from costmodel.measured import GPUS, INFERENCEX, RANGE_RATIO, decode_engine, load_inferencex, users_per_rank, worker
from costmodel.settings import CostSettings
from plan import Island, Role


@dataclass(frozen=True)
class Span:
    """What the fitting rows of one GPU type and role ran."""

    engine_gpus: tuple[int, int]  # (fewest, most)
    dp_attention: frozenset[bool]
    per_rank: tuple[int, int]  # decode: running sequences per attention rank (0, 0 for prefill)
    prompt: tuple[int, int]  # input tokens, (shortest, longest)
    experts: frozenset[str]  # fp8 | fp4
    mtp: frozenset[bool]

    @staticmethod
    def of(rows: Sequence[tuple[int, bool, int, int, str, bool]]) -> Span:
        gpus, dp, per, isl, experts, mtp = zip(*rows, strict=True)
        return Span((min(gpus), max(gpus)), frozenset(dp), (min(per), max(per)),
                    (int(min(isl) * RANGE_RATIO), max(isl)), frozenset(experts), frozenset(mtp))  # fmt: skip


@functools.cache
def measured_spans(path: str = str(INFERENCEX)) -> dict[tuple[str, str], Span]:
    """(catalogue GPU, role) -> what the fitting rows of `path` ran in that role."""
    found: dict[tuple[str, str], list[tuple[int, bool, int, int, str, bool]]] = {}
    for row in load_inferencex(path):
        if not row.fitting or (row.disagg and not (row.prefill.workers and row.decode.workers)):
            continue
        gpu, mtp = GPUS[row.hardware], row.spec_method == "mtp"
        size, tp, _ = decode_engine(row)
        role = "decode" if row.disagg else "aggregated"
        found.setdefault((gpu, role), []).append((size, tp < size, users_per_rank(row), row.isl, row.precision, mtp))
        if row.disagg:
            p_size, p_tp = worker(row.prefill)
            found.setdefault((gpu, "prefill"), []).append((p_size, p_tp < p_size, 0, row.isl, row.precision, mtp))
    return {key: Span.of(rows) for key, rows in found.items()}


def outside(island: Island, drafts: int, spans: dict[tuple[str, str], Span]) -> tuple[str, ...]:
    """The ways `island` (serving) lies outside the measured configurations; () when inside."""
    role = Role(island.role).value
    span = spans.get((island.gpu, role))
    if span is None:
        if not any(gpu == island.gpu for gpu, _ in spans):
            return (f"{island.gpu} was never measured serving",)
        return (f"no {role} engine was measured on {island.gpu}",)
    why = []
    engine = island.size if role == "prefill" else island.ep  # a prefill engine is its island
    lo, hi = span.engine_gpus
    if not lo <= engine <= hi:
        why.append(f"an engine of {engine} GPUs (measured {lo}-{hi})")
    if (island.tp < engine) not in span.dp_attention:
        why.append("attention data parallel" if island.tp < engine else "attention tensor parallel")
    lo, hi = span.per_rank
    if role != "prefill" and not lo <= island.batch <= hi:
        why.append(f"{island.batch} sequences per rank (measured {lo}-{hi})")
    lo, hi = span.prompt
    beyond = [r for r in island.ranges if not lo <= (r.start + r.end) / 2 <= hi]  # a range by its middle length
    if beyond:
        first, last = min(r.start for r in beyond), max(r.end for r in beyond)
        why.append(f"prompts of {first:,}-{last:,} tokens (measured {lo:,}-{hi:,})")
    experts = island.precision.experts
    if experts not in span.experts:
        why.append(f"experts in {experts.upper()}")
    if (drafts > 0) not in span.mtp:
        why.append(f"MTP {drafts} drafts" if drafts else "without MTP")
    return tuple(why)


def judged(islands: Sequence[Island], model: str, cost: CostSettings) -> tuple[Island, ...]:
    """`islands` with `outside` set on every serving one where the cost model was fitted to measured serving of
    `model` (a calibration recording that model); as given otherwise."""
    cal = cost.profile.calibration
    if cal is None or model not in cal.models:
        return tuple(islands)
    spans, drafts = measured_spans(), cost.drafts
    return tuple(dataclasses.replace(isl, outside=outside(isl, drafts, spans)) if isl.serving else isl
                 for isl in islands)  # fmt: skip

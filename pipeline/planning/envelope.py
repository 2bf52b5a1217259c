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
- its routed experts' format, and MTP drafting on or off, as measured;
- the tokens a GPU of it handles a second at the plan's rate (`Island.tokens_per_gpu_s`: a prefill island's input
  tokens, a decode island's output tokens, an aggregated one's both) at most the most any fitting row's engines of
  that GPU, role and experts' format delivered (`delivered`): a configuration inside the measured ones but run at a
  load nobody measured is priced where no measurement checks it (on InferenceX's busiest disaggregated rows the
  prefill workers deliver well under the model's capacity, docs/costmodel.md "TTFT past 64 users").

Each way it lies outside is one reason (`Island.outside`, report.md "Where the plan extrapolates"); the rate band
spreads the model's own error once more on the GPU types of such islands (`Calibration.widened`). A plan priced by a
model not fitted to serving is not judged (`Island.outside` None): nothing in it was measured end to end.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from costmodel.measured import (
    GPUS,
    INFERENCEX,
    RANGE_RATIO,
    Row,
    decode_engine,
    load_inferencex,
    users_per_rank,
    worker,
)
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
    # per experts' format, the most tokens a GPU of the role delivered a second (`delivered`)
    most: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @staticmethod
    def of(rows: Sequence[tuple[int, bool, int, int, str, bool, float]]) -> Span:
        gpus, dp, per, isl, experts, mtp, load = zip(*rows, strict=True)
        most: dict[str, float] = {}
        for fmt, tokens in zip(experts, load, strict=True):
            most[fmt] = max(most.get(fmt, 0.0), tokens)
        return Span((min(gpus), max(gpus)), frozenset(dp), (min(per), max(per)),
                    (int(min(isl) * RANGE_RATIO), max(isl)), frozenset(experts), frozenset(mtp), most)  # fmt: skip


UNIT = {"prefill": "input", "decode": "output", "aggregated": "input and output"}  # the tokens a role's load counts


def delivered(row: Row) -> dict[str, float]:
    """The tokens a GPU of each role of `row` handled a second: a disaggregated row's input tokens over its prefill
    GPUs and output tokens over its decode GPUs (InferenceX's per-GPU throughputs are over all of the row's GPUs), an
    aggregated row's input and output tokens over its GPUs."""
    m = row.metrics
    if not row.disagg:
        return {"aggregated": m["tput_per_gpu"]}
    gpus = row.prefill.gpus + row.decode.gpus
    return {"prefill": (m["tput_per_gpu"] - m["output_tput_per_gpu"]) * gpus / row.prefill.gpus,
            "decode": m["output_tput_per_gpu"] * gpus / row.decode.gpus}  # fmt: skip


@functools.cache
def measured_spans(path: str = str(INFERENCEX)) -> dict[tuple[str, str], Span]:
    """(catalogue GPU, role) -> what the fitting rows of `path` ran in that role."""
    found: dict[tuple[str, str], list[tuple[int, bool, int, int, str, bool, float]]] = {}
    for row in load_inferencex(path):
        if not row.fitting or (row.disagg and not (row.prefill.workers and row.decode.workers)):
            continue
        gpu, mtp, load = GPUS[row.hardware], row.spec_method == "mtp", delivered(row)
        size, tp, _ = decode_engine(row)
        role = "decode" if row.disagg else "aggregated"
        found.setdefault((gpu, role), []).append(
            (size, tp < size, users_per_rank(row), row.isl, row.precision, mtp, load[role]))
        if row.disagg:
            p_size, p_tp = worker(row.prefill)
            found.setdefault((gpu, "prefill"), []).append(
                (p_size, p_tp < p_size, 0, row.isl, row.precision, mtp, load["prefill"]))
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
    most, load = span.most.get(experts), island.tokens_per_gpu_s
    if most is not None and load > most:
        why.append(f"{load:,.0f} {UNIT[role]} tokens/s a GPU (measured at most {most:,.0f})")
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

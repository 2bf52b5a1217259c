"""A search's records for a reader: report.md, routing.png, convergence.png and trials.parquet."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from plan import RATES, Island, Plan, RangeShare, Verification, node_spans

# The two rates of one layout, in the words the console and report.md use for them (docs/inner.md).
TWO_MODELS = (
    "The search scores every layout, and the exact reference proves the best one, in one model: each island is "
    "kept at the load whose queue meets the SLOs when it serves the whole workload's mix of lengths (linear in "
    "the routing, so the optimum can be proven; the gap is measured there). The plan's rate is that best layout "
    "solved again with each island's load cap set for the mix its routing actually gives it: usually higher, "
    "since an island given only short prompts queues less than one given the whole mix."
)


def write_trials(path: Path, records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    rows = []
    for r in records:
        row = {k: v for k, v in r.items() if k != "params"}
        row.update({f"param_{k}": v for k, v in r["params"].items()})
        rows.append(row)
    df = pd.DataFrame(rows)
    if not df.empty:
        df.to_parquet(path, index=False)
    return df


def convergence_plot(
    path: Path,
    records: Sequence[Mapping[str, Any]],
    batch: int,
    reference: float | None,
    unit: str,
    title: str,
    polish_from: int | None = None,
    reference_is_bound: bool = False,
) -> None:
    """Best score so far per iteration (thesis Fig 5.5 style) with every trial's score behind it;
    `polish_from`: the trial the polish phase starts at (a marked line)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    scores = np.array([float(r["score"]) if r["status"] in ("optimal", "feasible") else np.nan for r in records])
    if scores.size:
        it = np.arange(scores.size) // batch + 1
        ax.scatter(it, scores, s=8, alpha=0.35, label="trial")
        best = np.fmax.accumulate(np.nan_to_num(scores, nan=0.0))
        per_iter = [best[it == k].max() for k in np.unique(it)]
        ax.plot(np.unique(it), per_iter, lw=2, label="best so far")
    if reference is not None and math.isfinite(reference):
        label = "bound on the exact optimum" if reference_is_bound else "exact optimum (reference MILP)"
        ax.axhline(reference, color="k", ls="--", lw=1, label=f"{label}: {reference:.4g}")
    if polish_from is not None and 0 < polish_from < len(records):
        ax.axvline(polish_from // batch + 1, color="tab:red", ls=":", lw=1, label="polish starts")
    ax.set(xlabel=f"iteration ({batch} trials each)", ylabel=unit, title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def best_so_far(records: Sequence[Mapping[str, Any]]) -> list[float]:
    """The best score after each trial, in trial order (failed trials keep the previous best)."""
    out, best = [], 0.0
    for r in records:
        ok = r.get("status") in ("optimal", "feasible")  # pipeline.search.trial.OK
        if ok and isinstance(r.get("score"), (int, float)):
            best = max(best, float(r["score"]))
        out.append(best)
    return out


def report(plan: Plan, df: pd.DataFrame, header: str, routing_png: str | None = None) -> str:
    """report.md: the rate to plan with and its check, the islands, the node map, then the diagnostics."""
    rate, rates = plan.rate_req_s, plan.rates
    lines = [
        header,
        "",
        "**The rate to plan with is the first row**: what the layout sustains within the SLOs, checked request "
        "by request by the simulator in the row below it (where the simulator sustains less, that row gives the "
        "rate it sustains). The rows under *Diagnostics* explain how the search got there; none of them is a rate "
        "to deploy for.",
        "",
        "| | |",
        "|---|---|",
        f"| **rate** ({'within ' + plan.slo.text() if plan.slo.any else 'no SLO: the fluid rate'}) | **{rate:.2f} "
        f"req/s** ({rates.output_tok_s:.0f} output tok/s) |",
        *verification_rows(plan.verification),
        *_band_rows(plan),
        *_burst_rows(plan),
        *_loss_rows(plan),
        *_replan_rows(plan),
        f"| cost | ${plan.cost_per_hour:,.2f}/h: ${plan.usd_per_m_output_tokens:.2f} per million output tokens, "
        f"{plan.rate_per_dollar:.4f} req/s per $/h |",
        f"| islands | {plan.count('prefill')} prefill + {plan.count('decode')} decode"
        + (
            f" + {plan.count('aggregated')} aggregated (prefill and decode in mixed steps)"
            if plan.count("aggregated")
            else ""
        )
        + " |",
        *_roles_rows(plan),
        f"| decoding | {_decoding_text(plan)} |",
        "",
        "Islands (batch: for prefill, prompts one forward pass takes, one per DP replica; for decode, running "
        "sequences per attention-DP rank of TP GPUs, so the island decodes batch x ep / tp at once. ranges: input "
        "lengths routed to the island, as first-last token (number of ranges), with the island's share of "
        "those requests. traffic: share of all requests through the island in its role; busy: share of its time "
        "at the plan's rate). Identical islands side by side share a row, (xN) counting them; its numbers are "
        "each island's:",
        "",
        "| island | role | TP / DP / EP | batch | precision | ranges (share of their requests) | traffic | busy | "
        "req/s | output tok/s | $/h |",
        "|---|---|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]

    def cells(isl: Island) -> str:
        tok = f"{isl.traffic_share * rates.output_tok_s:.0f}" if isl.role.decodes else "-"
        return (
            f"{isl.role} | {isl.tp} / {isl.dp} / {isl.ep} | {isl.batch} | {isl.precision.describe()} | "
            f"{_ranges_text(isl.ranges)} | {isl.traffic_share:.1%} | {isl.utilisation:.1%} | "
            f"{isl.traffic_share * rate:.1f} | {tok} | {isl.cost_per_hour:,.0f} |"
        )

    for group in _alike(plan.islands, lambda isl: f"{isl.size} x {isl.gpu} | {cells(isl)}"):
        lines.append(f"| {_label(group)} | {cells(group[0])}")
    if routing_png:
        lines += ["", f"![which island serves which input lengths]({routing_png})"]
    lines += _node_map(plan.islands)
    lines += hosts_lost(plan)
    lines += ["", "Diagnostics:", "", "| | |", "|---|---|", *_search_rows(plan)]
    lines += [
        f"| fluid bound (islands busy 100 %, no SLO) | {rates.fluid_req_s:.2f} req/s |",
        f"| re-scored at every input length (the routing of whole ranges, each length its own cost) | "
        f"{rates.evaluated_req_s:.2f} req/s |",
    ]
    if plan.search is not None:
        s = plan.search
        lines.append(f"| trials | {s.trials} ({s.failed} failed, {s.rejected} rejected) |")
    lines += ["", f"Two rates of one layout: {TWO_MODELS}", "",
              f"What each rate means: {'; '.join(f'`{k}`: {v}' for k, v in RATES.items())}."]  # fmt: skip
    if not df.empty and "score" in df:
        ok = df[df["status"].isin(["optimal", "feasible"])].sort_values(["score", "trial"], ascending=[False, True])
        times = ok.groupby("islands")["trial"].size()  # a sampler and polish propose the best layouts again
        lines += [
            "",
            "Top layouts (each once: the first trial that scored it, and how many trials did):",
            "",
            "| trial | trials | score | rate (req/s) | $/h | islands |",
            "|---:|---:|---:|---:|---:|---|",
        ]
        for _, r in ok.drop_duplicates("islands").head(5).iterrows():
            row = [str(r["trial"]), str(times[r["islands"]]), f"{r['score']:.4g}", f"{r['rate_req_s']:.2f}",
                   f"{r['cost_per_hour']:.0f}", _runs_text(str(r["islands"]))]  # fmt: skip
            lines.append(f"| {' | '.join(row)} |")
    for note in plan.notes:
        lines += ["", f"Note: {note}"]
    return "\n".join(lines) + "\n"


def _decoding_text(plan: Plan) -> str:
    c = plan.cost
    if not c.mtp_drafts:
        return "one token a step (no MTP: costmodel.mtp.drafts=0)"
    return (f"MTP, {c.mtp_drafts} draft token{'s' if c.mtp_drafts > 1 else ''} a step, each accepted with "
            f"{c.mtp_acceptance:g}: {1 + c.mtp_accepted:.2f} tokens a step")  # fmt: skip


def _search_rows(plan: Plan) -> list[str]:
    """The search's model, the reference and the gap (where the plan came from a search with a reference)."""
    rows = [f"| scored in the search (whole-mix caps: the reference's model) | {plan.rates.searched_req_s:.2f} req/s |"]
    ref = plan.reference
    if ref is None:
        return rows
    label = ("the exact reference, stopped at its time limit: its layout" if ref.gap_is_bound
             else "exact optimum of that model")  # fmt: skip
    rows.append(f"| {label} | {_fmt(ref.optimum_req_s)} req/s |")
    spare = plan.host_losses.spare_hosts if plan.host_losses is not None else 0
    if ref.gap is None:
        rows.append("| gap to it | n/a |")
    elif spare:
        rows.append(f"| gap to it | at most {ref.gap:.2%} (search.spare_hosts={spare}: the trials scored each layout "
                    f"by its rate with its worst {spare} host{'s' if spare > 1 else ''} lost; the optimum with every "
                    "host up bounds that) |")  # fmt: skip
    elif ref.gap_is_bound:
        rows.append(f"| gap to it | at most {ref.gap:.2%} (the reference stopped at its time limit; the optimum is at "
                    f"most {_fmt(ref.bound_req_s)} req/s) |")  # fmt: skip
    else:
        rows.append(f"| gap to it | {ref.gap:.2%} |")
    if ref.points_ahead:
        rows.append(f"| the exact reference's own layout | scores {ref.layout_ahead:.2%} more in the same model: "
                    "`search.sampler=exact` plans it (reference.json) |")  # fmt: skip
    return rows


def _band_rows(plan: Plan) -> list[str]:
    """The headline's range over the calibration's uncertainty (pipeline/planning/band.py), if it has one."""
    rows = []
    if plan.search is not None and plan.search.robust:
        rows.append("| planned at | every calibration factor's 10th percentile (search.robust) |")
    band = plan.band
    if band is None:
        uncalibrated = plan.cost.profile.calibration is None
        why = "no calibration (costmodel.calibration)" if uncalibrated else "search.band_draws=0"
        return [*rows, f"| range | not estimated: {why} |"]
    return [
        *rows,
        f"| range over the calibration (10th / 50th / 90th percentile) | {band.p10_req_s:.1f} / {band.p50_req_s:.1f} / "
        f"{band.p90_req_s:.1f} req/s ({band.draws} draws of {band.calibration}) |",
    ]


def _loss_rows(plan: Plan) -> list[str]:
    """The rate with the worst host gone (pipeline/planning/failures.py), if the plan has its host losses."""
    losses = plan.host_losses
    if losses is None:
        return []
    w = losses.worst
    share = w.rate_req_s / losses.rate_req_s if losses.rate_req_s > 0 else 0.0
    rows = [
        f"| one host lost (worst of {len(losses.losses)}) | {w.rate_req_s:.2f} req/s ({share:.0%}): {w.gpu} node "
        f"{w.node} stops {_stopped_text(plan, w.islands)}; the router re-spreads the rest (hosts lost, below) |"
    ]
    if losses.spare_req_s is not None:
        k, rate = losses.spare_hosts, losses.spare_req_s
        share = rate / losses.rate_req_s if losses.rate_req_s > 0 else 0.0
        rows.append(f"| {k} host{'s' if k > 1 else ''} lost at once (planned for: search.spare_hosts={k}) | "
                    f"{rate:.2f} req/s ({share:.0%}) at worst: {_nodes_text(list(losses.spare_nodes))} |")  # fmt: skip
    return rows


def _burst_rows(plan: Plan) -> list[str]:
    """The mean rate the plan sustains under its workload's own arrivals: the queueing model's (every plan of a
    workload with a trace) and the simulated one (search.arrivals=workload)."""
    model, b = plan.rates.bursty_req_s, plan.bursts
    rows = []
    if model is not None:
        share = model / plan.rate_req_s if plan.rate_req_s > 0 else 0.0
        rows.append(f"| under the workload's own arrivals, queueing model (each island's SLO caps under its trace's "
                    f"bursts, the percentiles over the whole day) | {model:.2f} req/s mean ({share:.1%} of the rate) "
                    "|")  # fmt: skip
    if b is None:
        return rows
    share = b.rate_req_s / plan.rate_req_s if plan.rate_req_s > 0 else 0.0
    held = f"none of the rates tried held ({b.why_above})"
    if b.rate_req_s > 0:
        held = (f"{b.slo_attainment:.1%} of requests within the SLOs, TTFT p99 {b.ttft_ms_p99:,.0f} ms, TPOT p99 "
                f"{b.tpot_ms_p99:.1f} ms")  # fmt: skip
    rows.append(f"| **under the workload's own arrivals** (a {b.day_s:,.0f}-s day of its trace's bursts, simulated) | "
                f"**{b.rate_req_s:.2f} req/s** mean ({share:.1%} of the rate above; it tolerates peaks of "
                f"{1 / share if share > 0 else float('inf'):.1f} x that mean): {held}; its 10-s rate is at most "
                f"{b.peak_to_mean:.2f} x the mean for {b.percentile:g} % of requests (the rate / that: "
                f"{b.estimate_req_s:.2f}) |")  # fmt: skip
    return rows


def _replan_rows(plan: Plan) -> list[str]:
    """How a re-plan (search.from_plan) reached this plan, and what it costs against one from scratch."""
    again = plan.replan
    if again is None:
        return []
    share = f", {again.searched_req_s / again.scratch_req_s:.1%} of" if again.scratch_req_s else ""
    kept = ", ".join(str(i) for i in again.kept) or "none"
    return [
        f"| re-planned from | {again.from_plan}: {len(again.moves)} of at most {again.max_moves} moves, "
        f"{again.hosts_relaunched} hosts re-launched; islands {kept} run on unchanged |",
        *(f"| move {k + 1} | {m} |" for k, m in enumerate(again.moves)),
        f"| against a plan from scratch | {again.searched_req_s:.2f} req/s in the search's model{share} "
        f"{_fmt(again.scratch_req_s)} req/s (the exact optimum, which may move every island) |",
    ]


def _stopped_text(plan: Plan, islands: tuple[int, ...]) -> str:
    return ", ".join(f"the {plan.islands[i].size} x {plan.islands[i].gpu} {plan.islands[i].role} island" for i in
                     islands)  # fmt: skip


def hosts_lost(plan: Plan) -> list[str]:
    """report.md's section on losing one host: each distinct loss (hosts whose loss stops alike islands share a
    row), worst first."""
    losses = plan.host_losses
    if losses is None:
        return []
    rows: dict[tuple[float, str], list[tuple[str, int]]] = {}
    for h in losses.losses:
        rows.setdefault((h.rate_req_s, _stopped_text(plan, h.islands)), []).append((h.gpu, h.node))
    lines = ["", "Hosts lost, one at a time: every island with a GPU on the host stops (an engine spanning hosts "
             "stops whole); the router re-solves its shares over the islands left, each in the role and engine it "
             "runs (nothing re-launched). Hosts whose loss stops alike islands share a row:", "",
             "| rate (req/s) | of the plan's | hosts (GPU node) | what stops |", "|---:|---:|---|---|"]  # fmt: skip
    for (rate, stops), names in sorted(rows.items()):
        share = rate / losses.rate_req_s if losses.rate_req_s > 0 else 0.0
        lines.append(f"| {rate:.2f} | {share:.0%} | {_nodes_text(names)} | {stops} |")
    return lines


def _nodes_text(nodes: list[tuple[str, int]]) -> str:
    """'H20 11-15, H200 0' for hosts (GPU, node): runs of consecutive nodes of a GPU type as a span."""
    return ", ".join(f"{gpu} {run}" for gpu in dict.fromkeys(g for g, _ in nodes)
                     for run in node_spans(n for g, n in nodes if g == gpu).split(", "))  # fmt: skip


def verification_rows(v: Verification | None) -> list[str]:
    """The simulated check's rows of report.md."""
    if v is None:
        return ["| simulated | not checked (search.verify=false) |"]
    verdict = "SLOs held" if v.sustained else f"**not sustained**: {v.why_not}"
    if not v.sustained and v.sustained_req_s:  # the highest rate below the stated one that held
        verdict += (f"; the simulator sustains **{v.sustained_req_s:.2f} req/s** ({v.sustained_over_stated:.3f} x "
                    "stated): plan with that")  # fmt: skip
    elif not v.sustained:
        verdict += "; none of the lower rates simulated held either (down to half the stated rate)"
    rows = [
        f"| simulated at that rate | {v.throughput_req_s:.2f} req/s = {v.simulated_over_stated:.3f} x stated"
        + (f" (± {v.precision:.1%}: its window's sampling noise)" if v.precision else "")
        + f"; {verdict} |",
        f"| simulated latency | TTFT p50 {v.ttft_ms_p50:.0f} ms, p99 {v.ttft_ms_p99:.0f} ms; TPOT p99 "
        f"{v.tpot_ms_p99:.1f} ms; {v.slo_attainment:.1%} of requests within the SLOs ({v.slo}) |",
    ]
    if v.steady_state:  # the verdict rests on a window that may be too short (or an overload)
        rows.append(f"| simulated window | {v.requests:,} requests: {v.steady_state} |")
    return rows


def _runs_text(islands: str) -> str:
    """'H200x8;H200x8;H800x16' as 'H200x8 (x2); H800x16'."""
    runs = _alike(islands.split(";"), lambda isl: isl)
    return "; ".join(r[0] + (f" (x{len(r)})" if len(r) > 1 else "") for r in runs)


def _alike(items: Iterable[Any], key: Callable[[Any], Any]) -> list[list[Any]]:
    """Runs of consecutive items with the same `key` (a 10,000-GPU plan has hundreds of identical islands)."""
    groups: list[list[Any]] = []
    for item in items:
        if groups and key(groups[-1][0]) == key(item):
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _label(group: Sequence[Island]) -> str:
    """`8 x H200`, or `8 x H200 (x125)` for a run of 125 such islands."""
    isl = group[0]
    return f"{isl.size} x {isl.gpu}" + (f" (x{len(group)})" if len(group) > 1 else "")


def _ranges_text(ranges: Sequence[RangeShare]) -> str:
    """`0-1250 (5 ranges, 96 %)`: the span, how many ranges, the island's mean share of their requests."""
    if not ranges:
        return "-"
    share = float(np.mean([r.fraction for r in ranges]))
    n = len(ranges)
    return f"{ranges[0].start}-{ranges[-1].end} ({n} range{'s' if n > 1 else ''}, {share:.0%})"


def _roles_rows(plan: Plan) -> list[str]:
    """The layout's rate with prefill and decode islands only beside its rate with aggregated ones allowed."""
    r = plan.rates
    if r.disaggregated_req_s is None or r.with_aggregated_req_s is None:
        return []
    chosen = "with" if plan.cost.aggregated else "without"
    return [f"| roles compared (this layout) | prefill and decode islands only: {r.disaggregated_req_s:.2f} req/s; "
            f"aggregated islands allowed: {r.with_aggregated_req_s:.2f} req/s (planned {chosen} them: "
            f"costmodel.aggregated={str(plan.cost.aggregated).lower()}) |"]  # fmt: skip


def routing_plot(path: Path, plan: Plan, title: str) -> None:
    """Which island serves which input lengths, prefill above decode: one row per island (or per run
    of identical ones), each range a bar shaded by its share of that range's requests."""
    islands = sorted(plan.serving, key=lambda isl: (isl.role != "prefill", isl.ranges[0].start))
    if not islands:
        return
    groups = _alike(islands, lambda isl: (isl.role, isl.size, isl.gpu, isl.ranges))
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(groups) + 1.4))
    colors = {"prefill": "tab:blue", "decode": "tab:orange", "aggregated": "tab:green"}
    for row, group in enumerate(groups):  # a row of N islands is shaded by their share together
        for r in group[0].ranges:
            share = min(max(r.fraction * len(group), 0.0), 1.0)
            ax.barh(row, r.end - r.start, left=r.start, height=0.8, color=colors[group[0].role],
                    alpha=0.25 + 0.75 * share, edgecolor="none")  # fmt: skip
    labels = [f"{g[0].role[0].upper()} {g[0].size}x{g[0].gpu}" + (f" (x{len(g)})" if len(g) > 1 else "")
              for g in groups]  # fmt: skip
    ax.set_yticks(range(len(groups)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="input length (tokens)", title=title)
    shown = [r for r in colors if any(g[0].role == r for g in groups)]
    names = {"prefill": "prefill (P)", "decode": "decode (D)", "aggregated": "aggregated (A)"}
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colors[r]) for r in shown],
              labels=[names[r] + ("; darker: more of the range's requests (a row of xN: all N)" if r == shown[-1]
                                  else "") for r in shown],
              fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(shown))  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _node_map(islands: Sequence[Island]) -> list[str]:
    """Which island runs on which hosts, and what each serving island is expected to do there."""
    if not any(isl.hosts is not None for isl in islands):
        return []
    out = [
        "",
        "Node map (hosts numbered per GPU type; expected latency: the queueing model's TTFT at the SLO "
        "percentile for prefill, the mean decode step for decode (aggregated: with its prompts' chunks); redundant "
        "experts: replicas added so the "
        "routed experts divide evenly over the EP group):",
        "",
        "| hosts | island | role | expected latency | EP group: experts/GPU (+redundant) |",
        "|---|---|---|---:|---|",
    ]

    def cells(isl: Island) -> str:
        if not isl.serving:
            return "idle | - | - |"
        lat = (f"TTFT {isl.ttft_ms_expected:.0f} ms" if isl.ttft_ms_expected is not None
               else f"TPOT {isl.tpot_ms_expected:.1f} ms" if isl.tpot_ms_expected is not None else "-")  # fmt: skip
        return f"{isl.role} | {lat} | {isl.ep_group}: {isl.experts_per_gpu} (+{isl.redundant_experts}) |"

    def aligned(isl: Island) -> bool:
        return isl.hosts is None or isl.hosts.aligned(isl.size)

    for group in _alike(islands, lambda isl: (isl.size, isl.gpu, cells(isl), isl.hosts is not None, aligned(isl))):
        isl = group[0]
        hosts = isl.placement
        if len(group) > 1 and isl.hosts is not None:  # a run of islands: the hosts they cover
            nodes = [h for member in group for h in member.hosts.nodes]  # type: ignore[union-attr]
            hosts = f"{isl.gpu} node{'s' if len(set(nodes)) > 1 else ''} {node_spans(nodes)}"
            hosts += "" if aligned(isl) else " (islands not host-aligned)"
        out.append(f"| {hosts} | {_label(group)} | {cells(isl)}")
    return out


def _fmt(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.2f}"

"""A search's records for a reader: report.md, routing.png, convergence.png and trials.parquet."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from plan import RATES, HostLosses, Island, Plan, RangeShare, node_spans

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
    *,
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


class Reported(Protocol):
    """What report.md asks of a post-search step (pipeline/search/steps): its rows under the rate, its section."""

    def rows(self, plan: Plan) -> list[str]: ...

    def sections(self, plan: Plan) -> list[str]: ...


@dataclass(frozen=True)
class Headline:
    """The four numbers to plan with, in the order a reader needs them (console's last line, report.md's first block,
    MLflow's first metrics): the rate (what the simulator sustains within the SLOs at the stated rate, or below it),
    its range, the rate with the worst host lost, and the rate under the workload's own arrivals."""

    rate_req_s: float
    sentences: tuple[str, str, str, str]
    metrics: dict[str, float]

    @staticmethod
    def of(plan: Plan) -> Headline:
        v, stated = plan.verification, plan.rate_req_s
        if v is None:
            rate = stated
            first = f"Plan with {stated:.2f} req/s, the model's rate (not simulated: search.verify=false)."
        elif v.sustained:
            rate = stated
            first = (f"Plan with {stated:.2f} req/s: the simulator sustains it"
                     + (f" within {plan.slo.text()}" if plan.slo.any else "") + f" ({v.simulated_over_stated:.3f} x).")
        else:
            rate = v.sustained_req_s
            first = (f"Plan with {rate:.2f} req/s: what the simulator sustains within the SLOs, below the "
                     f"{stated:.2f} the model states ({v.why_not}; the rates below are scaled by the same ratio).")
        scale = rate / stated if stated > 0 else 0.0
        band, losses, bursty = plan.band, plan.host_losses, plan.rates.bursty_req_s
        metrics = {"plan_req_s": rate}
        if band is not None:
            second = (f"Its range: {band.p10_req_s * scale:.1f}-{band.p90_req_s * scale:.1f} req/s (10th-90th "
                      f"percentile over the cost model's uncertainty, {band.draws} draws).")
            metrics |= {"plan_range_p10_req_s": band.p10_req_s * scale, "plan_range_p90_req_s": band.p90_req_s * scale}
        else:
            second = "No range: the cost model has no uncertainty to draw (search.band_draws=0 or no calibration)."
        if losses is not None:
            w = losses.worst
            third = (f"With its worst host lost ({w.gpu} node {w.node}): {w.rate_req_s * scale:.2f} req/s "
                     f"({w.rate_req_s / losses.rate_req_s:.0%}).")
            metrics["plan_host_lost_req_s"] = w.rate_req_s * scale
        else:
            third = "No host lost was scored (search.host_losses=false)."
        if bursty is not None:
            fourth = (f"Under the workload's own arrivals (its trace's bursts, queueing model): {bursty * scale:.2f} "
                      "req/s.")
            metrics["plan_bursty_req_s"] = bursty * scale
        else:
            fourth = ("No rate under the workload's own arrivals: that needs its trace's arrival model, SLOs, and "
                      "prefill and decode islands only.")
        return Headline(rate, (first, second, third, fourth), metrics)


def fleet_text(plan: Plan) -> str:
    """The GPUs a plan runs on: '8 H200 + 64 H800 + 24 H20'."""
    gpus: dict[str, int] = {}
    for isl in plan.serving:
        gpus[isl.gpu] = gpus.get(isl.gpu, 0) + isl.size
    return " + ".join(f"{n} {g}" for g, n in gpus.items())


def sizing_sentence(plan: Plan) -> str:
    """objective min_cost, in one sentence: the fleet, its $/h, and the exact cheapest beside it."""
    z, ref = plan.sizing, plan.reference
    assert z is not None
    notes = []
    if z.searched_per_hour is not None and plan.cost_per_hour > z.searched_per_hour * (1 + 1e-9):
        notes.append(f"sized again from the search's ${z.searched_per_hour:,.2f}/h fleet to hold the demand as the "
                     "plan states rates")  # fmt: skip
    if z.cheapest_per_hour is not None:
        gap = f", the search's {ref.gap_text()}" if ref is not None and ref.gap is not None else ""
        notes.append(f"the exact cheapest: {'at least ' if z.cheapest_is_bound else ''}${z.cheapest_per_hour:,.2f}/h"
                     f"{gap}")  # fmt: skip
    said = f" ({'; '.join(notes)})" if notes else ""
    lost = f" with any {z.hosts_lost} host{'s' if z.hosts_lost > 1 else ''} lost" if z.hosts_lost else ""
    return (f"Cheapest fleet found for {z.demand_req_s:g} req/s{lost}: {fleet_text(plan)} at "
            f"${plan.cost_per_hour:,.2f}/h{said}, of an inventory of ${z.inventory_cost_per_hour:,.2f}/h; on it the "
            f"plan states up to {plan.rate_req_s:.2f} req/s.")


def _sizing_section(plan: Plan) -> list[str]:
    """report.md's sizing block: the demand, the fleet, the exact answers, and each GPU mix alone."""
    z = plan.sizing
    if z is None:
        return []
    rows = ["## Sizing (search.objective=min_cost)", "", sizing_sentence(plan), "",
            "| | |", "|---|---|",
            f"| demand | {z.demand_req_s:g} req/s within the SLOs |",
            f"| the fleet found | {fleet_text(plan)}: ${plan.cost_per_hour:,.2f}/h |"]  # fmt: skip
    lost = z.hosts_lost and not z.reference_hosts_lost  # the exact answers with every host up: bounds
    up = " with every host up (a lower bound: search.reference=spare solves it with a host lost)" if lost else ""
    if z.hosts_lost:
        rows.insert(-1, f"| hosts lost | the fleet serves the demand with any {z.hosts_lost} of its hosts lost "
                        "(search.spare_hosts) |")  # fmt: skip
    if z.cheapest_per_hour is not None:
        rows.append(f"| the exact cheapest fleet (every layout of the inventory, the search's model){up} | "
                    f"{'at least ' if z.cheapest_is_bound else ''}${z.cheapest_per_hour:,.2f}/h |")  # fmt: skip
    if z.most_req_s is not None:
        rows.append(f"| the whole inventory | ${z.inventory_cost_per_hour:,.2f}/h, serving at most "
                    f"{z.most_req_s:.2f} req/s with every host up |")  # fmt: skip
    for mix, cost in z.mixes:
        rows.append(f"| {mix} {'together' if ' + ' in mix else 'alone'} (exact cheapest{up and ', every host up'}) | "
                    f"${cost:,.2f}/h |")  # fmt: skip
    for mix in z.short_mixes:
        rows.append(f"| {mix} {'together' if ' + ' in mix else 'alone'} | cannot serve {z.demand_req_s:g} req/s"
                    f"{' with a host lost' if z.reference_hosts_lost else ''} |")  # fmt: skip
    return [*rows, ""]


def report(plan: Plan, df: pd.DataFrame, header: str, routing_png: str | None = None,
           steps: Sequence[Reported] = ()) -> str:  # fmt: skip
    """report.md: the rate to plan with and what the post-search `steps` found of it (their rows), the cost, the
    islands, the node map and the steps' sections, then the diagnostics."""
    rate, rates = plan.rate_req_s, plan.rates
    lines = [
        header,
        "",
        *(f"{k}. {sentence}" for k, sentence in enumerate(Headline.of(plan).sentences, 1)),
        "",
        *_sizing_section(plan),
        "**The rate to plan with is the first row**: what the layout sustains within the SLOs, checked request "
        "by request by the simulator in the row below it (where the simulator sustains less, that row gives the "
        "rate it sustains). The rows under *Diagnostics* explain how the search got there; none of them is a rate "
        "to deploy for.",
        "",
        "| | |",
        "|---|---|",
        f"| **rate** ({'within ' + plan.slo.text() if plan.slo.any else 'no SLO: the fluid rate'}) | **{rate:.2f} "
        f"req/s** ({rates.output_tok_s:.0f} output tok/s) |",
        *(row for s in steps for row in s.rows(plan)),
        f"| cost | ${plan.cost_per_hour:,.2f}/h: ${plan.usd_per_m_output_tokens:.2f} per million output tokens, "
        f"{plan.rate_per_dollar:.4f} req/s per $/h |",
        f"| islands | {plan.count('prefill')} prefill + {plan.count('decode')} decode"
        + (
            f" + {plan.count('aggregated')} aggregated (prefill and decode in mixed steps)"
            if plan.count("aggregated")
            else ""
        )
        + " |",
        *_measured_rows(plan),
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
            f"{isl.role} | {isl.tp} / {isl.dp} / {isl.ep if isl.experts_per_gpu else '-'} | {isl.batch} | "
            f"{isl.precision.describe()} | "
            f"{_ranges_text(isl.ranges)} | {isl.traffic_share:.1%} | {isl.utilisation:.1%} | "
            f"{isl.traffic_share * rate:.1f} | {tok} | {isl.cost_per_hour:,.0f} |"
        )

    for group in _alike(plan.islands, lambda isl: f"{isl.size} x {isl.gpu} | {cells(isl)}"):
        lines.append(f"| {_label(group)} | {cells(group[0])}")
    lines += _extrapolation_lines(plan)
    if routing_png:
        lines += ["", f"![which island serves which input lengths]({routing_png})"]
    lines += _node_map(plan.islands, plan.host_losses)
    lines += [line for s in steps for line in s.sections(plan)]
    lines += ["", "Diagnostics:", "", "| | |", "|---|---|", *_search_rows(plan), *_roles_rows(plan), *_cache_rows(plan)]
    lines += [
        f"| fluid bound (islands busy 100 %, no SLO) | {rates.fluid_req_s:.2f} req/s |",
        f"| re-scored at every input length (the routing of whole ranges, each length its own cost) | "
        f"{rates.evaluated_req_s:.2f} req/s |",
    ]
    if plan.search is not None:
        s = plan.search
        lines.append(f"| trials | {s.trials} ({s.failed} failed, {s.rejected} rejected) |")
    lines += ["", f"Two rates of one layout: {TWO_MODELS}", "",
              f"What each rate means: {'; '.join(f'`{k}`: {v}' for k, v in _rates_meant(plan))}."]  # fmt: skip
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


def _measured_rows(plan: Plan) -> list[str]:
    """How many serving islands lie outside the measured serving the cost model was fitted on (none: not judged)."""
    if plan.extrapolated is None:
        return []
    out = len(plan.extrapolated)
    return [f"| measured | {out} of {len(plan.serving)} serving islands extrapolate beyond the configurations the "
            f"cost model was fitted on{' (below: where)' if out else ''} |"]  # fmt: skip


def _extrapolation_lines(plan: Plan) -> list[str]:
    """Each extrapolated island and how it lies outside the measured configurations."""
    judged = plan.extrapolated
    if not judged:
        return []
    lines = ["", "Where the plan extrapolates: islands whose configuration no measurement the cost model was fitted on "
             "ran (a GPU type, role, engine size, attention parallelism, sequences per rank, prompt lengths, "
             "experts' format or MTP outside them), or that run at more tokens a GPU a second than any measured "
             "engine of their GPU and role delivered (docs/costmodel.md). The range spreads the model's own error "
             "once more on their GPU types.", "", "| island | role | outside the measured configurations |",
             "|---|---|---|"]  # fmt: skip
    for group in _alike(judged, lambda isl: (isl.size, isl.gpu, isl.role, isl.outside)):
        lines.append(f"| {_label(group)} | {group[0].role} | {'; '.join(group[0].outside or ())} |")
    return lines


def _decoding_text(plan: Plan) -> str:
    c = plan.cost
    if c.mtp is None:
        return "one token a step (no MTP: costmodel.mtp.drafts=0)"
    return (f"MTP, {c.mtp.drafts} draft token{'s' if c.mtp.drafts > 1 else ''} a step, each accepted with "
            f"{c.mtp.acceptance:g}: {1 + c.mtp.accepted:.2f} tokens a step")  # fmt: skip


def _search_rows(plan: Plan) -> list[str]:
    """The search's model, the reference and the gap (where the plan came from a search with a reference)."""
    rows = [f"| scored in the search (whole-mix caps: the reference's model) | {plan.rates.searched_req_s:.2f} req/s |"]
    ref = plan.reference
    if ref is None:
        return rows
    spare = plan.host_losses.spare_hosts if plan.host_losses is not None else 0
    label = ("exact optimum of that model with the worst host lost (search.reference=spare)" if ref.lost_hosts
             else "exact optimum of that model with every host up" if spare
             else "the exact reference, stopped at its time limit: its layout" if ref.gap_is_bound
             else "exact optimum of that model")  # fmt: skip
    rows.append(f"| {label} | {_fmt(ref.optimum_req_s)} req/s |")
    if ref.gap is None:
        rows.append("| gap to it | n/a |")
    elif ref.lost_hosts:
        rows.append(f"| gap to it | {ref.gap_text().removeprefix('gap ')} (the trials' rate with the worst host lost "
                    "against the optimum of that) |")  # fmt: skip
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


def _rates_meant(plan: Plan) -> list[tuple[str, str]]:
    """The rates' meanings (`plan.RATES`), a comparison the plan does not make left out."""
    absent = {"cache_free_req_s"} if plan.rates.cache_free_req_s is None else set()
    return [(k, v) for k, v in RATES.items() if k not in absent]


def _cache_rows(plan: Plan) -> list[str]:
    """What the prefix caches add to the layout's rate, as priced."""
    free = plan.rates.cache_free_req_s
    if free is None:
        return []
    gain = f" (the caches add {plan.rate_req_s / free - 1:+.0%})" if free > 0 else ""
    return [f"| prefix caches priced | {plan.rate_req_s:.2f} req/s at the prefill islands' expected hit rates; "
            f"{free:.2f} req/s priced without them{gain} |"]


def _roles_rows(plan: Plan) -> list[str]:
    """The layout's rate with prefill and decode islands only beside its rate with aggregated ones allowed."""
    r = plan.rates
    if r.disaggregated_req_s is None or r.with_aggregated_req_s is None:
        return []
    chosen = "with" if plan.cost.engine.aggregated else "without"
    return [f"| roles compared (this layout) | prefill and decode islands only: {r.disaggregated_req_s:.2f} req/s; "
            f"aggregated islands allowed: {r.with_aggregated_req_s:.2f} req/s (planned {chosen} them: "
            f"costmodel.aggregated={str(plan.cost.engine.aggregated).lower()}) |"]  # fmt: skip


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


def _node_map(islands: Sequence[Island], losses: HostLosses | None = None) -> list[str]:
    """Which island runs on which hosts, what each serving island is expected to do there, and, with the plan's
    host losses, the share of its rate the plan keeps when a host of the island fails (its worst host): flagged
    where that costs more than the island's share of the serving GPUs."""
    if not any(isl.hosts is not None for isl in islands):
        return []
    kept = _kept_by_island(islands, losses)
    out = [
        "",
        "Node map (hosts numbered per GPU type; expected latency: the queueing model's TTFT at the SLO "
        "percentile for prefill, the mean decode step for decode (aggregated: with its prompts' chunks); redundant "
        "experts: replicas added so the "
        "routed experts divide evenly over the EP group"
        + ("; a host lost: the share of the plan's rate kept with one of the island's hosts down, **flagged** "
           "where the loss costs more than the island's share of the serving GPUs" if kept else "") + "):",
        "",
        "| hosts | island | role | expected latency | EP group: experts/GPU (+redundant) |"
        + (" a host lost |" if kept else ""),
        "|---|---|---|---:|---|" + ("---|" if kept else ""),
    ]

    def cells(isl: Island) -> str:
        loss = f" {kept.get(id(isl), '-')} |" if kept else ""
        if not isl.serving:
            return "idle | - | - |" + loss
        lat = (f"TTFT {isl.ttft_ms_expected:.0f} ms" if isl.ttft_ms_expected is not None
               else f"TPOT {isl.tpot_ms_expected:.1f} ms" if isl.tpot_ms_expected is not None else "-")  # fmt: skip
        if isl.cache_hit_expected is not None:  # prefill priced at its prefix caches' expected hit rate
            lat += f", {isl.cache_hit_expected:.0%} of prompt tokens cached"
        experts = (f"{isl.ep_group}: {isl.experts_per_gpu} (+{isl.redundant_experts})" if isl.experts_per_gpu
                   else f"none: {isl.dp} replicas of TP {isl.tp}")  # a dense model's island
        return f"{isl.role} | {lat} | {experts} |" + loss

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


def _kept_by_island(islands: Sequence[Island], losses: HostLosses | None) -> dict[int, str]:
    """Per serving island (by id), the share of the rate kept with its worst host lost, flagged where the loss costs
    more than the island's share of the serving GPUs ({} without host losses)."""
    if losses is None or losses.rate_req_s <= 0:
        return {}
    gpus = sum(isl.size for isl in islands if isl.serving)
    out = {}
    for i, isl in enumerate(islands):
        rates = [h.rate_req_s for h in losses.losses if i in h.islands]
        if not isl.serving or not rates:
            continue
        keep = min(rates) / losses.rate_req_s
        text, share = f"keeps {keep:.0%}", isl.size / gpus
        out[id(isl)] = f"**{text}** (has {share:.0%} of the GPUs)" if 1 - keep > share + 1e-9 else text
    return out


def _fmt(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.2f}"

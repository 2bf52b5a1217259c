"""A search's outputs: the plan (plan.json), trials.parquet, convergence.png, report.md."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from costmodel.island_bench import PhaseTable
from pipeline.planner import Layout, Planner

RATES = {
    "rate_req_s": "the plan's rate: requests/s the layout sustains with every island kept at a load whose "
    "queue meets the SLO percentiles (docs/inner.md); without SLOs (slo=null), the fluid rate",
    "fluid_req_s": "diagnostic: the same layout and routing with every island busy all the time (no queueing, "
    "no SLO): an upper bound no deployment reaches",
    "searched_req_s": "the rate the search scored this layout with: each island's caps for the whole workload's "
    "mix, the model of the exact reference (the gap compares these two); rate_req_s refines the caps for the mix "
    "the routing gives each island (docs/inner.md)",
    "evaluated_req_s": "diagnostic: the plan's routing re-scored at every input length of the workload instead of "
    "each range's representative length, under the utilisation caps it was solved with",
    "simulated_req_s": "objective goodput: the highest rate the simulator sustained within the SLOs for this "
    "layout in the search (bisection from rate_req_s; pipeline/goodput.py)",
    "verification": "the plan simulated request by request at its rate (pipeline.simulate): throughput, latency "
    "percentiles and whether the SLOs held; where they broke, `sustained_req_s`: the highest rate below it the "
    "simulator sustains within them",
}


def build_plan(planner: Planner, layout: Layout, time_limit_s: float, backend: str = "AUTO") -> dict[str, Any]:
    """Solve `layout` with max_rate and describe every island: role, parallelism, batch, ranges."""
    searched = planner.solve(layout, "max_rate", time_limit_s, backend=backend)  # the search's model
    prob, sol = planner.solve_routed(layout, time_limit_s, backend=backend, first=searched)
    ev, _ = planner.evaluate(layout, prob, sol)
    r = planner.ranges
    islands = []
    for i, (gpu, size) in enumerate(layout.islands):
        serves = sol.x_prefill[i].sum() + sol.x_decode[i].sum() > 1e-9
        role = sol.roles[i] if serves else "idle"  # e.g. an island too small to hold the model
        bench = planner.benchmark(gpu, size)
        phase = "decode" if sol.roles[i] == "decode" else "prefill"
        x, b = (sol.x_decode, prob.decode_req_s) if phase == "decode" else (sol.x_prefill, prob.prefill_req_s)
        cap = b * x
        tot = cap.sum(axis=0)
        served = np.flatnonzero(cap[i] > 0)
        cfg = bench.config(phase) or {"tp": 0, "dp": 0, "ep": 0}
        table = bench.decode if phase == "decode" else bench.prefill
        batch = _engine_batch(table, cap[i], served, phase)
        fraction = cap[i] / np.where(tot > 0, tot, 1.0)
        facts = _serving_facts(planner, bench, phase, cfg, fraction, sol.rate_req_s) if serves else {}
        islands.append(
            {
                "gpu": gpu,
                "size": size,
                "role": role,
                **cfg,
                "batch": batch,
                **facts,
                "cost_per_hour": size * planner.gpus[gpu].price_per_hour,
                "ranges": [
                    {
                        "start": int(r.start[j]),
                        "end": int(r.end[j]),
                        "fraction": float(cap[i, j] / tot[j]),  # share of range j's traffic in this phase
                        "capacity": float(x[i, j]),  # share of this island's time
                    }
                    for j in served
                ],
            }
        )
    _place(islands, {g: planner.gpus[g].node_gpus for g, _ in layout.islands})
    in_use = [isl["role"] != "idle" for isl in islands]
    cost = float(sum(isl["cost_per_hour"] for isl, u in zip(islands, in_use, strict=True) if u))
    fluid = sol.rate_req_s  # without SLOs all three are one rate
    if planner.cost.slo:
        fluid = planner.solve(layout, "max_rate", time_limit_s, backend=backend, queueing=False)[1].rate_req_s
    return {
        "status": sol.status,
        "rate_req_s": sol.rate_req_s,  # the headline: what the layout sustains within the SLOs (RATES)
        "fluid_req_s": fluid,
        "searched_req_s": searched[1].rate_req_s,
        "evaluated_req_s": ev.rate_req_s,
        "rates": RATES,
        "output_tok_s": sol.rate_req_s * planner.workload.mean_decode,
        "cost_per_hour": cost,
        "rate_per_dollar": sol.rate_req_s / cost if cost > 0 else 0.0,
        "prefill_islands": sum(isl["role"] == "prefill" for isl in islands),
        "decode_islands": sum(isl["role"] == "decode" for isl in islands),
        "islands": islands,
        "model_spec": dataclasses.asdict(planner.model),  # the dimensions planned with, checked by simulate
        "cost": planner.cost.to_json(),  # every cost-model switch and value: simulate rebuilds exactly this
    }


def _serving_facts(
    planner: Planner, bench: Any, phase: str, cfg: Mapping[str, int], fraction: np.ndarray, rate: float
) -> dict[str, Any]:
    """What a deployment needs to know of one serving island besides its shape.

    - `redundant_experts`: r >= 0 extra expert replicas so the E + r routed experts divide evenly
      over the island's EP group (G GPUs, ceil(E / G) each: the memory the cost model counts);
      engines require (E + r) % G == 0 (SGLang --ep-num-redundant-experts).
    - `traffic_share`: the share of all requests that pass through the island in its phase.
    - `utilisation`: the share of its time it is busy at the plan's rate (at most its SLO cap).
    - prefill `ttft_ms_expected`: the TTFT bound at the SLO percentile the queueing model gives the
      island at that load (W_q + batching + S_q, docs/inner.md); decode `tpot_ms_expected`: its mean
      step over the mix it serves.
    """
    from costmodel.queueing import mix_moments, mix_quantile, wait_quantile

    experts = planner.model.n_routed_experts
    group = int(cfg["ep"]) if phase == "decode" else int(cfg["tp"]) * int(cfg["dp"])
    per_gpu = -(-experts // group)
    table = bench.decode if phase == "decode" else bench.prefill
    raw = bench.decode_req_s if phase == "decode" else bench.prefill_req_s
    routed = rate * planner.ranges.p * fraction  # req/s of each range through this island
    ok = routed > 0
    out: dict[str, Any] = {
        "ep_group": group,
        "experts_per_gpu": per_gpu,
        "redundant_experts": per_gpu * group - experts,
        "traffic_share": float(planner.ranges.p @ fraction),
        "utilisation": float((routed[ok] / raw[ok]).sum()) if ok.any() else 0.0,
    }
    if not ok.any() or table.chosen < 0:
        return out
    times_s = table.time_ms[table.chosen, ok] / 1e3
    if phase == "decode":
        out["tpot_ms_expected"] = float(routed[ok] @ times_s / routed[ok].sum() * 1e3)
        return out
    cost = planner.cost
    q = cost.ttft_percentile / 100
    mean, cs2 = mix_moments(times_s, routed[ok])
    c = int(cfg["dp"])
    rho = min(out["utilisation"], 0.9999)
    wait = wait_quantile(c, rho * c / mean, mean, cs2, q)
    tokens = float(routed[ok] @ planner.lengths[ok] / routed[ok].sum())
    batch_s = mean / tokens * max(cost.prefill_batch_tokens - tokens, 0.0)
    out["ttft_ms_expected"] = float((wait + min(rho * wait, batch_s) + mix_quantile(times_s, routed[ok], q)) * 1e3)
    return out


def _place(islands: list[dict[str, Any]], node_gpus: Mapping[str, int]) -> None:
    """Give every island its hosts: per GPU type, whole-host islands first on hosts 0, 1, ...,
    then islands smaller than a host packed into the next hosts (first fit). `placement` reads
    e.g. "H20 nodes 0-5" or "H20 node 6, GPUs 0-3"; an island that is neither (search.shapes=any)
    spans hosts and says so."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for isl in islands:
        by_type.setdefault(isl["gpu"], []).append(isl)
    for gpu, isls in by_type.items():
        n = node_gpus[gpu]
        nxt = 0  # next free GPU, counted over the type's hosts
        free: list[tuple[int, int]] = []  # (host, first free GPU) of partly used hosts
        for isl in sorted(isls, key=lambda d: -d["size"]):
            size = isl["size"]
            if size < n and n % size == 0:
                spot = next((k for k, (_, g) in enumerate(free) if g + size <= n), None)
                if spot is None:
                    host = -(-nxt // n)
                    free.append((host, 0))
                    nxt = (host + 1) * n
                    spot = len(free) - 1
                host, first = free[spot]
                free[spot] = (host, first + size)
                isl["nodes"], isl["first_gpu"] = [host], first
                isl["placement"] = f"{gpu} node {host}, GPUs {first}-{first + size - 1}"
                continue
            start = -(-nxt // n) * n if size % n == 0 else nxt  # whole hosts start on a host boundary
            hosts = list(range(start // n, (start + size - 1) // n + 1))
            nxt = start + size
            isl["nodes"], isl["first_gpu"] = hosts, start % n
            aligned = size % n == 0
            isl["placement"] = (
                f"{gpu} node{'s' if len(hosts) > 1 else ''} {hosts[0]}"
                + (f"-{hosts[-1]}" if len(hosts) > 1 else "")
                + ("" if aligned else f" (GPUs {start % n}-{(start + size - 1) % n} of the last: not host-aligned)")
            )


def _engine_batch(table: PhaseTable, routed: np.ndarray, served: np.ndarray, phase: str) -> int:
    """The one batch an island's engines run with, from the per-range batches of its benchmark.

    Prefill: the batch at the range with the most traffic. Decode: the benchmark sizes a batch
    per range as if each range decoded alone (the largest that fits in memory and meets the
    TPOT step cap). An engine running the island's mix holds one batch whose step and KV use are
    set by the mix's mean context; with step time and KV memory linear in the batch's summed
    context, that batch is the traffic-weighted harmonic mean of the per-range batches: its
    throughput equals the range-by-range capacity the inner solve counted (docs/inner.md).
    Rounded down, so the mix's step stays within the cap.
    """
    if table.chosen < 0 or not served.size:
        return 0
    b = table.batch[table.chosen, served]
    w = routed[served]
    if phase == "prefill" or (b <= 0).any():
        return int(b[np.argmax(w)])
    return max(int(np.floor(w.sum() / (w / b).sum() + 1e-9)), 1)


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


def _band_rows(plan: Mapping[str, Any]) -> list[str]:
    """The headline's range over the calibration's uncertainty (pipeline/band.py), if it has one."""
    band = plan.get("band")
    rows = []
    if plan.get("robust"):
        rows.append("| planned at | every calibration factor's 10th percentile (search.robust) |")
    if not band:
        cal = (plan.get("cost") or {}).get("calibration")
        why = "no calibration (costmodel.calibration)" if cal is None else "search.band_draws=0"
        return [*rows, f"| range | not estimated: {why} |"]
    return [
        *rows,
        f"| range over the calibration (10th / 50th / 90th percentile) | {band['p10_req_s']:.1f} / "
        f"{band['p50_req_s']:.1f} / {band['p90_req_s']:.1f} req/s ({band['draws']} draws of "
        f"{band['calibration']}) |",
    ]


def best_so_far(records: Sequence[Mapping[str, Any]]) -> list[float]:
    """The best score after each trial, in trial order (failed trials keep the previous best)."""
    out, best = [], 0.0
    for r in records:
        ok = r.get("status") in ("optimal", "feasible")  # pipeline.trial.OK
        if ok and isinstance(r.get("score"), (int, float)):
            best = max(best, float(r["score"]))
        out.append(best)
    return out


def usd_per_m_tokens(plan: Mapping[str, Any]) -> float:
    """$ per million output tokens at the plan's rate (the inventory's $/h over its tok/s)."""
    tok_s = float(plan.get("output_tok_s") or 0.0)
    return float(plan.get("cost_per_hour", 0.0)) / (tok_s * 3600.0) * 1e6 if tok_s > 0 else float("nan")


def _gap_text(plan: Mapping[str, Any]) -> str:
    if not plan.get("gap_is_bound"):
        return f"{plan['gap']:.2%}"
    return (f"at most {plan['gap']:.2%} (the reference stopped at its time limit; the optimum is at most "
            f"{plan['reference_bound_req_s']:.2f} req/s)")  # fmt: skip


REFERENCE_AHEAD = 1e-4  # the reference's own layout scoring this much more than the plan's is pointed out


def _reference_ahead_row(plan: Mapping[str, Any]) -> list[str]:
    """A row where the exact reference's own layout scores more than the plan's (pipeline/search.py)."""
    ahead = plan.get("reference_layout_ahead")
    if ahead is None or ahead <= REFERENCE_AHEAD:
        return []
    return [f"| the exact reference's own layout | scores {ahead:.2%} more in the same model: `search.sampler=exact` "
            "plans it (reference.json) |"]  # fmt: skip


def report(plan: Mapping[str, Any], df: pd.DataFrame, header: str, routing_png: str | None = None) -> str:
    lines = [header, ""]
    gap = plan.get("gap")
    rate = plan["rate_req_s"]
    lines += [
        "**The rate to plan with is the first row**: what the layout sustains within the SLOs, checked request "
        "by request by the simulator in the row below it (where the simulator sustains less, that row gives the "
        "rate it sustains). The rows under *Diagnostics* explain how the search got there; none of them is a rate "
        "to deploy for.",
        "",
        "| | |",
        "|---|---|",
        f"| **rate** (within the SLOs) | **{rate:.2f} req/s** ({plan['output_tok_s']:.0f} output tok/s) |",
        *_verification_rows(plan.get("verification")),
        *_band_rows(plan),
        f"| cost | ${plan['cost_per_hour']:,.2f}/h: ${usd_per_m_tokens(plan):.2f} per million output tokens, "
        f"{plan['rate_per_dollar']:.4f} req/s per $/h |",
        f"| islands | {plan['prefill_islands']} prefill + {plan['decode_islands']} decode |",
        "",
        "Islands (batch: for prefill, prompts one forward pass takes, one per DP replica; for decode, running "
        "sequences per attention-DP rank of TP GPUs, so the island decodes batch x ep / tp at once. ranges: input "
        "lengths routed to the island, as first-last token (number of ranges), with the island's share of "
        "those requests. traffic: share of all requests through the island in its role; busy: share of its time "
        "at the plan's rate). Identical islands side by side share a row, (xN) counting them; its numbers are "
        "each island's:",
        "",
        "| island | role | TP / DP / EP | batch | ranges (share of their requests) | traffic | busy | req/s | "
        "output tok/s | $/h |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]

    def cells(isl: Mapping[str, Any]) -> str:
        share = isl.get("traffic_share", 0.0)
        tok = f"{share * plan['output_tok_s']:.0f}" if isl["role"] == "decode" else "-"
        return (
            f"{isl['role']} | {isl['tp']} / {isl['dp']} / {isl['ep']} | {isl['batch']} | "
            f"{_ranges_text(isl['ranges'])} | {share:.1%} | {isl.get('utilisation', 0.0):.1%} | {share * rate:.1f} | "
            f"{tok} | {isl.get('cost_per_hour', 0.0):,.0f} |"
        )

    for group in _alike(plan["islands"], lambda isl: f"{isl['size']} x {isl['gpu']} | {cells(isl)}"):
        lines.append(f"| {_label(group)} | {cells(group[0])}")
    if routing_png:
        lines += ["", f"![which island serves which input lengths]({routing_png})"]
    lines += _node_map(plan["islands"])
    cut = plan.get("gap_is_bound")  # a reference stopped by its time limit: a layout, not the optimum
    ref_label = "the exact reference, stopped at its time limit: its layout" if cut else "exact optimum of that model"
    lines += [
        "",
        "Diagnostics:",
        "",
        "| | |",
        "|---|---|",
        f"| scored in the search (whole-mix caps, the reference's model) | {_fmt(plan.get('searched_req_s'))} req/s |",
        f"| {ref_label} | {_fmt(plan.get('reference_optimum_req_s'))} req/s |",
        f"| gap to it | {'n/a' if gap is None or gap != gap else _gap_text(plan)} |",
        *_reference_ahead_row(plan),
        f"| fluid bound (islands busy 100 %, no SLO) | {plan.get('fluid_req_s', float('nan')):.2f} req/s |",
        f"| re-scored at every input length (the routing of whole ranges, each length its own cost) | "
        f"{plan['evaluated_req_s']:.2f} req/s |",
        f"| trials | {plan['trials']} ({plan.get('failed', 0)} failed, {plan.get('rejected', 0)} rejected) |",
        "",
        f"What each rate means: {'; '.join(f'`{k}`: {v}' for k, v in RATES.items())}.",
    ]
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
            cells = [str(r["trial"]), str(times[r["islands"]]), f"{r['score']:.4g}", f"{r['rate_req_s']:.2f}",
                     f"{r['cost_per_hour']:.0f}", _runs_text(str(r["islands"]))]  # fmt: skip
            lines.append(f"| {' | '.join(cells)} |")
    for note in plan.get("notes", []):
        lines += ["", f"Note: {note}"]
    return "\n".join(lines) + "\n"


def _runs_text(islands: str) -> str:
    """'H200x8;H200x8;H800x16' as 'H200x8 (x2); H800x16'."""
    runs = _alike(islands.split(";"), lambda isl: isl)
    return "; ".join(r[0] + (f" (x{len(r)})" if len(r) > 1 else "") for r in runs)


def _alike(islands: Iterable[Any], key: Callable[[Any], Any]) -> list[list[Any]]:
    """Runs of consecutive islands with the same `key` (a 10,000-GPU plan has hundreds of identical islands)."""
    groups: list[list[Any]] = []
    for isl in islands:
        if groups and key(groups[-1][0]) == key(isl):
            groups[-1].append(isl)
        else:
            groups.append([isl])
    return groups


def _label(group: Sequence[Mapping[str, Any]]) -> str:
    """`8 x H200`, or `8 x H200 (x125)` for a run of 125 such islands."""
    isl = group[0]
    return f"{isl['size']} x {isl['gpu']}" + (f" (x{len(group)})" if len(group) > 1 else "")


def _spans(hosts: Iterable[int]) -> str:
    """`0-124` or `3, 5-7`: host numbers as runs."""
    out: list[list[int]] = []
    for h in sorted(set(hosts)):
        if out and h == out[-1][1] + 1:
            out[-1][1] = h
        else:
            out.append([h, h])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in out)


def _ranges_text(ranges: Sequence[Mapping[str, Any]]) -> str:
    """`0-1250 (5 ranges, 96 %)`: the span, how many ranges, the island's mean share of their requests."""
    if not ranges:
        return "-"
    share = float(np.mean([r["fraction"] for r in ranges]))
    n = len(ranges)
    return f"{ranges[0]['start']}-{ranges[-1]['end']} ({n} range{'s' if n > 1 else ''}, {share:.0%})"


def routing_plot(path: Path, plan: Mapping[str, Any], title: str) -> None:
    """Which island serves which input lengths, prefill above decode: one row per island (or per run
    of identical ones), each range a bar shaded by its share of that range's requests."""
    islands = [isl for isl in plan["islands"] if isl["role"] != "idle" and isl["ranges"]]
    if not islands:
        return
    islands.sort(key=lambda isl: (isl["role"] != "prefill", isl["ranges"][0]["start"]))
    groups = _alike(islands, lambda isl: (isl["role"], isl["size"], isl["gpu"],
                                          [(r["start"], r["end"], r["fraction"]) for r in isl["ranges"]]))  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(groups) + 1.4))
    colors = {"prefill": "tab:blue", "decode": "tab:orange"}
    for row, group in enumerate(groups):  # a row of N islands is shaded by their share together
        for r in group[0]["ranges"]:
            share = min(max(r["fraction"] * len(group), 0.0), 1.0)
            ax.barh(row, r["end"] - r["start"], left=r["start"], height=0.8, color=colors[group[0]["role"]],
                    alpha=0.25 + 0.75 * share, edgecolor="none")  # fmt: skip
    labels = [f"{g[0]['role'][0].upper()} {g[0]['size']}x{g[0]['gpu']}" + (f" (x{len(g)})" if len(g) > 1 else "")
              for g in groups]  # fmt: skip
    ax.set_yticks(range(len(groups)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="input length (tokens)", title=title)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
              labels=["prefill (P)", "decode (D); darker: more of the range's requests (a row of xN: all N)"],
              fontsize=7,
              loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _node_map(islands: Sequence[Mapping[str, Any]]) -> list[str]:
    """Which island runs on which hosts, and what each serving island is expected to do there."""
    if not any("placement" in isl for isl in islands):
        return []
    out = [
        "",
        "Node map (hosts numbered per GPU type; expected latency: the queueing model's TTFT at the SLO "
        "percentile for prefill, the mean decode step for decode; redundant experts: replicas added so the "
        "routed experts divide evenly over the EP group):",
        "",
        "| hosts | island | role | expected latency | EP group: experts/GPU (+redundant) |",
        "|---|---|---|---:|---|",
    ]

    def cells(isl: Mapping[str, Any]) -> str:
        if isl["role"] == "idle":
            return "idle | - | - |"
        lat = (f"TTFT {isl['ttft_ms_expected']:.0f} ms" if "ttft_ms_expected" in isl
               else f"TPOT {isl['tpot_ms_expected']:.1f} ms" if "tpot_ms_expected" in isl else "-")  # fmt: skip
        return (f"{isl['role']} | {lat} | {isl.get('ep_group', '-')}: {isl.get('experts_per_gpu', '-')} "
                f"(+{isl.get('redundant_experts', 0)}) |")  # fmt: skip

    def aligned(isl: Mapping[str, Any]) -> bool:
        return "not host-aligned" not in isl.get("placement", "")

    for group in _alike(islands, lambda isl: (isl["size"], isl["gpu"], cells(isl), "nodes" in isl, aligned(isl))):
        isl = group[0]
        hosts = isl.get("placement", "-")
        if len(group) > 1 and "nodes" in isl:  # a run of islands: the hosts they cover
            nodes = [h for member in group for h in member["nodes"]]
            hosts = f"{isl['gpu']} node{'s' if len(set(nodes)) > 1 else ''} {_spans(nodes)}"
            hosts += "" if aligned(isl) else " (islands not host-aligned)"
        out.append(f"| {hosts} | {_label(group)} | {cells(isl)}")
    return out


def _verification_rows(v: Mapping[str, Any] | None) -> list[str]:
    if not v:
        return ["| simulated | not checked (search.verify=false) |"]
    verdict = "SLOs held" if v["sustained"] else f"**not sustained**: {v['why_not']}"
    if not v["sustained"] and v.get("sustained_req_s"):  # the highest rate below the stated one that held
        verdict += (f"; the simulator sustains **{v['sustained_req_s']:.2f} req/s** "
                    f"({v['sustained_over_stated']:.3f} x stated): plan with that")  # fmt: skip
    elif not v["sustained"] and "sustained_req_s" in v:
        verdict += "; none of the lower rates simulated held either (down to half the stated rate)"
    elif not v["sustained"] and v.get("holds_at_0_95"):  # a plan.json written before `sustained_req_s`
        verdict += "; the SLOs hold at 0.95 x stated (within 5 %)"
    rows = [
        f"| simulated at that rate | {v['throughput_req_s']:.2f} req/s = {v['simulated_over_stated']:.3f} x stated; "
        f"{verdict} |",
        f"| simulated latency | TTFT p50 {v['ttft_ms_p50']:.0f} ms, p99 {v['ttft_ms_p99']:.0f} ms; TPOT p99 "
        f"{v['tpot_ms_p99']:.1f} ms; {v['slo_attainment']:.1%} of requests within the SLOs ({v['slo']}) |",
    ]
    if v.get("steady_state"):  # the verdict rests on a window that may be too short (or an overload)
        rows.append(f"| simulated window | {v.get('requests', 0):,} requests: {v['steady_state']} |")
    return rows


def _fmt(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.2f}"

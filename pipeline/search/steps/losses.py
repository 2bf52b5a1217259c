"""Host losses: the plan's rate with each of its hosts gone in turn, the router re-spreading the rest
(`pipeline.planning.failures.host_losses`); with search.spare_hosts=K, also its worst K hosts lost at once. The
plan's `host_losses`; off with search.host_losses=false."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.checks import boolean
from pipeline.planning.failures import host_losses, spare_solve, worst_loss
from pipeline.search.steps.base import PlanStep, StepContext
from plan import HostLosses, Plan, node_spans


class Losses(PlanStep):
    name = "losses"
    field = "host_losses"
    what = "the host losses"
    off = "search.host_losses=false"
    on = ("search.host_losses=true",)

    def read(self, search: Any) -> bool:
        return boolean(search.get("host_losses", True), "search.host_losses")

    def wanted(self, plan: Plan, sc: StepContext) -> bool:
        return bool(self.options(sc))

    def compute(self, plan: Plan, sc: StepContext) -> HostLosses | None:
        ctx, spare = sc.rates, sc.settings.search.spare_hosts
        # planned for hosts lost: the roles the plan was built in (by the trials' planner, whose cache holds them), its
        # standby islands' too (the plan lists them idle)
        built = sc.ctx
        roles = spare_solve(built.planner, sc.layout, spare, built.inner_time_limit_s, built.backend).roles \
            if spare and sc.run.replanned is None else None  # fmt: skip
        losses = host_losses(ctx.planner, sc.layout, plan, ctx.inner_time_limit_s, ctx.backend, roles)
        if losses is None or not spare:
            return losses
        rate, nodes = worst_loss(ctx.planner, sc.layout, plan, spare, ctx.inner_time_limit_s, ctx.backend)
        return dataclasses.replace(losses, spare_hosts=spare, spare_nodes=nodes, spare_req_s=rate)

    def lines(self, plan: Plan, sc: StepContext, seconds: float) -> list[str]:
        losses = plan.host_losses
        if losses is None:
            return []
        out = []
        if losses.spare_req_s is not None:
            k = losses.spare_hosts
            worst = ", ".join(f"{g} node {n}" for g, n in losses.spare_nodes)
            out.append(f"{k} hosts lost at once (search.spare_hosts): at worst {worst}: {losses.spare_req_s:.1f} req/s")
        w = losses.worst
        share = w.rate_req_s / plan.rate_req_s if plan.rate_req_s > 0 else 0.0
        stops = ", ".join(f"{plan.islands[i].gpu} x{plan.islands[i].size} {plan.islands[i].role}" for i in w.islands)
        out.append(f"one host lost: at worst {w.gpu} node {w.node} (stops {stops}): {w.rate_req_s:.1f} req/s, "
                   f"{share:.0%} of the plan's rate ({len(losses.losses)} hosts; report.md: hosts lost)")  # fmt: skip
        return out

    def scored(self, plan: Plan, sc: StepContext) -> str | None:
        losses, ref = plan.host_losses, plan.reference
        if losses is None or losses.spare_req_s is None:
            return None
        k = losses.spare_hosts
        gap = ""
        if ref is not None and ref.gap is not None:  # against the optimum with the host lost, or every host up
            there = "with the worst host lost" if ref.lost_hosts else "there with every host up"
            gap = f", {ref.gap_text()} to the exact optimum {there}"
        if plan.sizing is not None:
            return (f"planned for {k} host{'s' if k > 1 else ''} lost: the trials scored each layout by the cheapest "
                    f"of its islands that serve {plan.sizing.demand_req_s:g} req/s with any {k} of their hosts "
                    f"lost{gap}")
        return (f"planned for {k} host{'s' if k > 1 else ''} lost: the trials scored each layout by its rate with its "
                f"worst {k} lost{gap}")  # fmt: skip

    def metrics(self, plan: Plan) -> dict[str, float]:
        losses = plan.host_losses
        if losses is None:
            return {}
        out = {"one_host_lost_req_s": losses.worst.rate_req_s}
        if losses.spare_req_s is not None:
            out["spare_hosts_lost_req_s"] = losses.spare_req_s
        return out

    def rows(self, plan: Plan) -> list[str]:
        """The rate with the worst host gone (and, planned for, the worst K at once)."""
        losses = plan.host_losses
        if losses is None:
            return []
        w = losses.worst
        share = w.rate_req_s / losses.rate_req_s if losses.rate_req_s > 0 else 0.0
        planned = " (planned for: search.spare_hosts=1)" if losses.spare_hosts == 1 else ""
        rows = [
            f"| one host lost (worst of {len(losses.losses)}){planned} | {w.rate_req_s:.2f} req/s ({share:.0%}): "
            f"{w.gpu} node {w.node} stops {stopped_text(plan, w.islands)}; the router re-spreads the rest (hosts lost, "
            "below) |"
        ]
        if losses.spare_req_s is not None and losses.spare_hosts > 1:  # (one host: the row above)
            k, rate = losses.spare_hosts, losses.spare_req_s
            share = rate / losses.rate_req_s if losses.rate_req_s > 0 else 0.0
            at_worst = nodes_text(list(losses.spare_nodes))
            rows.append(f"| {k} host{'s' if k > 1 else ''} lost at once (planned for: search.spare_hosts={k}) | "
                        f"{rate:.2f} req/s ({share:.0%}) at worst: {at_worst} |")  # fmt: skip
        return rows

    def sections(self, plan: Plan) -> list[str]:
        """Each distinct loss (hosts whose loss stops alike islands share a row), worst first."""
        losses = plan.host_losses
        if losses is None:
            return []
        rows: dict[tuple[float, str], list[tuple[str, int]]] = {}
        for h in losses.losses:
            rows.setdefault((h.rate_req_s, stopped_text(plan, h.islands)), []).append((h.gpu, h.node))
        lines = ["", "Hosts lost, one at a time: every island with a GPU on the host stops (an engine spanning hosts "
                 "stops whole); the router re-solves its shares over the islands left, each in the role and engine it "
                 "runs (nothing re-launched). Hosts whose loss stops alike islands share a row:", "",
                 "| rate (req/s) | of the plan's | hosts (GPU node) | what stops |", "|---:|---:|---|---|"]  # fmt: skip
        for (rate, stops), names in sorted(rows.items()):
            share = rate / losses.rate_req_s if losses.rate_req_s > 0 else 0.0
            lines.append(f"| {rate:.2f} | {share:.0%} | {nodes_text(names)} | {stops} |")
        return lines


def stopped_text(plan: Plan, islands: tuple[int, ...]) -> str:
    return ", ".join(f"the {plan.islands[i].size} x {plan.islands[i].gpu} {plan.islands[i].role} island" for i in
                     islands)  # fmt: skip


def nodes_text(nodes: list[tuple[str, int]]) -> str:
    """'H20 11-15, H200 0' for hosts (GPU, node): runs of consecutive nodes of a GPU type as a span."""
    return ", ".join(f"{gpu} {run}" for gpu in dict.fromkeys(g for g, _ in nodes)
                     for run in node_spans(n for g, n in nodes if g == gpu).split(", "))  # fmt: skip

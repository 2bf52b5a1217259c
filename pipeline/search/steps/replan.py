"""The re-plan's record: how this plan is reached from the running one it was re-planned from (search.from_plan;
`pipeline.planning.replan` found its islands in place of the trials). Every kept island runs as its engines run
now (the old plan's batch and micro-batching); a kept island whose configuration for the new workload differs
from the running one is re-launched: a move too, past search.max_moves if need be, and the console and report say
so. The plan's `replan`; off without search.from_plan."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pipeline.planning.replan import as_running
from pipeline.search.steps.base import PlanStep, StepContext
from plan import Island, Plan, Replan


@dataclass(frozen=True)
class Running:
    """The plan's islands as the kept ones run, and the re-plan's record."""

    islands: tuple[Island, ...]
    replan: Replan
    relaunched_kept: int  # kept islands re-launched for another configuration


class Replanned(PlanStep):
    name = "replan"
    field = "replan"
    what = "the re-plan"
    off = "search.from_plan=null"
    on = ("search.from_plan={plan}",)
    stage = 0  # the islands as they run: before anything judges them
    interruptible = False  # a plan of islands not as they run would mislead everything after it

    def wanted(self, plan: Plan, sc: StepContext) -> bool:
        return sc.settings.replan is not None

    def compute(self, plan: Plan, sc: StepContext) -> Running:
        s, again = sc.settings.replan, sc.run.replanned
        assert s is not None and again is not None
        islands, kept, moves, relaunched = as_running(plan, s.plan, again)
        scratch = sc.run.ref.rate_req_s if sc.run.ref is not None else None
        record = Replan(s.path, moves, kept, relaunched, s.max_moves, again.searched_req_s, scratch)
        return Running(islands, record, len(moves) - len(again.moves))

    def attach(self, plan: Plan, record: Running) -> Plan:
        return dataclasses.replace(plan, islands=record.islands, replan=record.replan)

    def lines(self, plan: Plan, sc: StepContext, seconds: float) -> list[str]:
        again = sc.run.replanned
        if plan.replan is None or again is None or len(plan.replan.moves) == len(again.moves):
            return []
        extra = len(plan.replan.moves) - len(again.moves)
        return [f"warning: {extra} kept island(s) run another configuration for this workload and are re-launched "
                f"too: {len(plan.replan.moves)} moves"]  # fmt: skip

    def scored(self, plan: Plan, sc: StepContext) -> str | None:
        again = plan.replan
        if again is None or not again.scratch_req_s:
            return None
        share = again.searched_req_s / again.scratch_req_s
        return (f"re-planned with {len(again.moves)} moves, {again.hosts_relaunched} hosts re-launched: "
                f"{again.searched_req_s:.2f} req/s in the search's model, {share:.1%} of the best plan from scratch "
                f"({again.scratch_req_s:.2f}, which moves any island); launch files for the changed islands only "
                "(pipeline.deploy)")  # fmt: skip

    def metrics(self, plan: Plan) -> dict[str, float]:
        again = plan.replan
        if again is None:
            return {}
        out = {"replan_moves": float(len(again.moves)), "replan_hosts_relaunched": float(again.hosts_relaunched)}
        if again.scratch_req_s:
            out["replan_share_of_scratch"] = again.searched_req_s / again.scratch_req_s
        return out

    def rows(self, plan: Plan) -> list[str]:
        """How the re-plan reached this plan, and what it costs against one from scratch."""
        again = plan.replan
        if again is None:
            return []
        share = f", {again.searched_req_s / again.scratch_req_s:.1%} of" if again.scratch_req_s else ""
        kept = ", ".join(str(i) for i in again.kept) or "none"
        scratch = "n/a" if again.scratch_req_s is None else f"{again.scratch_req_s:.2f}"
        return [
            f"| re-planned from | {again.from_plan}: {len(again.moves)} of at most {again.max_moves} moves, "
            f"{again.hosts_relaunched} hosts re-launched; islands {kept} run on unchanged |",
            *(f"| move {k + 1} | {m} |" for k, m in enumerate(again.moves)),
            f"| against a plan from scratch | {again.searched_req_s:.2f} req/s in the search's model{share} "
            f"{scratch} req/s (the exact optimum, which may move every island) |",
        ]

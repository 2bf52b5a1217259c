"""The cost curve of sizing runs: $/h against the demand, one line per GPU mix (search.objective=min_cost).

Every sizing run adds its point to `cost_curve.jsonl` in a folder: the Hydra multirun's (`-m
search.demand_req_s=100,200,400`: one point per job, the picture of the sweep so far redrawn after each) and
its own run folder. A point is the demand, the fleet the search found ($/h), the exact cheapest fleet of the
whole inventory, and the exact cheapest of each GPU type alone (sizing.json); `cost_curve.png` draws one line
per mix (exact), the search's fleets as crosses (and, where the plan's fleet was sized again to hold the demand
at the plan's rates, that one as a square), a panel per inventory.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from plan import Plan

POINTS = "cost_curve.jsonl"
PICTURE = "cost_curve.png"


def point(plan: Plan, inventory: str) -> dict[str, Any]:
    """One sizing run's point: its demand, the search's fleet and the exact cheapest fleets, per mix."""
    z = plan.sizing
    assert z is not None
    return {
        "inventory": inventory,
        "demand_req_s": z.demand_req_s,
        "plan_per_hour": plan.cost_per_hour,
        "search_per_hour": z.searched_per_hour,
        "cheapest_per_hour": z.cheapest_per_hour,
        "mixes": dict(z.mixes),
        "hosts_lost": z.hosts_lost,
        "reference_hosts_lost": z.reference_hosts_lost,
    }


def add_point(folder: Path, row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Append `row` to `folder`/cost_curve.jsonl (under a lock: jobs of a sweep may run at once) and return every
    point there, the older first; a point of the same inventory, demand and hosts lost replaces the older one."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / POINTS
    with path.open("a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(row) + "\n")
        f.flush()
        f.seek(0)
        rows = [json.loads(line) for line in f if line.strip()]
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        latest[(r["inventory"], r["demand_req_s"], r.get("hosts_lost", 0))] = r
    return list(latest.values())


def draw(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """cost_curve.png: per inventory (and hosts lost), $/h against the demand, one line per GPU mix (the exact
    cheapest fleet of those types alone; a mix missing at a demand cannot serve it) and the search's fleets."""
    panels: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        panels.setdefault((r["inventory"], int(r.get("hosts_lost", 0))), []).append(r)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, ((inventory, lost), pts) in zip(axes[0], sorted(panels.items()), strict=True):
        pts = sorted(pts, key=lambda r: r["demand_req_s"])
        mixes = sorted({m for r in pts for m in r["mixes"]}, key=lambda m: (-m.count("+"), m))
        up = lost and not all(r.get("reference_hosts_lost", 0) for r in pts)  # the exact lines with every host up
        exact = "exact cheapest, every host up" if up else "exact cheapest"
        for mix in mixes:
            xy = [(r["demand_req_s"], r["mixes"][mix]) for r in pts if mix in r["mixes"]]
            ax.plot(*zip(*xy, strict=True), marker="o", ms=4, lw=2 if "+" in mix else 1.2, ls=":" if up else "-",
                    label=f"{mix} ({exact})")  # fmt: skip
        if not mixes:  # one GPU type: the exact cheapest fleet is its line
            xy = [(r["demand_req_s"], r["cheapest_per_hour"]) for r in pts if r["cheapest_per_hour"] is not None]
            if xy:
                ax.plot(*zip(*xy, strict=True), marker="o", ms=4, lw=2, ls=":" if up else "-", label=exact)
        found = [(r["demand_req_s"], r.get("search_per_hour") or r["plan_per_hour"]) for r in pts]
        ax.scatter(*zip(*found, strict=True), marker="x", s=60, color="k", zorder=5, label="the search's fleet")
        again = [(r["demand_req_s"], r["plan_per_hour"]) for r in pts
                 if r["plan_per_hour"] > (r.get("search_per_hour") or r["plan_per_hour"]) * (1 + 1e-9)]  # fmt: skip
        if again:
            ax.scatter(*zip(*again, strict=True), marker="s", s=50, facecolors="none", edgecolors="tab:red", zorder=5,
                       label="the plan's fleet, sized again to hold the demand at the plan's rates")  # fmt: skip
        lost_text = f": fleets that keep the demand with {lost} host{'s' if lost > 1 else ''} lost" if lost else ""
        ax.set(xlabel="demand (req/s within the SLOs)", ylabel="$/h", title=f"{inventory}{lost_text}")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def record(plan: Plan, inventory: str, folders: Sequence[Path]) -> list[Path]:
    """Add the plan's point in every folder and redraw its picture; the pictures written."""
    out = []
    for folder in folders:
        rows = add_point(folder, point(plan, inventory))
        draw(folder / PICTURE, rows)
        out.append(folder / PICTURE)
    return out

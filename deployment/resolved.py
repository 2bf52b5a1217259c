"""Settings an engine resolves, against the plan's numbers: the record the engines' checks return
(`deployment.engines`, read back by `deployment.parameters`) and the table `deployment.check` prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    """One setting of one engine: what the engine resolves, what the plan priced (None: no number to compare),
    and whether the engine runs what the plan priced."""

    name: str
    resolved: Any
    plan: Any
    holds: bool

    @classmethod
    def equal(cls, name: str, resolved: Any, plan: Any) -> Setting:
        """A setting that holds when the engine resolves exactly the plan's value."""
        return cls(name, resolved, plan, resolved == plan)


def table(rows: list[tuple[str, list[Setting]]]) -> str:
    """Markdown, an engine a row: each setting as `resolved / plan` (one value where they are equal), marked
    **off** where the engine would not run what the plan priced."""
    names: list[str] = []  # every engine's settings, each in its place among the others' (the table's row order)
    for _, got in rows:
        at = 0
        for s in got:
            if s.name in names:
                at = names.index(s.name) + 1
            else:
                names.insert(at, s.name)
                at += 1
    out = ["| engine | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for engine, got in rows:
        cells = {}
        for s in got:
            text = str(s.resolved) if s.plan is None or s.resolved == s.plan else f"{s.resolved} / {s.plan}"
            cells[s.name] = text if s.holds else f"**off** {text}"
        out.append(f"| {engine} | " + " | ".join(cells.get(n, "") for n in names) + " |")
    return "\n".join(out)

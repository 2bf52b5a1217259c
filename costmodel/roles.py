"""What an island does: `Role`, one name the whole stack shares (the island benchmark's phases, the inner solver's
roles, the plan's islands, the simulator's and the launch files' engines).

A `Role` is a string (`Role.DECODE == "decode"`), so plan.json and the configs keep writing plain words; its
properties say what follows from it, so code asks `role.decodes` instead of listing roles.
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """An island's role: prefill, decode, aggregated (prefill and decode in mixed steps) or idle."""

    PREFILL = "prefill"
    DECODE = "decode"
    AGGREGATED = "aggregated"
    IDLE = "idle"

    @property
    def serving(self) -> bool:
        """Does the island serve requests at all?"""
        return self is not Role.IDLE

    @property
    def decodes(self) -> bool:
        """Does it run decode steps? Its engines are then expert-parallel groups of `ep` GPUs whose attention-DP
        ranks each hold `batch` running sequences (decode and aggregated islands)."""
        return self in (Role.DECODE, Role.AGGREGATED)

    @property
    def prefills(self) -> bool:
        """Does it prefill prompts (prefill and aggregated islands)?"""
        return self in (Role.PREFILL, Role.AGGREGATED)

    @property
    def disaggregated(self) -> bool:
        """Is it one half of a prefill-decode pair, handing KV cache over to (or taking it from) another island?"""
        return self in (Role.PREFILL, Role.DECODE)

    @property
    def other(self) -> Role:
        """The other half of a disaggregated pair (prefill <-> decode)."""
        if not self.disaggregated:
            raise ValueError(f"a {self} island has no other half")
        return Role.DECODE if self is Role.PREFILL else Role.PREFILL


ROLES = tuple(r.value for r in Role)
SERVING = tuple(r for r in Role if r.serving)

"""The routing table of routing.json, indexed: which engines serve a prompt of a given length, drawn with the
plan's fractions."""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from typing import Any

PROTOCOLS = ("sglang", "vllm")


@dataclass(frozen=True)
class Table:
    """Per phase: range ends (sorted) and, per range, (island engines, cumulative share) to draw from."""

    ends: list[int]
    draw: dict[str, list[tuple[list[list[str]], list[float]]]]


def load(config: dict[str, Any]) -> Table:
    """Check a routing.json and index it; ValueError names what is off."""
    if config.get("protocol") not in PROTOCOLS:
        raise ValueError(f"routing: `protocol` must be one of {list(PROTOCOLS)}, got {config.get('protocol')!r}")
    phases = config.get("islands")
    if not isinstance(phases, dict) or set(phases) != {"prefill", "decode"}:
        raise ValueError("routing: `islands` must have `prefill` and `decode`")
    ends = sorted({int(r[1]) for ph in phases.values() for isl in ph.values() for r in isl["ranges"]})
    draw: dict[str, list[tuple[list[list[str]], list[float]]]] = {}
    for phase, isls in phases.items():
        per_range: list[tuple[list[list[str]], list[float]]] = []
        for end in ends:
            engines, weights = [], []
            for name, isl in isls.items():
                if not isl.get("engines"):
                    raise ValueError(f"routing: {phase} island {name} has no engines")
                for _, e, frac in isl["ranges"]:
                    if int(e) == end and frac > 0:
                        engines.append(list(isl["engines"]))
                        weights.append(float(frac))
            if not engines:
                raise ValueError(f"routing: no {phase} island serves the range ending at {end} tokens")
            total, cum, acc = sum(weights), [], 0.0
            for w in weights:
                acc += w / total
                cum.append(acc)
            per_range.append((engines, cum))
        draw[phase] = per_range
    return Table(ends, draw)


def prompt_tokens(body: dict[str, Any], chars_per_token: float) -> int:
    """The request's prompt length in tokens: exact for token ids, else estimated from characters."""
    for key in ("input_ids", "prompt"):
        v = body.get(key)
        if isinstance(v, list) and v and all(isinstance(t, int) for t in v):
            return len(v)
    text = body.get("prompt") if isinstance(body.get("prompt"), str) else body.get("text", "")
    if isinstance(body.get("messages"), list):
        text = "".join(str(m.get("content", "")) for m in body["messages"] if isinstance(m, dict))
    return max(int(len(str(text)) / chars_per_token), 1)


def pick(table: Table, phase: str, tokens: int, rng: random.Random) -> str:
    j = min(bisect.bisect_right(table.ends, tokens), len(table.ends) - 1)  # ranges are [start, end)
    engines, cum = table.draw[phase][j]
    k = min(bisect.bisect_left(cum, rng.random() * cum[-1]), len(cum) - 1)
    return rng.choice(engines[k])

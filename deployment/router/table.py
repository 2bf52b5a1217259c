"""routing.json, checked and indexed: which islands and engines serve a prompt of a given length, drawn with the
plan's fractions among the engines that are up."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

PROTOCOLS = ("sglang", "vllm", "llmd")  # llmd: a decode engine's llm-d routing sidecar runs either
PHASES = ("prefill", "decode")
AGGREGATED = "aggregated"  # islands that prefill and decode a request themselves (optional in routing.json)
ROLES = (*PHASES, AGGREGATED)
FRACTION_TOLERANCE = 1e-6  # a range's fractions over its islands sum to 1 within this


class RoutingError(ValueError):
    """routing.json is not a table the router can apply; the message names the field and what it must be."""


@dataclass(frozen=True)
class Island:
    """One serving island: its name in routing.json (the plan's island index) and its engines' base URLs."""

    name: str
    engines: tuple[str, ...]


@dataclass(frozen=True)
class Range:
    """Prompts of `start <= tokens < end`: per role (prefill, decode, aggregated), the islands serving it and their
    fractions; an aggregated island's counts in both phases."""

    start: int
    end: int
    islands: dict[str, tuple[tuple[Island, float], ...]]


@dataclass(frozen=True)
class Table:
    """The checked routing table: ranges sorted by end; every island by role."""

    protocol: str
    ranges: tuple[Range, ...]
    islands: dict[str, tuple[Island, ...]]
    bootstrap_port: int
    chars_per_token: float
    in_flight: int  # requests the plan has in flight at its rate (0: not stated)
    tokenizer: str | None  # the model's tokenizer.json on the router's host, when routing.json names one
    health: dict[str, str]  # an engine's URL -> where its health is asked, when not the engine's own URL

    @property
    def engines(self) -> list[str]:
        return [e for role in ROLES for isl in self.islands[role] for e in isl.engines]

    def range_of(self, tokens: int) -> Range:
        """The range of a prompt of `tokens` (ranges are [start, end); past the last end, the last range)."""
        j = min(bisect.bisect_right([r.end for r in self.ranges], tokens), len(self.ranges) - 1)
        return self.ranges[j]


def _url(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RoutingError(f"{where}: an engine must be a URL string like http://10.0.0.5:30000, got {value!r}")
    u = urlparse(value)
    try:
        port = u.port
    except ValueError:
        port = -1
    if u.scheme not in ("http", "https") or not u.hostname or port == -1 or u.path not in ("", "/"):
        raise RoutingError(f"{where}: {value!r} is not an engine URL like http://10.0.0.5:30000 (scheme, host, port)")
    return value.rstrip("/")


def _number(value: Any, where: str, low: float, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RoutingError(f"{where}: must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def load(config: Any) -> Table:
    """Check a routing.json (already parsed) and index it; RoutingError names what is off and where."""
    if not isinstance(config, dict):
        raise RoutingError(
            f"the top level must be an object with `protocol` and `islands`, got a {type(config).__name__}"
        )
    if config.get("protocol") not in PROTOCOLS:
        raise RoutingError(f"`protocol` must be one of {list(PROTOCOLS)}, got {config.get('protocol')!r}")
    phases = config.get("islands")
    if not isinstance(phases, dict) or not set(PHASES) <= set(phases) <= set(ROLES):
        raise RoutingError(
            "`islands` must be an object with `prefill` and `decode` (and optionally `aggregated`), each {island: "
            f"{{engines, ranges}}}}, got {type(phases).__name__ if not isinstance(phases, dict) else sorted(phases)}"
        )
    phases = {AGGREGATED: {}, **phases}
    if not isinstance(phases[AGGREGATED], dict):
        raise RoutingError("`islands.aggregated` must be an object {island: {engines, ranges}}")
    islands: dict[str, tuple[Island, ...]] = {}
    shares: dict[str, dict[tuple[int, int], list[tuple[Island, float]]]] = {}
    for phase in ROLES:
        empty = not phases[phase] and not phases[AGGREGATED] and phase != AGGREGATED
        if not isinstance(phases[phase], dict) or empty:
            raise RoutingError(f"`islands.{phase}` must name at least one island: {{island: {{engines, ranges}}}}")
        found, by_range = [], shares.setdefault(phase, {})
        for name, isl in phases[phase].items():
            where = f"islands.{phase}.{name}"
            if not isinstance(isl, dict) or not isinstance(isl.get("engines"), list) or not isl["engines"]:
                raise RoutingError(f"{where}: must be an object with a non-empty list `engines` and `ranges`")
            engines = tuple(_url(e, f"{where}.engines[{j}]") for j, e in enumerate(isl["engines"]))
            if len(set(engines)) != len(engines):
                raise RoutingError(f"{where}.engines: an engine is listed twice")
            island = Island(str(name), engines)
            found.append(island)
            ranges = isl.get("ranges")
            if not isinstance(ranges, list) or not ranges:
                raise RoutingError(f"{where}.ranges: must be a non-empty list of [start, end, fraction]")
            for j, r in enumerate(ranges):
                if not isinstance(r, list) or len(r) != 3:
                    raise RoutingError(f"{where}.ranges[{j}]: must be [start, end, fraction], got {r!r}")
                start = _number(r[0], f"{where}.ranges[{j}][0] (start)", 0)
                end = _number(r[1], f"{where}.ranges[{j}][1] (end)", start + 1)
                frac = _number(r[2], f"{where}.ranges[{j}][2] (fraction)", 0, 1)
                if start != int(start) or end != int(end):
                    raise RoutingError(f"{where}.ranges[{j}]: start and end are whole token counts, got {r!r}")
                if frac > 0:
                    by_range.setdefault((int(start), int(end)), []).append((island, frac))
        islands[phase] = tuple(found)
    spans = sorted(set(shares["prefill"]) | set(shares["decode"]) | set(shares[AGGREGATED]))
    for a, b in itertools.pairwise(spans):
        if b[0] != a[1]:
            raise RoutingError(f"ranges [{a[0]}, {a[1]}) and [{b[0]}, {b[1]}) must meet end to start (no gap, no "
                               "overlap): write them as the plan's routing gives them")  # fmt: skip
    ranges = []
    for span in spans:
        both = shares[AGGREGATED].get(span, [])
        per_phase = {AGGREGATED: tuple(both)}
        for phase in PHASES:
            got = shares[phase].get(span, [])
            total = sum(f for _, f in got + both)
            if abs(total - 1.0) > FRACTION_TOLERANCE:
                named = ", ".join(f"island {i.name}: {f:g}" for i, f in got + both) or "no island serves it"
                theirs = " (aggregated islands' included)" if both else ""
                raise RoutingError(
                    f"range [{span[0]}, {span[1]}): its {phase} fractions{theirs} sum to {total:.6g}, not 1 ({named})"
                )
            per_phase[phase] = tuple(got)
        ranges.append(Range(span[0], span[1], per_phase))
    cpt = _number(config.get("chars_per_token", 4.0), "`chars_per_token`", 0.5, 64)
    port = _number(config.get("bootstrap_port", 8998), "`bootstrap_port`", 1, 65535)
    in_flight = _number(config.get("in_flight", 0), "`in_flight`", 0, 10_000_000)
    tokenizer = config.get("tokenizer")
    if tokenizer is not None and not isinstance(tokenizer, str):
        raise RoutingError(f"`tokenizer`: the path of the model's tokenizer.json, got {tokenizer!r}")
    health = config.get("health", {})
    if not isinstance(health, dict):
        raise RoutingError(f"`health`: an object {{engine URL: URL of its health check}}, got {type(health).__name__}")
    listed = {e for role in ROLES for isl in islands[role] for e in isl.engines}
    for engine in health:
        if engine.rstrip("/") not in listed:
            raise RoutingError(f"`health`: {engine!r} is not an engine of `islands`")
    checked = {k.rstrip("/"): _url(v, f"health.{k}") for k, v in health.items()}
    return Table(config["protocol"], tuple(ranges), islands, int(port), cpt, int(in_flight), tokenizer, checked)


def pick(
    table: Table, phase: str, tokens: int, rng: random.Random, down: Collection[str] = (), avoid: Collection[str] = ()
) -> tuple[Island, str] | None:
    """An (island, engine) for a prompt of `tokens` in `phase`: an island drawn with the plan's fractions for
    the range, then one of its engines at random. Engines in `down` or `avoid` are skipped; an island with
    none left gives its share to the range's other islands. None when no engine serving the range is left."""
    choices = []
    for island, frac in table.range_of(tokens).islands[phase]:
        ok = [e for e in island.engines if e not in down and e not in avoid] if down or avoid else island.engines
        if ok:
            choices.append((island, frac, ok))
    if not choices:
        return None
    x = rng.random() * sum(f for _, f, _ in choices)
    for island, frac, ok in choices:
        x -= frac
        if x < 0:
            return island, ok[int(rng.random() * len(ok))]
    island, _, ok = choices[-1]
    return island, ok[int(rng.random() * len(ok))]


def aggregated_first(
    table: Table, tokens: int, rng: random.Random, down: Collection[str] = (), avoid: Collection[str] = ()
) -> bool:
    """Does a prompt of `tokens` go to an aggregated island (True) or to a prefill and a decode island? Drawn with the
    range's fractions, among the islands with an engine up (`pick`'s rule): aggregated islands against the prefill
    islands they stand beside."""
    r = table.range_of(tokens)

    def up(role: str) -> float:
        return sum(f for isl, f in r.islands[role] if any(e not in down and e not in avoid for e in isl.engines))

    together, apart = up(AGGREGATED), up("prefill")
    return together > 0 and rng.random() * (together + apart) < together

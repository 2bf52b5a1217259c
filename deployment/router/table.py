"""routing.json, read, checked and indexed: which islands and engines serve a prompt of a given length, drawn with
the plan's fractions among the engines that are up.

`read` takes the file as a hostile one would be written: at most `MAX_TABLE_BYTES`, UTF-8, JSON nested at most
`MAX_DEPTH` deep (routing.json needs 6); `load` checks what it says, engine URLs included (http or https, a host, a
port 1-65535, no whitespace or control characters), and every problem is one RoutingError naming the field.
"""

from __future__ import annotations

import bisect
import hashlib
import ipaddress
import itertools
import math
import random
import re
import reprlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

PROTOCOLS = ("sglang", "vllm", "llmd")  # llmd: a decode engine's llm-d routing sidecar runs either
PHASES = ("prefill", "decode")
AGGREGATED = "aggregated"  # islands that prefill and decode a request themselves (optional in routing.json)
ROLES = (*PHASES, AGGREGATED)
FRACTION_TOLERANCE = 1e-6  # a range's fractions over its islands sum to 1 within this
MAX_TABLE_BYTES = 64 << 20  # a routing.json of 100,000 islands is ~17 MB
MAX_DEPTH = 32  # objects and lists nested in routing.json (it needs 6)
# an engine's base URL: http(s), a host (a DNS name, IPv4, or [IPv6]), an optional port, nothing after but one "/"
ENGINE_URL = re.compile(r"(https?)://([A-Za-z0-9_.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::([0-9]{1,5}))?/?")
HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_shown = reprlib.Repr()
_shown.maxstring = _shown.maxother = 80


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


def shown(value: Any) -> str:
    """`value` as a message shows it: its repr, cut short (a long or deeply nested value is not printed whole)."""
    return _shown.repr(value)


def read(path: str | Path) -> Table | Fleet:
    """routing.json from a file, checked: RoutingError says in one line what is off (unreadable, too large, not UTF-8,
    not JSON, nested too deep, or a table `load` refuses)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TABLE_BYTES + 1)
    except OSError as err:
        raise RoutingError(f"cannot read it ({err.strerror or err})") from None
    if len(data) > MAX_TABLE_BYTES:
        raise RoutingError(f"larger than the router reads ({MAX_TABLE_BYTES:,} bytes): give the routing.json "
                           "python -m pipeline.deploy wrote")  # fmt: skip
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RoutingError(f"not UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start:,}): write it as UTF-8") \
            from None  # fmt: skip
    try:
        config = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        if "depth" in err.msg:
            raise RoutingError(f"nested deeper than {MAX_DEPTH} (at line {err.lineno}): not a routing.json") from None
        raise RoutingError(f"not JSON ({err.msg}, line {err.lineno})") from None
    _check_depth(config)
    return load_any(config)


def _check_depth(config: Any) -> None:
    level, depth = [config], 0
    while level := [x for x in level if isinstance(x, dict | list)]:
        depth += 1
        if depth > MAX_DEPTH:
            raise RoutingError(f"nested deeper than {MAX_DEPTH}: not a routing.json")
        level = [v for x in level for v in (x.values() if isinstance(x, dict) else x)]


def _url(value: Any, where: str) -> str:
    """An engine's base URL, checked (http or https, a host, a port 1-65535, no whitespace or control characters)."""
    like = "like http://10.0.0.5:30000 (http or https, a host, a port 1-65535, no path)"
    if not isinstance(value, str):
        raise RoutingError(f"{where}: an engine must be a URL string {like}, got {shown(value)}")
    if not value.isascii() or not value.isprintable() or " " in value:
        raise RoutingError(f"{where}: {shown(value)} has whitespace, control or non-ASCII characters: an engine URL is "
                           f"{like}")  # fmt: skip
    m = ENGINE_URL.fullmatch(value)
    host = m.group(2) if m else ""
    if m and host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            m = None
    elif m and not all(HOST_LABEL.fullmatch(label) for label in host.removesuffix(".").split(".")):
        m = None
    if m is None:
        raise RoutingError(f"{where}: {shown(value)} is not an engine URL {like}")
    if m.group(3) is not None and not 1 <= int(m.group(3)) <= 65535:
        raise RoutingError(f"{where}: {shown(value)}: port {int(m.group(3))} is not a port (1-65535)")
    return value.rstrip("/")


def _number(value: Any, where: str, low: float, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RoutingError(f"{where}: must be a number in [{low}, {high}], got {shown(value)}")
    return float(value)


def load(config: Any) -> Table:
    """Check a routing.json (already parsed) and index it; RoutingError names what is off and where."""
    if not isinstance(config, dict):
        raise RoutingError(
            f"the top level must be an object with `protocol` and `islands`, got a {type(config).__name__}"
        )
    if config.get("protocol") not in PROTOCOLS:
        raise RoutingError(f"`protocol` must be one of {list(PROTOCOLS)}, got {shown(config.get('protocol'))}")
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
        for key, isl in phases[phase].items():
            name = str(key)
            where = f"islands.{phase}.{name}"
            if not (0 < len(name) <= 64 and name.isascii() and name.isprintable() and " " not in name):
                raise RoutingError(f"islands.{phase}: island {shown(name)}: its name must be 1-64 printable ASCII "
                                   "characters without spaces (the plan's island index)")  # fmt: skip
            if not isinstance(isl, dict) or not isinstance(isl.get("engines"), list) or not isl["engines"]:
                raise RoutingError(f"{where}: must be an object with a non-empty list `engines` and `ranges`")
            engines = tuple(_url(e, f"{where}.engines[{j}]") for j, e in enumerate(isl["engines"]))
            if len(set(engines)) != len(engines):
                raise RoutingError(f"{where}.engines: an engine is listed twice")
            island = Island(name, engines)
            found.append(island)
            ranges = isl.get("ranges")
            if not isinstance(ranges, list) or not ranges:
                raise RoutingError(f"{where}.ranges: must be a non-empty list of [start, end, fraction]")
            for j, r in enumerate(ranges):
                if not isinstance(r, list) or len(r) != 3:
                    raise RoutingError(f"{where}.ranges[{j}]: must be [start, end, fraction], got {shown(r)}")
                start = _number(r[0], f"{where}.ranges[{j}][0] (start)", 0)
                end = _number(r[1], f"{where}.ranges[{j}][1] (end)", start + 1)
                frac = _number(r[2], f"{where}.ranges[{j}][2] (fraction)", 0, 1)
                if start != int(start) or end != int(end):
                    raise RoutingError(f"{where}.ranges[{j}]: start and end are whole token counts, got {shown(r)}")
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
        raise RoutingError(f"`tokenizer`: the path of the model's tokenizer.json, got {shown(tokenizer)}")
    health = config.get("health", {})
    if not isinstance(health, dict):
        raise RoutingError(f"`health`: an object {{engine URL: URL of its health check}}, got {type(health).__name__}")
    listed = {e for role in ROLES for isl in islands[role] for e in isl.engines}
    for engine in health:
        if engine.rstrip("/") not in listed:
            raise RoutingError(f"`health`: {shown(engine)} is not an engine of `islands`")
    checked = {k.rstrip("/"): _url(v, f"health.{k}") for k, v in health.items()}
    return Table(config["protocol"], tuple(ranges), islands, int(port), cpt, int(in_flight), tokenizer, checked)


@dataclass(frozen=True)
class Fleet:
    """A routing.json of several models (`{"models": {model: routing table}, "aliases": {name: model}}`, a fleet
    plan's): a request goes to the table of the model its OpenAI `model` field names (the model's name, or an alias:
    the name its engines serve it under, their weights' path), then by its length as that table routes it."""

    tables: dict[str, Table]
    aliases: dict[str, str]

    def model_of(self, name: Any) -> str | None:
        """The model a request's `model` field names (None: none served here)."""
        if not isinstance(name, str):
            return None
        return name if name in self.tables else self.aliases.get(name)

    @property
    def names(self) -> list[str]:
        return sorted({*self.tables, *self.aliases})

    @property
    def whole(self) -> Table:
        """Every model's islands in one table (island names `model/island`): the engines the router keeps pools,
        health checks and metrics for. Its ranges are none: a request is routed by its model's own table."""
        first = next(iter(self.tables.values()))
        islands = {role: tuple(Island(f"{m}/{i.name}", i.engines) for m, t in self.tables.items()
                               for i in t.islands[role]) for role in ROLES}  # fmt: skip
        return Table(first.protocol, (), islands, first.bootstrap_port, first.chars_per_token,
                     sum(t.in_flight for t in self.tables.values()), None,
                     {e: h for t in self.tables.values() for e, h in t.health.items()})  # fmt: skip


def load_any(config: Any) -> Table | Fleet:
    """A routing.json of one model (`load`) or of several (`models`: `load_fleet`)."""
    return load_fleet(config) if isinstance(config, dict) and "models" in config else load(config)


def load_fleet(config: dict[str, Any]) -> Fleet:
    """Check a fleet's routing.json: every model's table as `load` checks one, no engine serving two models, every
    alias naming a model of it; RoutingError names what is off and where."""
    extra = sorted(set(config) - {"models", "aliases"})
    if extra:
        raise RoutingError(f"a fleet's routing.json has `models` and `aliases` only, got {shown(extra[0])}")
    models = config["models"]
    if not isinstance(models, dict) or not models:
        raise RoutingError("`models` must be an object {model: routing table} naming at least one model")
    tables: dict[str, Table] = {}
    owner: dict[str, str] = {}
    for name, cfg in models.items():
        if not (0 < len(name) <= 200 and name.isascii() and name.isprintable()):
            raise RoutingError(f"models: {shown(name)} is not a model name (1-200 printable ASCII characters)")
        try:
            t = load(cfg)
        except RoutingError as err:
            raise RoutingError(f"models.{name}: {err}") from None
        for e in t.engines:
            if e in owner:
                raise RoutingError(f"models.{name}: engine {e} serves {owner[e]} too: an engine serves one model")
            owner[e] = name
        tables[name] = t
    protocols = sorted({t.protocol for t in tables.values()})
    if len(protocols) > 1:
        raise RoutingError(f"models: every model's engines must speak one protocol, got {protocols}")
    aliases = config.get("aliases") or {}
    if not isinstance(aliases, dict):
        raise RoutingError("`aliases` must be an object {name a request may give: model}")
    for alias, model in aliases.items():
        if model not in tables or not isinstance(alias, str) or not alias.isprintable():
            raise RoutingError(f"aliases.{shown(alias)}: must name a model of `models` ({sorted(tables)}), got "
                               f"{shown(model)}")  # fmt: skip
    return Fleet(tables, dict(aliases))


LOAD_BOUND = 1.25  # a session's engine is skipped while its prompt tokens in flight would pass this x their mean


def pick(
    table: Table, phase: str, tokens: int, rng: random.Random, down: Collection[str] = (), avoid: Collection[str] = (),
    session: str | None = None, load: Mapping[str, int] | None = None, last: tuple[str, int] | None = None,
) -> tuple[Island, str] | None:
    """An (island, engine) for a prompt of `tokens` in `phase`, among the range's islands' engines not in `down` or
    `avoid` (an island with none left gives its share to the range's other islands); None when none is left.

    With a `session`: the engine its `last` turn went to (engine, prompt tokens) where it serves the range, then
    weighted rendezvous hashing over all of them, each engine weighted by its island's fraction over the island's
    engines up, so the range's traffic splits as the plan says and a session's turns reach one engine (whose prefix
    cache holds the conversation) while their lengths keep to islands that engine belongs to; an engine lost moves
    only its own sessions. With `load` (prefill work in flight on each engine, `work`), the first engine whose load
    would stay within `LOAD_BOUND` x the mean, this prompt's work counted (consistent hashing with bounded loads,
    Mirrokni et al. 2018, in a prefill's work), so one hot session, prompt or long document cannot swamp an
    engine. Without a session: an island drawn with the plan's fractions, one of its engines at random."""
    choices = []
    for island, frac in table.range_of(tokens).islands[phase]:
        ok = [e for e in island.engines if e not in down and e not in avoid] if down or avoid else island.engines
        if ok:
            choices.append((island, frac, ok))
    if not choices:
        return None
    if session is not None:
        engines = [(island, e, frac / len(ok)) for island, frac, ok in choices for e in ok]
        home = last[0] if last is not None else None
        ranked = sorted(engines, key=lambda c: (c[1] != home, _draw(session, c[1]) / max(c[2], 1e-300)))
        if load:
            total = sum(load.get(e, 0) for _, e, _ in engines)
            for island, e, _ in ranked:
                w = work(tokens, e, last)
                if load.get(e, 0) + w <= LOAD_BOUND * (total + w) / len(engines):
                    return island, e
        return ranked[0][0], ranked[0][1]
    x = rng.random() * sum(f for _, f, _ in choices)
    chosen = choices[-1]  # where rounding leaves x >= 0 past them all
    for choice in choices:
        x -= choice[1]
        if x < 0:
            chosen = choice
            break
    island, _, ok = chosen
    return island, ok[int(rng.random() * len(ok))]


def work(tokens: int, engine: str, last: tuple[str, int] | None) -> int:
    """A prompt's prefill work on `engine`: its tokens, less its session's `last` prompt where that engine
    prefilled it (its prefix cache should hold it; a router cannot see the cache, only where it sent what)."""
    return tokens - last[1] if last is not None and last[0] == engine and last[1] < tokens else tokens


def _draw(session: str, engine: str) -> float:
    """Weighted rendezvous hashing's draw of `engine` for `session`: -ln of a uniform hash in (0, 1); the session
    goes to the engine of the smallest draw over weight."""
    h = int.from_bytes(hashlib.blake2b(f"{session}\0{engine}".encode("utf-8", "surrogatepass"), digest_size=8).digest())
    return -math.log((h + 0.5) / 2.0**64)


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

"""The router's aiohttp application: OpenAI-compatible in front, the plan's disaggregated engines behind.

One request's path (`forward`):
1. admission: past `max_in_flight` requests the router answers 503 at once (Retry-After), so an
   overload sheds instead of queueing without bound;
2. the prompt's length in tokens (`tokens.Counter`) picks the plan's range; an aggregated island, or a
   prefill and a decode island, are drawn with the range's fractions, then an engine of each that is up
   (`table.aggregated_first`, `table.pick`): for prefill and aggregated engines the session's (`X-Session-Id`,
   else OpenAI's `user`, else the prompt's opening: `prompt_key`): the engine its last turn went to, else the one
   weighted rendezvous hashing over the range's islands gives, so a conversation's turns find their prefix in that
   engine's cache, an engine whose work in flight would pass its bounded load passing the turn on; an aggregated
   engine gets the request as sent and its answer is the client's;
3. the engines' protocol: SGLang sends the request (bootstrap host, port and room added) to both at
   once and answers with the decode engine's stream; vLLM sends it to prefill first (one token,
   `do_remote_decode`) and then to decode with the prefill's `kv_transfer_params`; llm-d sends it to
   the decode engine's routing sidecar with the prefill engine in `x-prefiller-host-port`, and the
   sidecar runs the engines' protocol;
4. an engine that refuses the connection, resets it, or fails its health check is marked down and
   the request is sent again to another engine (of the same island when it has one, else another
   island the range allows), up to `retries` times, as long as nothing has been sent to the client.

Answers the router makes itself are JSON `{"error": reason}`: 400 a malformed request, 401 a
missing or wrong API key, 408 a body that did not arrive within `body_timeout_s` (the connection is
then closed), 413 a body past `max_body_bytes`, 502 an engine that failed or sent what is not HTTP
before its answer's first byte, 503 no engine up for the range or the router full, 504 an engine that
did not answer within `timeout_s`. An engine that fails once its answer is streaming to the client
cannot be answered with a status: an event stream gets an SSE error event, then the connection is
closed without the stream's end (no last chunk, or fewer bytes than its Content-Length), so the
client can tell its answer was cut. A reason names the engine as `<phase> engine <island>/<index>`;
its URL is only in the router's log and in `GET /routing`, which needs the API key. `GET /health`
(engines up, draining or not) and `GET /metrics` (Prometheus) are the operator's. Client connections'
limits (header and body timeouts, the connection cap) are `clients`'.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import hmac
import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import orjson
from aiohttp import web

from deployment.router.clients import Clients
from deployment.router.metrics import Metrics
from deployment.router.table import AGGREGATED, Fleet, Island, Table, aggregated_first, pick, shown, work
from deployment.router.tokens import BadRequest, Counter, prompt_text
from deployment.router.upstream import Answer, EngineDown, Pool

PATHS = ("/v1/completions", "/v1/chat/completions", "/generate")
STATE = web.AppKey("state", "Router")
HEALTH_CHECKS_AT_ONCE = 128  # engines' health asked at once, at most (a plan of thousands opens no thousands)
# a request's conversation (`session_of`), for the engines that keep prompts' prefixes: prefill and aggregated ones
SESSION: contextvars.ContextVar[str | None] = contextvars.ContextVar("session", default=None)
# the engines of cached phases a request was sent to and its tokens (their loads, `Router.load`, fall when it ends)
HELD: contextvars.ContextVar[list[tuple[str, int]] | None] = contextvars.ContextVar("held", default=None)
# a fleet's request: the table of the model it names (`Router.table`; None: the router's one table)
TABLE: contextvars.ContextVar[Table | None] = contextvars.ContextVar("table", default=None)
SESSION_HEADER = "X-Session-Id"
SESSION_CHARS = 1024  # a session id longer than this is cut (it is only hashed)
SESSIONS_KEPT = 1 << 18  # sessions whose last engine the router remembers (least recently seen forgotten first)
PROMPT_KEY_CHARS = 4096  # a text prompt's session key: a hash of its first this many characters (about 1,000 tokens)
CACHED_PHASES = ("prefill", AGGREGATED)
IDLE_ROOM = 1024  # client connections past the requests admitted (by default): idle ones, at most, while all are busy
DAY_S = 86_400.0
# each setting's bounds: (low, high, whether low itself is allowed); every one a finite number, the counts whole
LIMITS: dict[str, tuple[float, float, bool]] = {
    "max_in_flight": (0, 10_000_000, True), "timeout_s": (0, DAY_S, False), "connect_timeout_s": (0, DAY_S, False),
    "health_interval_s": (0, DAY_S, True), "retries": (0, 100, True), "max_body_bytes": (1, 1 << 31, True),
    "header_timeout_s": (0, DAY_S, False), "body_timeout_s": (0, DAY_S, False),
    "max_connections": (0, 10_000_000, True), "drain_seconds": (0, DAY_S, True),
}  # fmt: skip
log = logging.getLogger("archipelago.router")


def out_of_bounds(name: str, value: object, integer: bool) -> str | None:
    """What is wrong with `value` for the setting `name` (LIMITS), or None."""
    low, high, closed = LIMITS[name]
    kind = "a whole number" if integer else "a finite number"
    number = isinstance(value, int) if integer else isinstance(value, int | float) and math.isfinite(value)
    if isinstance(value, bool) or not number or not (low <= value if closed else low < value) or value > high:
        return f"{value!r} is not {kind} in {'[' if closed else '('}{low:g}, {high:g}]"
    return None


@dataclass(frozen=True)
class Settings:
    """How the router behaves under load and faults (the command's options)."""

    api_key: str | None = None  # Bearer key every endpoint but /health requires (None: none, and no /routing)
    max_in_flight: int = 0  # requests admitted at once; past it 503 (0: 2 x the plan's in-flight, at least 1,024)
    timeout_s: float = 600.0  # an engine silent this long (no byte) is abandoned: 504, or a cut stream
    connect_timeout_s: float = 1.0  # an engine that does not accept a connection within this is down
    health_interval_s: float = 2.0  # every engine's /health is asked this often (timeout: the same, at most 1 s)
    retries: int = 2  # times a request is sent to another engine after a connection failure
    max_body_bytes: int = 8 * 1024 * 1024
    # the model's tokenizer.json, which must be readable (None: routing.json's `tokenizer` where that file exists on
    # this host, else prompts estimated as characters / chars_per_token)
    tokenizer: str | None = None
    # a client connection that has not sent a whole request head within this of opening or of its last answer is
    # closed (aiohttp's keepalive_timeout: an idle kept-alive connection is closed after it too)
    header_timeout_s: float = 15.0
    body_timeout_s: float = 30.0  # a request's body arrives within this of its head, else 408 and the connection closed
    # client connections open at most; one more closes the one idle longest (no request in progress), never a busy
    # one (0: the requests admitted + IDLE_ROOM)
    max_connections: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in LIMITS and (why := out_of_bounds(f.name, getattr(self, f.name), f.type == "int")):
                raise ValueError(f"`{f.name}`: {why}")
        key = self.api_key
        if key is not None and not (key and key.isascii() and key.isprintable() and " " not in key):
            raise ValueError("the API key must be printable ASCII characters without spaces (it travels in the "
                             "Authorization header)")  # fmt: skip

    def tokenizer_of(self, table: Table) -> str | None:
        """The tokenizer the router counts with: the one given, else routing.json's where this host has it."""
        if self.tokenizer is not None:
            return self.tokenizer
        return table.tokenizer if table.tokenizer and Path(table.tokenizer).exists() else None

    def admitted(self, table: Table) -> int:
        return self.max_in_flight or max(2 * table.in_flight, 1024)


class Router:
    """The state one running router keeps: the table, which engines are down, the HTTP client, metrics."""

    def __init__(self, table: Table | Fleet, settings: Settings, seed: int | None = None) -> None:
        # a fleet: each request is routed by its model's table (`TABLE`); pools, health and metrics span every model
        self.fleet = table if isinstance(table, Fleet) else None
        table = table.whole if isinstance(table, Fleet) else table
        self.whole, self.settings = table, settings
        self.rng = random.Random(seed)
        self.count = Counter(settings.tokenizer_of(table), table.chars_per_token)
        self.counts = {m: Counter(settings.tokenizer_of(t), t.chars_per_token)
                       for m, t in self.fleet.tables.items()} if self.fleet else {}  # fmt: skip
        self.capacity = settings.admitted(table)
        self.in_flight = 0
        self.load: dict[str, int] = {}  # prefill work in flight per prefill and aggregated engine (bounded loads)
        # each session's last turn: (engine, prompt tokens), the most recent SESSIONS_KEPT sessions
        self.sessions: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self.down: set[str] = set()
        self.draining = False
        self.names = {e: (phase, isl.name, j) for phase in table.islands for isl in table.islands[phase]
                      for j, e in enumerate(isl.engines)}  # fmt: skip
        self.metrics = Metrics(self.names, self.down)
        self.clients = Clients(settings.max_connections or self.capacity + IDLE_ROOM)
        self.pools = {e: Pool(e, settings.connect_timeout_s, settings.timeout_s) for e in table.engines}
        # engines whose health is asked elsewhere (routing.json's `health`; llm-d: the engine behind its routing
        # sidecar, whose own /health answers 200 whatever the engine's state)
        self.health_pools = {e: Pool(url, settings.connect_timeout_s, settings.timeout_s)
                             for e, url in table.health.items()}  # fmt: skip
        self.checker: asyncio.Task[None] | None = None

    @property
    def table(self) -> Table:
        """The table the request in progress is routed by: its model's in a fleet, else the router's one."""
        return TABLE.get() or self.whole

    async def tokens(self, body: dict[str, Any]) -> int:
        """The prompt's tokens; in a fleet, the request's model's table set first (UnknownModel where it names
        none served here)."""
        if self.fleet is None:
            return await self.count(body)
        model = self.fleet.model_of(body.get("model"))
        if model is None:
            raise UnknownModel(f"model {shown(body.get('model'))} is not served here: `model` must be one of "
                               f"{self.fleet.names}")  # fmt: skip
        TABLE.set(self.fleet.tables[model])
        return await self.counts[model](body)

    def remember(self, session: str, engine: str, tokens: int) -> None:
        self.sessions[session] = (engine, tokens)
        self.sessions.move_to_end(session)
        if len(self.sessions) > SESSIONS_KEPT:
            self.sessions.popitem(last=False)

    def name(self, url: str) -> str:
        phase, island, j = self.names[url]
        return f"{phase} engine {island}/{j}"

    def mark(self, url: str, up: bool, why: str = "") -> None:
        if up and url in self.down:
            self.down.discard(url)
            log.warning("%s (%s) is up again", self.name(url), url)
        elif not up and url not in self.down:
            self.down.add(url)
            log.warning("%s (%s) is down: %s; its requests go to the others", self.name(url), url, why)

    async def check_health(self) -> None:
        """Ask every engine's /health, forever, at most HEALTH_CHECKS_AT_ONCE at a time; an answer other than 200
        within the timeout marks it down. A check opens a connection only where the engine has no idle one, and closes
        it after: a plan of many engines keeps no connection per engine for its health."""
        timeout = min(self.settings.health_interval_s, 1.0)
        whole = self.settings.connect_timeout_s + 2 * timeout  # a check that trickles its answer ends too

        async def one(url: str) -> None:
            try:
                pool = self.health_pools.get(url) or self.pools[url]
                async with asyncio.timeout(whole):
                    r = await pool.request("GET", "/health", read_s=timeout, keep=False)
                    await r.read()
                self.mark(url, r.status == 200, f"/health answered {r.status}")
            except EngineDown as err:
                self.mark(url, False, f"/health: {err.why}")
            except TimeoutError:
                self.mark(url, False, f"/health: no whole answer within {whole:g} s")

        async def worker(urls: Iterator[str]) -> None:
            for url in urls:  # (one iterator shared by the workers: each engine is asked once a round)
                await one(url)

        while True:
            urls = iter(self.table.engines)
            await asyncio.gather(*(worker(urls) for _ in range(min(HEALTH_CHECKS_AT_ONCE, len(self.pools)))))
            await asyncio.sleep(self.settings.health_interval_s)


def app(config: dict[str, Any] | Table | Fleet, settings: Settings | None = None,
        seed: int | None = None) -> web.Application:  # fmt: skip
    """The router for a routing.json (parsed; one model's or a fleet's) or a checked table."""
    from deployment.router.table import load_any

    table = config if isinstance(config, Table | Fleet) else load_any(config)
    router = Router(table, settings or Settings(), seed)
    # aiohttp's own limits: keepalive_timeout is the header timeout (clients.py); a head's line and field sizes and
    # header count stay at its defaults (8,190 bytes, 8,190 bytes, 128)
    application = web.Application(client_max_size=router.settings.max_body_bytes, middlewares=[_guard],
                                  handler_args={"keepalive_timeout": router.settings.header_timeout_s})  # fmt: skip
    application[STATE] = router

    async def start(a: web.Application) -> None:
        if router.settings.health_interval_s > 0:
            router.checker = asyncio.create_task(router.check_health())

    async def shutdown(a: web.Application) -> None:
        router.draining = True  # /health answers 503 so a load balancer stops sending; in-flight requests finish

    async def stop(a: web.Application) -> None:
        if router.checker:
            router.checker.cancel()
        for pool in [*router.pools.values(), *router.health_pools.values()]:
            pool.close()

    for path in PATHS:
        application.router.add_post(path, forward)
    application.router.add_get("/routing", routing_view)
    application.router.add_get("/health", health)
    application.router.add_get("/metrics", metrics_view)
    application.on_startup.append(start)
    application.on_shutdown.append(shutdown)
    application.on_cleanup.append(stop)
    return application


JSON_HEADERS = {"Content-Type": "application/json"}
WHOLE_ANSWER_BYTES = 1 << 20  # an engine answer up to this long is read whole, then sent in one write


def _extend(raw: bytes, body: dict[str, Any], extra: dict[str, Any], drop: tuple[str, ...] = ()) -> bytes:
    """The request's JSON with `extra`'s keys set: spliced onto the client's bytes when none is there already
    (no second encoding of a long prompt), else encoded again."""
    if any(k in body for k in extra) or any(k in body for k in drop):
        return orjson.dumps({**{k: v for k, v in body.items() if k not in drop}, **extra})
    end = raw.rstrip().rfind(b"}")
    return raw[:end] + (b"," if body else b"") + orjson.dumps(extra)[1:-1] + b"}"


def _error(status: int, reason: str, **headers: str) -> web.Response:
    return web.json_response({"error": reason}, status=status, headers=headers or None)


@web.middleware
async def _guard(request: web.Request, handler: Any) -> web.StreamResponse:
    """The API key (every path but /health), the router's own answers to what aiohttp refuses, and the connection
    marked busy while its request is in progress (the connection cap closes only idle ones)."""
    router = request.app[STATE]
    transport = request.transport
    router.clients.busy(transport)
    try:
        key = router.settings.api_key
        if key is not None and request.path != "/health":
            # (a header's bytes that are not UTF-8 come as surrogates: encoded back as they came, they just differ)
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, f"Bearer {key}".encode()):
                return _error(401, "missing or wrong API key: send `Authorization: Bearer <key>`")
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"the request body is larger than the router's {router.settings.max_body_bytes:,} bytes")
    except web.HTTPException as err:
        if err.status >= 400:
            return _error(err.status, err.reason)
        raise
    finally:
        router.clients.done(transport)


async def routing_view(request: web.Request) -> web.Response:
    router = request.app[STATE]
    if router.settings.api_key is None:
        return _error(403, "the routing table names every engine: start the router with an API key to read it")
    t = router.table
    return web.json_response({
        "protocol": t.protocol,
        "ranges": [{"start": r.start, "end": r.end, **{ph: [[i.name, f] for i, f in r.islands[ph]] for ph in r.islands}}
                   for r in t.ranges],
        "islands": {ph: {i.name: list(i.engines) for i in t.islands[ph]} for ph in t.islands},
        "down": sorted(router.down),
    })  # fmt: skip


async def health(request: web.Request) -> web.Response:
    router = request.app[STATE]
    up = {ph: sum(e not in router.down for i in router.table.islands[ph] for e in i.engines)
          for ph in router.table.islands if router.table.islands[ph]}  # fmt: skip
    ok = not router.draining and all(up.values())
    body = {"ok": ok, "draining": router.draining, "engines_up": up, "in_flight": router.in_flight}
    return web.json_response(body, status=200 if ok else 503)


async def metrics_view(request: web.Request) -> web.Response:
    router = request.app[STATE]
    return web.Response(body=router.metrics.render(router.in_flight, router.clients.counts()),
                        content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})  # fmt: skip


class UnknownModel(BadRequest):
    """A fleet's request names a model none of its tables serves (404, as OpenAI's API answers it)."""


class SlowClient(Exception):
    """The request's body did not arrive within `body_timeout_s`."""


async def _body(request: web.Request, settings: Settings) -> tuple[bytes, dict[str, Any]]:
    """The request's body, read within `body_timeout_s`, and its JSON object. BadRequest, SlowClient, or aiohttp's
    413 for a body past `max_body_bytes` (at once when its Content-Length says so)."""
    if (request.content_length or 0) > settings.max_body_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=settings.max_body_bytes, actual_size=request.content_length)
    try:
        async with asyncio.timeout(settings.body_timeout_s):
            raw = await request.read()
    except TimeoutError:
        raise SlowClient from None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        if "utf-8" in str(err).lower():
            raise BadRequest("the request body is not UTF-8") from None
        raise BadRequest(f"the request body is not JSON ({err.msg} at character {err.pos})") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got a JSON {type(body).__name__}")
    return raw, body


async def forward(request: web.Request) -> web.StreamResponse:
    router: Router = request.app[STATE]
    if router.draining:
        return _error(503, "the router is shutting down", **{"Retry-After": "1"})
    if router.in_flight >= router.capacity:
        router.metrics.answered("shed")
        return _error(503, f"the router is full: {router.in_flight} requests in flight (its limit)",
                      **{"Retry-After": "1"})  # fmt: skip
    router.in_flight += 1
    HELD.set([])  # (a connection's requests share one context: each starts its own list)
    started = time.perf_counter()
    outcome = "error"
    try:
        try:
            raw, body = await _body(request, router.settings)
            tokens = await router.tokens(body)
        except BadRequest as err:
            outcome = "bad_request"
            return _error(404 if isinstance(err, UnknownModel) else 400, str(err))
        except SlowClient:
            outcome = "client_timeout"
            return await _closing(request, _error(408, f"the request body did not arrive within "
                                                       f"{router.settings.body_timeout_s:g} s"))  # fmt: skip
        SESSION.set(session_of(request, body))
        if aggregated_first(router.table, tokens, router.rng, router.down):
            response, outcome = await _aggregated(router, request, raw, tokens)
            if outcome != "unavailable" or not router.table.range_of(tokens).islands["prefill"]:
                return response  # (with every aggregated engine of the range down, prefill and decode take it)
        sender = SENDERS[router.table.protocol]
        response, outcome = await sender(router, request, raw, body, tokens)
        return response
    finally:
        router.in_flight -= 1
        for engine, tokens in HELD.get() or ():
            router.load[engine] -= tokens
        router.metrics.answered(outcome, time.perf_counter() - started)


def _unavailable(router: Router, phase: str, tokens: int, tried: set[str]) -> web.Response:
    r = router.table.range_of(tokens)
    names = [router.name(e) for isl, _ in r.islands[phase] for e in isl.engines]
    why = f"no {phase} engine is up for a {tokens}-token prompt (range [{r.start}, {r.end}): {', '.join(names)}" + (
        f"; tried {', '.join(router.name(e) for e in sorted(tried))})" if tried else " down)"
    )
    return _error(503, why, **{"Retry-After": "1"})


def _choose(router: Router, phase: str, tokens: int, tried: set[str]) -> tuple[Island, str] | None:
    """`pick`, a request's session kept on one engine where prompts are prefilled (its prefix cache), that engine's
    load bounded (`table.LOAD_BOUND`)."""
    if phase not in CACHED_PHASES:
        return pick(router.table, phase, tokens, router.rng, router.down, tried)
    session = SESSION.get()
    last = router.sessions.get(session) if session is not None else None
    got = pick(router.table, phase, tokens, router.rng, router.down, tried, session, router.load, last)
    held = HELD.get()
    if got is not None and held is not None:
        w = work(tokens, got[1], last)
        router.load[got[1]] = router.load.get(got[1], 0) + w
        held.append((got[1], w))
        if session is not None:
            router.remember(session, got[1], tokens)
    return got


def session_of(request: web.Request, body: dict[str, Any]) -> str | None:
    """The conversation a request belongs to: its `X-Session-Id` header, else its OpenAI `user` field, else its
    prompt's opening (`prompt_key`); None for a request with no prompt (it goes to a random engine of its island)."""
    header = request.headers.get(SESSION_HEADER, "").strip()
    if header:
        return "session:" + header[:SESSION_CHARS]
    user = body.get("user") if isinstance(body, dict) else None
    if isinstance(user, str) and user.strip():
        return "user:" + user[:SESSION_CHARS]
    return prompt_key(body)


def prompt_key(body: dict[str, Any]) -> str | None:
    """A key that a conversation's turns share and other conversations do not: a chat's messages up to its first
    user message (its system prompt and opening, which every later turn resends), a text prompt's first
    `PROMPT_KEY_CHARS` characters, token ids' first quarter as many; hashed. Two conversations that open alike share
    an engine, and so their prefix, within the engines' bounded loads."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if isinstance(messages, list) and messages:
        upto = next((k for k, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
                    len(messages) - 1)  # fmt: skip
        opening = orjson.dumps([[m.get("role"), m.get("content")] if isinstance(m, dict) else m
                                for m in messages[:upto + 1]], option=orjson.OPT_SORT_KEYS)  # fmt: skip
    else:
        try:
            prompt = prompt_text(body)
        except BadRequest:
            return None
        opening = (orjson.dumps(prompt[:PROMPT_KEY_CHARS // 4]) if isinstance(prompt, list)
                   else prompt[:PROMPT_KEY_CHARS].encode("utf-8", "surrogatepass"))  # fmt: skip
    if not opening:
        return None
    return "prompt:" + hashlib.blake2b(opening, digest_size=16).hexdigest()


async def _post(router: Router, url: str, path: str, body: bytes) -> Answer:
    """POST to an engine; its answer with the status and headers read (EngineDown when it cannot be reached)."""
    return await router.pools[url].request("POST", path, body)


def _failed(router: Router, err: EngineDown) -> tuple[web.Response, str]:
    """The client's answer when an engine failed before its answer's first byte and no retry is left (or allowed):
    504 or 502."""
    if err.timed_out:
        return _error(504, f"{router.name(err.url)} did not answer within {router.settings.timeout_s:g} s"), "timeout"
    return _error(502, f"{router.name(err.url)} failed: {err.why}"), "engine_error"


def _down(router: Router, err: EngineDown) -> None:
    """An engine's failure counted and logged; one that cannot be reached is marked down (a timeout is not: a busy
    engine is not a dead one; nor is a malformed answer: its health check decides)."""
    router.metrics.upstream_error(err.url, err.kind, err.mid_answer)
    if err.kind == "connection":
        router.mark(err.url, False, err.why)  # (logged once, when it goes down)
    if err.kind != "connection" or err.mid_answer:
        cut = "mid-answer, the client's answer cut" if err.mid_answer else "before its answer"
        log.warning("%s (%s) failed %s: %s", router.name(err.url), err.url, cut, err.why)


async def _closing(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """`response` sent, then the client's connection closed (what it has not sent of its request is not waited for)."""
    response.force_close()
    try:
        await response.prepare(request)
        await response.write_eof()
    except (ConnectionError, OSError):
        pass
    request.protocol.force_close()
    return response


def _stream_error(router: Router, err: EngineDown) -> bytes:
    """The SSE event that tells a streaming client its answer was cut (OpenAI's clients raise it as an APIError)."""
    status, kind = (504, "timeout") if err.timed_out else (502, "engine_error")
    message = f"{router.name(err.url)} failed mid-answer: {err.why}; the answer is incomplete"
    return b"data: " + orjson.dumps({"error": {"message": message, "type": kind, "code": status}}) + b"\n\n"


async def _relay(
    router: Router, request: web.Request, r: Answer, served: dict[str, str]
) -> tuple[web.StreamResponse, str]:
    """Engine answer `r` back to the client, headers naming the islands and engines that served it: read whole and
    sent in one write when its length is known and small (most non-streamed answers), else streamed as it comes,
    its first piece read before the client's answer begins (a failure before it is still a 502 or 504). An engine
    that fails once the client's answer has begun cuts it: an event stream gets an SSE error event, and the
    connection is closed without the answer's end. The response and its outcome for the metrics."""
    outcome = "ok" if r.status < 400 else "engine_status"
    if r.length is not None and r.length <= WHOLE_ANSWER_BYTES:
        try:
            body = await r.read()
        except EngineDown as err:
            _down(router, err)
            return _failed(router, err)
        return web.Response(status=r.status, body=body, headers={**served, "Content-Type": r.content_type}), outcome
    pieces = r.chunks()
    try:
        first = await anext(pieces, None)
    except EngineDown as err:
        _down(router, err)
        return _failed(router, err)
    out = web.StreamResponse(status=r.status, headers=served)
    out.content_type = r.content_type
    if r.length is not None:
        out.content_length = r.length
    try:
        await out.prepare(request)
        if first is not None:
            await out.write(first)
            async for piece in pieces:
                await out.write(piece)
        await out.write_eof()
    except EngineDown as err:  # the client's answer has begun: cut it so that the client can tell
        _down(router, err)
        outcome = "timeout" if err.timed_out else "engine_error"
        if r.content_type == "text/event-stream":
            try:
                await out.write(_stream_error(router, err))
            except (ConnectionError, OSError):
                pass
        request.protocol.force_close()  # (no last chunk, or fewer bytes than its Content-Length)
    except (ConnectionError, OSError):  # the client went away: the engine's answer is dropped with its connection
        pass
    finally:
        await pieces.aclose()
        r.release()
    return out, outcome


async def _aggregated(router: Router, request: web.Request, raw: bytes, tokens: int) -> tuple[web.StreamResponse, str]:
    """An aggregated engine prefills and decodes the request itself: the request as the client sent it, its answer
    the client's (another engine of the range's aggregated islands while one cannot be reached)."""
    tried: set[str] = set()
    url, got = await _one_of(router, AGGREGATED, tokens, tried, lambda u: _post(router, u, request.path, raw))
    if url is None:
        return got
    served = {"X-Archipelago-Aggregated": "/".join(map(str, router.names[url][1:]))}
    return await _relay(router, request, got, served)


def _served(router: Router, pre: str, dec: str) -> dict[str, str]:
    return {"X-Archipelago-Prefill": "/".join(map(str, router.names[pre][1:])),
            "X-Archipelago-Decode": "/".join(map(str, router.names[dec][1:]))}  # fmt: skip


async def _sglang(
    router: Router, request: web.Request, raw: bytes, body: dict[str, Any], tokens: int
) -> tuple[web.StreamResponse, str]:
    """SGLang PD: both engines at once, one bootstrap room; the decode engine's answer is the client's.

    The decode engine's answer is relayed once the prefill engine has answered too (its answer comes
    when the prompt's KV has left for the decode engine, before the first token), so a prefill engine
    that fails sends the pair again, to other engines, before the client has seen a byte."""
    tried: set[str] = set()
    for attempt in range(router.settings.retries + 1):
        p, d = _choose(router, "prefill", tokens, tried), _choose(router, "decode", tokens, tried)
        if p is None or d is None:
            return _unavailable(router, "prefill" if p is None else "decode", tokens, tried), "unavailable"
        pre, dec = p[1], d[1]
        sent = _extend(
            raw,
            body,
            {
                "bootstrap_host": urlparse(pre).hostname,
                "bootstrap_port": router.table.bootstrap_port,
                "bootstrap_room": router.rng.getrandbits(63),
            },
        )
        prefill = asyncio.ensure_future(_prefill_sglang(router, pre, request.path, sent))
        decode = asyncio.ensure_future(_post(router, dec, request.path, sent))
        await asyncio.wait((prefill, decode), return_when=asyncio.FIRST_EXCEPTION)
        failed = _first_failure(prefill, decode)
        refused = prefill.result() if failed is None else None
        if failed is not None or refused is not None:
            _abandon(prefill, decode)
        if refused is not None:  # the prefill engine's refusal (e.g. a prompt past its context) is the answer
            status, payload, ctype = refused
            return web.Response(status=status, body=payload, content_type=ctype, headers=_served(router, pre, dec)), \
                "engine_status"  # fmt: skip
        if failed is not None:
            _down(router, failed)
            tried.add(failed.url)
            if failed.kind != "connection" or attempt == router.settings.retries:
                return _failed(router, failed)
            router.metrics.retried()
            continue
        r = decode.result()
        return await _relay(router, request, r, _served(router, pre, dec))
    raise AssertionError("unreachable")


def _abandon(*tasks: asyncio.Future[Any]) -> None:
    """Cancel engine requests still running and close answers already begun (the engine sees the client go)."""
    for t in tasks:
        if not t.done():
            t.cancel()
        elif not t.cancelled() and t.exception() is None and hasattr(t.result(), "close"):
            t.result().close()


async def _prefill_sglang(router: Router, url: str, path: str, body: bytes) -> tuple[int, bytes, str] | None:
    """The prefill engine's part: None when it answered 200 (its answer is not the client's), else its refusal."""
    r = await _post(router, url, path, body)
    payload = await r.read()
    return None if r.status < 400 else (r.status, payload, r.content_type or "application/json")


def _first_failure(*tasks: asyncio.Future[Any]) -> EngineDown | None:
    for t in tasks:
        if t.done() and not t.cancelled() and isinstance(t.exception(), EngineDown):
            return t.exception()  # type: ignore[return-value]
    return None


async def _one_of(router: Router, phase: str, tokens: int, tried: set[str], send: Any) -> tuple[str | None, Any]:
    """`await send(url)` on an engine of `phase` for a prompt of `tokens`, and again on another while one fails with
    EngineDown, up to `retries` times: (url, its result), or (None, the client's answer) when none is left (503 none
    up, 504 one silent, 502 one failed)."""
    for attempt in range(router.settings.retries + 1):
        p = _choose(router, phase, tokens, tried)
        if p is None:
            return None, (_unavailable(router, phase, tokens, tried), "unavailable")
        url = p[1]
        try:
            return url, await send(url)
        except EngineDown as err:
            _down(router, err)
            tried.add(url)
            if err.kind != "connection" or attempt == router.settings.retries:
                return None, _failed(router, err)
            router.metrics.retried()
    raise AssertionError("unreachable")


async def _vllm(
    router: Router, request: web.Request, raw: bytes, body: dict[str, Any], tokens: int
) -> tuple[web.StreamResponse, str]:
    """vLLM NIXL: prefill first (one token, remote decode), then decode with the prefill's KV handle."""
    first = _extend(raw, body, {"max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}},
                    drop=("stream_options", "max_completion_tokens"))  # fmt: skip
    tried: set[str] = set()

    async def prefill(url: str) -> tuple[Answer, bytes]:
        r = await _post(router, url, request.path, first)
        return r, await r.read()

    pre, got = await _one_of(router, "prefill", tokens, tried, prefill)
    if pre is None:
        return got
    r, payload = got
    if r.status >= 400:
        return web.Response(status=r.status, body=payload, content_type=r.content_type or "application/json"), \
            "engine_status"  # fmt: skip
    try:
        params = orjson.loads(payload).get("kv_transfer_params")
    except (ValueError, AttributeError):
        return _error(502, f"{router.name(pre)} answered without JSON kv_transfer_params"), "engine_error"
    second = _extend(raw, body, {"kv_transfer_params": params})
    dec, got = await _one_of(router, "decode", tokens, tried, lambda url: _post(router, url, request.path, second))
    if dec is None:
        return got
    return await _relay(router, request, got, _served(router, pre, dec))


LLMD_PATHS = ("/v1/completions", "/v1/chat/completions")  # what the sidecar disaggregates (others go to decode alone)
PREFILLER_HEADER = b"x-prefiller-host-port"  # llm-d's routing sidecar: the prefill engine to use, as host:port


async def _llmd(
    router: Router, request: web.Request, raw: bytes, body: dict[str, Any], tokens: int
) -> tuple[web.StreamResponse, str]:
    """llm-d: the request to a decode engine's routing sidecar, naming the drawn prefill engine in a header; the
    sidecar has that engine prefill (its connector: SGLang's bootstrap or vLLM's NIXL) and decodes. A prefill engine
    the health checks found down is not drawn; a sidecar that cannot be reached is retried on another decode engine."""
    if request.path not in LLMD_PATHS:
        return _error(400, f"{request.path}: llm-d's routing sidecar runs prefill and decode only for "
                           f"{' and '.join(LLMD_PATHS)}"), "bad_request"  # fmt: skip
    tried: set[str] = set()
    pre = _choose(router, "prefill", tokens, tried)
    if pre is None:
        return _unavailable(router, "prefill", tokens, tried), "unavailable"
    header = PREFILLER_HEADER + b": " + urlparse(pre[1]).netloc.encode() + b"\r\n"

    def send(url: str) -> Any:
        return router.pools[url].request("POST", request.path, raw, extra=header)

    dec, got = await _one_of(router, "decode", tokens, tried, send)
    if dec is None:
        return got
    return await _relay(router, request, got, _served(router, pre[1], dec))


SENDERS = {"sglang": _sglang, "vllm": _vllm, "llmd": _llmd}

"""The plan's router: OpenAI-compatible in front, length-routed disaggregated prefill/decode behind.

    python -m pipeline.router routing.json [--host 0.0.0.0] [--port 8000]

`routing.json` is written by `pipeline.deploy`: per phase, each serving island's engines and its
share of every input-length range. For a request (`/v1/completions`, `/v1/chat/completions`,
`/generate`) the router:
1. estimates its prompt length in tokens: exact for token ids (`prompt` / `input_ids` lists),
   else characters / `chars_per_token` (set it from your tokenizer);
2. finds the range, draws a prefill island and a decode island with the plan's fractions for
   that range (as the simulator's `plan` router does), then one engine of each at random;
3. forwards it in the engines' disaggregation protocol:
   - `sglang`: the request, with `bootstrap_host`, `bootstrap_port` and a random
     `bootstrap_room` added, goes to the prefill and the decode engine at once; the decode
     engine's answer (streamed or not) is the response;
   - `vllm`: the prefill engine first, with `max_tokens` 1 and `kv_transfer_params`
     `{"do_remote_decode": true}`; then the decode engine with the `kv_transfer_params` the
     prefill returned; its answer is the response.

Built on aiohttp (server and client); `GET /routing` shows the loaded table, `GET /health` answers
200. Errors from an engine are passed through with their status.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from aiohttp import ClientSession, ClientTimeout, web

PATHS = ("/v1/completions", "/v1/chat/completions", "/generate")
PROTOCOLS = ("sglang", "vllm")
CLIENT = web.AppKey("client", ClientSession)


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


def app(config: dict[str, Any], seed: int | None = None) -> web.Application:
    table = load(config)
    rng = random.Random(seed)
    protocol, cpt = config["protocol"], float(config.get("chars_per_token", 4.0))
    bootstrap_port = int(config.get("bootstrap_port", 8998))
    application = web.Application()

    async def start(a: web.Application) -> None:
        a[CLIENT] = ClientSession(timeout=ClientTimeout(total=None, sock_connect=30))

    async def stop(a: web.Application) -> None:
        await a[CLIENT].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": "the request body must be JSON"}, status=400)
        tokens = prompt_tokens(body, cpt)
        pre, dec = pick(table, "prefill", tokens, rng), pick(table, "decode", tokens, rng)
        client = request.app[CLIENT]
        path = request.path
        if protocol == "sglang":
            room = rng.getrandbits(63)
            body = {**body, "bootstrap_host": urlparse(pre).hostname, "bootstrap_port": bootstrap_port,
                    "bootstrap_room": room}  # fmt: skip
            prefill = asyncio.ensure_future(client.post(pre + path, json=body))
            answer = await _relay(request, client, dec + path, body, pre, dec)
            async with await prefill as r:
                await r.read()  # the prefill engine's own answer is not the client's
            return answer
        first = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        first.pop("stream_options", None)
        async with client.post(pre + path, json=first) as r:
            if r.status != 200:
                return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)
            params = (await r.json()).get("kv_transfer_params")
        return await _relay(request, client, dec + path, {**body, "kv_transfer_params": params}, pre, dec)

    async def routing_view(_: web.Request) -> web.Response:
        return web.json_response(config)

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    for path in PATHS:
        application.router.add_post(path, forward)
    application.router.add_get("/routing", routing_view)
    application.router.add_get("/health", health)
    application.on_startup.append(start)
    application.on_cleanup.append(stop)
    return application


async def _relay(
    request: web.Request, client: ClientSession, url: str, body: dict[str, Any], pre: str, dec: str
) -> web.StreamResponse:
    """POST `body` to `url` and stream its answer back, headers naming the engines that served it."""
    async with client.post(url, json=body) as r:
        out = web.StreamResponse(status=r.status, headers={"Content-Type": r.headers.get("Content-Type", "")})
        out.headers["X-Archipelago-Prefill"] = pre
        out.headers["X-Archipelago-Decode"] = dec
        await out.prepare(request)
        async for chunk in r.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
        return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("routing", help="routing.json written by pipeline.deploy")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    try:
        config = json.loads(Path(args.routing).read_text())
        application = app(config)
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"error: {args.routing}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    counts = {role: len(isl) for role, isl in config["islands"].items()}
    print(f"[router] {args.routing}: {counts.get('prefill', 0)} prefill and {counts.get('decode', 0)} decode islands; "
          f"listening on http://{args.host}:{args.port} (GET /health; Ctrl-C stops it)", flush=True)  # fmt: skip
    web.run_app(application, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()

"""The router's aiohttp application: OpenAI-compatible in front, disaggregated prefill/decode engines behind."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any
from urllib.parse import urlparse

from aiohttp import ClientSession, ClientTimeout, web

from deployment.router.table import load, pick, prompt_tokens

PATHS = ("/v1/completions", "/v1/chat/completions", "/generate")
CLIENT = web.AppKey("client", ClientSession)


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

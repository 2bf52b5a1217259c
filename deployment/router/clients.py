"""The router's client connections: how long one may take to send a request, and how many may be open.

- **Header timeout**: aiohttp's own `keepalive_timeout` (`app` sets it to `header_timeout_s`). Its
  RequestHandler arms it when a connection opens and again after every answer, and when it fires
  closes the connection unless a whole request head has arrived: a connection that has sent no
  request, or part of one, for `header_timeout_s` since it opened or since its last answer is
  closed. Bytes trickled in meanwhile do not extend it. (The installed aiohttp, 3.14.5, arms it when
  the connection opens, aio-libs/aiohttp#13681; an aiohttp without that change keeps a connection
  that never sends a request until the connection cap closes it.)
- **Head size**: aiohttp's own `max_line_size` and `max_field_size` (8,190 bytes) and `max_headers`
  (128): past them a 400 and the connection closed.
- **Body timeout**: `app` reads a request's body within `body_timeout_s` of its head, else answers
  408 and closes the connection (aiohttp has no limit of its own on a body's time).
- **Connection cap**: `Clients` counts the connections open and those without a request in
  progress (idle: none sent yet, part of a head, or kept alive after an answer); a connection that
  opens past `cap` closes the one idle longest, so a flood of connections that send nothing cannot
  take the router's descriptors from the clients it serves. A busy connection is never closed for
  it, and the default cap (the requests admitted + 1,024) leaves every admitted request its
  connection: a burst of kept-alive clients idle between two requests is not cut. `listen` serves an
  AppRunner's application on a socket with its connections counted; the app's middleware marks a
  connection busy while a request is in progress (`busy`, `done`).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from aiohttp import web


class Clients:
    """The client connections `listen` accepted, and which are idle (no request in progress), oldest first."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: set[asyncio.BaseTransport] = set()
        self.idle: dict[asyncio.BaseTransport, None] = {}  # in the order they became idle
        self.evicted = 0  # idle connections closed to keep within the cap

    def opened(self, transport: asyncio.BaseTransport) -> None:
        self.open.add(transport)
        self.idle[transport] = None
        while len(self.open) > self.cap and self.idle:
            oldest = next(iter(self.idle))
            del self.idle[oldest]
            self.open.discard(oldest)  # (closing: it no longer counts)
            oldest.close()
            self.evicted += 1

    def closed(self, transport: asyncio.BaseTransport) -> None:
        self.open.discard(transport)
        self.idle.pop(transport, None)

    def busy(self, transport: asyncio.BaseTransport | None) -> None:
        """A request arrived on `transport` (its head was read)."""
        self.idle.pop(transport, None)  # type: ignore[arg-type]

    def done(self, transport: asyncio.BaseTransport | None) -> None:
        """A request on `transport` was answered: idle again (if `listen` accepted it and it is still open)."""
        if transport in self.open and not transport.is_closing():  # type: ignore[union-attr]
            self.idle[transport] = None  # type: ignore[index]

    def counts(self) -> tuple[int, int, int]:
        """Connections open, of them idle, and idle ones closed to keep within the cap so far."""
        return len(self.open), len(self.idle), self.evicted


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, with its opening and closing told to `Clients`."""

    __slots__ = ("_clients", "_inner", "_transport")

    def __init__(self, inner: Any, clients: Clients) -> None:
        self._inner, self._clients = inner, clients
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._clients.opened(transport)
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._clients.closed(self._transport)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


async def listen(runner: web.AppRunner, sock: socket.socket, clients: Clients, backlog: int = 4096) -> asyncio.Server:
    """Serve `runner`'s application (after `runner.setup()`) on the listening `sock`, its connections counted in
    `clients`. Close the returned server to stop taking connections (then `runner.cleanup()`)."""
    server = runner.server
    assert server is not None, "runner.setup() first"
    return await asyncio.get_running_loop().create_server(lambda: _Counted(server(), clients), sock=sock,
                                                          backlog=backlog)  # fmt: skip

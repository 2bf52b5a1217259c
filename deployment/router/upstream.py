"""HTTP/1.1 to the engines: keep-alive connections per engine, a request's answer read whole or relayed.

A general HTTP client spends most of a router's time on what the router never needs (cookies,
redirects, proxies, encodings); this one does the little a request to an engine takes: POST JSON
(or GET) on a kept-alive connection, read the status and headers, then the body by Content-Length,
chunked, or to the connection's end. A connection that fails is closed and never reused; a failure
before the answer's first byte is an `EngineDown`, which the router answers by trying another
engine. Timeouts: `connect_s` to connect, `read_s` of silence while waiting for any byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlparse


class EngineDown(Exception):
    """An engine refused or reset the connection, or did not answer in time (`timed_out`)."""

    def __init__(self, url: str, why: str, timed_out: bool = False) -> None:
        super().__init__(why)
        self.url, self.why, self.timed_out = url, why, timed_out


@dataclass
class Answer:
    """An engine's answer: status and headers read; the body still on its connection."""

    status: int
    headers: dict[str, str]
    conn: _Connection
    pool: Pool
    length: int | None  # Content-Length; None with chunked or to-the-end bodies
    chunked: bool
    done: bool = False  # the whole body was read
    released: bool = False  # the connection went back to its pool or was closed

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/json").split(";")[0]

    async def read(self) -> bytes:
        """The whole body (within `read_s` when its length is known: one read, no per-chunk timer)."""
        if self.length is None:
            return b"".join([c async for c in self.chunks()])
        r = self.conn.reader
        assert r is not None
        try:
            async with asyncio.timeout(self.pool.read_s):
                data = await r.readexactly(self.length)
            self.done = True
            return data
        except TimeoutError:
            self.conn.reusable = False
            raise EngineDown(self.pool.url, f"silent for {self.pool.read_s:g} s mid-answer", timed_out=True) from None
        except (OSError, asyncio.IncompleteReadError) as err:
            self.conn.reusable = False
            raise EngineDown(self.pool.url, f"{type(err).__name__} mid-answer: {err}") from None
        finally:
            self.release()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it comes; the connection goes back to its pool after the last byte."""
        r, loop, wait = self.conn.reader, asyncio.get_running_loop(), self.pool.read_s
        assert r is not None
        try:
            async with asyncio.timeout(None) as silence:  # re-armed before every read
                if self.length is not None:
                    left = self.length
                    while left > 0:
                        silence.reschedule(loop.time() + wait)
                        data = await r.read(min(left, 1 << 16))
                        if not data:
                            raise ConnectionResetError("the engine closed the connection mid-answer")
                        left -= len(data)
                        yield data
                elif self.chunked:
                    while True:
                        silence.reschedule(loop.time() + wait)
                        size = int((await r.readline()).split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while (await r.readline()) not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            break
                        data = await r.readexactly(size + 2)
                        yield data[:-2]
                else:
                    silence.reschedule(loop.time() + wait)
                    while data := await r.read(1 << 16):
                        silence.reschedule(loop.time() + wait)
                        yield data
                    self.conn.reusable = False
            self.done = True
        except TimeoutError:
            self.conn.reusable = False
            raise EngineDown(self.pool.url, f"silent for {self.pool.read_s:g} s mid-answer", timed_out=True) from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as err:
            self.conn.reusable = False
            raise EngineDown(self.pool.url, f"{type(err).__name__} mid-answer: {err}") from None
        finally:
            self.release()

    def release(self) -> None:
        """Give the connection back (whole answer read) or close it (answer abandoned); once."""
        if self.released:
            return
        self.released = True
        if self.done and self.conn.reusable:
            self.pool.idle.append(self.conn)
        else:
            self.conn.close()

    close = release


@dataclass
class _Connection:
    reader: asyncio.StreamReader | None
    writer: asyncio.StreamWriter | None
    reusable: bool = True

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class Pool:
    """Kept-alive connections to one engine."""

    url: str
    connect_s: float
    read_s: float
    idle: list[_Connection] = field(default_factory=list)

    def __post_init__(self) -> None:
        u = urlparse(self.url)
        self.host, self.port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
        self.ssl = u.scheme == "https"
        self.hostheader = f"{self.host}:{self.port}".encode()

    async def _connect(self) -> _Connection:
        try:
            r, w = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl or None, limit=1 << 20), self.connect_s
            )
        except TimeoutError:
            raise EngineDown(self.url, f"no connection within {self.connect_s:g} s") from None
        except OSError as err:
            raise EngineDown(self.url, f"cannot connect ({err.strerror or err})") from None
        return _Connection(r, w)

    async def request(
        self, method: str, path: str, body: bytes = b"", read_s: float | None = None, extra: bytes = b""
    ) -> Answer:
        """Send a request (`extra`: more header lines, each ending in CRLF); the answer with its status and headers
        read. EngineDown before the first byte."""
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\n%s" % (method.encode(), path.encode(), self.hostheader, extra)
        if method == "POST":
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        data = head + b"\r\n" + body
        timeout = self.read_s if read_s is None else read_s
        while True:
            fresh = not self.idle
            conn = self.idle.pop() if self.idle else await self._connect()
            try:
                conn.writer.write(data)  # type: ignore[union-attr]
                async with asyncio.timeout(timeout):
                    head = await conn.reader.readuntil(b"\r\n\r\n")  # type: ignore[union-attr]
                break
            except TimeoutError:
                conn.close()
                raise EngineDown(self.url, f"no answer within {timeout:g} s", timed_out=True) from None
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
                conn.close()
                if not fresh and not isinstance(err, asyncio.LimitOverrunError):
                    continue  # a kept-alive connection the engine had closed: open a new one
                raise EngineDown(self.url, f"{type(err).__name__}: {err}".rstrip(": ")) from None
            except asyncio.CancelledError:
                conn.close()
                raise
        try:
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if line:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
            length = None if "content-length" not in headers else int(headers["content-length"])
        except (ValueError, IndexError):
            conn.close()
            raise EngineDown(self.url, f"a malformed answer: {head[:80]!r}") from None
        conn.reusable = headers.get("connection", "").lower() != "close"
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = None if chunked else length
        return Answer(status, headers, conn, self, length, chunked)

    def close(self) -> None:
        for c in self.idle:
            c.close()
        self.idle.clear()

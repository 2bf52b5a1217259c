"""HTTP/1.1 to the engines: keep-alive connections per engine, a request's answer read whole or relayed.

A general HTTP client spends most of a router's time on what the router never needs (cookies,
redirects, proxies, encodings); this one does the little a request to an engine takes: POST JSON
(or GET) on a kept-alive connection, read the status and headers, then the body by Content-Length,
chunked, or to the connection's end. A connection that fails is closed and never reused.

An engine's failure is an `EngineDown` of one `kind`: "connection" (refused, reset, or closed before
its answer's end), "timeout" (silent for `read_s` while the router waited for a byte) or "malformed"
(what it sent is not HTTP the router can relay: a status outside 100-599, a Content-Length that is
not a number, both or neither framing headers where one is needed, a broken chunk, an answer read
whole past `MAX_WHOLE_BYTES`); `mid_answer` once part of the answer's body was read, which the
router can no longer answer with a status of its own. Timeouts: `connect_s` to connect, `read_s` of
silence while waiting for any byte.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from urllib.parse import urlparse

PIECE_BYTES = 1 << 16  # a body is read, and relayed, in pieces of at most this
HEAD_BYTES = 1 << 20  # an answer's status line and headers, and a chunk's size line, at most
MAX_WHOLE_BYTES = 64 << 20  # an answer read whole (a prefill engine's, a health check's) at most
INTERIM_ANSWERS = 8  # 1xx answers skipped before the real one, at most
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a header value's characters: no control character but tab
CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?\r?\n")


class EngineDown(Exception):
    """An engine could not be reached or failed (`kind`: "connection", "timeout" or "malformed"), before the first
    byte of its answer's body or `mid_answer`."""

    def __init__(self, url: str, why: str, kind: str = "connection", mid_answer: bool = False) -> None:
        super().__init__(why)
        self.url, self.why, self.kind, self.mid_answer = url, why, kind, mid_answer

    @property
    def timed_out(self) -> bool:
        return self.kind == "timeout"


class _Malformed(ValueError):
    """What the engine sent breaks HTTP's framing (the message says how)."""


@dataclass(slots=True)
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
        return self.headers.get("content-type", "application/json").split(";")[0].strip()

    async def read(self) -> bytes:
        """The whole body (within `read_s` when its length is known: one read, no per-chunk timer), at most
        `MAX_WHOLE_BYTES`."""
        if self.length is None or self.length > MAX_WHOLE_BYTES:
            parts, size = [], 0
            async with aclosing(self.chunks()) as pieces:
                async for piece in pieces:
                    parts.append(piece)
                    size += len(piece)
                    if size > MAX_WHOLE_BYTES:
                        raise EngineDown(self.pool.url, f"an answer longer than the router reads whole "
                                         f"({MAX_WHOLE_BYTES:,} bytes)", "malformed", mid_answer=True)  # fmt: skip
            return b"".join(parts)
        r = self.conn.reader
        assert r is not None
        try:
            async with asyncio.timeout(self.pool.read_s):
                data = await r.readexactly(self.length)
            self.done = True
            return data
        except TimeoutError:
            self.conn.reusable = False
            raise EngineDown(self.pool.url, f"silent for {self.pool.read_s:g} s mid-answer", "timeout") from None
        except (OSError, asyncio.IncompleteReadError) as err:
            self.conn.reusable = False
            raise EngineDown(self.pool.url, f"{type(err).__name__} mid-answer: {err}") from None
        finally:
            self.release()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it comes, in pieces of at most PIECE_BYTES; the connection goes back to its pool after the
        last byte. EngineDown when the engine fails, breaks the framing, or is silent for `read_s` while a piece is
        awaited (time spent by the caller between pieces does not count)."""
        r, loop, wait = self.conn.reader, asyncio.get_running_loop(), self.pool.read_s
        assert r is not None
        began = False  # a piece was handed on: a failure now is mid-answer
        try:
            async with asyncio.timeout(None) as silence:
                left = self.length
                while True:
                    silence.reschedule(loop.time() + wait)
                    if self.chunked and not left:
                        if left == 0 and await r.readexactly(2) != b"\r\n":
                            raise _Malformed("a chunk's data is not followed by CRLF")
                        left = _chunk_size(await r.readuntil(b"\n"))
                        if left == 0:
                            await _trailers(r)
                            break
                    elif left == 0:
                        break
                    data = await r.read(PIECE_BYTES if left is None else min(left, PIECE_BYTES))
                    if not data:
                        if left is None:  # the body ran to the connection's end, as its headers said it would
                            self.conn.reusable = False
                            break
                        raise ConnectionResetError("the engine closed the connection mid-answer")
                    if left is not None:
                        left -= len(data)
                    silence.reschedule(None)
                    began = True
                    yield data
            self.done = True
        except TimeoutError:
            self.conn.reusable = False
            raise EngineDown(self.pool.url, f"silent for {wait:g} s mid-answer", "timeout", began) from None
        except (_Malformed, asyncio.LimitOverrunError) as err:
            self.conn.reusable = False
            why = str(err) if isinstance(err, _Malformed) else f"a chunk size line longer than {HEAD_BYTES:,} bytes"
            raise EngineDown(self.pool.url, f"a malformed answer: {why}", "malformed", began) from None
        except (OSError, asyncio.IncompleteReadError) as err:
            self.conn.reusable = False
            raise EngineDown(self.pool.url, f"{type(err).__name__} mid-answer: {err}", "connection", began) from None
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


def _chunk_size(line: bytes) -> int:
    m = CHUNK_SIZE.fullmatch(line)
    if m is None:
        raise _Malformed(f"a chunk size line that is not hexadecimal: {line[:40]!r}")
    return int(m.group(1), 16)


async def _trailers(r: asyncio.StreamReader) -> None:
    for _ in range(128):
        if await r.readuntil(b"\n") in (b"\r\n", b"\n"):
            return
    raise _Malformed("more than 128 trailer lines")


def _parse_head(head: bytes) -> tuple[int, dict[str, str], int | None, bool]:
    """An answer's status, headers (names lower-cased), Content-Length and whether it is chunked; _Malformed when
    it is not an HTTP/1.x answer the router can relay."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0"):
        raise _Malformed(f"not an HTTP/1.x status line: {lines[0][:60]!r}")
    code = parts[1]
    if not (len(code) == 3 and code.isascii() and code.isdigit() and 100 <= int(code) <= 599):
        raise _Malformed(f"status {code[:20]!r} is not an HTTP status (100-599)")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not HEADER_NAME.fullmatch(name) or BAD_VALUE.search(value):
            raise _Malformed(f"a header line that is not `name: value`: {line[:60]!r}")
        name, value = name.lower(), value.strip(" \t")
        if name in headers and (name == "content-length" or name == "transfer-encoding"):
            if headers[name] != value:
                raise _Malformed(f"two {name} headers ({headers[name][:20]!r}, {value[:20]!r})")
        headers[name] = value
    status = int(code)
    length = headers.get("content-length")
    if length is not None and not (length.isascii() and length.isdigit() and len(length) <= 18):
        raise _Malformed(f"Content-Length {length[:20]!r} is not a byte count")
    coding = headers.get("transfer-encoding")
    if coding is not None and coding.lower() != "chunked":
        raise _Malformed(f"Transfer-Encoding {coding[:40]!r} (the router reads chunked or Content-Length bodies)")
    if coding is not None and length is not None:
        raise _Malformed("both Transfer-Encoding and Content-Length")
    if status in (204, 304):
        return status, headers, 0, False
    return status, headers, None if length is None else int(length), coding is not None


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader | None
    writer: asyncio.StreamWriter | None
    reusable: bool = True

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Pool:
    """Kept-alive connections to one engine."""

    __slots__ = ("connect_s", "host", "hostheader", "idle", "port", "read_s", "ssl", "url")

    def __init__(self, url: str, connect_s: float, read_s: float) -> None:
        self.url, self.connect_s, self.read_s = url, connect_s, read_s
        self.idle: list[_Connection] = []
        u = urlparse(url)
        self.host, self.port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
        self.ssl = u.scheme == "https"
        self.hostheader = f"{self.host}:{self.port}".encode()

    async def _connect(self) -> _Connection:
        try:
            r, w = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl or None, limit=HEAD_BYTES), self.connect_s
            )
        except TimeoutError:
            raise EngineDown(self.url, f"no connection within {self.connect_s:g} s") from None
        except OSError as err:
            raise EngineDown(self.url, f"cannot connect ({err.strerror or err})") from None
        return _Connection(r, w)

    async def request(
        self, method: str, path: str, body: bytes = b"", read_s: float | None = None, extra: bytes = b"",
        keep: bool = True,
    ) -> Answer:  # fmt: skip
        """Send a request (`extra`: more header lines, each ending in CRLF); the answer with its status and headers
        read. EngineDown before the first byte of its body. `keep=False`: a connection opened for it is closed after
        (a health check of many engines keeps no connection to each)."""
        timeout = self.read_s if read_s is None else read_s
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\n%s" % (method.encode(), path.encode(), self.hostheader, extra)
        if method == "POST":
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        while True:  # a kept-alive connection the engine had closed: the next, then a new one (which raises no _Stale)
            fresh = not self.idle
            conn = self.idle.pop() if self.idle else await self._connect()
            close = b"" if keep or not fresh else b"Connection: close\r\n"
            try:
                conn.writer.write(head + close + b"\r\n" + body)  # type: ignore[union-attr]
                answer = await self._answer(conn, timeout, fresh)
            except _Stale:
                continue
            answer.conn.reusable = answer.conn.reusable and not close
            return answer

    async def _answer(self, conn: _Connection, timeout: float, fresh: bool) -> Answer:
        """The answer's head on `conn` (interim 1xx answers skipped)."""
        try:
            async with asyncio.timeout(timeout):
                for _ in range(INTERIM_ANSWERS + 1):
                    head = await conn.reader.readuntil(b"\r\n\r\n")  # type: ignore[union-attr]
                    status, headers, length, chunked = _parse_head(head)
                    if status >= 200 or status == 101:
                        break
                else:
                    raise _Malformed(f"more than {INTERIM_ANSWERS} interim (1xx) answers")
                if status == 101:
                    raise _Malformed("101 Switching Protocols to a request that asked for none")
        except TimeoutError:
            conn.close()
            raise EngineDown(self.url, f"no answer within {timeout:g} s", "timeout") from None
        except asyncio.LimitOverrunError:
            conn.close()
            raise EngineDown(self.url, f"a malformed answer: headers past {HEAD_BYTES:,} bytes", "malformed") from None
        except _Malformed as err:
            conn.close()
            raise EngineDown(self.url, f"a malformed answer: {err}", "malformed") from None
        except (OSError, asyncio.IncompleteReadError) as err:
            conn.close()
            if not fresh:
                raise _Stale from None
            raise EngineDown(self.url, f"{type(err).__name__}: {err}".rstrip(": ")) from None
        except asyncio.CancelledError:
            conn.close()
            raise
        conn.reusable = headers.get("connection", "").lower() != "close"
        return Answer(status, headers, conn, self, length, chunked)

    def close(self) -> None:
        for c in self.idle:
            c.close()
        self.idle.clear()


class _Stale(Exception):
    """A kept-alive connection the engine had closed before the request reached it."""

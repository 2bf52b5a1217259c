"""Stand-in engines and a load generator for the router's load tests, on loopback.

Both speak minimal HTTP/1.1 with keep-alive on bare asyncio (no framework), so on a 2-core machine
the router under test, not its neighbours, is what runs out of CPU. A stand-in engine answers every
POST after a delay (its role's: prefill short, decode long) with a small JSON completion, and
`GET /health` with 200; it carries the vLLM `kv_transfer_params` a decode request needs. A broken
stand-in (`Broken`) answers its health check and breaks every answer as `BROKEN` lists: a stream cut
or gone silent, a status or framing that is not HTTP. The load generator keeps `concurrency`
requests in flight over persistent connections for `seconds` and reports what it saw; `idle` holds
connections open that send part of a request head, or nothing, and times how long each is kept.
Run as `python tests/standin.py engines PORT... --delay S` in its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field


class Engine(asyncio.Protocol):
    """One connection to a stand-in engine."""

    def __init__(self, name: str, delay: float, seen: list[int]) -> None:
        self.name, self.delay, self.seen = name, delay, seen
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            if len(self.buf) < head_end + 4 + length:
                return
            self.buf = self.buf[head_end + 4 + length :]
            method, _path = head.split(" ", 2)[:2]
            self.seen[0] += 1
            if method == "GET":
                self.reply(200, b'{"ok":true}')
            else:
                body = b'{"choices":[{"text":"from %s"}],"kv_transfer_params":{"remote_engine":"%s"}}' % (
                    self.name.encode(),
                    self.name.encode(),
                )
                asyncio.get_running_loop().call_later(self.delay, self.reply, 200, body)

    def reply(self, status: int, body: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (status, len(body), body))  # fmt: skip


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def sse_chunk(text: str) -> bytes:
    """One SSE event `data: {"text": ...}` as one HTTP chunk."""
    event = b'data: {"choices":[{"text":"%s"}]}\n\n' % text.encode()
    return b"%x\r\n%s\r\n" % (len(event), event)


# what a broken stand-in engine sends to every POST: (the bytes, then whether it closes the connection)
BROKEN: dict[str, tuple[bytes, bool]] = {
    "cut": (SSE_HEAD + sse_chunk("one") + sse_chunk("two"), True),  # its stream ends with no last chunk
    "silent": (SSE_HEAD + sse_chunk("one"), False),  # one event, then nothing, the connection open
    "silent_at_once": (SSE_HEAD, False),  # the head, then nothing
    "status_1000": (b"HTTP/1.1 1000 OK\r\nContent-Length: 2\r\n\r\n{}", False),
    "negative_length": (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n{}", False),
    "two_lengths": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", False),
    "bad_chunk": (SSE_HEAD + b"zz\r\nnot a chunk\r\n", False),
    "not_http": (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", False),
}


class Broken(asyncio.Protocol):
    """A broken engine: `GET /health` answers 200, every POST gets what BROKEN[mode] says."""

    def __init__(self, mode: str) -> None:
        self.mode, self.buf = mode, b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0 or self.transport is None:
            return
        length = next((int(line.split(b":")[1]) for line in self.buf[:head_end].split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
        if len(self.buf) < head_end + 4 + length:
            return
        method, self.buf = self.buf[:4], self.buf[head_end + 4 + length :]
        if method.startswith(b"GET"):
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            return
        answer, close = BROKEN[self.mode]
        self.transport.write(answer)
        if close:
            self.transport.close()


async def serve_engines(ports: list[int], delays: list[float]) -> None:
    loop = asyncio.get_running_loop()
    seen = [0]
    for k, (port, delay) in enumerate(zip(ports, delays, strict=True)):
        await loop.create_server(lambda k=k, d=delay: Engine(f"e{k}", d, seen), "127.0.0.1", port, backlog=4096)
    print("ready", flush=True)
    await asyncio.Event().wait()


@dataclass
class Load:
    """What the load generator saw. `stale`: requests sent again on a new connection because the router had closed
    their kept-alive one before any byte of the answer (`_Closed`), as HTTP clients do (RFC 9112 9.3.1): a server
    closes a connection idle past its keep-alive time, and a request written meanwhile meets the close."""

    sent: int = 0
    ok: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    peak_in_flight: int = 0
    in_flight: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    stale: int = 0

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


class _Closed(Exception):
    """The connection closed before any byte of the answer."""


async def load(
    port: int, body: bytes, concurrency: int, seconds: float, ramp_s: float = 1.0, timeout_s: float = 30.0
) -> Load:
    """`concurrency` clients, each on one keep-alive connection, posting `body` back to back for `seconds`
    (started over `ramp_s`); counts the answers completed in the `seconds` after the ramp. An answer not complete within
    `timeout_s` is an error (TimeoutError), never a hang. A kept-alive connection (one that has had an answer) closed
    before any byte of the next answer is stale: the request is sent again on a new one (`Load.stale`); on a new
    connection that is an error (`_Closed`)."""
    out = Load()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
    start = time.perf_counter()
    end = start + ramp_s + seconds

    async def client(k: int) -> None:
        await asyncio.sleep(ramp_s * k / concurrency)
        reader = writer = None
        answered = 0  # answers on the connection open now
        while time.perf_counter() < end:
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
                    answered = 0
                t0 = time.perf_counter()
                out.sent += 1
                out.in_flight += 1
                out.peak_in_flight = max(out.peak_in_flight, out.in_flight)
                writer.write(request)
                async with asyncio.timeout(timeout_s):
                    status = await _answer(reader)  # type: ignore[arg-type]
                out.in_flight -= 1
                answered += 1
                out.statuses[status] = out.statuses.get(status, 0) + 1
                if status == 200 and start + ramp_s <= time.perf_counter() <= end:  # answered in the window
                    out.ok += 1
                    out.latencies.append(time.perf_counter() - t0)
            except (_Closed, OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as err:
                out.in_flight -= 1
                if writer is not None:
                    writer.close()
                writer = None
                if isinstance(err, _Closed) and answered:  # a stale kept-alive connection: again on a new one
                    out.sent -= 1
                    out.stale += 1
                    continue
                out.errors[type(err).__name__] = out.errors.get(type(err).__name__, 0) + 1
                await asyncio.sleep(0.05)
        if writer is not None:
            writer.close()

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    out.seconds = seconds
    return out


PARTIAL_HEADS = (b"", b"POST /v1/completions HTTP/1.1\r\nHost: r\r\n")  # nothing; a head with no end


@dataclass
class Idle:
    """What the idle connections saw: how long the router kept each (s) from when the client saw it open, and from
    when the client asked to open it (`asked_s`: on a busy event loop the client sees a connection open well after
    the router accepted it, so only this one bounds how early the router closed it); and how many it had not
    closed within `patience_s`."""

    kept_s: list[float] = field(default_factory=list)
    asked_s: list[float] = field(default_factory=list)
    still_open: int = 0
    refused: int = 0


async def idle(port: int, count: int, seconds: float, patience_s: float = 30.0, ramp_s: float = 1.0) -> Idle:
    """`count` connections (opened over `ramp_s`) that send part of a request head, or nothing (alternately), and
    wait up to `patience_s` for the router to close them; each opens again once closed, while `seconds` last."""
    out = Idle()
    end = time.perf_counter() + seconds

    async def one(k: int) -> None:
        await asyncio.sleep(ramp_s * k / count)
        while time.perf_counter() < end:
            asked = time.perf_counter()
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                out.refused += 1
                await asyncio.sleep(0.1)
                continue
            t0 = time.perf_counter()
            writer.write(PARTIAL_HEADS[k % 2])
            try:
                async with asyncio.timeout(patience_s):
                    while await reader.read(1 << 16):
                        pass  # (the router may answer before it closes)
            except TimeoutError:
                out.still_open += 1
                return
            except OSError:
                pass
            finally:
                writer.close()
            out.kept_s.append(time.perf_counter() - t0)
            out.asked_s.append(time.perf_counter() - asked)

    await asyncio.gather(*(one(k) for k in range(count)))
    return out


async def _answer(reader: asyncio.StreamReader) -> int:
    """Read one HTTP answer; its status. `_Closed` where the connection closes before any byte of it."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as err:
        if err.partial:
            raise
        raise _Closed("closed before the answer") from err
    except ConnectionResetError as err:
        raise _Closed("reset before the answer") from err
    status = int(head.split(b" ", 2)[1])
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length")), None)  # fmt: skip
    if length is None:  # chunked (a streamed answer): read to the last chunk
        while (size := int((await reader.readline()).strip() or b"0", 16)) > 0:
            await reader.readexactly(size + 2)
        await reader.readline()
    else:
        await reader.readexactly(length)
    return status


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["engines"])
    ap.add_argument("ports", type=int, nargs="+")
    ap.add_argument("--delays", type=float, nargs="+", required=True)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve_engines(args.ports, args.delays))


if __name__ == "__main__":
    sys.exit(main())

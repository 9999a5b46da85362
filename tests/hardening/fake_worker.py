"""A misbehaving worker: raw HTTP/1.1 over asyncio, its misbehaviour picked per request.

The emulated worker (``workersim``) is a well-behaved engine; this one is not. It
answers ``/health``, ``/v1/models`` and ``/metrics`` properly (so the gateway
routes to it), and ``POST /v1/*`` according to the ``mode`` named in the
request's ``prompt`` (``"mode:<name>"``), so one fake plays every fault:

- ``ok``: a normal JSON completion; ``stream``: a normal SSE stream;
  ``slow_stream``: an event every 100 ms for 20 s
- ``poison``: 500 (as engines do on input they choke on)
- ``garbage``: bytes that are not HTTP; ``huge_head``: a 70 KiB head in one write
- ``reset_head``: reset before any byte; ``reset_body``: reset half-way through a body
- ``stall_stream``: two events 50 ms apart, a 300 ms stall, one more, the usage, ``[DONE]``
- ``reset_stream``: two events, then reset; ``bad_chunk``: one good chunk, then bad framing
- ``linger_stream``: an event, the usage and ``[DONE]``, then the stream's last chunk only
  once ``linger`` is set (a worker slow to close; the client may hang up first)
- ``hang``: never answers; ``empty_200``: 200 with an empty body; ``html_200``: 200 text
- ``echo``: 200 with the request's headers and body (what the gateway forwarded)

``metrics_page`` sets the ``/metrics`` body (a huge page to test the scrape cap).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


def _response(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    head = (
        f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


_COMPLETION = json.dumps(
    {
        "id": "c1",
        "object": "text_completion",
        "model": "demo",
        "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
).encode()

STALL_S = 0.3
"""How long a ``stall_stream`` goes quiet between its second and third event."""

FLOOD_EVENTS = 1024
"""Events of 64 KiB in one ``flood_stream`` (64 MiB: far more than the sockets buffer)."""

_EVENT = b'data: {"id":"c1","object":"text_completion","choices":[{"index":0,"text":"hi"}]}\n\n'


_USAGE = (
    b'data: {"id":"c1","object":"text_completion","choices":[],'
    b'"usage":{"prompt_tokens":300,"completion_tokens":5,"total_tokens":305,'
    b'"prompt_tokens_details":{"cached_tokens":100}}}\n\n'
)


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        # SO_LINGER 0: close sends a RST instead of a FIN.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass
class FakeWorker:
    """The fake's state: where it listens and what it saw."""

    port: int = 0
    metrics_page: bytes = b"vllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.0\n"
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    heads: list[bytes] = field(default_factory=list)
    """Every request's head as it arrived (the target, each header line in its case)."""
    streaming: int = 0
    """Slow streams being written now (one the gateway dropped ends at its next write)."""
    flooded: int = 0
    """Bytes of ``flood_stream`` events written so far."""
    linger: asyncio.Event = field(default_factory=asyncio.Event)
    """Set to let a ``linger_stream`` end."""
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        """The fake's base URL."""
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((target, headers, body))
                if not await self._answer(method, target, headers, body, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _answer(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer one request; False when the connection is done with."""
        if method == "GET":
            if target == "/health":
                writer.write(_response(200, b"{}"))
            elif target == "/v1/models":
                models = {"object": "list", "data": [{"id": "demo", "object": "model"}]}
                writer.write(_response(200, json.dumps(models).encode()))
            elif target == "/metrics":
                writer.write(_response(200, self.metrics_page, "text/plain"))
            else:
                writer.write(_response(404, b"{}"))
            await writer.drain()
            return True
        try:
            prompt = json.loads(body).get("prompt", "")
        except ValueError:
            prompt = ""
        mode = prompt[5:] if isinstance(prompt, str) and prompt.startswith("mode:") else "ok"
        if mode == "ok":
            writer.write(_response(200, _COMPLETION))
        elif mode == "echo":
            echoed = {"headers": headers, "body": body.decode("utf-8", "replace")}
            writer.write(_response(200, json.dumps(echoed).encode()))
        elif mode == "poison":
            writer.write(_response(500, b'{"error":"Internal Server Error at 10.1.2.3"}'))
        elif mode == "stream":
            writer.write(_STREAM_HEAD + _chunk(_EVENT) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        elif mode == "slow_stream":
            self.streaming += 1
            try:
                writer.write(_STREAM_HEAD)
                for _ in range(200):  # 20 s of events
                    writer.write(_chunk(_EVENT))
                    await writer.drain()
                    await asyncio.sleep(0.1)
                writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            finally:
                self.streaming -= 1
        elif mode == "flood_stream":
            # FLOOD_EVENTS events of 64 KiB as fast as the gateway takes them; ``flooded``
            # counts the bytes written (the socket's drain holds them when it pushes back).
            event = b"data: " + b"x" * (64 * 1024) + b"\n\n"
            writer.write(_STREAM_HEAD)
            for _ in range(FLOOD_EVENTS):
                writer.write(_chunk(event))
                self.flooded += len(event)
                await writer.drain()
            writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        elif mode == "linger_stream":
            done = _chunk(b"data: [DONE]\n\n")
            writer.write(_STREAM_HEAD + _chunk(_EVENT) + _chunk(_USAGE) + done)
            await writer.drain()
            await asyncio.wait_for(self.linger.wait(), 30.0)
            writer.write(b"0\r\n\r\n")
        elif mode == "stall_stream":
            writer.write(_STREAM_HEAD + _chunk(_EVENT))
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(_chunk(_EVENT))
            await writer.drain()
            await asyncio.sleep(STALL_S)
            done = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
            writer.write(_chunk(_EVENT) + _chunk(_USAGE) + done)
        elif mode == "reset_stream":
            writer.write(_STREAM_HEAD + _chunk(_EVENT) + _chunk(_EVENT))
            await writer.drain()
            await asyncio.sleep(0.05)
            _reset(writer)
            return False
        elif mode == "bad_chunk":
            writer.write(_STREAM_HEAD + _chunk(_EVENT) + b"zz\r\nnot a chunk\r\n")
            await writer.drain()
            return False
        elif mode == "garbage":
            writer.write(b"\x00\xffSSH-2.0-nonsense\r\n\r\n")
            await writer.drain()
            return False
        elif mode == "huge_head":
            filler = b"X-Filler: " + b"a" * 70_000 + b"\r\n"
            writer.write(b"HTTP/1.1 200 OK\r\n" + filler + b"Content-Length: 2\r\n\r\n{}")
        elif mode == "reset_head":
            _reset(writer)
            return False
        elif mode == "reset_body":
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(_COMPLETION)}\r\n\r\n"
            writer.write(head.encode() + _COMPLETION[:10])
            await writer.drain()
            await asyncio.sleep(0.05)
            _reset(writer)
            return False
        elif mode == "hang":
            await asyncio.sleep(3600)
        elif mode == "empty_200":
            writer.write(_response(200, b""))
        elif mode == "redirect":
            # Starlette's redirect_slashes names the worker by the Host it was sent.
            host = headers.get("host", "")
            writer.write(
                f"HTTP/1.1 307 X\r\nLocation: http://{host}/v1/completions?x=1\r\n"
                f"Content-Location: //{host}/v1/c\r\n"
                "Connection: keep-alive, X-Worker-Secret\r\nX-Worker-Secret: s3cret\r\n"
                "X-Kvgate-Worker: spoofed\r\nX-Kvgate-Request-ID: spoofed\r\n"
                "Content-Length: 0\r\n\r\n".encode()
            )
        elif mode == "html_200":
            writer.write(_response(200, b"<html>oops</html>", "text/html"))
        await writer.drain()
        return True

    async def start(self) -> None:
        """Listen on a free loopback port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))


@contextlib.asynccontextmanager
async def fake_workers(count: int) -> AsyncIterator[list[FakeWorker]]:
    """``count`` misbehaving workers for the block's duration."""
    fakes = [FakeWorker() for _ in range(count)]
    try:
        for fake in fakes:
            await fake.start()
        yield fakes
    finally:
        for fake in fakes:
            await fake.stop()

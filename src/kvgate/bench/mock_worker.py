"""A fast stand-in for an OpenAI-compatible worker, for measuring what routers add.

The emulated worker (``kvgate worker-sim``) runs the engine model and serves
about 1,400 small requests per second: slower than the routers measured against
it, so their own cost would hide behind it. This one answers canned bodies from
a raw asyncio protocol on llhttp (``httptools``) and uvloop: a completion in one
write, or a stream of ``--events`` SSE events, each its own chunk and its own
write (so a router relays them one by one, as it would tokens). It answers the
probes routers send (``/health``, ``/v1/models``, ``/metrics``, and any other GET
with a small model card).

    .venv/bin/python -m kvgate.bench.mock_worker --port 8101 --events 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket

import httptools

MODEL = "demo"

_COMPLETION = json.dumps(
    {
        "id": "cmpl-mock",
        "object": "text_completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "text": " a b c d", "finish_reason": "length"}],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "total_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    },
    separators=(",", ":"),
).encode()
_EVENT = (
    b"data: "
    + json.dumps(
        {
            "id": "cmpl-mock",
            "object": "text_completion",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "text": " tok", "finish_reason": None}],
        },
        separators=(",", ":"),
    ).encode()
    + b"\n\n"
)
_USAGE_EVENT = (
    b"data: "
    + json.dumps(
        {
            "id": "cmpl-mock",
            "object": "text_completion",
            "created": 0,
            "model": MODEL,
            "choices": [],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": 16,
                "total_tokens": 19,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        },
        separators=(",", ":"),
    ).encode()
    + b"\n\n"
)
_MODELS = json.dumps(
    {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "mock"}]}
).encode()
_CARD = json.dumps(
    {"model_path": MODEL, "model_id": MODEL, "tokenizer_path": MODEL, "is_generation": True}
).encode()
_METRICS = (
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{model_name="demo"} 0\n'
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{model_name="demo"} 0\n'
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _answer(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type
        + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )  # fmt: skip


class RequestProtocol(asyncio.Protocol):
    """One client connection parsed by llhttp: collects each request's URL and body.

    Subclasses answer in ``on_message_complete``; ``benchmarks/server_floor.py`` uses
    it too, so both llhttp servers parse the same way.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)


class _Worker(RequestProtocol):
    """One client connection: parse requests, answer each from the canned bodies."""

    events = 16
    event_gap_s = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def on_message_complete(self) -> None:
        transport = self.transport
        assert transport is not None
        method = self.parser.get_method()
        path = self.url.split(b"?", 1)[0]
        if method == b"POST":
            body = b"".join(self.body)
            if b'"stream":true' in body.replace(b" ", b""):
                asyncio.get_running_loop().create_task(self._stream(transport, body))
                return
            transport.write(_answer(b"200 OK", b"application/json", _COMPLETION))
        elif path == b"/v1/models":
            transport.write(_answer(b"200 OK", b"application/json", _MODELS))
        elif path == b"/metrics":
            transport.write(_answer(b"200 OK", b"text/plain; version=0.0.4", _METRICS))
        else:
            transport.write(_answer(b"200 OK", b"application/json", _CARD))

    async def _stream(self, transport: asyncio.Transport, body: bytes) -> None:
        transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for _ in range(self.events):
            # A yield between events: each goes out in its own write, as tokens do.
            await asyncio.sleep(self.event_gap_s)
            if transport.is_closing():
                return
            transport.write(_chunk(_EVENT))
        tail = _chunk(_USAGE_EVENT) if b"include_usage" in body else b""
        transport.write(tail + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")


async def serve(host: str, port: int, events: int, gap_s: float) -> None:
    """Serve until cancelled."""
    _Worker.events = events
    _Worker.event_gap_s = gap_s
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Worker, host, port, backlog=4096, reuse_port=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    """Parse options and serve."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--events", type=int, default=16, help="SSE events per stream")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="pause between events")
    opts = parser.parse_args()
    import uvloop

    uvloop.run(serve(opts.host, opts.port, opts.events, opts.gap_ms / 1000))


if __name__ == "__main__":
    main()

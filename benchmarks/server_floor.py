"""The floor of each Python server stack: forwarding alone, no routing, same client.

Before replacing aiohttp's server on the data plane, measure what each candidate
costs when all it does is what every forwarded request needs: read the
request, send it to a worker over kvgate's own forwarding client
(``Upstream``: llhttp, keep-alive), and pass the answer back (a JSON body, or an
SSE stream chunk by chunk). The difference between two rows is what switching
servers could save per request; the gap between a row and kvgate's own CPU per
request (``overhead.py --side-by-side``) is kvgate's routing, metrics and
bookkeeping.

Candidates: aiohttp's ``web`` server (what kvgate runs), a protocol-level
server on llhttp (``httptools``) and uvloop, and uvicorn's httptools protocol
with a raw ASGI app (when ``uvicorn`` is importable). Each runs in its own
process in front of one mock worker; ``wrk`` loads it; CPU comes from ``/proc``.

    .venv/bin/python benchmarks/server_floor.py --duration 3 --repeat 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from kvgate.bench import wrk
from kvgate.bench.mock_worker import RequestProtocol
from kvgate.bench.processes import free_port, running, tree_cpu_seconds
from kvgate.gateway.upstream.transport import Timeouts, Upstream

MOCK = ("-m", "kvgate.bench.mock_worker")
_TIMEOUTS = Timeouts(connect=5.0, first_byte=30.0, total=60.0)
_HEADERS = {"Content-Type": "application/json"}


# -- candidate 1: aiohttp's web server -------------------------------------------------


def serve_aiohttp(port: int, worker: str) -> None:
    """aiohttp ``web``: one route, the answer relayed whole or chunk by chunk."""
    from aiohttp import web

    upstream = Upstream(worker, _TIMEOUTS)

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        answer = await upstream.post("/v1/completions", body, _HEADERS)
        kind = answer.headers.get("Content-Type", "")
        if not kind.startswith("text/event-stream"):
            data = await answer.read()
            return web.Response(body=data, status=answer.status, content_type="application/json")
        response = web.StreamResponse(status=answer.status, headers={"Content-Type": kind})
        try:
            await response.prepare(request)
            async for chunk in answer.chunks():
                await response.write(chunk)
            await response.write_eof()
        except ConnectionResetError:  # wrk hangs up at the end of a run
            answer.close()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", forward)
    app.router.add_get("/health", health)
    import uvloop

    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


# -- candidate 2: a protocol-level server on llhttp and uvloop ---------------------------


class _Forwarder(RequestProtocol):
    """One client connection: llhttp parses, each request is forwarded in its own task."""

    upstream: Upstream

    def on_message_complete(self) -> None:
        transport = self.transport
        assert transport is not None
        if self.parser.get_method() != b"POST":
            transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return
        asyncio.get_running_loop().create_task(self._forward(transport, b"".join(self.body)))

    async def _forward(self, transport: asyncio.Transport, body: bytes) -> None:
        answer = await self.upstream.post("/v1/completions", body, _HEADERS)
        kind = answer.headers.get("Content-Type", "")
        if not kind.startswith("text/event-stream"):
            data = await answer.read()
            transport.write(
                b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % (answer.status, len(data))
                + data
            )
            return
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        async for chunk in answer.chunks():
            transport.write(head + b"%x\r\n%s\r\n" % (len(chunk), chunk))
            head = b""
        transport.write(head + b"0\r\n\r\n")


def serve_llhttp(port: int, worker: str) -> None:
    """The protocol-level server above, on uvloop."""
    import uvloop

    async def main() -> None:
        _Forwarder.upstream = Upstream(worker, _TIMEOUTS)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Forwarder, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


# -- candidate 3: uvicorn's httptools protocol with a raw ASGI app ------------------------


def serve_uvicorn(port: int, worker: str) -> None:
    """uvicorn (``--http httptools --loop uvloop``) and an ASGI callable, no framework."""
    import uvicorn

    upstream = Upstream(worker, _TIMEOUTS)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        parts = []
        more = True
        while more:
            message = await receive()
            parts.append(message.get("body", b""))
            more = message.get("more_body", False)
        answer = await upstream.post("/v1/completions", b"".join(parts), _HEADERS)
        kind = answer.headers.get("Content-Type", "")
        await send(
            {
                "type": "http.response.start",
                "status": answer.status,
                "headers": [(b"content-type", kind.encode())],
            }
        )
        if not kind.startswith("text/event-stream"):
            await send({"type": "http.response.body", "body": await answer.read()})
            return
        async for chunk in answer.chunks():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    uvicorn.run(
        app, host="127.0.0.1", port=port, http="httptools", loop="uvloop",
        log_level="warning", access_log=False, lifespan="off",
    )  # fmt: skip


CANDIDATES = {"aiohttp": serve_aiohttp, "llhttp+uvloop": serve_llhttp, "uvicorn": serve_uvicorn}


def main() -> None:
    """Run every candidate beside the others, interleaved; print CPU per request."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--events", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.serve:
        CANDIDATES[opts.serve](opts.port, opts.worker)
        return
    names = [n for n in CANDIDATES if n != "uvicorn" or importlib.util.find_spec("uvicorn")]
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        wport = free_port()
        worker = f"http://127.0.0.1:{wport}"
        mock = [sys.executable, *MOCK, "--port", str(wport), "--events", str(opts.events)]
        stack.enter_context(running(mock, worker + "/health", quiet=False))
        servers: dict[str, tuple[int, str]] = {}
        for name in names:
            port = free_port()
            argv = [sys.executable, __file__, "--serve", name, "--port", str(port)]
            proc = stack.enter_context(
                running([*argv, "--worker", worker], f"http://127.0.0.1:{port}/health", quiet=False)
            )
            servers[name] = (proc.pid, f"http://127.0.0.1:{port}")
        for _pid, url in servers.values():
            wrk.run_wrk([url], 8, 1, False)
            wrk.run_wrk([url], 8, 1, True)
        print(
            f"c={opts.concurrency}, {opts.duration:g}s per run, {opts.events} events per stream, "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        print(f"{'server':<16}{'load':<8}{'run':>4}{'req/s':>10}{'cpu ms/req':>12}{'errors':>8}")
        for stream in (False, True):
            for run in range(1, opts.repeat + 1):
                order = names if run % 2 else names[::-1]
                for name in order:
                    pid, url = servers[name]
                    before = tree_cpu_seconds(pid)
                    result = wrk.run_wrk([url], opts.concurrency, opts.duration, stream)
                    cpu = tree_cpu_seconds(pid) - before
                    row = {
                        "server": name,
                        "stream": stream,
                        "run": run,
                        "rps": result.rps,
                        "cpu_ms_per_req": 1e3 * cpu / max(1, result.requests),
                        "errors": result.errors,
                    }
                    rows.append(row)
                    load = "stream" if stream else "plain"
                    print(
                        f"{name:<16}{load:<8}{run:>4}{result.rps:>10,.0f}"
                        f"{row['cpu_ms_per_req']:>12.3f}{result.errors:>8}"
                    )
    print("\nmedian CPU ms per request (plain / stream), and as a share of aiohttp's")
    base: dict[bool, float] = {}
    for name in names:
        cells = []
        for stream in (False, True):
            values = [
                r["cpu_ms_per_req"] for r in rows if r["server"] == name and r["stream"] == stream
            ]
            mid = statistics.median(values)
            base.setdefault(stream, mid)
            cells.append(f"{mid:.3f} ({mid / base[stream]:.2f}x)")
        print(f"  {name:<16}" + "   ".join(cells))
    if opts.json is not None:
        opts.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()

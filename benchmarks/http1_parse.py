"""CPU cost of the forwarding client's response parsing, without sockets.

Feeds recorded worker answers (a small JSON completion, and an SSE stream of
small chunked events) into ``http1.Connection`` through a fake transport and
times whole exchanges: head parsed, body taken, connection ready for reuse.
CPU time (``time.process_time``), so other load on the machine does not count.

    .venv/bin/python benchmarks/http1_parse.py --repeat 5

Run it with ``PYTHONPATH=<another checkout>/src`` to compare parsers across commits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import cast

from kvgate.gateway.upstream import http1

_PLAIN = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
    b"Content-Length: %d\r\nDate: Tue, 01 Dec 2026 10:00:00 GMT\r\nServer: Python/3.11 aiohttp\r\n"
    b"\r\n"
)
_BODY = (
    b'{"id":"cmpl-1","object":"text_completion","created":0,"model":"demo","choices":[{"index":0,'
    b'"text":" a b c d","finish_reason":"length"}],"usage":{"prompt_tokens":3,'
    b'"completion_tokens":4,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}}'
)
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\nDate: Tue, 01 Dec 2026 10:00:00 GMT\r\n\r\n"
)
_EVENT = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":0,"model":"demo",'
    b'"choices":[{"index":0,"text":" tok","finish_reason":null}]}\n\n'
)


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def run(kind: str, n: int, events: int) -> tuple[float, int]:
    """CPU seconds for ``n`` exchanges of ``kind``; and the pieces fed per exchange."""
    loop = asyncio.new_event_loop()
    try:
        conn = http1.Connection(loop)
        conn.connection_made(cast(asyncio.Transport, _Transport()))
        if kind == "plain":
            pieces = [_PLAIN % len(_BODY) + _BODY]
        else:
            # The head alone, then one chunked event per read, then the end marker:
            # what a streaming worker's writes look like on the wire.
            pieces = [_SSE_HEAD] + [_chunk(_EVENT)] * events + [_chunk(b"data: [DONE]\n\n")]
            pieces.append(b"0\r\n\r\n")
        start = time.process_time()
        for _ in range(n):
            conn.start(b"POST / HTTP/1.1\r\n\r\n", 60.0, 60.0)
            for piece in pieces:
                conn.data_received(piece)
                conn.take()
            if not conn.reusable:
                raise SystemExit("the exchange did not end cleanly")
        return time.process_time() - start, len(pieces)
    finally:
        loop.close()


def main() -> None:
    """Time each kind ``--repeat`` times; print µs per exchange and per piece."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20000, help="exchanges per run")
    parser.add_argument("--events", type=int, default=16, help="SSE events per stream")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    opts = parser.parse_args()
    print(f"parser module: {http1.__file__}")
    print(f"{'kind':<8}{'µs/exchange p50':>17}{'min':>8}{'max':>8}{'µs/piece':>10}")
    rows = []
    for kind in ("plain", "stream"):
        per: list[float] = []
        pieces = 1
        for _ in range(opts.repeat):
            cpu, pieces = run(kind, opts.n, opts.events)
            per.append(cpu / opts.n * 1e6)
        p50 = statistics.median(per)
        print(f"{kind:<8}{p50:>17.2f}{min(per):>8.2f}{max(per):>8.2f}{p50 / pieces:>10.2f}")
        rows.append({"kind": kind, "us_per_exchange": per, "pieces": pieces})
    if opts.json is not None:
        opts.json.write_text(json.dumps({"module": http1.__file__, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

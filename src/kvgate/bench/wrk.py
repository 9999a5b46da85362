"""Load from ``wrk`` (Debian's package) and time to first event, for the overhead benchmarks.

``wrk`` is a C load generator: it leaves most of the machine to the router being
measured, where a Python client would take a core of its own. It cannot see
when the first SSE event of a stream arrives, so ``first_event_times`` measures
that at one connection from a plain blocking socket.
"""

from __future__ import annotations

import re
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def body(stream: bool) -> bytes:
    """The small completion request every load sends."""
    if stream:
        return b'{"model":"demo","prompt":"hello world","max_tokens":16,"stream":true}'
    return b'{"model":"demo","prompt":"hello world","max_tokens":4}'


def _script(stream: bool, folder: Path, sessions: int = 0) -> Path:
    path = folder / ("stream.lua" if stream else "plain.lua")
    if not path.exists():
        text = body(stream).decode()
        lua = (
            'wrk.method = "POST"\n'
            f"wrk.body = '{text}'\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
        if sessions:
            # Each request names one of ``sessions`` sessions in turn (X-Session-ID).
            lua += (
                "local n = 0\n"
                "request = function()\n"
                "  n = n + 1\n"
                f'  wrk.headers["X-Session-ID"] = "s" .. (n % {sessions})\n'
                "  return wrk.format()\n"
                "end\n"
            )
        path.write_text(lua)
    return path


@dataclass
class WrkResult:
    """What one or more concurrent ``wrk`` runs reported."""

    requests: int
    elapsed: float
    p50_ms: float
    p99_ms: float
    errors: int
    """Non-2xx answers plus socket errors (connect, read, write, timeouts)."""
    non2xx: int = 0
    """Of ``errors``, the answers with a non-2xx status (the rest are socket errors)."""

    @property
    def rps(self) -> float:
        """Completed requests per second."""
        return self.requests / self.elapsed if self.elapsed else 0.0


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(match[1]) * _UNITS[match[2]]


def _parse(out: str) -> WrkResult:
    done = re.search(r"(\d+) requests in ([\d.]+)(ms|s|m)", out)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    if done is None or p50 is None or p99 is None:
        raise RuntimeError(f"could not read wrk's output:\n{out}")
    errors = non2xx = 0
    if found := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        non2xx = int(found[1])
        errors += non2xx
    socket_errors = r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"
    if found := re.search(socket_errors, out):
        errors += sum(int(x) for x in found.groups())
    return WrkResult(
        requests=int(done[1]),
        elapsed=_ms(done[2] + done[3]) / 1e3,
        p50_ms=_ms(p50[1]),
        p99_ms=_ms(p99[1]),
        errors=errors,
        non2xx=non2xx,
    )


def run_wrk(
    urls: list[str], connections: int, duration: float, stream: bool, sessions: int = 0
) -> WrkResult:
    """``connections`` spread over one ``wrk`` per URL, all at once; results merged.

    Requests and errors add up; p50/p99 are the slowest URL's (a conservative merge).
    With ``sessions``, each request names one of that many sessions in turn.
    """
    shares = [connections // len(urls) + (i < connections % len(urls)) for i in range(len(urls))]
    with tempfile.TemporaryDirectory(prefix="kvgate-wrk-") as folder:
        script = _script(stream, Path(folder), sessions)
        procs = []
        for url, n in zip(urls, shares, strict=True):
            if not n:
                continue
            argv = ["wrk", "-t1", f"-c{n}", f"-d{duration:g}s", "--latency", "-s", str(script)]
            argv.append(f"{url}/v1/completions")
            procs.append(
                subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            )
        parts = [_parse(proc.communicate()[0]) for proc in procs]
    return WrkResult(
        requests=sum(p.requests for p in parts),
        elapsed=max(p.elapsed for p in parts),
        p50_ms=max(p.p50_ms for p in parts),
        p99_ms=max(p.p99_ms for p in parts),
        errors=sum(p.errors for p in parts),
        non2xx=sum(p.non2xx for p in parts),
    )


def first_event_times(url: str, n: int) -> list[float]:
    """Seconds from sending a streamed request to its first ``data:`` bytes, ``n`` times.

    One keep-alive connection; each stream is read to its end (``0\\r\\n\\r\\n``, or
    the close of a read-to-close answer) before the next request goes out.
    """
    host, _, port = url.removeprefix("http://").partition(":")
    payload = body(stream=True)
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    times: list[float] = []
    sock: socket.socket | None = None
    try:
        for _ in range(n):
            if sock is None:
                sock = socket.create_connection((host, int(port)), timeout=10)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            start = time.perf_counter()
            sock.sendall(request)
            seen = b""
            first: float | None = None
            while True:
                data = sock.recv(65536)
                if not data:
                    sock.close()
                    sock = None
                    break
                seen += data
                if first is None and b"data:" in seen:
                    first = time.perf_counter() - start
                if seen.endswith(b"0\r\n\r\n"):
                    break
            if first is not None:
                times.append(first)
    finally:
        if sock is not None:
            sock.close()
    return times

"""A raw-socket fuzz of the gateway: request lines, headers, bodies, encodings, JSON, framing.

Hypothesis draws whole HTTP requests, bytes and all, and sends them over a plain
socket to a gateway (client API keys on) in front of two emulated workers. Each
drawn request knows what it should get (an oracle built as it is drawn): every
part valid, a 2xx; a part that is wrong whatever the rest (no or a wrong key on
a ``/v1/`` path, a broken request line, a ``Content-Length`` that is no number),
a 4xx; otherwise at least no 5xx. Whatever it sends:

- an answer comes (no hang): within the configured head/body deadlines (short
  here) at the latest;
- it is never a 5xx;
- every error the gateway gives is in the OpenAI shape, ``{"error": {"message",
  "type", "code"}}`` with a JSON content type;
- nothing logged a traceback, and nothing was logged at ERROR.

Three families aim at what clients broke before (issue 45): paths that climb out
of ``/v1`` (dot segments literal or encoded in any case, encoded slashes) get a
400 ``invalid_path``; credential headers in any case of their names (the key in
``AuThOrIzAtIoN`` works, a wrong one is a 401); HEAD, and methods the POST-only
endpoints do not take, get a 405 with ``Allow`` at once.

Examples are derandomized (the same ones every run), and bounded in number.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import os
import socket
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgate.gateway.testing import running_gateway
from kvgate.testing import wait_until
from kvgate.workersim import WorkerOptions, running_worker

pytestmark = pytest.mark.usefixtures("both_servers")

EXAMPLES = 200
"""Mixed requests per server."""
FAMILY_EXAMPLES = 120
"""Requests of the three families (traversal, credential case, method) per server."""
STATUSES: Counter[int] = Counter()
"""Answers seen over the fuzz, by status (to show it reached the workers too)."""
CHECKED: Counter[str] = Counter()
"""Answers checked against each expectation (to show the oracle is not vacuous)."""
READ_DEADLINE_S = 8.0
TOKEN = "fuzz-admin-token"
KEY = "fuzz-client-key"


# -- the fleet, on a loop of its own (hypothesis drives plain sync code) -------------


class _Recorder(logging.Handler):
    """Keeps every record that has a traceback or is at ERROR or above."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.bad: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.exc_text or record.levelno >= logging.ERROR:
            trace = logging.Formatter().formatException(record.exc_info) if record.exc_info else ""
            self.bad.append(f"{record.levelname} {record.name}: {record.getMessage()} {trace}")


class BackgroundFleet:
    """Two emulated workers and a gateway, served by an event loop on another thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.stack = contextlib.AsyncExitStack()
        self.port = 0

    async def _start(self) -> None:
        urls = []
        for i in range(2):
            options = WorkerOptions(port=0, seed=i, profile="fast", time_scale=50.0)
            urls.append((await self.stack.enter_async_context(running_worker(options))).url)
        config = {
            "workers": [{"url": url} for url in urls],
            "health": {"interval_s": 0.2, "timeout_s": 2.0},
            "retries": {"backoff_base_s": 0.0, "backoff_max_s": 0.0},
            "timeouts": {"first_byte_s": 3.0, "total_s": 4.0},
            "limits": {"header_timeout_s": 1.0, "body_timeout_s": 1.0},
            "admin_token": TOKEN,
            "api_keys": [KEY],
        }
        gw = await self.stack.enter_async_context(running_gateway(config))
        await wait_until(
            lambda: all(w.probe_ok and w.model for w in gw.gateway.pool), message="workers up"
        )
        self.port = int(gw.url.rsplit(":", 1)[1])
        self.gateway = gw.gateway

    def __enter__(self) -> BackgroundFleet:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(60)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.stack.aclose(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[BackgroundFleet, _Recorder]]:
    recorder = _Recorder()
    root = logging.getLogger()
    level = root.level
    root.addHandler(recorder)
    root.setLevel(logging.DEBUG)
    try:
        with BackgroundFleet() as running:
            yield running, recorder
    finally:
        root.removeHandler(recorder)
        root.setLevel(level)


# -- what a request is made of -------------------------------------------------------

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=3),  # surrogates
)
json_values = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
texts = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=3),
    st.just("mode:poison"),
)
messages = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.one_of(
                st.sampled_from(["user", "system", "assistant", "tool"]), json_values
            ),
            "content": st.one_of(
                texts,
                json_values,
                st.lists(
                    st.fixed_dictionaries({"type": st.just("text"), "text": texts}), max_size=2
                ),
            ),
        },
    ),
    max_size=3,
)
prompts = st.one_of(
    texts,
    st.lists(texts, max_size=3),
    st.lists(st.integers(min_value=-5, max_value=2**66), max_size=5),
    st.lists(st.lists(st.integers(min_value=-1, max_value=2**40), max_size=3), max_size=2),
    json_values,
)
openai_bodies = st.fixed_dictionaries(
    {"model": st.one_of(st.just("demo"), st.just("demo"), json_values)},
    optional={
        "prompt": prompts,
        "messages": messages,
        "stream": st.one_of(st.booleans(), json_values),
        "max_tokens": st.one_of(st.integers(min_value=-3, max_value=8), json_values),
        "user": st.one_of(texts, json_values),
        "stream_options": st.one_of(st.just({"include_usage": True}), json_values),
        "temperature": json_values,
    },
)


def mostly(valid: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` about four times in five, else ``other``: each part of a request is
    usually right, so a drawn request is often valid but for one or two parts."""
    return st.integers(min_value=0, max_value=99).flatmap(lambda n: valid if n < 80 else other)


good_prompts = st.fixed_dictionaries(
    {"model": st.just("demo"), "prompt": st.text(min_size=1, max_size=30)},
    optional={
        "max_tokens": st.integers(1, 4),
        "stream": st.booleans(),
        "user": st.text(max_size=8),
    },
)
good_chats = st.fixed_dictionaries(
    {
        "model": st.just("demo"),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=30)}),
            min_size=1,
            max_size=2,
        ),
    },
    optional={"max_tokens": st.integers(1, 4), "stream": st.booleans()},
)
GOOD = {"/v1/completions": good_prompts, "/v1/chat/completions": good_chats}
"""A valid body for each generation endpoint."""


@st.composite
def bodies(draw: st.DrawFn, kind: str, path: str) -> bytes:
    """A body of ``kind``: ``good`` (valid for ``path``'s endpoint, else for either), or
    one of the ways to be wrong."""
    if kind == "good":
        good = GOOD[path] if path in GOOD else st.one_of(*GOOD.values())
        return json.dumps(draw(good)).encode()
    if kind == "openai":
        value: Any = draw(openai_bodies)
    elif kind == "json":
        value = draw(json_values)
    elif kind == "deep":
        depth = draw(st.integers(min_value=1, max_value=5000))
        opener = draw(st.sampled_from(["[", '{"a":']))
        closer = "]" if opener == "[" else "}"
        return ('{"model":"demo","prompt":' + opener * depth + "1" + closer * depth + "}").encode()
    elif kind == "bytes":
        return draw(st.binary(max_size=200))
    else:
        return b""
    ascii_only = draw(st.booleans())
    text = json.dumps(value, ensure_ascii=ascii_only)
    return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class RawRequest:
    """One request's bytes, cut into the pieces it is sent in, and what it should get."""

    pieces: tuple[bytes, ...]
    method: str
    expect: str = "any"
    """``2xx``, ``4xx``, or ``any`` (no 5xx, as every answer); a status (``405``) exactly."""
    code: str | None = None
    """The error code an exact 4xx carries."""

    def __repr__(self) -> str:
        return f"RawRequest({self.expect}, {b''.join(self.pieces)[:600]!r})"


_GENERATION = ["/v1/completions", "/v1/chat/completions"]
_PATHS = [
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/healthz", "/readyz",
    "/metrics", "/admin/workers", "/admin/models", "/nope", "/v1/completions?x=1",
    "/v1/../v1/completions", "//v1/completions", "/%ff", "*", "/health",
]  # fmt: skip
_METHODS = ["POST", "POST", "POST", "GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "BREW"]
_HEADER_NAMES = [
    "Content-Type", "Accept", "Authorization", "X-Session-ID", "X-Kvgate-Priority",
    "X-Kvgate-Model-Version", "Connection", "Expect", "Accept-Encoding", "User-Agent",
    "X-Request-ID", "Upgrade", "Cookie",
]  # fmt: skip


def any_case(name: str) -> st.SearchStrategy[str]:
    """``name`` with each letter's case drawn."""
    return st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
        lambda upper: "".join(
            c.upper() if u else c.lower() for c, u in zip(name, upper, strict=True)
        )
    )


def _frame(
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    payload: bytes,
    version: str = "HTTP/1.1",
) -> bytes:
    head = f"{method} {path} {version}\r\n".encode("utf-8", "surrogatepass")
    return (
        head
        + b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        + b"\r\n"
        + payload
    )


def _split(draw: st.DrawFn, data: bytes) -> tuple[bytes, ...]:
    splits = sorted(
        draw(st.lists(st.integers(min_value=1, max_value=max(1, len(data) - 1)), max_size=3))
    )
    pieces, start = [], 0
    for at in [*splits, len(data)]:
        if at > start:
            pieces.append(data[start:at])
            start = at
    return tuple(pieces)


@st.composite
def raw_requests(draw: st.DrawFn) -> RawRequest:
    """A request whose every part is usually right, and what it should get."""
    method = draw(mostly(st.just("POST"), st.sampled_from(_METHODS) | st.text(max_size=6)))
    path = draw(
        mostly(st.sampled_from(_GENERATION), st.sampled_from(_PATHS) | st.text(max_size=30))
    )
    version = draw(
        mostly(st.just("HTTP/1.1"), st.sampled_from(["HTTP/1.0", "HTTP/2.0", "HTP/1.1"]))
    )
    kind = draw(
        mostly(st.just("good"), st.sampled_from(["openai", "json", "deep", "bytes", "empty"]))
    )
    body = draw(bodies(kind, path))
    encoding = draw(
        mostly(st.just("none"), st.sampled_from(["gzip", "gzip-label", "deflate", "weird"]))
    )
    headers: list[tuple[bytes, bytes]] = [(b"Host", b"gateway")]
    if encoding == "gzip":
        body = gzip.compress(body)
        headers.append((b"Content-Encoding", b"gzip"))
    elif encoding == "gzip-label":
        headers.append((b"Content-Encoding", b"gzip"))
    elif encoding == "deflate":
        body = zlib.compress(body)
        headers.append((b"Content-Encoding", b"deflate"))
    elif encoding == "weird":
        headers.append(
            (b"Content-Encoding", draw(st.sampled_from([b"br", b"zstd", b"x", b"gzip, gzip"])))
        )
    headers.append(
        (b"Content-Type", draw(st.sampled_from([b"application/json", b"text/plain", b""])))
    )
    key = draw(mostly(st.just("right"), st.sampled_from(["none", "wrong"])))
    if key != "none":
        name = draw(any_case("Authorization")).encode()
        given = KEY if key == "right" else "not-" + KEY
        headers.append((name, f"Bearer {given}".encode()))
    extras = draw(st.integers(min_value=0, max_value=4))
    for _ in range(extras):
        name = draw(st.sampled_from(_HEADER_NAMES)).encode()
        value = draw(
            mostly(
                st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(
                    str.encode
                ),
                st.binary(max_size=40).filter(lambda v: b"\r" not in v and b"\n" not in v),
            )
        )
        headers.append((name, value))
    junk = draw(mostly(st.just(False), st.just(True)))
    if junk:
        headers.append((draw(st.binary(min_size=1, max_size=10)), draw(st.binary(max_size=10))))
    framing = draw(
        mostly(
            st.sampled_from(["length", "chunked"]),
            st.sampled_from(["short", "long", "none", "bad"]),
        )
    )
    if framing == "chunked":
        headers.append((b"Transfer-Encoding", b"chunked"))
        cut = draw(st.integers(min_value=0, max_value=len(body)))
        chunks = [body[:cut], body[cut:]]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c) + b"0\r\n\r\n"
    elif framing == "bad":
        headers.append(
            (
                b"Content-Length",
                draw(st.sampled_from([b"-1", b"abc", b"1e3", b"99999999999999999999", b"1, 2"])),
            )
        )
        payload = body
    elif framing == "none":
        payload = body
    else:
        length = len(body) + {"length": 0, "short": -1, "long": 7}[framing]
        headers.append((b"Content-Length", str(max(0, length)).encode()))
        payload = body
    data = _frame(method, path, headers, payload, version)
    # The oracle: every part right is a 2xx; a part wrong whatever the rest, a 4xx.
    valid = (
        method == "POST"
        and path in _GENERATION
        and version == "HTTP/1.1"
        and kind == "good"
        and encoding in ("none", "gzip", "deflate")
        and key == "right"
        and extras == 0
        and not junk
        and framing in ("length", "chunked")
    )
    wrong = version == "HTP/1.1" or framing == "bad" or (key != "right" and path.startswith("/v1/"))
    expect = "2xx" if valid else "4xx" if wrong else "any"
    return RawRequest(_split(draw, data), method, expect)


_BODY = b'{"model":"demo","prompt":"hi","max_tokens":1}'
_JSON_HEADERS = [(b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(_BODY))]
_AUTH = (b"Authorization", f"Bearer {KEY}".encode())

_CLIMBS = ["..", ".", "%2e%2e", "%2E%2E", "%2e%2E", ".%2e", "%2e.", "%2e", "%252e%252e"]
_SLASHES = ["%2f", "%2F", "%5c", "%5C", "\\"]
_TARGETS = ["admin/faults", "reset_prefix_cache", "sleep", "slots/0?action=erase", "metrics"]


@st.composite
def traversals(draw: st.DrawFn) -> RawRequest:
    """A path climbing out of ``/v1`` (or resolving inside it): a 400, never forwarded."""
    segments = ["v1", *draw(st.lists(st.sampled_from(["x", "chat", "completions"]), max_size=2))]
    how = draw(st.sampled_from(["segment", "slash"]))
    if how == "segment":
        climb = draw(st.sampled_from(_CLIMBS))
        segments += [climb] * draw(st.integers(min_value=1, max_value=3))
        path = "/" + "/".join(segments) + "/" + draw(st.sampled_from(_TARGETS))
    else:
        slash = draw(st.sampled_from(_SLASHES))
        path = "/" + "/".join(segments) + "/" + ".." + slash + draw(st.sampled_from(_TARGETS))
    method = draw(st.sampled_from(["POST", "GET", "DELETE", "PUT", "PATCH"]))
    data = _frame(method, path, [(b"Host", b"gateway"), _AUTH, *_JSON_HEADERS], _BODY)
    return RawRequest((data,), method, "400", code="invalid_path")


@st.composite
def credentials(draw: st.DrawFn) -> RawRequest:
    """The key in any case of ``Authorization``'s name (2xx), a wrong one (401), and other
    credential headers in any case beside it (no effect on the answer)."""
    right = draw(st.booleans())
    lines = [(b"Host", b"gateway")]
    name = draw(any_case("Authorization")).encode()
    lines.append((name, f"Bearer {KEY if right else 'wrong-key'}".encode()))
    for other in draw(
        st.lists(
            st.sampled_from(["X-Api-Key", "Api-Key", "Cookie", "Proxy-Authorization"]), max_size=3
        )
    ):
        lines.append((draw(any_case(other)).encode(), b"client-secret"))
    lines += _JSON_HEADERS
    path = "/v1/completions"  # _BODY is a completion's
    expect = "2xx" if right else "401"
    return RawRequest(
        (_frame("POST", path, lines, _BODY),),
        "POST",
        expect,
        code=None if right else "invalid_api_key",
    )


_POST_ONLY = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]


@st.composite
def not_allowed(draw: st.DrawFn) -> RawRequest:
    """HEAD anywhere under ``/v1`` but the model list, and any method but POST on the
    POST-only endpoints: a 405 with ``Allow``, answered by the gateway."""
    method = draw(st.sampled_from(["HEAD", "GET", "PUT", "DELETE", "PATCH", "OPTIONS"]))
    if method == "HEAD":
        path = draw(st.sampled_from([*_POST_ONLY, "/v1/anything", "/v1/files/x"]))
    else:
        path = draw(st.sampled_from(_POST_ONLY))
    lines = [(b"Host", b"gateway"), _AUTH, (b"Content-Length", b"0")]
    return RawRequest((_frame(method, path, lines, b""),), method, "405", code="method_not_allowed")


# -- one exchange --------------------------------------------------------------------


@dataclass
class Answer:
    status: int | None
    headers: dict[str, str]
    body: bytes


def _exchange(port: int, request: RawRequest) -> Answer:
    deadline = time.monotonic() + READ_DEADLINE_S
    data = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=READ_DEADLINE_S) as sock:
        with contextlib.suppress(OSError):
            for piece in request.pieces:
                sock.sendall(piece)
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                break
            if not chunk:
                break
            data += chunk
            answer = _parse(bytes(data), request.method)
            if answer is not None:
                return answer
    found = _parse(bytes(data), request.method, complete=True)
    assert found is not None and found.status is not None, (
        f"no answer within {READ_DEADLINE_S}s (got {bytes(data)[:200]!r})"
    )
    return found


def _parse(data: bytes, method: str, complete: bool = False) -> Answer | None:
    while data.startswith(b"HTTP/1.1 100 "):  # an interim answer to Expect: 100-continue
        data = data.partition(b"\r\n\r\n")[2]
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if method == "HEAD" or status in (204, 304):
        return Answer(status, headers, b"")
    length = headers.get("content-length")
    if length is not None:
        if len(rest) >= int(length):
            return Answer(status, headers, rest[: int(length)])
        return Answer(status, headers, rest) if complete else None
    if headers.get("transfer-encoding", "").lower() == "chunked":
        if rest.endswith(b"0\r\n\r\n") or complete:
            return Answer(status, headers, _dechunk(rest))
        return None
    return Answer(status, headers, rest) if complete else None


def _dechunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return bytes(out)
        size = int(data[pos:end].split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2


def _check(answer: Answer, request: RawRequest) -> None:
    """The answer is what ``request`` should get, and an error is in the OpenAI shape."""
    status = answer.status
    assert status is not None
    assert status < 500, answer
    expect = request.expect
    if expect == "2xx":
        assert 200 <= status < 300, answer
    elif expect == "4xx":
        assert 400 <= status < 500, answer
    elif expect != "any":
        assert status == int(expect), answer
    if expect == "405":  # the gateway's own: it says what is allowed
        assert "POST" in answer.headers.get("allow", ""), answer
    if status >= 400 and request.method != "HEAD":  # HEAD answers carry no body
        assert answer.headers.get("content-type", "").startswith("application/json"), answer
        error = json.loads(answer.body)["error"]
        assert isinstance(error["message"], str) and error["message"], answer
        assert isinstance(error["type"], str) and error["type"], answer
        assert "code" in error, answer
        if request.code is not None:
            assert error["code"] == request.code, answer


def _fuzz(running: BackgroundFleet, recorder: _Recorder, request: RawRequest) -> None:
    answer = _exchange(running.port, request)
    STATUSES[answer.status or 0] += 1
    CHECKED[request.expect] += 1
    if os.environ.get("FUZZ_DEBUG"):
        print(request.expect, answer.status, answer.body[:160])
    _check(answer, request)
    assert not recorder.bad, recorder.bad


_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


@_SETTINGS
@given(request=raw_requests())
def test_fuzzed_requests_get_the_answer_they_should(
    fleet: tuple[BackgroundFleet, _Recorder], request: RawRequest
) -> None:
    _fuzz(*fleet, request)


@settings(_SETTINGS, max_examples=FAMILY_EXAMPLES)
@given(request=st.one_of(traversals(), credentials(), not_allowed()))
def test_traversals_credential_cases_and_head_get_the_answer_they_should(
    fleet: tuple[BackgroundFleet, _Recorder], request: RawRequest
) -> None:
    _fuzz(*fleet, request)


def test_after_the_fuzz_no_worker_was_ejected_and_nothing_was_logged_badly(
    fleet: tuple[BackgroundFleet, _Recorder],
) -> None:
    running, recorder = fleet
    assert not recorder.bad, recorder.bad
    assert not any(w.ejected for w in running.gateway.pool)
    # The fuzz reached the workers as well as the gateway's own refusals.
    print("fuzz statuses:", dict(sorted(STATUSES.items())), "checked:", dict(CHECKED))
    assert STATUSES[200] >= 10 and STATUSES[400] >= 10 and STATUSES[405] >= 5, STATUSES
    assert CHECKED["2xx"] >= 20 and CHECKED["4xx"] >= 10, CHECKED
    assert CHECKED["400"] >= 5 and CHECKED["401"] >= 5 and CHECKED["405"] >= 5, CHECKED

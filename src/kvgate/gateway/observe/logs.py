"""Logs: one access line per request (JSON or plain text) and the process log set-up."""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import re
import sys
import threading
import time
from dataclasses import dataclass, fields
from typing import TextIO

from kvgate.redaction import RedactingFilter, redact

ACCESS_LOGGER = "kvgate.access"


@dataclass(slots=True)
class AccessRecord:
    """One finished request, as logged (answered, refused or failed).

    Not frozen: a frozen dataclass sets each of its 17 fields through
    ``object.__setattr__``, which costs more than the line it feeds (one per
    request); nothing keeps a record past the write.

    ``model`` is what the client asked for, even when no worker serves it;
    ``reason`` is the route reason, or the shed reason of a refused request.
    Token counts are ``None`` when the response carried no usage.
    """

    request_id: str
    model: str
    worker: str
    version: str
    reason: str
    status: int
    ttft: float | None
    duration: float
    retries: int = 0
    method: str = "POST"
    path: str = ""
    session: str = "none"
    """Where the session key came from: header, user, prefix or none."""
    stream: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    key: str | None = None
    """The name of the client API key the request presented (``api_keys[].name``; ``None``:
    none, or unnamed): which tenant it was. Never the key, nor a digest of it."""


_FIELDS = tuple(f.name for f in fields(AccessRecord))
_TEXT_FIELDS = ("model", "worker", "version", "reason", "method", "path", "session")
"""The text fields other than the request id, which take few distinct values."""

_PLAIN_ORDER = (
    "worker",
    "version",
    "reason",
    "session",
    "key",
    "stream",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "ttft",
    "duration",
    "retries",
    "request_id",
)


_NEEDS_QUOTES = re.compile(r'[\s"=]')


def _seconds(value: float) -> str:
    """``str(round(value, 6))``, the same text, for a plain line's times.

    ``round`` formats the float to six decimals, parses that back, and ``str`` formats
    the result again: three conversions (1% of a request's instructions for two times
    a line). Between 1e-4 and 1e9 the six decimals, less trailing zeros, are that text
    already; outside that range (exponent notation, or more digits than the decimals
    tell apart) it is made as before.
    """
    if not 1e-4 <= value < 1e9:
        return str(round(value, 6))
    text = f"{value:.6f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _plain_value(value: object) -> str:
    if value is None:
        return "-"
    kind = type(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int or kind is float:
        return str(value)  # no quoting to look for
    text = str(value)
    if not text:
        return '""'
    if _NEEDS_QUOTES.search(text) is not None:
        return json.dumps(text)
    return text


class AccessLog:
    """Writes one line per request to the ``kvgate.access`` logger: JSON or plain text.

    Plain lines read like a web server's (``POST /v1/chat/completions 200 model=...``)
    followed by ``key=value`` pairs; JSON lines hold the same fields as one object.
    Nothing is formatted when the logger would drop the line.
    """

    def __init__(
        self, enabled: bool, logger: logging.Logger | None = None, *, json_lines: bool = True
    ) -> None:
        self.enabled = enabled
        self.json_lines = json_lines
        self._logger = logger or logging.getLogger(ACCESS_LOGGER)

    def write(self, record: AccessRecord) -> None:
        """Log one request on one line.

        Built by hand, not with ``dataclasses.asdict`` (which deep-copies: about
        25 µs of a request's ~400 µs of gateway CPU).
        """
        if not self._logger.isEnabledFor(logging.INFO):
            return
        sink = _sink_for(self._logger)
        if sink is not None and not self.json_lines:
            sink.write(sink.plain_line(record))
            return
        data = {name: getattr(record, name) for name in _FIELDS}
        if sink is not None:
            # The logging filter redacts whole lines; here each text field is redacted
            # (the few distinct workers, models and reasons once each, from a memo).
            clean = sink.clean
            for name in _TEXT_FIELDS:
                data[name] = clean(data[name])
            data["request_id"] = redact(record.request_id)
            if record.key is not None:
                data["key"] = clean(record.key)
        data["duration"] = round(record.duration, 6)
        if record.ttft is not None:
            data["ttft"] = round(record.ttft, 6)
        if self.json_lines:
            data["ts"] = round(time.time(), 6)
            line = json.dumps(data, separators=(",", ":"))
            if sink is not None:
                sink.write(line)
            else:
                self._logger.info(line)
            return
        model = _plain_value(data["model"])
        head = f"{data['method']} {data['path'] or '-'} {record.status} model={model}"
        rest = " ".join(f"{k}={_plain_value(data[k])}" for k in _PLAIN_ORDER)
        self._logger.info("%s %s", head, rest)


class _AccessSink:
    """Access lines straight to the process log's stream, one write per event-loop turn.

    The same lines, in the same format, as through the ``logging`` module, which
    costs a record, a filter, a formatter and a write with a flush for each:
    about a fifth of a request's CPU on the data plane. Used only while the
    process's logging is the one ``configure_logging`` set up (a test capturing
    logs, or an embedding application's handlers, get records as before).
    """

    def __init__(self, handler: _ProcessHandler, json_lines: bool) -> None:
        self.handler = handler
        self.json_lines = json_lines
        self._lines: list[str] = []
        self._scheduled = False
        self._second = -1
        self._stamp = ""
        self._memo: dict[str, str] = {}
        self._plain: dict[str, str] = {}
        self._starts: dict[tuple[str | int | None, ...], str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0

    def clean(self, text: str) -> str:
        """``text`` redacted, from a bounded memo."""
        memo = self._memo
        found = memo.get(text)
        if found is None:
            if len(memo) >= 4096:
                memo.clear()  # made-up model names must not grow it without bound
            found = memo[text] = redact(text)
        return found

    def plain(self, text: str) -> str:
        """``text`` redacted and as a plain line shows it (quoted when needed), memoised."""
        memo = self._plain
        found = memo.get(text)
        if found is None:
            if len(memo) >= 4096:
                memo.clear()
            found = memo[text] = _plain_value(redact(text))
        return found

    def plain_line(self, r: AccessRecord) -> str:
        """The plain line of ``r``: what ``AccessLog`` logs, built in one f-string.

        Its start (method to ``stream=``) takes few distinct values (the fleet's
        workers, versions, reasons): it is memoised whole, one lookup a line.
        """
        key = (r.method, r.path, r.status, r.model, r.worker, r.version, r.reason, r.session, r.key)
        start = self._starts.get(key)
        if start is None:
            if len(self._starts) >= 4096:
                self._starts.clear()  # made-up model names must not grow it without bound
            plain = self.plain
            start = self._starts[key] = (
                f"{plain(r.method)} {plain(r.path) if r.path else '-'} {r.status} "
                f"model={plain(r.model)} worker={plain(r.worker)} version={plain(r.version)} "
                f"reason={plain(r.reason)} session={plain(r.session)} "
                f"key={'-' if r.key is None else plain(r.key)} "
            )
        ttft = "-" if r.ttft is None else _seconds(r.ttft)
        rid = r.request_id
        # The gateway's own ids are hex digits: nothing to redact or quote in them.
        if not rid.isalnum():
            rid = _plain_value(redact(rid))
        prompt, cached, completion = r.prompt_tokens, r.cached_tokens, r.completion_tokens
        return (
            f"{start}stream={'true' if r.stream else 'false'} "
            f"prompt_tokens={'-' if prompt is None else prompt} "
            f"cached_tokens={'-' if cached is None else cached} "
            f"completion_tokens={'-' if completion is None else completion} ttft={ttft} "
            f"duration={_seconds(r.duration)} retries={r.retries} request_id={rid}"
        )

    def write(self, line: str) -> None:
        """Hold one line (already redacted) for the end of this loop turn."""
        if not self.json_lines:
            now = time.time()
            second = int(now)
            if second != self._second:
                self._second = second
                self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
            millis = int((now - second) * 1000)
            line = f"{self._stamp},{millis:03d} INFO {ACCESS_LOGGER}: {line}"
        self._lines.append(line + "\n")
        if self._scheduled:
            return
        loop = self._running_loop()
        if loop is None:
            self.flush()
            return
        self._scheduled = True
        loop.call_soon(self.flush)

    def _running_loop(self) -> asyncio.AbstractEventLoop | None:
        """This thread's running loop, remembered: ``asyncio.get_running_loop`` makes a
        ``getpid`` system call each time, a few microseconds of every request at c=1."""
        loop = self._loop
        thread = threading.get_ident()
        if loop is not None and self._thread == thread and loop.is_running():
            return loop  # one loop runs in a thread at a time: this one is the running one
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        self._loop, self._thread = loop, thread
        return loop

    def flush(self) -> None:
        """Write the lines held, in one write."""
        self._scheduled = False
        if not self._lines:
            return
        text = "".join(self._lines)
        self._lines.clear()
        stream = self.handler.stream
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stderr: as logging, never fail the request for it


class _ProcessHandler(logging.StreamHandler[TextIO]):
    """The process log's handler (``configure_logging``), with its access-line sink."""

    def __init__(self, stream: TextIO, json_lines: bool) -> None:
        super().__init__(stream)
        self.sink = _AccessSink(self, json_lines)


def _sink_for(logger: logging.Logger) -> _AccessSink | None:
    """The sink of the process log's handler, when access lines would reach only it."""
    handlers = logging.root.handlers
    if len(handlers) != 1 or logger.handlers or logger.name != ACCESS_LOGGER:
        return None
    handler = handlers[0]
    return handler.sink if isinstance(handler, _ProcessHandler) else None


class _JsonFormatter(logging.Formatter):
    """Formats every log record as a JSON object (access lines pass through as-is)."""

    def format(self, record: logging.LogRecord) -> str:
        if record.name == ACCESS_LOGGER:
            return record.getMessage()
        data = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, separators=(",", ":"))


def configure_logging(json_logs: bool, level: int = logging.INFO) -> None:
    """Set up the process's root logger: JSON lines or plain text on stderr."""
    for old in logging.getLogger().handlers:
        if isinstance(old, _ProcessHandler):
            old.sink.flush()
    handler = _ProcessHandler(sys.stderr, json_logs)
    if json_logs:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())  # no credential in any line, whoever logs it
    root = logging.getLogger()
    root.handlers[:] = [handler]
    atexit.register(handler.sink.flush)  # the lines of the last loop turn
    root.setLevel(level)
    # aiohttp's own access log would duplicate ours.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

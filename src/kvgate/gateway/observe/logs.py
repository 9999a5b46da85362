"""Structured logs: one JSON line per request (optional) and the process log set-up."""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict, dataclass

from kvgate.redaction import RedactingFilter

ACCESS_LOGGER = "kvgate.access"


@dataclass(frozen=True, slots=True)
class AccessRecord:
    """One answered request, as logged."""

    request_id: str
    model: str
    worker: str
    version: str
    reason: str
    status: int
    ttft: float | None
    duration: float
    retries: int = 0


class AccessLog:
    """Writes ``AccessRecord``s as JSON lines to the ``kvgate.access`` logger when enabled."""

    def __init__(self, enabled: bool, logger: logging.Logger | None = None) -> None:
        self.enabled = enabled
        self._logger = logger or logging.getLogger(ACCESS_LOGGER)

    def write(self, record: AccessRecord) -> None:
        """Log one request as a JSON object on one line."""
        data = asdict(record)
        data["ts"] = round(time.time(), 6)
        data["duration"] = round(record.duration, 6)
        if record.ttft is not None:
            data["ttft"] = round(record.ttft, 6)
        self._logger.info(json.dumps(data, separators=(",", ":")))


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
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())  # no credential in any line, whoever logs it
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiohttp's own access log would duplicate ours.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

"""Credentials out of everything the gateway writes down: URLs, log lines, messages.

A Redis URL (``redis://:secret@host``) or a worker URL may carry a password; the
store and the prober name their peers in log lines. ``redact`` blanks the user
information of every URL in a text; the log filter applies it to every record,
so a new log line cannot leak a secret by forgetting to.
"""

from __future__ import annotations

import logging
import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/@]+@")
"""``scheme://user:password@`` (or ``scheme://token@``): what ``redact`` blanks."""

_SECRET_PARAM = re.compile(r"(?i)([?&](?:password|passwd|pass|token|secret|auth)=)[^&\s]+")


def redact(text: str) -> str:
    """``text`` with the user information (and password query fields) of its URLs blanked."""
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return _SECRET_PARAM.sub(r"\1***", text)


class RedactingFilter(logging.Filter):
    """A log filter that redacts credentials from each record's rendered message."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Render the message once, redact it, and keep the record."""
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True

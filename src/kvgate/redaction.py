"""Credentials out of everything the gateway writes down: URLs, log lines, messages.

A Redis URL (``redis://:secret@host``) or a worker URL may carry a password; the
store and the prober name their peers in log lines. ``redact`` blanks the user
information of every URL in a text; the log filter applies it to every record,
so a new log line cannot leak a secret by forgetting to.
"""

from __future__ import annotations

import logging
import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#]+@")
"""``scheme://user:password@`` (or ``scheme://token@``): what ``redact`` blanks, up to
the authority's *last* ``@`` (as URL parsers split it), so a raw ``@`` in a password
does not leave the rest of it showing."""

_SECRET_PARAM = re.compile(r"(?i)([?&](?:password|passwd|pass|token|secret|auth)=)[^&\s]+")


def redact(text: str) -> str:
    """``text`` with the user information (and password query fields) of its URLs blanked."""
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return _SECRET_PARAM.sub(r"\1***", text)


def without_userinfo(url: str) -> str:
    """``url`` with no user information (``http://user:pass@host:8000`` is
    ``http://host:8000``): how a worker is named wherever it is shown. The authority
    ends at the first ``/``, ``?`` or ``#`` and the user information at its last ``@``.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    end = len(rest)
    for stop in "/?#":
        found = rest.find(stop)
        if 0 <= found < end:
            end = found
    at = rest.rfind("@", 0, end)
    return url if at < 0 else f"{scheme}://{rest[at + 1 :]}"


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

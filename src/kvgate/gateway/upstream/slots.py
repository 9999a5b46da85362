"""llama.cpp's slot API as seen from the gateway: list slots, save, restore, erase.

The worker-side action boundary of offload and migration. What the llama.cpp
server in ``xllamacpp`` 2026.10 does, as tried against it:

- a request's ``id_slot`` field pins it to that slot (the answer does not name
  the slot, and ``GET /slots`` does not show the cached prompt's text, so the
  gateway pins every request rather than trying to read placement back);
- ``GET /slots`` lists ``{"id", "n_ctx", "is_processing", ...}`` per slot;
- ``POST /slots/{id}?action=save`` with ``{"filename"}`` answers
  ``{"n_saved": tokens, "n_written": bytes, "timings": {"save_ms"}}``;
  ``?action=restore`` answers ``n_restored``, ``n_read`` and ``restore_ms``;
  a missing or unreadable file is a 400. Both need ``--slot-save-path``;
- an ``id`` past the last slot is *not* refused (it acts on some other slot),
  so slot ids are only ever taken from ``GET /slots``.

Errors of every kind come out as ``SlotCallError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvgate.gateway.dataplane.errors import UpstreamError
from kvgate.gateway.upstream.transport import Upstream


class SlotCallError(Exception):
    """A slot call failed: unreachable, refused, or an answer that makes no sense."""


@dataclass(frozen=True, slots=True)
class SlotTransfer:
    """What one save or restore moved: tokens, bytes and the worker's own time."""

    tokens: int
    bytes: int
    seconds: float


class SlotActions:
    """The slot calls on one worker, through its ``Upstream`` (aiohttp's short calls)."""

    def __init__(self, upstream: Upstream, base_url: str, timeout_s: float) -> None:
        self.upstream = upstream
        self.base_url = base_url
        self.timeout_s = timeout_s

    async def count(self) -> int:
        """How many slots the worker has (``GET /slots``)."""
        try:
            status, body = await self.upstream.get(f"{self.base_url}/slots", self.timeout_s)
        except UpstreamError as exc:
            raise SlotCallError(f"GET /slots: {exc}") from None
        listed = _json(status, body, "GET /slots")
        if not isinstance(listed, list) or not listed:
            raise SlotCallError("GET /slots did not list any slot")
        try:
            ids = sorted(int(s["id"]) for s in listed if isinstance(s, dict) and "id" in s)
        except (TypeError, ValueError):  # an id that is no number
            raise SlotCallError("GET /slots listed an id that is not a number") from None
        if ids != list(range(len(listed))):
            raise SlotCallError(f"GET /slots listed unexpected ids {ids}")
        return len(ids)

    async def save(self, slot: int, filename: str) -> SlotTransfer:
        """Write ``slot``'s KV to ``filename`` under the worker's slot save path."""
        answer = await self._action(slot, "save", filename)
        return _transfer(answer, "n_saved", "n_written", "save_ms")

    async def restore(self, slot: int, filename: str) -> SlotTransfer:
        """Load ``filename`` into ``slot``; fails when the file is missing or unreadable."""
        answer = await self._action(slot, "restore", filename)
        return _transfer(answer, "n_restored", "n_read", "restore_ms")

    async def erase(self, slot: int) -> None:
        """Empty ``slot``'s KV (after a failed restore, so nothing half-loaded is reused)."""
        await self._action(slot, "erase", None)

    async def _action(self, slot: int, action: str, filename: str | None) -> dict[str, Any]:
        url = f"{self.base_url}/slots/{slot}?action={action}"
        body = json.dumps({"filename": filename} if filename is not None else {}).encode()
        what = f"{action} slot {slot}"
        try:
            status, answer = await self.upstream.post_short(
                url, body, self.timeout_s, {"Content-Type": "application/json"}
            )
        except UpstreamError as exc:
            raise SlotCallError(f"{what}: {exc}") from None
        decoded = _json(status, answer, what)
        if not isinstance(decoded, dict):
            raise SlotCallError(f"{what}: answer is not an object")
        return decoded


def _json(status: int, body: bytes, what: str) -> Any:
    if status != 200:
        raise SlotCallError(f"{what} answered {status}: {body[:200]!r}")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # nested past the parser's depth: no answer either
        raise SlotCallError(f"{what}: answer is not JSON") from None


def _transfer(answer: dict[str, Any], tokens: str, size: str, ms: str) -> SlotTransfer:
    try:
        timings = answer.get("timings") or {}
        return SlotTransfer(int(answer[tokens]), int(answer[size]), float(timings[ms]) / 1000.0)
    except (KeyError, TypeError, ValueError):
        raise SlotCallError(f"slot answer lacks {tokens}/{size}/{ms}: {answer}") from None

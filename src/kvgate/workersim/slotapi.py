"""llama.cpp's slot API on the emulated worker (``--slots N``), in llama.cpp's shapes.

- ``GET /slots``: ``[{"id", "id_task", "n_ctx", "speculative", "is_processing"}]``;
- ``POST /slots/{id}?action=save`` with ``{"filename"}``: ``{"id_slot", "filename",
  "n_saved", "n_written", "timings": {"save_ms"}}``;
- ``?action=restore``: ``{"id_slot", "filename", "n_restored", "n_read",
  "timings": {"restore_ms"}}``; a missing or foreign file is a 400;
- ``?action=erase``: ``{"id_slot", "n_erased"}``;
- without ``--slot-save-path`` every action is a 501 ``not_supported_error``, and
  ``GET /slots`` on a worker without slots is a 501 too, as llama.cpp answers
  with its slots endpoint disabled.

An action on a busy slot waits for it, as llama.cpp defers it. Save and restore
answer after their modelled time (``engine.slotio.SlotIo`` per token, at the
worker's time scale). Unlike llama.cpp, a slot id past the last slot is refused
(400) rather than quietly acting on another slot. Requests name their slot with
``id_slot`` (absent or -1: the worker picks, see ``SlotTable.pick``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from kvgate.engine.slotio import SlotIo
from kvgate.workersim.protocol import ApiError
from kvgate.workersim.slottable import SlotFileError, SlotTable
from kvgate.workersim.worker import WORKER_KEY, Worker

_IO = SlotIo()


def _table(worker: Worker) -> SlotTable:
    if worker.slot_table is None:
        raise ApiError(
            501, "This server does not support slots endpoint.", type_="not_supported_error"
        )
    return worker.slot_table


def requested_slot(extra: dict[str, Any] | None, table: SlotTable) -> int | None:
    """A request body's ``id_slot``: a slot index, or None (absent or -1: any slot)."""
    value = (extra or {}).get("id_slot")
    if value is None or value == -1:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(table.slots):
        raise ApiError(
            400, f"id_slot must be -1 or a slot id below {len(table.slots)}", param="id_slot"
        )
    return value


async def list_slots(request: web.Request) -> web.Response:
    """``GET /slots``."""
    worker = request.app[WORKER_KEY]
    table = _table(worker)
    return web.json_response(
        [
            {
                "id": i,
                "id_task": s.task,
                "n_ctx": worker.context_limit,
                "speculative": False,
                "is_processing": s.busy,
            }
            for i, s in enumerate(table.slots)
        ]
    )


def _valid_filename(name: object) -> str:
    """llama.cpp's filename rule: a plain file name in the save folder."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > 255
        or name != name.strip()
        or name.endswith(".")
        or any(c in name for c in "/\\:\0")
        or name in (".", "..")
    ):
        raise ApiError(400, "Invalid filename", param="filename")
    return name


async def slot_action(request: web.Request) -> web.Response:
    """``POST /slots/{id}?action=save|restore|erase``."""
    worker = request.app[WORKER_KEY]
    table = _table(worker)
    if table.save_path is None:
        raise ApiError(
            501, "This server does not support slots action.", type_="not_supported_error"
        )
    try:
        slot = int(request.match_info["id"])
    except ValueError:
        raise ApiError(400, "Invalid slot id") from None
    if not 0 <= slot < len(table.slots):
        raise ApiError(400, f"Invalid slot id {slot}: the server has {len(table.slots)} slots")
    action = request.query.get("action", "")
    if action not in ("save", "restore", "erase"):
        raise ApiError(400, "Invalid action", param="action")
    filename = ""
    if action != "erase":
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            raise ApiError(400, "the body is not JSON") from None
        filename = _valid_filename(body.get("filename") if isinstance(body, dict) else None)
    await table.acquire(slot, [], task=-1)
    try:
        return await _act(worker, table, slot, action, filename)
    finally:
        table.release(slot)


async def _act(
    worker: Worker, table: SlotTable, slot: int, action: str, filename: str
) -> web.Response:
    scale = worker.options.time_scale
    if action == "erase":
        return web.json_response({"id_slot": slot, "n_erased": table.erase(slot)})
    if action == "save":
        tokens = table.save(slot, filename)  # a small file; the engine is read on the loop
        seconds = _IO.save_seconds(tokens)
        await asyncio.sleep(seconds / scale)
        return web.json_response(
            {
                "id_slot": slot,
                "filename": filename,
                "n_saved": tokens,
                "n_written": table.kv_bytes(tokens),
                "timings": {"save_ms": seconds * 1000.0},
            }
        )
    try:
        tokens = table.restore(slot, filename)
    except SlotFileError as exc:
        raise ApiError(
            400, f"Unable to restore slot, invalid slot save file: {exc}", param="filename"
        ) from None
    worker.driver.wake()
    seconds = _IO.restore_seconds(tokens)
    await asyncio.sleep(seconds / scale)
    return web.json_response(
        {
            "id_slot": slot,
            "filename": filename,
            "n_restored": tokens,
            "n_read": table.kv_bytes(tokens),
            "timings": {"restore_ms": seconds * 1000.0},
        }
    )

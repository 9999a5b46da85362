"""llama.cpp's slot API: see whether a worker is busy, and erase its slots' KV cache.

``GET /slots`` lists the worker's slots with ``is_processing``; ``POST
/slots/{id}?action=erase`` empties one slot's KV. The action needs the worker to
run with ``--slot-save-path`` (``LlamaCppOptions.slot_save_path``). Erasing does
not touch the host-RAM prompt cache (``cache_ram_mib``); only a worker without
one (``cache_ram_mib=0``) is fully cold afterwards.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

from kvgate.waiting import wait_until


class SlotActionError(RuntimeError):
    """A worker refused or failed a slot request; carries its answer."""


def _request(url: str, method: str, timeout: float) -> Any:
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:300]
        raise SlotActionError(f"{method} {url} answered {exc.code}: {body}") from None


def slots(url: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The worker's slots as ``GET /slots`` lists them (``id``, ``is_processing``, ...)."""
    listed = _request(url + "/slots", "GET", timeout)
    if not isinstance(listed, list):
        raise SlotActionError(f"GET {url}/slots answered {type(listed).__name__}, not a list")
    return listed


def idle(url: str, timeout: float = 10.0) -> bool:
    """True when no slot of the worker is processing a request."""
    return not any(slot.get("is_processing") for slot in slots(url, timeout))


def erase_slots(url: str, timeout: float = 10.0) -> int:
    """Erase every slot's KV cache; return how many slots were erased."""
    ids = [int(slot["id"]) for slot in slots(url, timeout)]
    for slot_id in ids:
        _request(f"{url}/slots/{slot_id}?action=erase", "POST", timeout)
    return len(ids)


async def reset_prefix_cache(url: str, timeout_s: float = 60.0) -> int:
    """Wait until the worker is idle, then erase its slots; return how many were erased.

    Raises ``TimeoutError`` if it stays busy past ``timeout_s``.
    """
    await wait_until(
        lambda: asyncio.to_thread(idle, url),
        timeout=timeout_s,
        interval=0.1,
        message=f"{url} to finish its requests",
    )
    return await asyncio.to_thread(erase_slots, url)

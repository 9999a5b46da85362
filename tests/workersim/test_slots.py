"""llama.cpp's slot API on the emulated worker: one prompt's KV per slot, save/restore/erase."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kvgate.workersim import WorkerHandle, running_worker

from .conftest import FAST
from .helpers import assert_openai_error, get_json, post


@pytest.fixture
async def llama(tmp_path: Path) -> AsyncIterator[WorkerHandle]:
    """A fast worker emulating a llama.cpp server with two slots and a save folder."""
    options = FAST.model_copy(update={"slots": 2, "slot_save_path": str(tmp_path)})
    async with running_worker(options) as handle:
        yield handle


def _text(seed: int, words: int = 200) -> str:
    return " ".join(f"w{seed}x{i}" for i in range(words))


async def _complete(worker: WorkerHandle, prompt: str, slot: int | None) -> int:
    """One 1-token completion in ``slot``; its cached tokens."""
    body: dict[str, Any] = {"model": "demo", "prompt": prompt, "max_tokens": 1}
    if slot is not None:
        body["id_slot"] = slot
    status, answer = await post(worker.url + "/v1/completions", body)
    assert status == 200, answer
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


async def _action(worker: WorkerHandle, slot: int, action: str, **body: Any) -> tuple[int, Any]:
    return await post(f"{worker.url}/slots/{slot}?action={action}", body)


async def test_slots_are_listed_in_llamacpp_shape(llama: WorkerHandle) -> None:
    status, listed = await get_json(llama.url + "/slots")
    assert status == 200
    assert [s["id"] for s in listed] == [0, 1]
    assert all(s["is_processing"] is False and s["n_ctx"] > 0 for s in listed)


async def test_each_slot_keeps_only_its_last_prompt(llama: WorkerHandle) -> None:
    a, b = _text(1), _text(2)
    assert await _complete(llama, a, 0) == 0
    assert await _complete(llama, a + " more", 0) >= 192  # a's KV is in slot 0
    assert await _complete(llama, a + " more", 1) == 0  # ... and only there
    assert await _complete(llama, b, 0) == 0  # b takes slot 0: a's KV is overwritten
    assert await _complete(llama, a + " again", 0) == 0


async def test_save_then_restore_into_another_slot(llama: WorkerHandle, tmp_path: Path) -> None:
    a, b = _text(3), _text(4)
    await _complete(llama, a, 0)
    status, saved = await _action(llama, 0, "save", filename="a.bin")
    assert status == 200, saved
    assert saved["id_slot"] == 0 and saved["filename"] == "a.bin"
    assert saved["n_saved"] >= 192 and saved["n_written"] == saved["n_saved"] * 4_096
    assert saved["timings"]["save_ms"] > 0
    assert (tmp_path / "a.bin").exists()
    await _complete(llama, b, 0)  # slot 0 now holds b
    await _complete(llama, b, 1)  # and slot 1 too
    status, restored = await _action(llama, 1, "restore", filename="a.bin")
    assert status == 200, restored
    assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
    assert restored["timings"]["restore_ms"] > 0
    assert await _complete(llama, a + " later", 1) >= 192  # served from the restored KV
    status, erased = await _action(llama, 1, "erase")
    assert status == 200 and erased["id_slot"] == 1 and erased["n_erased"] > 0
    assert await _complete(llama, a + " later still", 1) == 0


async def test_bad_slot_calls_are_openai_shaped_errors(llama: WorkerHandle) -> None:
    status, body = await _action(llama, 0, "restore", filename="missing.bin")
    assert status == 400
    assert_openai_error(body, "invalid_request_error")
    for name in ("../x.bin", "", " x.bin", "a/b"):
        status, body = await _action(llama, 0, "save", filename=name)
        assert status == 400 and "filename" in body["error"]["message"].lower(), name
    for raw in (b"not json", b"[1]", b'{"filename": 3}', b""):
        status, body = await post(f"{llama.url}/slots/0?action=save", None, raw=raw)
        assert status == 400, raw
        assert_openai_error(body, "invalid_request_error")
    status, body = await _action(llama, 0, "reboot")
    assert status == 400
    status, body = await _action(llama, 9, "erase")
    assert status == 400
    status, body = await post(
        llama.url + "/v1/completions",
        {"model": "demo", "prompt": "x", "max_tokens": 1, "id_slot": 5},
    )
    assert status == 400 and body["error"]["param"] == "id_slot"


async def test_without_slots_or_a_save_path_the_calls_are_not_supported(tmp_path: Path) -> None:
    async with running_worker(FAST) as plain:
        status, body = await get_json(plain.url + "/slots")
        assert status == 501
        assert_openai_error(body, "not_supported_error")
    async with running_worker(FAST.model_copy(update={"slots": 1})) as unsaved:
        status, _ = await get_json(unsaved.url + "/slots")
        assert status == 200
        status, body = await _action(unsaved, 0, "save", filename="x.bin")
        assert status == 501
        assert_openai_error(body, "not_supported_error")

"""What a llama.cpp worker answers to ``GET /slots`` cannot raise past ``SlotCallError``:
the slot plane treats any other exception as a bug, on the request's path."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from kvgate.gateway.upstream.slots import SlotActions, SlotCallError


class _Answering:
    """An ``Upstream`` stand-in whose every GET answers ``body``."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    async def get(
        self,
        url: str,
        limit_s: float,
        headers: Mapping[str, str] | None = None,
        *,
        max_bytes: int | None = None,
    ) -> tuple[int, bytes]:
        return self.status, self.body


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 200_000,  # nested past the JSON parser's depth: RecursionError, not ValueError
        b'[{"id": null}]',  # int(None): TypeError
        b'[{"id": "zero"}]',
        b'[{"id": [0]}]',
        b"{}",
        b"[]",
        b"not json",
    ],
)
async def test_a_hostile_slots_answer_is_a_slot_call_error(body: bytes) -> None:
    actions = SlotActions(_Answering(200, body), "http://w", 1.0)  # type: ignore[arg-type]
    with pytest.raises(SlotCallError):
        await actions.count()


async def test_a_well_formed_slots_answer_counts_its_slots() -> None:
    actions = SlotActions(_Answering(200, b'[{"id": 1}, {"id": 0}]'), "http://w", 1.0)  # type: ignore[arg-type]
    assert await actions.count() == 2

"""The wire format, pinned against vLLM's published schema (``vllm/distributed/kv_events.py``).

The ``vllm`` package does not install on this machine cheaply (it pulls torch), so the
structs below restate its schema: up to vLLM 0.10 (and SGLang) batches and events are
msgspec ``array_like`` structs; later vLLM encodes them as maps and adds fields. Both
must decode to the same events, and ``encode_batch`` must write what vLLM's own
decoder reads.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from kvgate.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from kvgate.kvevents.wire import WireError, decode_batch, encode_batch, seq_bytes, seq_of


class OldBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class OldStored(OldEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OldRemoved(OldEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class OldCleared(OldEvent, tag="AllBlocksCleared"):
    pass


class OldKVBatch(OldBatch):
    events: list[OldStored | OldRemoved | OldCleared]


class NewBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class NewEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class NewStored(NewEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None


class NewRemoved(NewEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class NewCleared(NewEvent, tag="AllBlocksCleared"):
    pass


class NewKVBatch(NewBatch):
    events: list[NewStored | NewRemoved | NewCleared]


EXPECTED = EventBatch(
    1.5,
    (
        BlockStored((11, 12), None, tuple(range(8)), 4, None, "GPU"),
        BlockRemoved((11,), "GPU"),
        AllBlocksCleared(),
    ),
)


def test_decodes_the_array_like_format() -> None:
    batch = OldKVBatch(
        1.5,
        [OldStored([11, 12], None, list(range(8)), 4, None, "GPU"), OldRemoved([11], "GPU"),
         OldCleared()],
    )  # fmt: skip
    assert decode_batch(msgspec.msgpack.encode(batch)) == EXPECTED


def test_decodes_the_map_format_with_bytes_hashes_and_later_fields() -> None:
    batch = NewKVBatch(
        2.0,
        [NewStored([b"\x01" * 32], 7, [1, 2], 2, None, "GPU", None, [None], 0),
         NewRemoved([b"\x01" * 32], "GPU", 0), NewCleared()],
        data_parallel_rank=1,
    )  # fmt: skip
    decoded = decode_batch(msgspec.msgpack.encode(batch))
    assert decoded.data_parallel_rank == 1
    assert decoded.events == (
        BlockStored((b"\x01" * 32,), 7, (1, 2), 2, None, "GPU"),
        BlockRemoved((b"\x01" * 32,), "GPU"),
        AllBlocksCleared(),
    )


def test_older_events_without_a_medium_decode() -> None:
    payload = msgspec.msgpack.encode([0.0, [["BlockStored", [1], None, [5], 1, None]]])
    assert decode_batch(payload).events == (BlockStored((1,), None, (5,), 1, None, None),)


def test_what_kvgate_publishes_is_what_vllms_decoder_reads() -> None:
    payload = encode_batch(EXPECTED)
    vllm = msgspec.msgpack.Decoder(OldKVBatch).decode(payload)
    assert [type(e).__name__ for e in vllm.events] == ["OldStored", "OldRemoved", "OldCleared"]
    assert vllm.events[0].token_ids == list(range(8))
    assert decode_batch(payload) == EXPECTED


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # not msgpack
        msgspec.msgpack.encode("hello"),
        msgspec.msgpack.encode([1.0, "x"]),
        msgspec.msgpack.encode([1.0, [["Teleported", [1]]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, ["a"], 1, None]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1.5], None, [1], 1, None]]]),
        msgspec.msgpack.encode([1.0, [["BlockRemoved"]]]),
        msgspec.msgpack.encode({"ts": "now", "events": []}),
    ],
)
def test_anything_else_is_a_wire_error(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode_batch(payload)


def test_sequence_frames() -> None:
    assert seq_of(seq_bytes(258)) == 258
    assert seq_of((-1).to_bytes(8, "big", signed=True)) == -1
    with pytest.raises(WireError):
        seq_of(b"\x00")

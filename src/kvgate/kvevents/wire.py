"""vLLM's KV event wire format (SGLang publishes the same), decoded and encoded.

Pinned from vLLM's ``vllm/distributed/kv_events.py`` (its published schema; the
``vllm`` package itself is not installed here):

- a message on the PUB socket is three frames: topic (bytes, ``""`` by default),
  sequence number (8 bytes, big-endian, rising by one per batch from 0), payload;
- the payload is msgpack of a ``KVEventBatch``: ``ts`` (float), ``events``,
  ``data_parallel_rank`` (int or absent). vLLM up to 0.10 and SGLang encode the
  batch and its events ``array_like`` (``[ts, events, dp_rank?]``); later vLLM
  encodes them as maps (``{"ts": ..., "events": [...], "data_parallel_rank": ...}``);
- an event is a tagged union, the tag its class name: ``["BlockStored",
  block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]``
  (or a map with ``"type": "BlockStored"``), ``["BlockRemoved", block_hashes,
  medium]``, ``["AllBlocksCleared"]``. Older engines omit ``medium``; newer ones add
  fields after it (``lora_name``, ``extra_keys``, ``group_idx``, ...), which are
  ignored. A block hash is an int (older vLLM, SGLang) or bytes (newer vLLM);
- replay: a client sends the first sequence number it wants (8 bytes, big-endian)
  to the ROUTER socket behind an empty delimiter frame (a REQ or DEALER socket);
  the publisher answers each buffered batch from there as ``[seq, payload]``, then
  ``[-1 (8 bytes, signed), b""]``.

Decoding reads the msgpack into plain values first and checks every field, so a
payload of another shape raises ``WireError`` rather than anything else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from kvgate.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEvent

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay's end marker."""

_decode = msgspec.msgpack.Decoder().decode
_encode = msgspec.msgpack.Encoder().encode


class WireError(ValueError):
    """A message that is not a KV event batch in the expected format."""


def seq_bytes(seq: int) -> bytes:
    """A sequence number as its frame."""
    return seq.to_bytes(8, "big", signed=True)


def seq_of(frame: bytes) -> int:
    """The sequence number a frame holds."""
    if len(frame) != 8:
        raise WireError(f"a sequence frame has 8 bytes, not {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def decode_batch(payload: bytes) -> EventBatch:
    """The batch a payload holds; ``WireError`` when it holds something else."""
    try:
        raw = _decode(payload)
    except msgspec.DecodeError as exc:
        raise WireError(f"not msgpack: {exc}") from None
    if isinstance(raw, list | tuple) and 2 <= len(raw) <= 3:
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) == 3 else None
    elif isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    else:
        raise WireError("a batch is [ts, events, rank?] or a map")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise WireError("a batch's ts is a number")
    if not isinstance(events, list):
        raise WireError("a batch's events are a list")
    if rank is not None and not _is_int(rank):
        raise WireError("a batch's data_parallel_rank is an int")
    return EventBatch(float(ts), tuple(_event(e) for e in events), rank)


def _event(raw: Any) -> KVEvent:
    if isinstance(raw, list | tuple) and raw:
        tag, fields = raw[0], list(raw[1:])
    elif isinstance(raw, dict):
        tag = raw.get("type")
        names = _FIELDS.get(tag) if isinstance(tag, str) else None
        fields = [raw.get(name) for name in names] if names is not None else []
    else:
        raise WireError("an event is a tagged array or map")
    if tag == "BlockStored":
        if len(fields) < 5:
            raise WireError("BlockStored has at least 5 fields")
        hashes, parent, tokens, size, lora = fields[:5]
        medium = fields[5] if len(fields) > 5 else None
        if parent is not None:
            _check_hash(parent)
        if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
            raise WireError("BlockStored's token_ids are ints")
        if not _is_int(size) or (lora is not None and not _is_int(lora)):
            raise WireError("BlockStored's block_size and lora_id are ints")
        return BlockStored(_hashes(hashes), parent, tuple(tokens), size, lora, _medium(medium))
    if tag == "BlockRemoved":
        if not fields:
            raise WireError("BlockRemoved has block_hashes")
        medium = fields[1] if len(fields) > 1 else None
        return BlockRemoved(_hashes(fields[0]), _medium(medium))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise WireError(f"unknown event {str(tag)[:40]!r}")


_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}  # fmt: skip


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_hash(value: object) -> None:
    if not (_is_int(value) or isinstance(value, bytes)):
        raise WireError("a block hash is an int or bytes")


def _hashes(value: object) -> tuple[int | bytes, ...]:
    if not isinstance(value, list):
        raise WireError("block_hashes is a list")
    for h in value:
        _check_hash(h)
    return tuple(value)


def _medium(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise WireError("medium is a string")
    return value


def encode_batch(batch: EventBatch) -> bytes:
    """A batch as vLLM (array-like, as SGLang too) encodes it."""
    events: list[list[Any]] = []
    for event in batch.events:
        if isinstance(event, BlockStored):
            events.append(
                [
                    "BlockStored",
                    list(event.block_hashes),
                    event.parent_block_hash,
                    list(event.token_ids),
                    event.block_size,
                    event.lora_id,
                    event.medium,
                ]
            )
        elif isinstance(event, BlockRemoved):
            events.append(["BlockRemoved", list(event.block_hashes), event.medium])
        else:
            events.append(["AllBlocksCleared"])
    fields: list[Any] = [batch.ts, events]
    if batch.data_parallel_rank is not None:
        fields.append(batch.data_parallel_rank)
    return _encode(fields)


def message(topic: bytes, seq: int, batch: EventBatch) -> Sequence[bytes]:
    """The frames of one published batch."""
    return (topic, seq_bytes(seq), encode_batch(batch))

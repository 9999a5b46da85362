"""``SlotTable``: llama.cpp's slots on the emulated worker, over the paged engine.

llama.cpp keeps, per slot, the KV of the last prompt the slot served; a request
reuses only the prefix it shares with its own slot's prompt. The emulated
worker gets the same behaviour from its paged engine (``engine.blocks``) by
giving every slot its own namespace of block hashes (each hash salted with the
slot's index), so a request hits only the blocks its own slot computed, and by
dropping a slot's old blocks past the shared prefix when another prompt takes
the slot (``Engine.forget``), as llama.cpp overwrites them.

Saving a slot writes its cached chain (the unsalted block hashes, so any slot of
any worker reading the same folder can load it) to a small JSON file; restoring
loads a file's chain into a slot as cached blocks (``Engine.adopt``). What the
answers report (tokens, bytes, milliseconds) is the modelled KV, not the file:
bytes from the profile's KV bytes per token, time from ``engine.slotio.SlotIo``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from kvgate.core.chain import shared_blocks
from kvgate.engine import Engine, EngineRequest
from kvgate.types import BlockHash

_MASK = (1 << 64) - 1
_FORMAT = "kvgate-workersim-slot"


class SlotFileError(ValueError):
    """A slot file is missing, unreadable, or was saved by another model or block size."""


def salted(chain: list[BlockHash], slot: int) -> list[BlockHash]:
    """``chain`` in ``slot``'s namespace of block hashes (a deterministic mix)."""
    salt = (slot + 1) * 0x9E3779B97F4A7C15
    return [((h ^ salt) * 0xBF58476D1CE4E5B9) & _MASK for h in chain]


@dataclass(slots=True)
class SlotState:
    """One slot: the unsalted chain of the prompt (and output) it last held."""

    chain: list[BlockHash] = field(default_factory=list)
    tokens: int = 0
    busy: bool = False
    last_used: int = 0
    task: int = -1


class SlotTable:
    """The slots of one emulated worker and the engine whose blocks they own."""

    def __init__(self, count: int, engine: Engine, *, model: str, save_path: Path | None) -> None:
        if count < 1:
            raise ValueError("a slot table needs at least one slot")
        self.engine = engine
        self.model = model
        self.save_path = save_path
        self.block_size = engine.config.block_size
        self.bytes_per_token = engine.config.kv_bytes_per_block / self.block_size
        self.slots = [SlotState() for _ in range(count)]
        self._uses = 0
        self._freed: asyncio.Event | None = None

    # -- leases ---------------------------------------------------------------

    def pick(self, chain: list[BlockHash]) -> int | None:
        """The idle slot llama.cpp would choose: longest shared prefix, else least recent."""
        idle = [i for i, s in enumerate(self.slots) if not s.busy]
        if not idle:
            return None
        slots = self.slots
        return max(idle, key=lambda i: (shared_blocks(slots[i].chain, chain), -slots[i].last_used))

    async def acquire(self, requested: int | None, chain: list[BlockHash], task: int) -> int:
        """A slot for a request (``requested``, else ``pick``), waiting while it is busy."""
        while True:
            slot = self.pick(chain) if requested is None else requested
            if slot is not None and not self.slots[slot].busy:
                state = self.slots[slot]
                state.busy, state.task = True, task
                return slot
            if self._freed is None:
                self._freed = asyncio.Event()
            await self._freed.wait()

    def release(self, slot: int) -> None:
        """``slot`` is idle again; wakes requests waiting for a slot."""
        state = self.slots[slot]
        self._uses += 1
        state.busy, state.task, state.last_used = False, -1, self._uses
        freed, self._freed = self._freed, None
        if freed is not None:
            freed.set()

    def begin(self, slot: int, request: EngineRequest) -> EngineRequest:
        """``request`` in ``slot``'s namespace; the slot's old prompt past the shared prefix
        is dropped (overwritten), and the slot now holds this prompt and its output."""
        state = self.slots[slot]
        chain = list(request.block_hashes) + list(request.output_block_hashes)
        keep = shared_blocks(state.chain, chain)
        self.engine.forget(salted(state.chain[keep:], slot))
        state.chain, state.tokens = chain, request.prompt_tokens + request.max_tokens
        return dataclasses.replace(
            request,
            block_hashes=salted(list(request.block_hashes), slot),
            output_block_hashes=salted(list(request.output_block_hashes), slot),
        )

    # -- the slot actions -----------------------------------------------------

    def cached(self, slot: int) -> tuple[list[BlockHash], int]:
        """The leading blocks of ``slot``'s chain still cached, and their tokens."""
        state = self.slots[slot]
        names = salted(state.chain, slot)
        n = 0
        while n < len(names) and self.engine.block_location(names[n]) == "gpu":
            n += 1
        tokens = state.tokens if n == len(names) else n * self.block_size
        return state.chain[:n], tokens

    def save(self, slot: int, filename: str) -> int:
        """Write ``slot``'s cached chain to ``filename``; returns the tokens saved."""
        if self.save_path is None:
            raise SlotFileError("no slot save path")
        chain, tokens = self.cached(slot)
        record = {
            "format": _FORMAT,
            "model": self.model,
            "block_size": self.block_size,
            "tokens": tokens,
            "chain": chain,
        }
        (self.save_path / filename).write_text(json.dumps(record))
        return tokens

    def restore(self, slot: int, filename: str) -> int:
        """Load ``filename`` into ``slot`` (what it held is dropped); returns the tokens."""
        if self.save_path is None:
            raise SlotFileError("no slot save path")
        try:
            record = json.loads((self.save_path / filename).read_text())
            chain = [int(h) for h in record["chain"]]
            tokens = int(record["tokens"])
            ok = record.get("format") == _FORMAT and record.get("model") == self.model
            ok = ok and record.get("block_size") == self.block_size
        except (OSError, ValueError, KeyError, TypeError):
            raise SlotFileError(f"cannot read slot file {filename!r}") from None
        if not ok:
            raise SlotFileError(f"slot file {filename!r} was saved by another model or block size")
        self.erase(slot)
        adopted = self.engine.adopt(salted(chain, slot))
        state = self.slots[slot]
        state.chain = chain[:adopted]
        state.tokens = tokens if adopted == len(chain) else adopted * self.block_size
        return state.tokens

    def erase(self, slot: int) -> int:
        """Drop ``slot``'s KV; returns the tokens it held."""
        state = self.slots[slot]
        _, tokens = self.cached(slot)
        self.engine.forget(salted(state.chain, slot))
        state.chain, state.tokens = [], 0
        return tokens

    def kv_bytes(self, tokens: int) -> int:
        """The modelled size of ``tokens`` tokens of KV."""
        return int(tokens * self.bytes_per_token)

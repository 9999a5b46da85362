"""``SlotIo``: what saving and restoring a llama.cpp slot costs per token.

Apart from ``engine.slots`` (which fits with numpy) so the emulated worker can
use it: the gateway and the worker import no numpy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlotIo:
    """Seconds per token to save a slot's KV to a file and to restore it.

    The defaults are what llama.cpp measured on a CPU (Gemma 3 270M, a 2,317-token
    slot of 30.8 MB saved in 41 ms and restored in 16 ms); the emulated worker
    answers its slot actions at these costs.
    """

    save_s_per_token: float = 0.041 / 2_317
    restore_s_per_token: float = 0.016 / 2_317

    def save_seconds(self, tokens: int) -> float:
        """Seconds to save ``tokens`` tokens of KV."""
        return self.save_s_per_token * max(0, tokens)

    def restore_seconds(self, tokens: int) -> float:
        """Seconds to restore ``tokens`` tokens of KV."""
        return self.restore_s_per_token * max(0, tokens)

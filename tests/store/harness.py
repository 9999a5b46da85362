"""Shared pieces of the store tests: a fake clock and a backend-neutral handle."""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.store import AffinityStore


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds


@dataclass
class StoreUnderTest:
    """A store plus how to let time pass for it.

    Memory stores run on a ``FakeClock`` that ``elapse`` advances; Redis expires
    keys on its own clock, so there ``elapse`` does nothing and tests wait on the
    outcome with a deadline instead.
    """

    kind: str
    store: AffinityStore
    clock: FakeClock | None

    def elapse(self, seconds: float) -> None:
        """Let ``seconds`` of store time pass (virtual stores only)."""
        if self.clock is not None:
            self.clock.advance(seconds)

"""A simulated worker: one engine, the gateway's accounting of it, and its scraped signals.

The gateway's own in-flight count changes the instant a request is routed or
finishes; the engine's waiting queue, KV usage and GPU readings are seen only as
of the last scrape, as the live gateway sees them.
"""

from __future__ import annotations

from kvgate.core.fleet import Health, WorkerState
from kvgate.engine import Engine, EngineConfig
from kvgate.types import Seconds, WorkerId


class SimWorker:
    """One worker of the simulated fleet."""

    __slots__ = (
        "_state",
        "busy",
        "engine",
        "id",
        "in_flight",
        "index",
        "max_in_flight",
        "model",
        "profile",
        "signals",
        "signals_at",
        "stale_after",
    )

    def __init__(
        self,
        index: int,
        config: EngineConfig,
        *,
        model: str,
        max_in_flight: int,
        stale_after: Seconds,
    ) -> None:
        self.index = index
        self.id: WorkerId = f"sim-w{index:02d}"
        self.model = model
        self.profile = config.profile
        self.engine = Engine(config)
        self.max_in_flight = max_in_flight
        self.stale_after = stale_after
        self.in_flight = 0
        self.busy = False  # a step is scheduled or running
        self.signals: tuple[int, int, float, float, float] | None = None
        self.signals_at = float("-inf")
        self._state: WorkerState | None = None

    def scrape(self, now: Seconds) -> None:
        """Read the engine's metrics as the gateway's scraper would."""
        stats = self.engine.stats(now)
        mem = stats.gpu_mem_used_mib / stats.gpu_mem_total_mib if stats.gpu_mem_total_mib else 0.0
        self.signals = (stats.running, stats.waiting, stats.kv_usage, stats.gpu_temp_c, mem)
        self.signals_at = now
        self._state = None

    def changed(self) -> None:
        """The gateway's accounting changed: rebuild the state on next use."""
        self._state = None

    def state(self, now: Seconds) -> WorkerState:
        """This worker as the gateway's snapshot shows it at ``now``."""
        state = self._state
        if state is not None and now - self.signals_at <= self.stale_after:
            return state
        sig = self.signals
        if sig is None or now - self.signals_at > self.stale_after:
            state = WorkerState(
                id=self.id,
                model=self.model,
                health=Health.DEGRADED,
                in_flight=self.in_flight,
                max_in_flight=self.max_in_flight,
            )
        else:
            running, waiting, kv_usage, temp, mem = sig
            state = WorkerState(
                id=self.id,
                model=self.model,
                health=Health.HEALTHY,
                in_flight=self.in_flight,
                max_in_flight=self.max_in_flight,
                running=running,
                waiting=waiting,
                kv_usage=kv_usage,
                # As the live scrape reads it from the engine's cache config.
                kv_capacity_tokens=self.engine.config.kv_capacity_tokens,
                gpu_temp_c=temp,
                gpu_mem_usage=mem,
            )
        self._state = state
        return state

"""A simulated worker: one engine, and its routed state as the live gateway keeps it.

The routed state is the same immutable ``core.routed.Routed`` value the live
pool keeps, turned into the ``WorkerState`` policies see by the same
``worker_state``. The gateway's own in-flight count and KV estimate change the
instant a request is routed or finishes; the engine's waiting queue, KV usage,
cache size and GPU readings are seen only as of the last scrape, as the live
gateway sees them.
"""

from __future__ import annotations

from dataclasses import replace

from kvgate.core.fleet import Pressure, WorkerState
from kvgate.core.pressure import PressureConfig
from kvgate.core.routed import Routed, Scraped, state_bounds, worker_state
from kvgate.engine import Engine, EngineConfig
from kvgate.types import Seconds, WorkerId


class SimWorker:
    """One worker of the simulated fleet."""

    __slots__ = (
        "_state",
        "_state_after",
        "_state_until",
        "busy",
        "engine",
        "index",
        "pressure_config",
        "profile",
        "routed",
        "stale_after",
    )

    def __init__(
        self,
        index: int,
        config: EngineConfig,
        *,
        worker_id: str,
        model: str,
        max_in_flight: int,
        stale_after: Seconds,
        version: str = "default",
        pressure: PressureConfig | None = None,
    ) -> None:
        self.index = index
        self.profile = config.profile
        self.engine = Engine(config)
        self.stale_after = stale_after
        self.pressure_config = pressure
        self.busy = False  # a step is scheduled or running
        # A simulated worker always passes its health checks.
        self.routed = Routed(
            id=worker_id,
            model=model,
            version=version,
            max_in_flight=max_in_flight,
            probe_ok=True,
        )
        self._state: WorkerState | None = None
        self._state_after = 0.0
        self._state_until = 0.0

    @property
    def id(self) -> WorkerId:
        """The worker's id (its URL, live)."""
        return self.routed.id

    @property
    def in_flight(self) -> int:
        """Requests the gateway has in flight here."""
        return self.routed.in_flight

    @property
    def version(self) -> str:
        """The model version it serves."""
        return self.routed.version

    @property
    def kv_usage(self) -> float:
        """KV usage as last scraped (0 before the first scrape)."""
        signals = self.routed.signals
        return (signals.kv_usage or 0.0) if signals is not None else 0.0

    def update(self, routed: Routed) -> None:
        """Replace the routed state (its snapshot is rebuilt on next use)."""
        self.routed = routed
        self._state = None

    def load(self, requests: int, kv_tokens: int) -> None:
        """Count ``requests`` more (or fewer) in flight holding ``kv_tokens`` of KV."""
        self.update(self.routed.loaded(requests, kv_tokens))

    def peered(self, requests: int, kv_tokens: int) -> bool:
        """The other replicas' in-flight counts here, as last exchanged (``core.peers``);
        True when they fell (what they held is free now)."""
        old = self.routed
        routed = old.peered(requests, kv_tokens)
        if routed is old:
            return False
        self.update(routed)
        return requests < old.peer_in_flight or kv_tokens < old.peer_kv_tokens

    def set_pressure(self, level: Pressure, draining: bool) -> bool:
        """The pressure tracker's verdict after a scrape; True when it changed anything."""
        routed = self.routed
        if routed.pressure is level and routed.draining == draining:
            return False
        self.update(replace(routed, pressure=level, draining=draining))
        return True

    def scrape(self, now: Seconds) -> Scraped:
        """Read the engine's metrics as the gateway's scraper would."""
        stats = self.engine.stats(now)
        signals = Scraped(
            running=stats.running,
            waiting=stats.waiting,
            kv_usage=stats.kv_usage,
            kv_capacity_tokens=stats.num_gpu_blocks * stats.block_size,
            gpu_temp_c=stats.gpu_temp_c,
            gpu_mem_used_mib=stats.gpu_mem_used_mib,
            gpu_mem_total_mib=stats.gpu_mem_total_mib,
        )
        self.update(self.routed.scraped(signals, now))
        return signals

    def state(self, now: Seconds) -> WorkerState:
        """This worker as the gateway's snapshot shows it at ``now``."""
        state = self._state
        if state is not None and self._state_after < now <= self._state_until:
            return state
        routed = self.routed
        state = worker_state(routed, now, self.stale_after, self.pressure_config)
        self._state = state
        self._state_after, self._state_until = state_bounds(routed, now, self.stale_after)
        return state

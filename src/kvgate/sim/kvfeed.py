"""The engines' KV events in virtual time: publishers, a lossy link, subscribers.

A policy named with ``+kv_events`` (``default+kv_events``) runs with the exact index
(``core.exact_index``) fed by every simulated engine's events, as the live gateway's
subscribers feed it: each engine's journal (``Engine.drain_kv_events``) becomes a
batch with the next sequence number in its publisher's replay buffer, the link
loses a batch with probability ``drop``, and the subscriber's ``Follower`` asks for
a replay when it sees a gap (or when nothing came for ``probe_s``, as the live
subscriber's idle probe). Faults can be injected: the subscriber killed and
restarted (its index and positions lost, rebuilt from the replay buffers), a
worker restarted (its cache cleared, its publisher counting from 0 again).

The simulator's engines hash a block by its tokens, so an engine's block hash *is*
the index's key: blocks are stored under their own hashes.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from itertools import islice

from kvgate.core.exact_index import ExactIndex
from kvgate.core.kv_events import Follower, Offer
from kvgate.engine import Engine
from kvgate.types import BlockHash, Seconds, WorkerId

EXACT_SUFFIX = "+kv_events"
"""A policy name ending so runs with the engines' KV events (the exact index)."""

_Batch = tuple[tuple[bool, BlockHash], ...]


def split_policy(name: str) -> tuple[str, bool]:
    """The registered policy's name, and whether it runs on KV events."""
    if name.endswith(EXACT_SUFFIX):
        return name[: -len(EXACT_SUFFIX)], True
    return name, False


@dataclass
class FeedStats:
    """What the feed did over a run."""

    batches: int = 0
    dropped: int = 0
    replays: int = 0
    restarts: int = 0
    placements: int = 0
    """Placements on a worker the exact index answers for."""
    overclaims: int = 0
    """Of those, placements whose worker the index credited with a block it no longer held."""
    recovery_batches: list[int] = field(default_factory=list)
    """After each fault: batches delivered until the index equalled the engine again."""


class _Publisher:
    __slots__ = ("buffer", "seq")

    def __init__(self, buffer_steps: int) -> None:
        self.seq = 0
        self.buffer: deque[tuple[int, _Batch]] = deque(maxlen=buffer_steps)


class KVFeed:
    """Every simulated worker's KV events into one exact index (see the module docs)."""

    def __init__(
        self,
        engines: dict[WorkerId, Engine],
        block_size: int,
        *,
        drop: float = 0.0,
        seed: int = 0,
        probe_s: Seconds = 1.0,
        buffer_steps: int = 10_000,
    ) -> None:
        self.index = ExactIndex()
        self.engines = engines
        self.block_size = block_size
        self.drop = drop
        self.probe_s = probe_s
        self.stats = FeedStats()
        self._rng = random.Random(seed)
        self._buffer_steps = buffer_steps
        self._publishers = {w: _Publisher(buffer_steps) for w in engines}
        self._followers = {w: Follower() for w in engines}
        self._heard: dict[WorkerId, Seconds] = dict.fromkeys(engines, 0.0)
        self._recovering: dict[WorkerId, int] = {}
        for worker, engine in engines.items():
            engine.record_kv_events()
            self.index.track(worker)

    # -- the link -----------------------------------------------------------------

    def pump(self, now: Seconds, worker: WorkerId | None = None) -> None:
        """Publish what an engine's cache did since its last batch (every engine's with
        ``worker`` None), and deliver it; probe a publisher heard nothing from lately."""
        for wid in self.engines if worker is None else (worker,):
            journal = self.engines[wid].drain_kv_events()
            publisher = self._publishers[wid]
            if journal:
                seq = publisher.seq
                publisher.seq += 1
                batch = tuple(journal)
                publisher.buffer.append((seq, batch))
                self.stats.batches += 1
                if self.drop and self._rng.random() < self.drop:
                    self.stats.dropped += 1
                else:
                    self._deliver(wid, seq, batch, now)
            elif (
                self._followers[wid].replay_from() < publisher.seq
                and now - self._heard[wid] > self.probe_s
            ):
                self._replay(wid, now)  # the idle probe
            if self._recovering:
                self._check_recovery(wid)

    def _deliver(self, worker: WorkerId, seq: int, batch: _Batch, now: Seconds) -> None:
        follower = self._followers[worker]
        self._heard[worker] = now
        offer = follower.offer(seq)
        if offer is Offer.STALE:
            return
        if offer is Offer.RESTART:
            self.index.clear(worker)
            follower.reset()
        if offer is Offer.APPLY or (offer is Offer.RESTART and seq == 0):
            self._apply(worker, seq, batch)
            return
        self._replay(worker, now)

    def _replay(self, worker: WorkerId, now: Seconds) -> None:
        """One replay round trip: the buffer from the next expected batch."""
        self.stats.replays += 1
        follower = self._followers[worker]
        start = follower.replay_from()
        buffer = self._publishers[worker].buffer
        if buffer and buffer[0][0] > start and follower.expected is not None:
            self.index.clear(worker)  # the buffer does not reach back: resync
        for seq, batch in buffer:
            if seq >= start:
                self._apply(worker, seq, batch)
        follower.replayed(start)
        self._heard[worker] = now

    def _apply(self, worker: WorkerId, seq: int, batch: _Batch) -> None:
        index = self.index
        stored: list[BlockHash] = []
        for cached, block in batch:
            if cached:
                stored.append(block)
                continue
            if stored:
                index.store(worker, stored, stored, self.block_size)
                stored = []
            index.remove(worker, (block,))
        if stored:
            index.store(worker, stored, stored, self.block_size)
        self._followers[worker].applied(seq)

    # -- faults -------------------------------------------------------------------

    def restart_subscriber(self) -> None:
        """The subscriber process died and came back: it knows nothing until replays."""
        for worker in self.engines:
            self.index.clear(worker)
            self._followers[worker].reset()
            self._heard[worker] = float("-inf")  # the first pump probes at once
            self._recovering[worker] = 0
        self.stats.restarts += 1

    def restart_worker(self, worker: WorkerId) -> None:
        """``worker``'s engine restarted: its cache is empty (the blocks of requests
        still running aside) and its publisher counts from 0 with an empty buffer."""
        engine = self.engines[worker]
        engine.reset_prefix_cache()
        engine.drain_kv_events()  # the old process's last events never went out
        publisher = self._publishers[worker] = _Publisher(self._buffer_steps)
        # The new process announces what it holds (requests it took over), then goes on.
        held = tuple((True, block) for block in engine.cached_blocks())
        publisher.buffer.append((0, held))
        publisher.seq = 1
        self._deliver(worker, 0, held, self._heard[worker])
        self._recovering[worker] = 0
        self.stats.restarts += 1

    def _check_recovery(self, worker: WorkerId) -> None:
        count = self._recovering.get(worker)
        if count is None:
            return
        if self.index.held_keys(worker) == self.engines[worker].cached_blocks():
            self.stats.recovery_batches.append(count)
            del self._recovering[worker]
        else:
            self._recovering[worker] = count + 1

    # -- what routing reads ---------------------------------------------------------

    def note_placement(self, worker: WorkerId, blocks: list[BlockHash]) -> None:
        """Count a placement, and whether the index credited ``worker`` with more of
        the chain than its engine holds."""
        if not self.index.tracks(worker):
            return
        self.stats.placements += 1
        claimed = self.index.depth(worker, blocks)
        engine = self.engines[worker]
        held = 0
        for block in blocks[:claimed]:
            if not engine.holds(block):
                break
            held += 1
        if held < claimed:
            self.stats.overclaims += 1

    def summary(self) -> dict[str, object]:
        """The feed's counts for ``results.json``."""
        s = self.stats
        recovery = sorted(s.recovery_batches)
        return {
            "batches": s.batches,
            "dropped": s.dropped,
            "replays": s.replays,
            "restarts": s.restarts,
            "placements": s.placements,
            "overclaims": s.overclaims,
            "overclaim_rate": round(s.overclaims / s.placements, 6) if s.placements else 0.0,
            "recovery_batches_max": recovery[-1] if recovery else None,
            "index_blocks": len(self.index),
            "orphans": self.index.orphans,
        }


def fault_run(
    workload: str, *, workers: int, kv_blocks: int, seed: int, requests: int = 1500
) -> dict[str, object]:
    """``default+kv_events`` in the simulator with 10% of event batches lost, the
    subscriber killed and restarted a third of the way in, and a worker restarted
    (its cache cleared) two thirds of the way: the feed's counts (``sim.kvfeed``)."""
    from kvgate.sim.simulation import SimConfig, Simulation  # sim imports this module
    from kvgate.workload.synthetic import build_workload

    probe = build_workload(workload, seed=seed).requests()
    last = max((r.arrival for r in islice(probe, requests)), default=1.0)
    config = SimConfig(
        max_requests=requests,
        workers=workers,
        kv_blocks=(kv_blocks,),
        seed=seed,
        kv_event_drop=0.1,
        subscriber_restarts=(last / 3,),
        worker_restarts=((2 * last / 3, 1),),
    )
    sim = Simulation(config, build_workload(workload, seed=seed).requests(), "default+kv_events")
    summary = sim.run().summary
    feed: dict[str, object] = summary["kv_events"]
    return {"hit_rate": summary["hit_rate"], "ttft_p99": summary["ttft_p99"], **feed}

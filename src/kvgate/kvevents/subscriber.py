"""One worker's KV event subscriber: SUB socket in, the exact index out.

It follows the publisher's sequence numbers (``core.kv_events.Follower``) and asks
the replay socket for what it missed: on a gap, when it starts (from 0: the
publisher's buffer rebuilds what the engine holds), and after the publisher
restarted (its sequence back at 0; the worker's blocks are forgotten first).
What it cannot replay it cannot know: a gap no replay covers clears the worker's
blocks (a missed ``BlockRemoved`` would otherwise credit blocks long gone), and
the index then under-claims until the engine stores blocks again. A message that
is not a batch (wrong frames, not msgpack, another schema) is counted, logged
once per subscriber, and replayed in case the replay's copy is whole; it never
ends the subscriber. ZeroMQ reconnects a SUB socket by itself, so a publisher that
stalls or restarts needs nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import zmq
import zmq.asyncio

from kvgate.core.exact_index import ExactIndex
from kvgate.core.kv_events import EventBatch, Follower, Offer
from kvgate.kvevents.wire import WireError, decode_batch, seq_bytes, seq_of
from kvgate.tasks import cancel_and_wait
from kvgate.types import WorkerId

logger = logging.getLogger(__name__)

_RESTARTED = object()
"""``_replay``'s answer when the publisher restarted since the last batch applied."""


@dataclass
class SubscriberStats:
    """Counts one subscriber keeps (exported as metrics)."""

    batches: int = 0
    """Batches applied, live or replayed."""
    garbage: int = 0
    """Messages that were not a batch in the expected format."""
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0
    """Replays that did not answer in time, or did not reach back far enough."""
    restarts: int = 0
    """Times the publisher's sequence went back (a new engine process)."""
    probes: int = 0
    """Replays asked because nothing came for ``idle_probe_s``."""
    resyncs: int = 0
    """Times the worker's blocks were cleared because what was missed was unknown."""


class KVEventSubscriber:
    """Follows one worker's KV events into ``index``."""

    def __init__(
        self,
        worker: WorkerId,
        endpoint: str,
        index: ExactIndex,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        replay_timeout_s: float = 2.0,
        idle_probe_s: float = 1.0,
    ) -> None:
        self.worker = worker
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.index = index
        self.stats = SubscriberStats()
        self.follower = Follower()
        self._topic = topic.encode()
        self._timeout_ms = int(replay_timeout_s * 1000)
        self._ctx = zmq.asyncio.Context()
        self._task: asyncio.Task[None] | None = None
        self._idle_ms = int(idle_probe_s * 1000)
        self._warned: set[str] = set()
        self._last: tuple[int, bytes] | None = None
        """The last batch applied: its number and payload (``_replay`` checks it)."""
        index.track(worker)

    def start(self) -> None:
        """Subscribe on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"kv-events-{self.worker}"
            )

    async def close(self) -> None:
        """Stop following (the worker's blocks stay until it leaves the index)."""
        await cancel_and_wait(self._task)
        self._task = None
        self._ctx.destroy(linger=0)

    # -- the loop -------------------------------------------------------------

    async def _run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        sub.connect(self.endpoint)
        try:
            with contextlib.suppress(WireError):
                await self.probe()  # what the engine holds already, from the replay buffer
            while True:
                try:
                    if await sub.poll(self._idle_ms):
                        await self.receive(await sub.recv_multipart())
                    else:
                        await self.probe()
                except (asyncio.CancelledError, KeyboardInterrupt):
                    raise
                except Exception:  # a bug here must not end the subscription
                    logger.exception("kv events from %s: a batch failed", self.worker)
        finally:
            sub.close(0)

    async def receive(self, frames: list[bytes]) -> None:
        """Handle one message from the PUB socket."""
        if len(frames) != 3:
            self._garbage(f"a message of {len(frames)} frames")
            return
        _, seq_frame, payload = frames
        try:
            seq = seq_of(seq_frame)
        except WireError as exc:
            self._garbage(str(exc))
            return
        follower = self.follower
        offer = follower.offer(seq)
        if offer is Offer.STALE:
            return
        if offer is Offer.RESTART:
            self._restarted()
            offer = Offer.APPLY if seq == 0 else Offer.GAP
        if offer is Offer.GAP:
            self.stats.gaps += 1
            if await self._recover(seq):
                return
        try:
            batch = decode_batch(payload)
        except WireError as exc:
            self._garbage(str(exc))
            if not await self._recover(seq):
                follower.applied(seq)  # its content is lost: the blocks were cleared
            return
        self._apply(seq, batch, payload)

    async def probe(self) -> None:
        """Nothing came for a while: ask the replay socket what was missed (a
        subscriber that has applied nothing yet: everything it buffers).

        A publisher that restarted while nothing came (its first batches lost before
        the SUB socket reconnected) shows here: its buffer lacks the last batch
        applied, or holds another one under that number.
        """
        if self.replay_endpoint is None:
            return
        self.stats.probes += 1
        expected = self.follower.expected
        if await self._replay(expected or 0) is _RESTARTED:
            self._restarted()
            await self._replay(0)
        elif self.follower.expected != expected:
            self.stats.gaps += 1  # batches came by replay only: they were lost

    def _restarted(self) -> None:
        self.stats.restarts += 1
        self.index.clear(self.worker)
        self.follower.reset()
        self._last = None

    def _apply(self, seq: int, batch: EventBatch, payload: bytes) -> None:
        self.index.apply(self.worker, batch.events)
        self.follower.applied(seq)
        self._last = (seq, payload)
        self.stats.batches += 1

    async def _recover(self, seq: int) -> bool:
        """Replay from the next expected batch through live batch ``seq``.

        False when the replay did not get there: the worker's blocks are then
        cleared (what was missed is unknown; a fresh subscriber knew nothing to
        begin with) and the follower expects ``seq`` next.
        """
        start = self.follower.replay_from()
        reached = await self._replay(start)
        if reached is _RESTARTED:
            self._restarted()
            start, reached = 0, await self._replay(0)
        if isinstance(reached, int) and reached >= seq:
            self.follower.replayed(start)
            return True
        self.stats.replay_failures += 1
        if self.follower.expected is not None:
            # Removals may be among what was missed: credit nothing unseen.
            self.stats.resyncs += 1
            self.index.clear(self.worker)
        self.follower.applied(seq - 1)
        return False

    async def _replay(self, start: int) -> int | object | None:
        """Apply the replay socket's batches from ``start``: the last one applied,
        ``None`` if the replay failed or could not reach back to ``start``, or
        ``_RESTARTED`` if the publisher is not the one whose batches were applied.

        The request starts one batch early, at the last one applied, which must come
        back unchanged: a restarted publisher numbers its batches from 0 again.
        """
        if self.replay_endpoint is None:
            return None
        self.stats.replays += 1
        last = self._last if start > 0 and self._last is not None else None
        ask = start - 1 if last is not None else start
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        applied: int | None = None
        first = True
        try:
            await dealer.send_multipart((b"", seq_bytes(ask)))
            while True:
                if not await dealer.poll(self._timeout_ms):
                    self._warn("replay", f"the replay socket did not answer from {ask}")
                    return None
                frames = await dealer.recv_multipart()
                if len(frames) != 3:
                    self._garbage(f"a replay message of {len(frames)} frames")
                    return None
                seq = seq_of(frames[1])
                if first and last is not None and (seq != last[0] or frames[2] != last[1]):
                    return _RESTARTED  # the batch applied last is not there as applied
                if seq < 0:
                    return applied if applied is not None or last is None else start - 1
                if first and seq > ask and self.follower.expected is not None:
                    self._warn("short", f"the replay buffer starts at {seq}, past {ask}")
                    return None
                first = False
                if seq < self.follower.replay_from():
                    continue
                try:
                    batch = decode_batch(frames[2])
                except WireError as exc:
                    self._garbage(str(exc))
                    return None
                self._apply(seq, batch, frames[2])
                applied = seq
        except WireError as exc:
            self._garbage(str(exc))
            return None
        finally:
            dealer.close(0)

    # -- faults ---------------------------------------------------------------

    def _garbage(self, what: str) -> None:
        self.stats.garbage += 1
        self._warn("garbage", f"not a KV event batch ({what}); counted, not applied")

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning("kv events from %s: %s (logged once)", self.worker, message)

"""A KV event publisher in vLLM's format: a PUB socket and a replay ROUTER socket.

The emulated worker publishes its engine's events through it (``kvgate worker-sim
--kv-events-port P``: PUB on P, replay on P + 1), so everything tested against it
holds against vLLM's ``ZmqEventPublisher`` (``kvgate.kvevents.wire``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

import zmq
import zmq.asyncio

from kvgate.core.kv_events import EventBatch
from kvgate.kvevents.wire import END_SEQ, encode_batch, seq_bytes, seq_of
from kvgate.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

BUFFER_STEPS = 10_000
"""Batches kept for replay (vLLM's default ``buffer_steps``)."""


class KVEventPublisher:
    """Publishes batches with rising sequence numbers and answers replay requests."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        buffer_steps: int = BUFFER_STEPS,
        data_parallel_rank: int | None = None,
    ) -> None:
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self._replay: zmq.asyncio.Socket | None = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._rank = data_parallel_rank
        self.seq = 0
        """The next batch's sequence number."""
        self.drop: Callable[[int], bool] | None = None
        """Which sequence numbers to keep off the PUB socket (fault injection: batches
        lost in transit; they stay in the replay buffer)."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Serve replay requests on the running loop."""
        if self._replay is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._serve_replay(), name="kv-events-replay"
            )

    def publish(self, batch: EventBatch) -> int:
        """Send one batch; returns its sequence number."""
        if self._rank is not None and batch.data_parallel_rank is None:
            batch = EventBatch(batch.ts, batch.events, self._rank)
        seq = self.seq
        self.seq += 1
        payload = encode_batch(batch)
        self._buffer.append((seq, payload))
        if self.drop is None or not self.drop(seq):
            # PUB never blocks: past its high-water mark ZeroMQ drops, as in vLLM.
            with contextlib.suppress(zmq.Again):
                self._pub.send_multipart((self._topic, seq_bytes(seq), payload), zmq.NOBLOCK)
        return seq

    async def _serve_replay(self) -> None:
        replay = self._replay
        assert replay is not None
        while True:
            frames = await replay.recv_multipart()
            if len(frames) != 3:
                logger.warning("kv events: a replay request of %d frames ignored", len(frames))
                continue
            client, _, start_frame = frames
            try:
                start = seq_of(start_frame)
            except ValueError:
                continue
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await replay.send_multipart((client, b"", seq_bytes(seq), payload))
            await replay.send_multipart((client, b"", END_SEQ, b""))

    async def close(self) -> None:
        """Stop serving and close the sockets."""
        await cancel_and_wait(self._task)
        self._task = None
        self._pub.close(0)
        if self._replay is not None:
            self._replay.close(0)
        self._ctx.term()

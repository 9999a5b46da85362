"""What the engines say their caches hold: a KV event subscriber per worker that
publishes (``kv_events:`` in its config), all feeding one exact index.

Each gateway replica subscribes to every publishing worker itself: a PUB socket
serves any number of subscribers, the index is a few hundred bytes a block in
memory, and a lookup is a handful of dictionary probes with no I/O on the request
path (the alternative, the index in the shared store, costs a store round trip
per request; ``docs/kv-events.md`` has the measurements).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvgate.core.exact_index import ExactIndex, ExactIndexConfig
from kvgate.core.features import RequestFeatures
from kvgate.core.policy import Resident
from kvgate.extras import require
from kvgate.types import WorkerId

if TYPE_CHECKING:
    from kvgate.gateway.config import WorkerConfig
    from kvgate.kvevents.subscriber import KVEventSubscriber

logger = logging.getLogger(__name__)


class EngineCaches:
    """The exact index and its subscribers (see the module docs)."""

    def __init__(
        self, workers: Iterable[WorkerConfig], config: ExactIndexConfig | None = None
    ) -> None:
        self.index = ExactIndex(config)
        self._subscribers: dict[WorkerId, KVEventSubscriber] = {}
        # The publishing workers as one frozenset while they stay the same: a policy
        # remembers what it checked against this very set (``caches.IndexResidency``).
        self._exact: frozenset[WorkerId] = frozenset()
        self._started = False
        for worker in workers:
            self.add(worker)

    def add(self, worker: WorkerConfig) -> None:
        """Follow ``worker``'s events if it publishes them (``kv_events``); a worker
        added while the gateway runs (discovery, the admin API) is followed at once."""
        if not worker.kv_events or worker.id in self._subscribers:
            return
        require("zmq", "kvevents")  # a clear error naming the extra, not a traceback
        require("msgspec", "kvevents")
        from kvgate.kvevents.subscriber import KVEventSubscriber

        subscriber = KVEventSubscriber(
            worker.id, worker.kv_events, self.index, replay_endpoint=worker.kv_events_replay
        )
        self._subscribers[worker.id] = subscriber
        self._exact = frozenset(self._subscribers)
        if self._started:
            subscriber.start()

    async def remove(self, worker: WorkerId) -> None:
        """Stop following ``worker`` and forget its blocks (it left the fleet)."""
        subscriber = self._subscribers.pop(worker, None)
        self._exact = frozenset(self._subscribers)
        if subscriber is not None:
            await subscriber.close()
        self.index.remove_worker(worker)

    def __bool__(self) -> bool:
        return bool(self._subscribers)

    def start(self) -> None:
        """Subscribe to every publishing worker (on the running loop)."""
        self._started = True
        for subscriber in self._subscribers.values():
            subscriber.start()

    async def close(self) -> None:
        """Stop every subscription."""
        self._started = False
        for subscriber in self._subscribers.values():
            await subscriber.close()

    def subscribers(self) -> dict[WorkerId, KVEventSubscriber]:
        """The subscriptions by worker."""
        return dict(self._subscribers)

    def counts(self) -> dict[WorkerId, dict[str, int]]:
        """Per worker: its subscriber's counts and the blocks the index holds for it
        (``KVEventsCollector``)."""
        return {
            worker: {**vars(subscriber.stats), "blocks": self.index.blocks(worker)}
            for worker, subscriber in self._subscribers.items()
        }

    def resident(self, features: RequestFeatures) -> Resident | None:
        """What the publishing workers hold of the request's prompt (``None``: no worker
        publishes, or the request has no tokens: its model has no tokenizer)."""
        if not self._subscribers or not features.token_ids:
            return None
        tokens = features.token_ids
        groups = self.index.held_token_groups(tokens)
        return Resident.of_tokens(groups, len(tokens), features.prompt_chars, self._exact)


_KV_EVENT_COUNTERS = (
    ("kvgate_kv_events_batches", "batches", "KV event batches applied, live or replayed."),
    ("kvgate_kv_events_garbage", "garbage",
     "Messages on a KV event socket that were not a batch (counted, logged once)."),
    ("kvgate_kv_events_gaps", "gaps", "Sequence gaps seen (batches lost or not yet had)."),
    ("kvgate_kv_events_replays", "replays", "Replays asked of a publisher's replay socket."),
    ("kvgate_kv_events_replay_failures", "replay_failures",
     "Replays that did not answer in time or did not reach back far enough."),
    ("kvgate_kv_events_restarts", "restarts", "Publishers seen restarting (sequence back)."),
    ("kvgate_kv_events_resyncs", "resyncs",
     "Times a worker's blocks were cleared because what was missed was unknown."),
)  # fmt: skip
"""The KV event subscribers' counters: exported name, field, help."""


class KVEventsCollector(Collector):
    """Per worker that publishes KV events: its subscriber's counters and the blocks the
    exact index holds for it (its cache's fill as the engine tells it, between scrapes)."""

    def __init__(self, counts: Callable[[], Mapping[str, Mapping[str, int]]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        rows = self._counts()
        blocks = GaugeMetricFamily(
            "kvgate_kv_events_blocks",
            "Blocks the worker's engine holds by its KV events (the exact index).",
            labels=["worker"],
        )
        families = {
            field: CounterMetricFamily(name, text, labels=["worker"])
            for name, field, text in _KV_EVENT_COUNTERS
        }
        for worker, row in rows.items():
            blocks.add_metric([worker], row.get("blocks", 0))
            for field, family in families.items():
                family.add_metric([worker], row.get(field, 0))
        yield blocks
        yield from families.values()

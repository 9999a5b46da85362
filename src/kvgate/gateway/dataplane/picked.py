"""One request the endpoint picker placed, from its decision to its end: the one owner.

A native proxy (Envoy) moves the bytes; the picker only hears of them, as ext_proc
messages. Whatever the stream tells (the endpoint that served, the response's
status, its first body chunk, the chunks carrying ``usage``, the end, or the
stream breaking off) arrives here as one event, and this object alone releases
the placement's lease, tells the policy, updates passive health (outlier
detection) and records the outcome: once, on every path, as ``Relay`` does for
the built-in proxy. ``extproc`` only translates protocol messages into these
events, so moving the ownership into a shared attempt object is a change here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvgate.core.decision import Affinity
from kvgate.core.features import RequestFeatures
from kvgate.gateway.dataplane.relay import Outcome, PassiveHealth, Relay
from kvgate.gateway.dataplane.router import Placement, Router
from kvgate.gateway.dataplane.usage import StreamTap, Usage, usage_from_body
from kvgate.gateway.observe.pool import Worker

_BODY_KEEP = 1 << 20
"""A JSON answer's bytes kept to read its ``usage`` (larger ones: the tail only)."""


class PickedRequest:
    """The events of one placed request, and what each changes (released exactly once)."""

    __slots__ = (
        "_body",
        "_ended",
        "_stream",
        "_tap",
        "features",
        "outcome",
        "passive",
        "path",
        "placement",
        "relay",
        "request_id",
        "router",
        "started",
    )

    def __init__(
        self,
        router: Router,
        relay: Relay,
        passive: PassiveHealth,
        features: RequestFeatures,
        placement: Placement,
        *,
        started: float,
        path: str,
    ) -> None:
        self.router = router
        self.relay = relay
        self.passive = passive
        self.features = features
        self.placement = placement
        self.started = started
        self.path = path
        self.request_id = features.request_id
        self.outcome = Outcome(placement=placement)
        self._ended = False
        self._stream = False
        self._tap: StreamTap | None = None
        self._body = bytearray()

    @property
    def ended(self) -> bool:
        """True once the request's end (or its breaking off) was recorded."""
        return self._ended

    def sent(self) -> None:
        """The decision went back to the proxy: the request is on its way to its worker."""
        self.router.share(self.placement)

    async def served(self, worker: Worker | None, skipped: Sequence[Worker]) -> None:
        """The proxy says which endpoint served (``None``: it did not say).

        The endpoints of the fallback list before the one that served were tried
        and failed (the proxy goes down the list in order): each counts as a
        failure for outlier detection. The lease follows the serving worker, so
        the one doing the work is the one counted in flight and charged, and the
        session's binding follows it too (compare-and-set from the picked worker:
        where its KV now is), as a retry's does in the built-in proxy.
        """
        for failed in skipped:
            self.passive.failure(failed)
        placement = self.placement
        if worker is None or worker is placement.worker:
            return
        picked = placement.worker.id
        placement.lease.move(worker)
        placement.reason = "fallback"
        placement.version = worker.version
        key = self.features.affinity_key
        if key is None:
            return
        router = self.router
        bound = Affinity(key, worker.id, worker.version, router.wall())
        try:
            await router.store.compare_and_set(key, picked, bound, router.ttl)
        except Exception:
            router.metrics.store_errors.labels("compare_and_set").inc()

    def response_head(self, status: int, content_type: str) -> None:
        """The worker's response headers arrived (through the proxy)."""
        self.outcome.status = status
        self._stream = content_type.startswith("text/event-stream")
        if self._stream:
            self._tap = StreamTap()
        worker = self.placement.worker
        if status >= 500:
            self.passive.failure(worker)
        elif status != 429:
            self.passive.success(worker)

    def response_chunk(self, data: bytes) -> None:
        """A piece of the response body; the first one is the time to first token."""
        if not data:
            return
        outcome = self.outcome
        if outcome.ttft is None:
            outcome.ttft = time.monotonic() - self.started
        if self._stream:
            outcome.last_chunk = time.monotonic() - self.started
            assert self._tap is not None
            self._tap.feed(data)
        else:
            body = self._body
            body += data
            if len(body) > _BODY_KEEP:
                del body[: -_BODY_KEEP // 2]

    async def response_end(self) -> None:
        """The response ended (its last body chunk, its trailers or a header-only answer).

        The policy hears of it and the outcome is recorded before the one await
        (the binding's TTL refreshed in the store), so a cancellation there loses nothing.
        """
        if self._ended:
            return
        outcome = self.outcome
        if outcome.ttft is None:
            outcome.ttft = time.monotonic() - self.started
        usage = outcome.usage = self._usage()
        outcome.answered = outcome.status < 400
        self._release()
        if usage is None:
            self.router.ended(self.features, self.placement)
            return
        await self.router.finished(
            self.features, self.placement, usage.prompt, usage.cached, usage.completion
        )

    def broken(self, status: int = 499) -> None:
        """The stream ended before the response did: the client or the proxy went away."""
        if self._ended:
            return
        outcome = self.outcome
        usage = outcome.usage = self._usage()
        if usage is None:
            outcome.status = status
            self.relay.metrics.client_disconnects.labels(self.features.model).inc()
        self._release()
        if usage is None:
            self.router.ended(self.features, self.placement)
        else:
            self.router.ended(
                self.features, self.placement, usage.prompt, usage.cached, usage.completion
            )

    def _usage(self) -> Usage | None:
        if self._tap is not None:
            return self._tap.usage()
        if self._body and self.outcome.status < 300:
            return usage_from_body(bytes(self._body))
        return None

    def _release(self) -> None:
        """Give the slot back and record the outcome: the one place, run once."""
        self._ended = True
        self.placement.lease.release()
        self.relay.record(self.features, self.outcome, self.started, self.request_id, self.path)

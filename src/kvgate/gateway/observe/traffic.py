"""Where the last minutes' traffic went and why: a small ring of fixed-width time buckets.

Prometheus keeps history for Grafana; the dashboard has no Prometheus behind it,
so the gateway keeps a few minutes itself. Each finished request adds to the
bucket of its end time: its worker, its route reason, its prompt and cached
tokens (the hit rate), and why it was refused when it was. The ring is bounded
in time (``buckets`` × ``bucket_s``) and each bucket in keys (``max_keys``: the
label values come from config and the fleet, the bound only guards against a
surprise), so its memory never grows with traffic.

The clock is passed in (``now``, wall seconds): the window itself reads none.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

_OTHER = "(other)"


@dataclass(slots=True)
class TrafficBucket:
    """What finished during one ``bucket_s`` interval starting at ``start``."""

    start: float
    requests: int = 0
    errors: int = 0
    """Answers with a 5xx status (the gateway's or a worker's)."""
    retries: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    workers: Counter[str] = field(default_factory=Counter)
    sheds: Counter[str] = field(default_factory=Counter)

    @property
    def hit_rate(self) -> float | None:
        """Cached / prompt tokens of the requests in this bucket (``None``: no usage seen)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for the dashboard's state."""
        return {
            "start": self.start,
            "requests": self.requests,
            "errors": self.errors,
            "retries": self.retries,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_rate": self.hit_rate,
            "reasons": dict(self.reasons),
            "workers": dict(self.workers),
            "sheds": dict(self.sheds),
        }


class TrafficWindow:
    """The last ``buckets`` × ``bucket_s`` seconds of finished requests, by bucket."""

    def __init__(self, bucket_s: float = 10.0, buckets: int = 30, max_keys: int = 64) -> None:
        if bucket_s <= 0 or buckets < 1:
            raise ValueError("bucket_s must be > 0 and buckets >= 1")
        self.bucket_s = bucket_s
        self.size = buckets
        self.max_keys = max_keys
        self._ring: deque[TrafficBucket] = deque(maxlen=buckets)

    def _start(self, now: float) -> float:
        return math.floor(now / self.bucket_s) * self.bucket_s

    def _bucket(self, now: float) -> TrafficBucket:
        start = self._start(now)
        ring = self._ring
        if ring and ring[-1].start == start:
            return ring[-1]
        if ring and ring[-1].start > start:
            return ring[-1]  # the wall clock stepped back: count it in the newest bucket
        bucket = TrafficBucket(start)
        ring.append(bucket)
        return bucket

    def _add(self, counter: Counter[str], key: str) -> None:
        if key in counter or len(counter) < self.max_keys:
            counter[key] += 1
        else:
            counter[_OTHER] += 1

    def record(
        self,
        now: float,
        *,
        status: int,
        worker: str | None = None,
        reason: str | None = None,
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
        retries: int = 0,
        shed_reason: str | None = None,
    ) -> None:
        """Count one finished request (answered, refused or failed) at ``now``."""
        ring = self._ring
        # ``_bucket``'s usual case inlined (the newest bucket), with the keys already
        # counted in it: this runs once a request.
        if ring and ring[-1].start == math.floor(now / self.bucket_s) * self.bucket_s:
            bucket = ring[-1]
        else:
            bucket = self._bucket(now)
        bucket.requests += 1
        bucket.retries += retries
        if status >= 500:
            bucket.errors += 1
        if worker:
            counter = bucket.workers
            if worker in counter:
                counter[worker] += 1
            else:
                self._add(counter, worker)
        if reason:
            counter = bucket.reasons
            if reason in counter:
                counter[reason] += 1
            else:
                self._add(counter, reason)
        if shed_reason:
            self._add(bucket.sheds, shed_reason)
        bucket.prompt_tokens += prompt_tokens
        bucket.cached_tokens += cached_tokens

    def buckets(self, now: float) -> list[TrafficBucket]:
        """Every bucket of the window ending at ``now``, oldest first, empty ones included."""
        last = self._start(now)
        first = last - (self.size - 1) * self.bucket_s
        have = {b.start: b for b in self._ring if first <= b.start <= last}
        out = []
        for i in range(self.size):
            start = first + i * self.bucket_s
            out.append(have.get(start) or TrafficBucket(start))
        return out

    def total(self, now: float, seconds: float) -> TrafficBucket:
        """The buckets of the last ``seconds`` (whole buckets, the current one included) summed."""
        count = max(1, min(self.size, math.ceil(seconds / self.bucket_s)))
        total = TrafficBucket(self._start(now) - (count - 1) * self.bucket_s)
        for bucket in self.buckets(now)[-count:]:
            total.requests += bucket.requests
            total.errors += bucket.errors
            total.retries += bucket.retries
            total.prompt_tokens += bucket.prompt_tokens
            total.cached_tokens += bucket.cached_tokens
            total.reasons.update(bucket.reasons)
            total.workers.update(bucket.workers)
            total.sheds.update(bucket.sheds)
        return total

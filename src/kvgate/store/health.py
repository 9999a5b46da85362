"""How the affinity store is doing, as a value the gateway's metrics read at scrape time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """A store's health counters (all zero for the in-memory store, which cannot fail).

    ``errors_total``: failed backend round trips (probes included); ``degraded``:
    calls are answered from the local fallback map; ``fallbacks_total``: calls so
    answered; ``resyncs_total``: outages recovered from; ``degraded_total``: outages
    entered; ``dirty_dropped_total``: local writes dropped from the resync backlog;
    ``data_lost_total``: times the backend was found to have lost its data (a FLUSHALL).
    """

    errors_total: int = 0
    degraded: bool = False
    fallbacks_total: int = 0
    resyncs_total: int = 0
    degraded_total: int = 0
    dirty_dropped_total: int = 0
    data_lost_total: int = 0

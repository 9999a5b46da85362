"""The retry budget (Envoy's): retries in flight stay under a share of requests in flight.

A failing worker then cannot turn every request into two or three, which would
pile load on the healthy ones exactly when the fleet is weakest.

The budget is shared fairly between tenants (``RequestFeatures.tenant``): each retry
is charged to the tenant whose request needed it, and a tenant may take the budget's
last free retries only while no other tenant with requests in flight holds fewer than
it does. So one tenant's poison requests (a 5xx on every worker) take the room nobody
else wants, never the last retry of a tenant that has had fewer; with one tenant this
is Envoy's budget unchanged.
"""

from __future__ import annotations

import random


class RetryBudget:
    """Counts requests and retries in flight, per tenant too; ``allow`` grants a retry
    within the budget."""

    def __init__(self, ratio: float, minimum: int, backoff_base: float, backoff_max: float) -> None:
        self.ratio = ratio
        self.minimum = minimum
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.requests = 0
        self.retries = 0
        self._tenants: dict[str, list[int]] = {}
        """Per tenant with requests in flight: [its requests, its retries] in flight."""

    def limit(self) -> int:
        """How many retries may be in flight now."""
        return max(self.minimum, int(self.ratio * self.requests))

    def start(self, tenant: str = "") -> None:
        """A request of ``tenant`` is in flight (until its ``end``)."""
        self.requests += 1
        books = self._tenants.get(tenant)
        if books is None:
            self._tenants[tenant] = [1, 0]
        else:
            books[0] += 1

    def end(self, tenant: str = "", retries: int = 0) -> None:
        """A request of ``tenant`` that had taken ``retries`` from the budget has finished."""
        self.requests -= 1
        self.give_back(retries)
        books = self._tenants[tenant]
        books[0] -= 1
        books[1] -= retries
        if not books[0]:
            del self._tenants[tenant]

    def allow(self, tenant: str = "") -> bool:
        """Take one retry for ``tenant`` if there is room; its request's ``end`` gives it back.

        Room is the budget's free retries less one for each other tenant in flight that
        holds fewer retries than ``tenant`` does: those come first (max-min fairness).
        """
        room = self.limit() - self.retries
        if room <= 0:
            return False
        books = self._tenants.get(tenant)
        if len(self._tenants) > 1:
            mine = books[1] if books is not None else 0
            behind = 0
            for other, (_, retries) in self._tenants.items():
                if retries < mine and other != tenant:
                    behind += 1
                    if behind >= room:
                        return False
        self.retries += 1
        if books is not None:
            books[1] += 1
        return True

    def give_back(self, retries: int) -> None:
        """Retries taken by a request that has finished go back to the budget."""
        self.retries -= retries

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Full-jitter exponential backoff before retry number ``attempt`` (1-based)."""
        cap = min(self.backoff_max, self.backoff_base * (2 ** (attempt - 1)))
        return rng.uniform(0.0, cap)

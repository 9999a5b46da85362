"""The live side of warm-ups (``core.warmup``): cut, send and own them.

After each placement the proxy tells ``WarmUps.placed``. It keeps the bodies of
the requests the policy may cut a warm-up from (``Policy.openers``, a handful),
asks the policy for a warm-up on a fresh snapshot (``Router.warm_up``), and
sends one as a background task: the target worker's lease (an in-flight slot,
so routing sees it busy) and the policy's queue entry are taken before the task
starts and given back when it ends, on every path: answered, failed, timed out
or cancelled at shutdown (``close``). A warm-up's failure is counted and logged
at debug level; it never touches a client's request.

Workers that take the client's own ``Authorization`` (no ``api_key`` in their
config) get none on a warm-up, so where they require one the warm-up fails
(``kvgate_warm_ups_total{outcome="error"}``) and routing goes on as without it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kvgate.core.features import RequestFeatures
from kvgate.core.policy import Policy
from kvgate.core.prefix import Endpoint
from kvgate.core.warmup import WarmUp, warm_up_payload
from kvgate.gateway.observe.metrics import GatewayMetrics
from kvgate.gateway.observe.pool import Lease, Worker, WorkerPool
from kvgate.gateway.routing import Routing

log = logging.getLogger(__name__)

PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

WarmUpFor = Callable[[RequestFeatures, Worker], WarmUp | None]
"""``Router.warm_up``: the policy's warm-up after a placement on ``worker``, if any."""


class WarmUps:
    """Warm-ups in flight, and the bodies they are cut from."""

    def __init__(
        self,
        pool: WorkerPool,
        routing: Routing,
        metrics: GatewayMetrics,
        warm_up_for: WarmUpFor,
        *,
        timeout_s: float,
        wall: Callable[[], float],
    ) -> None:
        self.pool = pool
        self.routing = routing
        """The routing state in force: a warm-up's policy is the one in force when it is cut
        (the same one hears it ended, across a reload)."""
        self.metrics = metrics
        self.warm_up_for = warm_up_for
        self.timeout_s = timeout_s
        self.wall = wall
        self._bodies: dict[str, tuple[Mapping[str, Any], Endpoint]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        """Warm-ups sent and not ended."""
        return len(self._tasks)

    def placed(
        self,
        features: RequestFeatures,
        payload: Mapping[str, Any],
        endpoint: Endpoint,
        worker: Worker,
    ) -> None:
        """A request was placed on ``worker``: keep its body if the policy may cut a
        warm-up from it, and send the warm-up the policy asks for now, if any."""
        policy = self.routing.state.policy
        openers = policy.openers()
        if not openers and not self._bodies:
            return
        bodies = self._bodies
        if features.request_id in openers:
            bodies[features.request_id] = (payload, endpoint)
        for gone in [rid for rid in bodies if rid not in openers]:
            del bodies[gone]
        warm = self.warm_up_for(features, worker)
        if warm is None:
            return
        found = bodies.get(warm.opener)
        target = self.pool.get(warm.worker)
        body = warm_up_payload(found[0], found[1], warm.features.prompt_chars) if found else None
        if body is None or target is None or found is None:
            self.metrics.warm_ups.labels("skipped").inc()
            return
        lease = self.pool.lease(target, 0)
        try:
            policy.on_warm(warm.features, target.id, self.wall())
            task = asyncio.get_running_loop().create_task(
                self._send(warm.features, target, lease, PATHS[found[1]], body, policy=policy)
            )
        except BaseException:
            lease.release()
            raise
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(
        self,
        features: RequestFeatures,
        worker: Worker,
        lease: Lease,
        path: str,
        body: dict[str, Any],
        *,
        policy: Policy,
    ) -> None:
        """Send one warm-up; its lease and queue entry end here, whatever happens."""
        prompt_tokens = cached_tokens = 0
        outcome = "error"
        headers = {"Content-Type": "application/json"}
        if worker.config.api_key is not None:
            headers["Authorization"] = f"Bearer {worker.config.api_key}"
        try:
            status, answer = await worker.upstream.post_short(
                worker.upstream.base_url + path, json.dumps(body).encode(), self.timeout_s, headers
            )
            if status == 200:
                prompt_tokens, cached_tokens = _usage(answer)
                outcome = "sent"
            else:
                log.debug("warm-up on %s answered %d", worker.id, status)
        except Exception as exc:  # unreachable, timed out, refused: never a client's error
            log.debug("warm-up on %s failed: %s", worker.id, exc)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            lease.release()
            policy.on_warm_done(features, worker.id, prompt_tokens, cached_tokens, self.wall())
            self.metrics.warm_ups.labels(outcome).inc()
            self.metrics.warm_up_tokens.inc(prompt_tokens - cached_tokens)

    async def close(self) -> None:
        """Cancel the warm-ups still in flight and wait for them to give everything back."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._bodies.clear()


def _usage(answer: bytes) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of a worker's answer; (0, 0) when it has none."""
    try:
        usage = json.loads(answer).get("usage") or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        return prompt, min(prompt, int(details.get("cached_tokens") or 0))
    except (ValueError, AttributeError, TypeError):
        return 0, 0

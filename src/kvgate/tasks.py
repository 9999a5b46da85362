"""Background tasks: the one way to stop them (cancel, then wait until they have ended).

A component that runs a loop in the background (probing, exchanging, stepping,
listening) stops it by cancelling the task and waiting until its ``finally`` has
run. The task's own cancellation is the expected way out and is swallowed; the
caller's is not: a stop that is itself cancelled while it waits (a shutdown under
``asyncio.timeout``, a ``TaskGroup`` failing) raises ``CancelledError``, as asyncio
needs it to, instead of carrying on as though the wait had finished.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` (``None``: one never started) and wait until every one has ended.

    A task that ended with an error of its own rather than its cancellation raises it
    here, as ``await task`` would: the first such error once all have ended (any
    further one is logged). A cancellation of the caller while it waits reaches the
    task waited for (as in any ``await task``) and is raised once that one has ended,
    the tasks not yet waited for left cancelled.
    """
    caller = asyncio.current_task()
    # Counted from here: a caller already being cancelled (a stop in a cancelled
    # task's ``finally``) still waits for its tasks, as it did before this call.
    before = caller.cancelling() if caller is not None else 0
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    errors: list[Exception] = []
    for task in running:
        try:
            await task
        except asyncio.CancelledError:
            if caller is not None and caller.cancelling() > before:
                raise  # the caller's own cancellation, not (only) the task's
        except Exception as exc:
            errors.append(exc)
    # A task that swallowed its cancellation hides the caller's, requested meanwhile.
    cancelled = caller is not None and caller.cancelling() > before
    for error in errors[0 if cancelled else 1 :]:
        log.error("a background task failed as it was stopped", exc_info=error)
    if cancelled:
        raise asyncio.CancelledError
    if errors:
        raise errors[0]

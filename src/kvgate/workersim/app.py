"""``create_app``: the emulated worker's aiohttp application.

Serve it with ``handler_cancellation=True`` (``running_worker`` and the CLI do):
that is how a client going away reaches the handler, which then aborts its
request in the engine.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler

from kvgate.engine import Engine
from kvgate.workersim import admin, completions, messages_api, responses_api, slotapi, tokens
from kvgate.workersim.kvpublish import EnginePublisher
from kvgate.workersim.options import WorkerOptions
from kvgate.workersim.protocol import ApiError
from kvgate.workersim.worker import WORKER_KEY, Worker

if TYPE_CHECKING:
    from kvgate.kvevents.publisher import KVEventPublisher

logger = logging.getLogger(__name__)

KV_PUBLISHER_KEY: web.AppKey[KVEventPublisher] = web.AppKey("kvgate.workersim.kv_publisher")
"""The app's ``KVEventPublisher`` when it publishes KV events (the kvevents extra)."""

_MAX_BODY_BYTES = 64 * 1024 * 1024
"""Long-context prompts are large; aiohttp's 1 MiB default would refuse them."""


def create_app(options: WorkerOptions, engine: Engine | None = None) -> web.Application:
    """The worker's app; its engine starts stepping when the app starts."""
    app = web.Application(
        middlewares=[_refuse_connections, _openai_errors], client_max_size=_MAX_BODY_BYTES
    )
    worker = Worker(options, engine)
    app[WORKER_KEY] = worker
    app.router.add_post("/v1/chat/completions", completions.chat_completions)
    app.router.add_post("/v1/completions", completions.completions)
    app.router.add_get("/v1/models", admin.models)
    app.router.add_get("/v1/models/{model:.+}", admin.model)
    app.router.add_post("/v1/embeddings", tokens.embeddings_endpoint)
    app.router.add_post("/v1/responses", responses_api.responses_endpoint)
    app.router.add_get("/v1/responses/{response_id}", responses_api.retrieve_endpoint)
    app.router.add_delete("/v1/responses/{response_id}", responses_api.delete_endpoint)
    app.router.add_post("/v1/messages", messages_api.messages_endpoint)
    app.router.add_post("/tokenize", tokens.tokenize_endpoint)
    app.router.add_post("/detokenize", tokens.detokenize_endpoint)
    app[tokens.VOCABULARY_KEY] = tokens.Vocabulary()
    app[responses_api.RESPONSE_LOG_KEY] = responses_api.ResponseLog()
    app.router.add_get("/health", admin.health)
    app.router.add_get("/metrics", admin.metrics)
    app.router.add_post("/kv/offload", admin.offload)
    app.router.add_get("/slots", slotapi.list_slots)
    app.router.add_post("/slots/{id}", slotapi.slot_action)
    app.router.add_get("/admin/faults", admin.get_faults)
    app.router.add_post("/admin/faults", admin.set_faults)
    app.on_startup.append(_start_engine)
    app.on_cleanup.append(_stop_engine)
    return app


async def _start_engine(app: web.Application) -> None:
    worker = app[WORKER_KEY]
    port = worker.options.kv_events_port
    if port is not None:
        from kvgate.kvevents.publisher import KVEventPublisher  # the kvevents extra

        host = worker.options.host
        publisher = KVEventPublisher(f"tcp://{host}:{port}", f"tcp://{host}:{port + 1}")
        publisher.start()
        app[KV_PUBLISHER_KEY] = publisher
        worker.kv_publisher = EnginePublisher(
            worker.engine, worker.options.block_size, publisher.publish
        )
        worker.driver.on_step = worker.kv_publisher.publish
    worker.driver.start()


async def _stop_engine(app: web.Application) -> None:
    await app[WORKER_KEY].driver.stop()
    publisher = app.get(KV_PUBLISHER_KEY)
    if publisher is not None:
        await publisher.close()


@web.middleware
async def _openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error the worker answers, in OpenAI's error shape."""
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = ApiError(exc.status, exc.reason, type_=_error_type(exc.status))
        return error.response()
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        logger.exception("unhandled error serving %s %s", request.method, request.path)
        return ApiError(500, "internal error", type_="internal_server_error").response()


@web.middleware
async def _refuse_connections(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The ``refuse_connections`` fault: drop the connection without an answer.

    The admin API is spared so the fault can be read and cleared.
    """
    faults = request.app[WORKER_KEY].faults
    if faults.settings.refuse_connections and not request.path.startswith("/admin/"):
        faults.note("refuse_connection")
        if request.transport is not None:
            request.transport.abort()
        # aiohttp quietly drops a response it cannot write to a closed connection.
        return web.Response(status=503)
    return await handler(request)


def _error_type(status: int) -> str:
    return "invalid_request_error" if status < 500 else "internal_server_error"

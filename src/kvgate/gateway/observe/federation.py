"""One ``/metrics`` scrape for the whole gateway when it runs as several processes.

With ``listen.processes > 1`` every server process keeps its own registry and the
kernel hands a scrape to any one of them: successive scrapes read one process's
counters, then another's, and Prometheus sees resets. prometheus_client's
multiprocess mode would need every metric (and our scrape-time collectors) to
live in shared files; instead each process also serves its own page on a Unix
socket in a directory the parent made, and the process a scrape lands on asks
its siblings there and answers with every process's series, each labelled
``process="<index>"``. Every series then comes from one process, whichever
process answers, so counters only ever grow; ``sum without (process)`` gives
the gateway's totals.

A sibling that does not answer within ``timeout_s`` (starting, stopping, gone)
is left out of that scrape; what the others report is still answered.

The same socket takes ``POST /reload``: the process that took ``POST /admin/reload``
asks each sibling to reload too (``ask_siblings``) and says which did, so a reload
reaches every process or says which it did not (``gateway.app``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

log = logging.getLogger("kvgate.gateway.observe.federation")

PROCESS_LABEL = "process"


def socket_path(directory: str | Path, index: int) -> Path:
    """Where server process ``index`` serves its own metrics page."""
    return Path(directory) / f"{index}.sock"


class _Families(Collector):
    """Already-built families, for ``generate_latest`` to render (escaping and all)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge_pages(pages: dict[int, str]) -> bytes:
    """Every process's page (by index) as one page, each sample labelled by its process.

    Families keep their help and type (the first process's); samples of one family
    from every process are written together, as the text format requires.
    """
    merged: dict[str, Metric] = {}
    for index, text in sorted(pages.items()):
        label = str(index)
        for family in text_string_to_metric_families(text):
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type)
            for s in family.samples:
                into.samples.append(
                    Sample(s.name, {**s.labels, PROCESS_LABEL: label}, s.value, s.timestamp)
                )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(merged.values())))
    return generate_latest(registry)


class MetricsPeers:
    """This process's place among its siblings: serve our page, gather theirs."""

    def __init__(
        self, directory: str | Path, index: int, count: int, timeout_s: float = 1.0
    ) -> None:
        self.directory = Path(directory)
        self.index = index
        self.count = count
        self.timeout_s = timeout_s
        self._runner: web.AppRunner | None = None

    async def start(self, render: Handler, reload: Handler | None = None) -> None:
        """Serve ``render`` (our own page) and ``reload`` (``POST /reload``, for a sibling
        that took an admin reload) on this process's socket."""
        app = web.Application()
        app.router.add_get("/metrics", render)
        if reload is not None:
            app.router.add_post("/reload", reload)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        path = socket_path(self.directory, self.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a socket left by a process of the same index that died
        await web.UnixSite(self._runner, str(path)).start()

    async def stop(self) -> None:
        """Stop serving our page."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(FileNotFoundError):
            socket_path(self.directory, self.index).unlink()

    async def _fetch(self, index: int) -> str | None:
        path = socket_path(self.directory, index)
        if not path.exists():
            return None
        try:
            connector = aiohttp.UnixConnector(path=str(path))
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
                session.get("http://localhost/metrics") as resp,
            ):
                if resp.status != 200:
                    return None
                return await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def _post(self, index: int, path: str, timeout_s: float) -> tuple[int, bytes] | None:
        socket = socket_path(self.directory, index)
        if not socket.exists():
            return None
        try:
            connector = aiohttp.UnixConnector(path=str(socket))
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
                session.post("http://localhost" + path) as resp,
            ):
                return resp.status, await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def ask_siblings(
        self, path: str, timeout_s: float
    ) -> dict[int, tuple[int, bytes] | None]:
        """``POST path`` to every sibling at once: each one's (status, body), by index;
        ``None`` for one that did not answer within ``timeout_s``."""
        others = [i for i in range(self.count) if i != self.index]
        found = await asyncio.gather(*(self._post(i, path, timeout_s) for i in others))
        return dict(zip(others, found, strict=True))

    async def gather(self, own: bytes) -> bytes:
        """Our page ``own`` merged with every sibling that answers."""
        others = [i for i in range(self.count) if i != self.index]
        found = await asyncio.gather(*(self._fetch(i) for i in others))
        pages = {self.index: own.decode()}
        for index, text in zip(others, found, strict=True):
            if text is not None:
                pages[index] = text
        try:
            return merge_pages(pages)
        except ValueError:
            log.warning("a sibling's metrics page could not be parsed; answering our own")
            return merge_pages({self.index: own.decode()})

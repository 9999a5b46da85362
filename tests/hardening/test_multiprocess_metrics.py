"""``--processes N``: any one scrape shows every process's series, so counters never reset."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvgate.gateway.observe.federation import merge_pages
from kvgate.testing import free_port, wait_until
from kvgate.testing_redis import RedisServer

from .fake_worker import fake_workers

KVGATE = str(Path(sys.executable).parent / "kvgate")


def _total(text: str, name: str) -> tuple[float, set[str]]:
    total, processes = 0.0, set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                total += sample.value
                processes.add(sample.labels.get("process", ""))
    return total, processes


def test_pages_merge_by_family_with_a_process_label() -> None:
    page = (
        "# HELP kvgate_requests_total Requests.\n# TYPE kvgate_requests_total counter\n"
        'kvgate_requests_total{code="200"} 3.0\n'
        "# HELP kvgate_up Up.\n# TYPE kvgate_up gauge\nkvgate_up 1.0\n"
    )
    merged = merge_pages({0: page, 1: page.replace("3.0", "4.0")}).decode()
    assert _total(merged, "kvgate_requests_total") == (7.0, {"0", "1"})
    # One group per family, as the text format requires.
    assert merged.count("# TYPE kvgate_requests_total counter") == 1


async def test_every_scrape_counts_the_requests_of_every_process(tmp_path: Path) -> None:
    # Several processes need a shared store (the memory store is refused for N > 1).
    with RedisServer() as redis:
        await _every_scrape_counts(tmp_path, redis.url)


async def _every_scrape_counts(tmp_path: Path, store_url: str) -> None:
    async with fake_workers(1) as (fake,):
        port = free_port()
        config = {
            "listen": {"port": port, "processes": 2},
            "workers": [{"url": fake.url, "model": "demo"}],
            "store": {"url": store_url},
            "drain_timeout_s": 2.0,
        }
        path = tmp_path / "kvgate.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = await asyncio.create_subprocess_exec(
            KVGATE, "serve", "--config", str(path),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        listening = 0
        try:
            assert proc.stderr is not None
            while listening < 2:
                line = await asyncio.wait_for(proc.stderr.readline(), 60)
                assert line, "the gateway exited before both processes listened"
                listening += bool(re.search(rb"gateway process \d .* listening", line))
            rest = asyncio.create_task(proc.stderr.read())
            base = f"http://127.0.0.1:{port}"
            body = {"model": "demo", "prompt": "x"}
            sent = 24
            for _ in range(sent):
                # A new connection each time: the kernel spreads them over the processes.
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(base + "/v1/completions", json=body) as resp,
                ):
                    assert resp.status == 200

            async def scrape() -> tuple[float, set[str]]:
                async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as r:
                    return _total(await r.text(), "kvgate_requests_total")

            async def both_counted() -> bool:
                return (await scrape())[1] == {"0", "1"}

            await wait_until(both_counted, timeout=10, message="a scrape with both processes")
            totals = [await scrape() for _ in range(12)]
            assert all(total == sent for total, _ in totals), totals
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0
            await rest
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

"""Take the README's dashboard screenshot from a live scene (about a minute and a half).

    .venv/bin/python scripts/dashboard_screenshot.py [docs/img/dashboard.png]

Four emulated workers of model ``demo`` (three v1, one v2; one v1 worker with a
KV cache too small for its sessions, so it runs hot) behind a gateway; multi-turn chat sessions that
share a system prompt; a canary rollout of v2 started after 20 s; one v1 worker
that starts refusing connections after 40 s (ejected). The page is captured in
headless chromium (Debian's, as in the browser test) once the rollout is at its
third step. Nothing here is faked: every number on the picture is the gateway's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import sys
import time
from pathlib import Path

import aiohttp
from playwright.async_api import async_playwright

from kvgate.gateway.testing import running_gateway
from kvgate.testing import wait_until
from kvgate.workersim import WorkerOptions, running_worker

TOKEN = "screenshot"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SYSTEM = "You are a careful assistant for a hardware store. " * 40


async def chat_sessions(url: str, stop: asyncio.Event, concurrency: int = 6) -> None:
    """Closed-loop multi-turn sessions: each turn resends the growing conversation."""
    ids = itertools.count()
    rng = random.Random(7)

    async def one(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            sid = f"user-{next(ids)}"
            messages = [{"role": "system", "content": SYSTEM}]
            for turn in range(rng.randint(2, 6)):
                if stop.is_set():
                    return
                messages.append({"role": "user", "content": f"question {turn} of {sid} " * 8})
                body = {"model": "demo", "messages": messages, "max_tokens": 48}
                headers = {"X-Session-ID": sid}
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.post(
                        url + "/v1/chat/completions", json=body, headers=headers
                    ) as resp:
                        data = await resp.json(content_type=None)
                        if resp.status == 200:
                            text = data["choices"][0]["message"]["content"]
                            messages.append({"role": "assistant", "content": text})
                await asyncio.sleep(rng.uniform(0.2, 0.8))

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session) for _ in range(concurrency)))


async def main(path: Path) -> None:
    common = {"profile": "h100-llama3-8b", "time_scale": 4.0}
    async with contextlib.AsyncExitStack() as stack:
        workers = []
        for i, (version, kv_blocks) in enumerate(
            [("v1", None), ("v1", 420), ("v1", None), ("v2", None)]
        ):
            options = WorkerOptions(port=0, seed=i, version=version, kv_blocks=kv_blocks, **common)
            workers.append(await stack.enter_async_context(running_worker(options)))
        config = {
            "workers": [{"url": w.url, "model": "demo", "version": v} for w, v in
                        zip(workers, ["v1", "v1", "v1", "v2"], strict=True)],
            "health": {"interval_s": 0.5},
            "models": {"demo": {"weights": {"v1": 100, "v2": 0}, "stable": "v1"}},
            "admin_token": TOKEN,
        }  # fmt: skip
        gw = await stack.enter_async_context(running_gateway(config))
        await wait_until(lambda: all(w.probe_ok for w in gw.gateway.pool), message="workers up")
        stop = asyncio.Event()
        traffic = asyncio.create_task(chat_sessions(gw.url, stop))
        started = time.monotonic()
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(headers=headers) as admin:
            await asyncio.sleep(20)
            rollout = {
                "model": "demo",
                "baseline": "v1",
                "canary": "v2",
                "steps": [10, 25, 50, 100],
                "min_step_duration_s": 15,
                "min_requests_per_step": 10,
                "gates": {"min_samples": 10, "latency_p99": {"max_factor": 3.0}},
            }
            async with admin.post(gw.url + "/admin/rollouts", json=rollout) as resp:
                assert resp.status == 201, await resp.text()
            await asyncio.sleep(max(0.0, 40 - (time.monotonic() - started)))
            async with admin.post(
                workers[2].url + "/admin/faults", json={"refuse_connections": True}
            ) as resp:
                assert resp.status == 200
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
            )
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            await page.goto(gw.url + "/dashboard")
            await page.fill("#token", TOKEN)
            await page.click("#login button")
            await page.locator("#main").wait_for(state="visible")

            async def at_step_3() -> bool:
                step = page.locator('[data-field="step"]')
                return await step.count() > 0 and "step 3" in await step.first.inner_text()

            await wait_until(at_step_3, timeout=120, interval=0.5, message="rollout at step 3")
            await page.wait_for_timeout(2500)  # one more refresh with the latest bucket
            path.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(path), full_page=True)
            await browser.close()
        stop.set()
        await traffic
    print(f"wrote {path} after {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img/dashboard.png")))

"""The dashboard in a real browser: Debian's chromium, headless, driven by Playwright.

What is asserted is what a person reads on the page: the per-worker and
per-reason counts equal ``/metrics``, a rollout's step advances to promotion,
a worker whose connections fail turns ``ejected``. ``scripts/test.sh`` installs
chromium; Playwright never downloads a browser here.

Set ``KVGATE_DASHBOARD_SCREENSHOT=PATH`` to save a screenshot mid-rollout (the
README's ``docs/img/dashboard.png`` comes from this test).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import AsyncIterator

import aiohttp
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import wait_until

from .conftest import every_worker_up, set_faults
from .rollout_fleet import TOKEN, Traffic, admin, spec, versioned_fleet

playwright_api = pytest.importorskip("playwright.async_api")

CHROMIUM = "/usr/bin/chromium"
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

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK) and not os.environ.get("CI"),
        reason="chromium not installed (scripts/test.sh installs it)",
    ),
]


@pytest.fixture
async def page() -> AsyncIterator[playwright_api.Page]:
    """A page in a fresh headless chromium."""
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield await browser.new_page(viewport={"width": 1500, "height": 1200})
        finally:
            await browser.close()


async def scraped(gw: GatewayHandle) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``/metrics`` as a person's Prometheus would read it: name -> labels -> value."""
    async with aiohttp.ClientSession() as session, session.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return out


def summed(samples: dict[tuple[tuple[str, str], ...], float], by: str) -> dict[str, int]:
    """Samples summed by one label's value."""
    out: dict[str, int] = defaultdict(int)
    for labels, value in samples.items():
        out[dict(labels)[by]] += int(value)
    return dict(out)


async def table(page: playwright_api.Page, selector: str) -> dict[str, str]:
    """A two-or-more-column table on the page as {first cell: second cell}."""
    rows = await page.locator(f"{selector} tbody tr").all()
    out = {}
    for row in rows:
        cells = await row.locator("td").all_inner_texts()
        if len(cells) >= 2:
            out[cells[0]] = cells[1]
    return out


async def worker_cell(page: playwright_api.Page, worker: str, column: str) -> str:
    """The text of one worker's cell in the fleet table."""
    cell = page.locator(f'#fleet tr[data-worker="{worker}"] td.{column}')
    return str(await cell.inner_text()) if await cell.count() else ""


async def test_dashboard_shows_fleet_traffic_and_rollout_as_metrics_say(
    page: playwright_api.Page,
) -> None:
    async with versioned_fleet(baseline=2, canary=1) as fleet:
        config = fleet.config()
        async with running_gateway(config) as gw:
            await every_worker_up(gw)
            await page.goto(gw.url + "/dashboard?refresh=250")

            # The admin token is asked for once and kept in the tab.
            await page.locator("#login").wait_for(state="visible")
            await page.fill("#token", TOKEN)
            await page.click("#login button")
            await page.locator("#main").wait_for(state="visible")
            shown = await page.locator("#fleet tbody tr").count()
            assert shown == 3

            # Sessions: three conversations of two turns each, through the OpenAI client.
            client = AsyncOpenAI(base_url=gw.openai_base, api_key="x", max_retries=0)
            for turn in range(2):
                for s in range(3):
                    await client.chat.completions.create(
                        model="demo",
                        messages=[{"role": "user", "content": f"session {s} turn {turn} " * 20}],
                        max_tokens=4,
                        extra_headers={"X-Session-ID": f"s{s}"},
                    )
            metrics = await scraped(gw)
            requests = metrics["kvgate_requests_total"]
            by_worker = summed(requests, "worker")
            by_reason = summed(requests, "reason")
            assert sum(by_worker.values()) == 6

            async def page_agrees() -> bool:
                if await page.locator("#minute-requests").inner_text() != "6":
                    return False
                destinations = await table(page, "#destinations")
                reasons = await table(page, "#reasons")
                wanted = {w.removeprefix("http://"): str(n) for w, n in by_worker.items()}
                return destinations == wanted and reasons == {
                    r: str(n) for r, n in by_reason.items()
                }

            await wait_until(page_agrees, timeout=20, interval=0.1, message="page == /metrics")
            # Stickiness as the page states it: the second turns were affinity hits.
            assert by_reason.get("affinity_hit") == 3
            # The hit rate shown is cached / prompt tokens, as /metrics counts them.
            prompt = sum(metrics["kvgate_prompt_tokens_total"].values())
            cached = sum(metrics["kvgate_cached_tokens_total"].values())
            shown_rate = await page.locator("#minute-hit-rate").inner_text()
            assert shown_rate == f"{100 * cached / prompt:.1f}%"
            # Each worker's row says what its gauges say.
            for labels, limit in metrics["kvgate_worker_max_in_flight"].items():
                worker = dict(labels)["worker"]
                cell = await worker_cell(page, worker, "in-flight")
                assert cell.endswith(f"/ {int(limit)}"), cell

                async def health_agrees(worker: str = worker) -> bool:
                    # Page and a fresh scrape, read together: on a loaded machine a late
                    # scrape may mark a worker degraded for a moment, on both of them.
                    states = {
                        dict(k)["state"]: v
                        for k, v in (await scraped(gw))["kvgate_worker_health_state"].items()
                        if dict(k)["worker"] == worker
                    }
                    (state,) = [s for s, v in states.items() if v == 1.0]
                    return await worker_cell(page, worker, "health") == state == "healthy"

                await wait_until(health_agrees, timeout=20, interval=0.2, message="healthy")

            # A worker that refuses connections turns ejected, on the page and in /metrics.
            sick = fleet.baseline[1].url
            await set_faults(fleet.baseline[1], refuse_connections=True)

            async def shown_ejected() -> bool:
                return await worker_cell(page, sick, "health") == "ejected"

            await wait_until(shown_ejected, timeout=20, interval=0.1, message="worker ejected")
            assert "ejected" in await worker_cell(page, sick, "why")
            after = await scraped(gw)
            key = (("model", "demo"), ("state", "ejected"), ("version", "v1"), ("worker", sick))
            assert after["kvgate_worker_health_state"][key] == 1.0
            assert after["kvgate_worker_healthy"][(key[0], key[2], key[3])] == 0.0

            # A rollout advances step by step to promotion while traffic flows.
            # The gates are not what this test checks, and the browser shares two cores
            # with the fleet: one request stalled behind its rendering made a canary's
            # p99 30x the baseline's and rolled it back. Only a real failure may do that.
            loose = {"max_factor": 1000.0}
            gates = {"min_samples": 5, "max_error_rate": 0.01}
            gates |= {"latency_p99": loose, "ttft_p99": loose}
            body = spec(steps=[20, 50, 100], min_step_duration_s=1.0, gates=gates)
            async with aiohttp.ClientSession() as session:
                status, created = await admin(session, "POST", gw.url + "/admin/rollouts", body)
            assert status == 201, created
            rollout = created["rollout"]
            article = page.locator(f'article[data-rollout="{rollout}"]')
            seen_steps: list[str] = []
            screenshot = os.environ.get("KVGATE_DASHBOARD_SCREENSHOT")

            async def promoted() -> bool:
                if not await article.count():
                    return False
                step = await article.locator('[data-field="step"]').inner_text()
                if not seen_steps or seen_steps[-1] != step:
                    seen_steps.append(step)
                    if screenshot and step != "step 1 of 3" and len(seen_steps) == 2:
                        os.makedirs(os.path.dirname(screenshot) or ".", exist_ok=True)
                        await page.screenshot(path=screenshot, full_page=True)
                state = await article.locator('[data-field="state"]').inner_text()
                return state == "promoted"

            async with Traffic(gw.url, concurrency=3).running():
                await wait_until(promoted, timeout=60, interval=0.1, message="rollout promoted")
            # What the page showed moved forward only, from the first step to the last (a
            # loaded machine may skip a refresh within a step; the history has them all).
            assert seen_steps[0] == "step 1 of 3" and seen_steps[-1] == "step 3 of 3"
            assert seen_steps == sorted(seen_steps)
            # Its gates were shown with their observed values, bounds and samples.
            gate_rows = await article.locator("table.gates tbody tr[data-gate]").count()
            assert gate_rows > 0
            history = await article.locator(".history li").all_inner_texts()
            assert any("promoted" in line for line in history)
            assert any("advanced: step 2" in line for line in history)
            assert any("advanced: step 3" in line for line in history)

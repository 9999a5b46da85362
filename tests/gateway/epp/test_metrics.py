"""The picker's own metrics on its HTTP port's ``/metrics``: decisions by outcome, how long
each took, and the streams open (``observe.metrics.EppMetrics``)."""

from __future__ import annotations

import aiohttp
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client.parser import text_string_to_metric_families

from kvgate.gateway.epp import Picker
from kvgate.testing import wait_until

from ..conftest import gateway_config, worker_fleet
from .conftest import chat, envoy, leases_released, running_picker
from .envoy import _headers

pytestmark = pytest.mark.asyncio


async def scrape(picker: Picker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the picker's ``/metrics`` page, by name and labels."""
    url = f"http://127.0.0.1:{picker.http_port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def decisions(page: dict[tuple[str, tuple[tuple[str, str], ...]], float], outcome: str) -> float:
    return page[("kvgate_epp_decisions_total", (("outcome", outcome),))]


def timed(page: dict[tuple[str, tuple[tuple[str, str], ...]], float], outcome: str) -> float:
    return page.get(("kvgate_epp_decision_seconds_count", (("outcome", outcome),)), 0.0)


async def test_each_decision_is_counted_by_outcome_and_timed() -> None:
    async with (
        worker_fleet(2) as fleet,
        running_picker(gateway_config(fleet)) as picker,
        envoy(picker) as client,
    ):
        before = await scrape(picker)
        assert {decisions(before, o) for o in ("picked", "shed", "no_endpoint")} == {0.0}
        for n in range(3):
            assert (await client.request(chat(f"hello {n}"))).status == 200
        assert (await client.request(b"{not json")).status == 400
        assert (await client.request(chat("nobody", model="nobody"))).status == 404
        assert (await client.request(chat("nowhere"), subset=[])).status == 503
        await wait_until(lambda: leases_released(picker), message="released")
        page = await scrape(picker)
    assert decisions(page, "picked") == 3 and timed(page, "picked") == 3
    assert decisions(page, "bad_request") == 2 and timed(page, "bad_request") == 2
    assert decisions(page, "no_endpoint") == 1 and timed(page, "no_endpoint") == 1
    assert decisions(page, "shed") == 0 and decisions(page, "draining") == 0
    assert page[("kvgate_epp_decision_seconds_sum", (("outcome", "picked"),))] > 0.0


async def test_a_stream_open_is_a_gauge_that_falls_back_when_it_ends() -> None:
    async with (
        worker_fleet(1) as fleet,
        running_picker(gateway_config(fleet)) as picker,
        envoy(picker) as client,
    ):
        call = client.stub.Process()
        # Full duplex, the body still to come: the picker holds the stream, undecided.
        await call.write(
            pb.ProcessingRequest(
                request_headers=_headers(
                    {":method": "POST", ":path": "/v1/chat/completions"}, False
                )
            )
        )
        await wait_until(lambda: picker.extproc.streams == 1, message="stream open")
        assert (await scrape(picker))[("kvgate_epp_streams_open", ())] == 1.0
        call.cancel()
        await wait_until(lambda: picker.extproc.streams == 0, message="stream closed")
        page = await scrape(picker)
    assert page[("kvgate_epp_streams_open", ())] == 0.0
    assert decisions(page, "picked") == 0  # it broke off before any decision


async def test_the_built_in_gateway_page_carries_no_picker_metrics() -> None:
    from kvgate.gateway.observe.metrics import GatewayMetrics

    assert b"kvgate_epp_" not in GatewayMetrics().render()

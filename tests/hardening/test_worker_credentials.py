"""A worker URL with user information (``http://user:pass@host``) shows its password nowhere.

The worker is named by its URL without the user information everywhere the
gateway shows it: ``/metrics`` labels, the admin API, the dashboard's state,
``X-Kvgate-Worker`` (with ``expose_worker_urls``) and every log line. A raw ``@``
in the password does not defeat the log redaction either.
"""

from __future__ import annotations

import logging

import aiohttp
import pytest

from kvgate.gateway.config import WorkerConfig
from kvgate.redaction import redact, without_userinfo

from .conftest import fake_fleet
from .fake_worker import fake_workers

pytestmark = pytest.mark.usefixtures("both_servers")

USER = "kvuser"
PASSWORD = "s3cr@t-pw"  # a raw "@": URL parsers split the authority at its last one
SECRETS = (USER, "s3cr", "t-pw")


def _shows_no_secret(text: str) -> bool:
    return not any(secret in text for secret in SECRETS)


def test_redact_blanks_a_password_holding_a_raw_at() -> None:
    line = f"worker http://{USER}:{PASSWORD}@10.0.0.7:8000/v1 failed"
    assert redact(line) == "worker http://***@10.0.0.7:8000/v1 failed"
    assert redact("mail ops@example.com about http://10.0.0.7:8000") == (
        "mail ops@example.com about http://10.0.0.7:8000"
    )


@pytest.mark.parametrize(
    ("url", "clean"),
    [
        (f"http://{USER}:{PASSWORD}@10.0.0.7:8000", "http://10.0.0.7:8000"),
        ("https://token@w:443/base", "https://w:443/base"),
        ("http://w:8000", "http://w:8000"),
        ("http://w:8000/p@th", "http://w:8000/p@th"),
    ],
)
def test_without_userinfo(url: str, clean: str) -> None:
    assert without_userinfo(url) == clean
    assert WorkerConfig(url=url).id == clean


async def test_no_view_of_the_gateway_shows_a_worker_urls_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with fake_workers(1) as (fake,):
        url = f"http://{USER}:{PASSWORD}@127.0.0.1:{fake.port}"
        async with (
            fake_fleet(0, workers=[{"url": url, "model": "demo"}], expose_worker_urls=True) as (
                gw,
                _,
            ),
            aiohttp.ClientSession() as session,
        ):
            body = {"model": "demo", "prompt": "x"}
            async with session.post(gw.openai_base + "/completions", json=body) as resp:
                assert resp.status == 200
                header = resp.headers["X-Kvgate-Worker"]
            shown = [header]
            for path in (
                "/metrics",
                "/admin/workers",
                "/admin/models",
                "/dashboard/state.json",
                "/readyz",
            ):
                async with session.get(gw.url + path) as resp:
                    assert resp.status == 200, path
                    shown.append(await resp.text())
            # The admin API finds the worker by its URL with or without the password.
            async with session.delete(gw.url + "/admin/workers", params={"url": url}) as resp:
                assert resp.status == 200
                shown.append(await resp.text())
    assert header == f"http://127.0.0.1:{fake.port}"
    assert f"127.0.0.1:{fake.port}" in shown[1]  # /metrics names the worker, cleanly
    for text in shown:
        assert _shows_no_secret(text), text
    logged = [r.getMessage() for r in caplog.records]
    assert any(f"127.0.0.1:{fake.port}" in line for line in logged)
    assert all(_shows_no_secret(line) for line in logged), [
        line for line in logged if not _shows_no_secret(line)
    ]

"""Fixtures shared by every suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvgate.gateway import embedded


@pytest.fixture(params=["aiohttp", "llhttp"])
def both_servers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test once with each server of the generation endpoints (``listen.server``):
    aiohttp's, and the data plane's own on llhttp."""
    monkeypatch.setattr(embedded, "SERVER", request.param)
    yield str(request.param)

"""Fixtures shared by every suite."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from kvgate.gateway import embedded

# Property tests draw the same examples on every run (a seed per test, no example
# database): a CI run cannot fail on an example the last run never drew. To look for
# new ones on purpose: ``KVGATE_HYPOTHESIS=explore pytest --hypothesis-seed=N ...``.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("KVGATE_HYPOTHESIS", "deterministic"))


@pytest.fixture(params=["aiohttp", "llhttp"])
def both_servers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test once with each server of the generation endpoints (``listen.server``):
    aiohttp's, and the data plane's own on llhttp."""
    monkeypatch.setattr(embedded, "SERVER", request.param)
    yield str(request.param)

"""A request failing on a canary falls back to the stable version before its first byte."""

from __future__ import annotations

import aiohttp

from kvgate.gateway.testing import running_gateway

from .rollout_fleet import versioned_fleet


async def test_requests_failing_on_a_canary_are_served_by_the_stable_version() -> None:
    async with versioned_fleet(canary=2, error_rate=1.0) as fleet:
        config = fleet.config(models={"demo": {"weights": {"v1": 50, "v2": 50}, "stable": "v1"}})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            versions = []
            for i in range(12):
                body = {"model": "demo", "prompt": f"hello {i}", "max_tokens": 2}
                headers = {"X-Session-ID": f"s{i}"}
                async with session.post(
                    gw.openai_base + "/completions", json=body, headers=headers
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    versions.append(resp.headers["X-Kvgate-Model-Version"])
            assert set(versions) == {"v1"}
            # The canary's failures still count against it (its gates see them).
            text = gw.gateway.metrics.render().decode()
            errors = [
                line
                for line in text.splitlines()
                if line.startswith("kvgate_version_attempts_total")
                and 'version="v2"' in line
                and 'outcome="error"' in line
            ]
            assert errors and float(errors[0].split()[-1]) > 0, errors

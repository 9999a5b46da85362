"""The example config shipped in examples/ loads, so the README's example cannot rot."""

from __future__ import annotations

from pathlib import Path

from kvgate.gateway.config import load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kvgate.yaml"


def test_the_example_config_loads_with_the_values_it_states() -> None:
    config = load_config(EXAMPLE)
    assert config.listen.port == 8000
    assert config.policy.name == "default"
    assert config.store.url.startswith("redis://")
    assert [w.version for w in config.workers] == ["v1", "v1", "v2"]
    assert config.workers[1].dcgm_url == "http://127.0.0.1:9400/metrics"
    assert dict(config.models["llama-3-8b"].weights) == {"v1": 100, "v2": 0}
    assert config.pressure.soft_watermark == 0.85
    assert config.admin_token == "change-me"

"""docs/configuration.md is generated from the config models and must be up to date."""

from __future__ import annotations

from pathlib import Path

from kvgate.gateway.config import GatewayConfig
from kvgate.gateway.reference import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_configuration_reference_is_up_to_date() -> None:
    assert DOC.read_text() == render(), (
        "docs/configuration.md is stale: run "
        ".venv/bin/python -m kvgate.gateway.reference > docs/configuration.md"
    )


def test_every_top_level_key_and_section_is_documented() -> None:
    text = render()
    for name in GatewayConfig.model_fields:
        assert f"| `{name}` |" in text
    for section in ("## `discovery`", "## `discovery.dns[]`", "## `workers[]`", "## `store`"):
        assert section in text
    assert "(secret)" not in text  # secrets have no defaults to show

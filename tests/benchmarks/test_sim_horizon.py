"""``benchmarks/sim_horizon.py``: seed lists, and a change paired by seed against a saved run."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from .loading import load_benchmark

horizon = load_benchmark("sim_horizon")


@pytest.mark.parametrize(
    ("text", "seeds"),
    [
        ("100-103", [100, 101, 102, 103]),
        ("7", [7]),
        ("160-162,180,190-191", [160, 161, 162, 180, 190, 191]),
    ],
)
def test_seeds_are_a_comma_list_of_seeds_and_ranges(text: str, seeds: list[int]) -> None:
    assert horizon.parse_seeds(text) == seeds


def row(seed: int, hit: float, points: float, p99: float, requests: int = 240) -> dict[str, Any]:
    return {"seed": seed, "requests": requests, "hit": hit, "hit_points": points, "p99_s": p99}


def test_the_change_is_paired_by_seed_with_its_standard_error() -> None:
    before = [row(1, 50.0, -1.0, 2.0), row(2, 60.0, 0.0, 1.0), row(3, 70.0, 0.2, 1.0)]
    # Seed 3 is missing now, seed 4 was not run before: neither is paired.
    now = [row(1, 52.0, 1.0, 1.0), row(2, 60.0, 0.0, 1.0), row(4, 10.0, -9.0, 9.0)]
    console = Console(width=200, record=True)
    console.print(horizon.compared(now, before, [240, 600]))
    line = next(r for r in console.export_text().splitlines() if "240" in r)
    cells = [c.strip() for c in line.split("│") if c.strip()]
    # Changes +2 and 0: mean +1, standard error sqrt(2 / 2) = 1; p99 ratios 0.5 and 1.
    assert cells == ["240", "2", "+1.00", "1.00", "0.707x", "1 → 0", "-0.50 → +0.50"]
    assert "600" not in console.export_text()  # no pairs at that length: no row

"""``benchmarks/peers_tally.py``: every router against the best of the others, group by group."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .loading import load_benchmark

tally_mod = load_benchmark("peers_tally")

ROUTERS = ["kvgate-default", "sglang-router", "smg"]


def run(router: str, seed: int, hit: float, p99: float, *, shed: int = 0) -> dict[str, Any]:
    return {"router": router, "shape": "trace", "seed": seed, "hit_rate": hit / 100.0,
            "worker_ttft_p99": p99, "shed": shed}  # fmt: skip


def test_each_router_is_judged_against_the_best_of_the_others() -> None:
    runs = [
        # Seed 1, two repeats of kvgate (mean 40.0): 0.4 below smg's 40.4 is a tie.
        run("kvgate-default", 1, 39.0, 1.0),
        run("kvgate-default", 1, 41.0, 3.0),
        run("sglang-router", 1, 38.0, 4.0),
        run("smg", 1, 40.4, 1.5),
        # Seed 2: kvgate 1 point behind sglang-router, the fastest.
        run("kvgate-default", 2, 30.0, 1.0),
        run("sglang-router", 2, 31.0, 2.0),
        run("smg", 2, 29.0, 4.0),
    ]
    found, shed = tally_mod.groups([("a.json", r) for r in runs], ROUTERS)
    assert shed == 0
    assert [
        (g.seed, round(g.hit["kvgate-default"], 6), g.p99["kvgate-default"]) for g in found
    ] == [
        (1, 40.0, 2.0),
        (2, 30.0, 1.0),
    ]
    rows = {r.router: r for r in tally_mod.tally(found, ROUTERS)}
    kv, sg, smg = rows["kvgate-default"], rows["sglang-router"], rows["smg"]
    # kvgate: gaps -0.4 (a tie) and -1.0; p99 2.0 / 1.5 and 1.0 / 2.0.
    assert (kv.groups, kv.hit_passed, kv.p99_passed, kv.both_passed) == (2, 1, 1, 0)
    assert kv.mean_gap == pytest.approx(-0.7)
    assert kv.worst_gap == pytest.approx(-1.0)
    assert kv.p99_geomean == pytest.approx((2.0 / 1.5 * 1.0 / 2.0) ** 0.5)
    # sglang-router: -2.4 then +1.0 against kvgate's 30; p99 4/1.5 and 2/1.
    assert (sg.hit_passed, sg.p99_passed, sg.both_passed) == (1, 0, 0)
    assert sg.mean_gap == pytest.approx((-2.4 + 1.0) / 2)
    # smg: +0.4 then -2.0; p99 1.5 / 2.0 (the best) then 4.0 / 1.0.
    assert (smg.hit_passed, smg.p99_passed, smg.both_passed) == (1, 1, 1)


def test_a_group_where_a_router_shed_or_one_is_missing_is_left_out() -> None:
    runs = [
        run("kvgate-default", 1, 20.0, 1.0, shed=12),  # another request set than the peers'
        run("sglang-router", 1, 30.0, 9.0),
        run("smg", 1, 30.0, 9.0),
        run("kvgate-default", 2, 20.0, 1.0),  # smg never ran seed 2
        run("sglang-router", 2, 30.0, 9.0),
        run("kvgate-default", 3, 20.0, 1.0),
        run("sglang-router", 3, 20.0, 1.0),
        run("smg", 3, 20.0, 1.0),
    ]
    found, shed = tally_mod.groups([("a.json", r) for r in runs], ROUTERS)
    assert ([g.seed for g in found], shed) == ([3], 1)
    # The same seed in two files is two groups (two separate runs).
    again, _ = tally_mod.groups([(f, r) for f in ("a.json", "b.json") for r in runs], ROUTERS)
    assert [(g.source, g.seed) for g in again] == [("a.json", 3), ("b.json", 3)]
    only, _ = tally_mod.groups([("a.json", r) for r in runs], ROUTERS, seeds={1, 2})
    assert only == []


def test_the_command_skips_other_files_and_writes_json(tmp_path: Path) -> None:
    peers = tmp_path / "peers.json"
    peers.write_text(json.dumps({"runs": [run(r, 1, 30.0, 1.0) for r in ROUTERS]}))
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{"seed": 1}]))
    out = tmp_path / "tally.json"
    tally_mod.main([str(peers), str(other), "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["left_out_shed"] == 0
    assert [(t["router"], t["hit_passed"], t["p99_passed"]) for t in doc["tally"]] == [
        (r, 1, 1) for r in ROUTERS
    ]
    with pytest.raises(SystemExit, match="no group"):
        tally_mod.main([str(other)])

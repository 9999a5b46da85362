"""How often each router passes issue 11's test against the others, over saved peers.py runs.

The test (issue 11's "done means"): a router's hit rate at or above the best of the
others' (a tie within half a point counts) and its model-clock p99 TTFT at or below the
better of theirs. Run it for *every* router, not only kvgate: on a shape where the
routers are equal in expectation (the shared-opening trace, where every router's
placement ends on full caches and a seed is decided by a point or two of LRU luck),
no router passes on every seed, and how often the peers pass says what the test can
tell there.

A group is one seed of one shape in one file (``benchmarks/peers.py --json``), with every
router named present; each router's figure is the mean over the group's repeats. A
group in which any router shed is left out (shedding changes which requests are
measured, so their hit rates are not of one request set) and counted as such.

    python benchmarks/peers_tally.py docs/runs/peers_*.json [--seeds 176-199] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sim_horizon import parse_seeds

ROUTERS = ("kvgate-default", "sglang-router", "smg")
TIE_POINTS = 0.5
"""A hit rate this many points below the best of the others' still ties (issue 11)."""


@dataclass(frozen=True)
class Group:
    """One seed of one shape in one saved run: each router's mean hit (%) and p99 (s)."""

    source: str
    shape: str
    seed: int
    hit: dict[str, float]
    p99: dict[str, float]


@dataclass(frozen=True)
class Tally:
    """One router on one shape against the best of the others, over the groups."""

    shape: str
    router: str
    groups: int
    hit_passed: int
    mean_gap: float
    worst_gap: float
    p99_passed: int
    p99_geomean: float
    both_passed: int


def groups(
    runs: Iterable[tuple[str, dict[str, Any]]],
    routers: Sequence[str],
    seeds: set[int] | None = None,
) -> tuple[list[Group], int]:
    """The complete groups among ``runs`` (source, one ``peers.py`` run each), and how many
    complete groups were left out because a router shed in them."""
    found: dict[tuple[str, str, int], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for source, run in runs:
        if run["router"] in routers and (seeds is None or run["seed"] in seeds):
            found[(source, run["shape"], run["seed"])][run["router"]].append(run)
    kept: list[Group] = []
    shed = 0
    for (source, shape, seed), by_router in sorted(found.items()):
        if any(r not in by_router for r in routers):
            continue
        if any(run.get("shed", 0) for rs in by_router.values() for run in rs):
            shed += 1
            continue
        hit = {
            r: 100.0 * statistics.fmean(x["hit_rate"] for x in rs) for r, rs in by_router.items()
        }
        p99 = {r: statistics.fmean(x["worker_ttft_p99"] for x in rs) for r, rs in by_router.items()}
        kept.append(Group(source, shape, seed, hit, p99))
    return kept, shed


def tally(found: Sequence[Group], routers: Sequence[str]) -> list[Tally]:
    """Per shape and router: how often it passes the test against the best of the others."""
    shapes = sorted({g.shape for g in found})
    out: list[Tally] = []
    for shape in shapes:
        mine = [g for g in found if g.shape == shape]
        for router in routers:
            gaps, ratios = [], []
            for g in mine:
                others = [r for r in routers if r != router]
                gaps.append(g.hit[router] - max(g.hit[r] for r in others))
                ratios.append(g.p99[router] / min(g.p99[r] for r in others))
            hits = [gap >= -TIE_POINTS for gap in gaps]
            fast = [ratio <= 1.0 for ratio in ratios]
            out.append(
                Tally(
                    shape=shape,
                    router=router,
                    groups=len(mine),
                    hit_passed=sum(hits),
                    mean_gap=statistics.fmean(gaps),
                    worst_gap=min(gaps),
                    p99_passed=sum(fast),
                    p99_geomean=math.exp(statistics.fmean(math.log(r) for r in ratios)),
                    both_passed=sum(h and f for h, f in zip(hits, fast, strict=True)),
                )
            )
    return out


def table(rows: Sequence[Tally], shed: int) -> Table:
    """The tally as a table, a shape's routers together."""
    t = Table(
        title="each router against the best of the others (hit: within "
        f"{TIE_POINTS} points; p99: at or below)",
        caption=f"groups left out because a router shed: {shed}",
    )
    for name in ("shape", "router", "groups", "hit passed", "mean gap", "worst gap",
                 "p99 passed", "p99 ratio (geo mean)", "both passed"):  # fmt: skip
        t.add_column(name, justify="left" if name in ("shape", "router") else "right")
    for r in rows:
        t.add_row(
            r.shape,
            r.router,
            str(r.groups),
            f"{r.hit_passed}/{r.groups}",
            f"{r.mean_gap:+.2f}",
            f"{r.worst_gap:+.2f}",
            f"{r.p99_passed}/{r.groups}",
            f"{r.p99_geomean:.2f}x",
            f"{r.both_passed}/{r.groups}",
        )
    return t


def load(paths: Iterable[Path]) -> tuple[list[tuple[str, dict[str, Any]]], list[Path]]:
    """Every run in the ``peers.py --json`` files, with its file's name; and the files
    that are not such (another benchmark's JSON matched by a glob)."""
    runs: list[tuple[str, dict[str, Any]]] = []
    other: list[Path] = []
    for path in paths:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
            other.append(path)
            continue
        runs.extend((path.name, run) for run in data["runs"] if _is_run(run))
    return runs, other


def _is_run(run: object) -> bool:
    return isinstance(run, dict) and {"router", "shape", "seed", "hit_rate"} <= run.keys()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="benchmarks/peers.py --json files")
    parser.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated")
    parser.add_argument("--seeds", help="only these seeds: a comma list of seeds and FIRST-LAST")
    parser.add_argument("--shapes", help="only these shapes, comma-separated")
    parser.add_argument("--json", type=Path, help="write the tally and the groups here")
    args = parser.parse_args(argv)
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    if len(routers) < 2:
        parser.error("--routers needs at least two routers")
    seeds = set(parse_seeds(args.seeds)) if args.seeds else None
    runs, other = load(args.files)
    console = Console(width=150)
    if other:
        console.print(f"not peers.py --json files, skipped: {', '.join(str(p) for p in other)}")
    if args.shapes:
        wanted = {s.strip() for s in args.shapes.split(",")}
        runs = [(source, run) for source, run in runs if run["shape"] in wanted]
    found, shed = groups(runs, routers, seeds)
    if not found:
        raise SystemExit("no group has every router named")
    rows = tally(found, routers)
    console.print(table(rows, shed))
    if args.json is not None:
        doc = {
            "routers": routers,
            "tie_points": TIE_POINTS,
            "left_out_shed": shed,
            "tally": [r.__dict__ for r in rows],
            "groups": [g.__dict__ for g in found],
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()

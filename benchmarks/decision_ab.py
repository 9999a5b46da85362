"""A policy's decision time on this tree against another revision's, side by side.

    .venv/bin/python benchmarks/decision_ab.py --base REV [--policy default] [--workers 64]
                                               [--rounds 10] [--json PATH]

``benchmarks/decision_bench.py`` times every policy of one tree; a change that should
make a decision cheaper needs the tree before it beside it, on the same machine at the
same moment (these machines are shared: one run's absolute figures move by a third
between runs, and two processes run one after the other differ as much). So both trees
run in one process: ``REV`` is checked out into a temporary git worktree, ``kvgate`` is
imported from its ``src/`` and the policy warmed with ``--sessions`` sessions on
``--workers`` workers (``decision_bench``'s fleet and prompts), its modules are then set
aside (the objects built keep theirs) and this tree's ``kvgate`` is imported and warmed
the same way. Then ``--rounds`` rounds time ``--picks`` picks of each kind (a known
session, a new session, a headerless request behind a known system prompt) on each
tree in turn, the order alternating. Per kind it prints each tree's least CPU time a
pick over the rounds and this tree's over the base's: that ratio, and the median and
range of the rounds' ratios (a round's two timings run one after the other, so the
machine's slow spells cancel in it).

The timing code is this tree's; the base must have the policy and the
``decision_bench`` fleet fields this tree uses, and import nothing inside a function
that a pick runs (``kvgate.core`` does not).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = Path(__file__).resolve().parent
KINDS = ("known", "new", "headerless")


@dataclass
class Tree:
    """One tree's warmed policy and its picks, built with that tree's ``kvgate``."""

    name: str
    policy: Any
    picks: dict[str, list[tuple[Any, Any]]]


def build(name: str, src: Path, args: argparse.Namespace) -> Tree:
    """Import ``kvgate`` from ``src``, warm the policy and make the picks, then set the
    modules aside so the next tree imports its own."""
    sys.path.insert(0, str(src))
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(1, str(BENCHMARKS))
    importlib.invalidate_caches()
    try:
        import decision_bench as bench
        import kvgate
        from kvgate.core.decision import Affinity
        from kvgate.core.policies import default_registry
        from kvgate.core.policy import RouteContext
        from kvgate.core.prefix import FeatureConfig, build_features

        loaded = Path(kvgate.__file__).resolve()
        if not loaded.is_relative_to(src.resolve()):
            raise SystemExit(f"kvgate was imported from {loaded}, not from {src}")
        rng = random.Random(args.seed)
        config = FeatureConfig()
        systems = [bench.words(rng, 2048) for _ in range(bench.GROUPS)]
        fleet = bench.make_fleet(rng, args.workers)
        ids = [w.id for w in fleet.workers]
        policy = default_registry().build(args.policy)
        sessions = []
        for i in range(args.sessions):
            features = build_features(
                bench.body(systems[i % bench.GROUPS], bench.words(rng, 1024)),
                {"X-Session-ID": f"sess-{i:08d}"},
                config,
                request_id=f"warm-{i}",
            )
            home = ids[rng.randrange(args.workers)]
            policy.on_routed(features, home, 0.0)
            sessions.append((features, home))
        picks: dict[str, list[tuple[Any, Any]]] = {kind: [] for kind in KINDS}
        for n in range(args.picks):
            question = bench.words(rng, 1024)
            system = systems[n % bench.GROUPS]
            known, home = sessions[rng.randrange(len(sessions))]
            affinity = Affinity(known.session_key or "", home, "default")
            picks["known"].append((known, RouteContext(fleet, affinity, random.Random(n))))
            body = bench.body(system, question)
            new = build_features(body, {"X-Session-ID": f"new-{n}"}, config, request_id=f"n{n}")
            picks["new"].append((new, RouteContext(fleet, None, random.Random(n))))
            headerless = build_features(body, {}, config, request_id=f"h{n}")
            holders = {ids[n % args.workers]: 8}
            picks["headerless"].append(
                (headerless, RouteContext(fleet, None, random.Random(n), holders))
            )
        return Tree(name, policy, picks)
    finally:
        sys.path.remove(str(src))
        for module in [m for m in sys.modules if m == "kvgate" or m.startswith("kvgate.")]:
            del sys.modules[module]
        sys.modules.pop("decision_bench", None)


def time_kind(tree: Tree, kind: str) -> float:
    """CPU µs a pick over one pass of ``tree``'s picks of ``kind``."""
    items, pick = tree.picks[kind], tree.policy.pick
    started = time.process_time()
    for request, context in items:
        pick(request, context)
    return (time.process_time() - started) / len(items) * 1e6


def compare(base: Tree, head: Tree, rounds: int) -> list[dict[str, Any]]:
    """Per kind: each tree's least µs a pick, and head over base round by round."""
    gc.collect()
    gc.freeze()  # the warmed state is a long-lived heap, not what a decision costs
    timings: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    for n in range(rounds):
        for kind in KINDS:
            if n % 2:
                h, b = time_kind(head, kind), time_kind(base, kind)
            else:
                b, h = time_kind(base, kind), time_kind(head, kind)
            timings[kind].append((b, h))
    gc.unfreeze()
    return summarize(timings)


def summarize(timings: dict[str, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    """Per kind, from each round's (base, head) µs a pick: each tree's least, their ratio,
    and the median and range of the rounds' ratios."""
    rows = []
    for kind, pairs in timings.items():
        ratios = [h / b for b, h in pairs]
        base, head = min(b for b, _ in pairs), min(h for _, h in pairs)
        rows.append(
            {
                "requests": kind,
                "base_us": base,
                "head_us": head,
                "ratio": head / base,
                "round_ratio_median": statistics.median(ratios),
                "round_ratio_min": min(ratios),
                "round_ratio_max": max(ratios),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--picks", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if min(args.workers, args.sessions, args.picks, args.rounds) < 1:
        parser.error("--workers, --sessions, --picks and --rounds must be >= 1")
    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory(prefix="kvgate-ab-") as tmp:
        checkout = Path(tmp) / "base"
        added = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(checkout), args.base],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if added.returncode != 0:
            raise SystemExit(f"git worktree add {args.base}: {added.stderr.strip()}")
        try:
            base = build(args.base, checkout / "src", args)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout)],
                capture_output=True, check=False,
            )  # fmt: skip
    head = build("this tree", ROOT / "src", args)
    rows = compare(base, head, args.rounds)
    table = Table(
        title=f"{args.policy}: pick() CPU µs, {args.workers} workers, {args.sessions:,} "
        f"sessions; this tree against {args.base}, {args.rounds} rounds in one process"
    )
    columns = ("requests", "base µs", "this tree µs", "ratio", "rounds' median", "range")
    for name in columns:
        table.add_column(name, justify="left" if name == "requests" else "right")
    for r in rows:
        table.add_row(
            r["requests"],
            f"{r['base_us']:.1f}",
            f"{r['head_us']:.1f}",
            f"{r['ratio']:.3f}x",
            f"{r['round_ratio_median']:.3f}x",
            f"{r['round_ratio_min']:.3f}-{r['round_ratio_max']:.3f}x",
        )
    Console(width=120).print(table)
    if args.json is not None:
        doc = {"base": args.base, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()

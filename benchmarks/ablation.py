"""A policy's terms, each switched off, on every shape, over seeds (``kvgate.sim.ablation``).

Prints per shape and variant the mean hit rate and TTFT p50/p99 with their 95% intervals,
and each against the baseline on the same seeds: the hit rate's difference in points and
the TTFT ratios, and whether switching the term off is significantly ``worse`` (an
interval excludes parity on the bad side) or ``better``. A term earns its place where
switching it off makes some shape significantly worse. ``--baseline ttft`` (the default)
runs ``ttft``'s terms on every scenario of the judge (``benchmarks/judge.py``);
``--baseline default`` runs ``default``'s terms there and on ``chat-tight`` (explicit
sessions, tight KV); tune seeds 0-7 (the judge holds out 500-507). ``--json`` keeps the
rows and the summary (docs/runs/)::

    .venv/bin/python benchmarks/ablation.py --seeds 8 --json docs/runs/ablation_ttft.json
    .venv/bin/python benchmarks/ablation.py --baseline default --jobs 2 \\
        --json docs/runs/ablation_default.json
    .venv/bin/python benchmarks/ablation.py --baseline default --shapes agent-preamble \\
        --variants default,-waste
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvgate.sim.ablation import (
    CHAT_TIGHT,
    DEFAULT_VARIANTS,
    VARIANTS,
    Shape,
    Variant,
    judge_shapes,
    run_all,
    summarize,
    verdict,
)

LINE_UPS: dict[str, tuple[tuple[Shape, ...], tuple[Variant, ...]]] = {
    "ttft": (judge_shapes(), VARIANTS),
    "default": ((*judge_shapes(), CHAT_TIGHT), DEFAULT_VARIANTS),
}
"""Per baseline: the shapes and variants it is ablated on."""


def _cell(mean_half: tuple[float, float], fmt: str) -> str:
    mean, half = mean_half
    return f"{mean:{fmt}} ± {half:{fmt}}"


def _pick(known: Sequence[Shape] | Sequence[Variant], names: str | None) -> list:  # type: ignore[type-arg]
    if names is None:
        return list(known)
    wanted = names.split(",")
    unknown = sorted(set(wanted) - {k.name for k in known})
    if unknown:
        raise SystemExit(
            f"unknown: {', '.join(unknown)}; known: {', '.join(k.name for k in known)}"
        )
    return [k for k in known if k.name in wanted]


def main(argv: list[str] | None = None) -> int:
    """Run the ablation and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="ttft", choices=sorted(LINE_UPS))
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--shapes", default=None, help="comma-separated (default: all)")
    parser.add_argument("--variants", default=None, help="comma-separated (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="simulations run at once")
    parser.add_argument("--json", type=Path, help="write the rows and summary here")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    known_shapes, known_variants = LINE_UPS[args.baseline]
    shapes = _pick(known_shapes, args.shapes)
    variants = _pick(known_variants, args.variants)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    say = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    rows = run_all(shapes, variants, seeds, say, jobs=args.jobs)
    summary = summarize(rows, args.baseline)
    for entry in summary:
        entry["verdict"] = verdict(entry)
    table = Table(title=f"ablation: mean ± 95% over {len(seeds)} seeds; vs {args.baseline}")
    for column in ("shape", "variant", "hit", "p50 s", "p99 s", "Δhit pt", "p50 ×", "p99 ×", "off"):
        table.add_column(column, justify="left" if column in ("shape", "variant") else "right")
    for e in summary:
        vs = [e.get(f"{m}_vs") for m in ("hit_rate", "ttft_p50", "ttft_p99")]
        table.add_row(
            e["shape"],
            e["variant"],
            _cell(e["hit_rate"], ".3f"),
            _cell(e["ttft_p50"], ".3f"),
            _cell(e["ttft_p99"], ".2f"),
            *(_cell(v, ".2f") if v is not None else "-" for v in vs),
            e["verdict"],
        )
    console = Console(width=160)
    console.print(table)
    for variant in variants:
        if variant.name == args.baseline:
            continue
        worse = [
            e["shape"] for e in summary if e["variant"] == variant.name and e["verdict"] == "worse"
        ]
        better = [
            e["shape"] for e in summary if e["variant"] == variant.name and e["verdict"] == "better"
        ]
        console.print(f"{variant.name}: worse on {', '.join(worse) or 'none'}; "
                      f"better on {', '.join(better) or 'none'}")  # fmt: skip
    if args.json is not None:
        document = {"seeds": seeds, "baseline": args.baseline, "rows": rows, "summary": summary}
        args.json.write_text(json.dumps(document, indent=1, default=sorted) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

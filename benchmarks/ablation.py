"""``ttft``'s terms, each switched off, on every shape, over seeds (``kvgate.sim.ablation``).

Prints per shape and variant the mean hit rate and TTFT p50/p99 with their 95% intervals,
and each against the baseline (``ttft``) on the same seeds: the hit rate's difference in
points and the TTFT ratios. A term earns its place where switching it off makes some shape
significantly worse (the interval excludes parity) and none better. ``--json`` keeps the
rows and the summary (docs/runs/)::

    .venv/bin/python benchmarks/ablation.py --seeds 8 --json docs/runs/ablation.json
    .venv/bin/python benchmarks/ablation.py --shapes groups-tight --variants ttft,-evict
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvgate.sim.ablation import SHAPES, VARIANTS, run_all, summarize


def _cell(mean_half: tuple[float, float], fmt: str) -> str:
    mean, half = mean_half
    return f"{mean:{fmt}} ± {half:{fmt}}"


def main(argv: list[str] | None = None) -> int:
    """Run the ablation and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--shapes", default=",".join(s.name for s in SHAPES))
    parser.add_argument("--variants", default=",".join(v.name for v in VARIANTS))
    parser.add_argument("--baseline", default="ttft")
    parser.add_argument("--json", type=Path, help="write the rows and summary here")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    shapes = [s for s in SHAPES if s.name in args.shapes.split(",")]
    variants = [v for v in VARIANTS if v.name in args.variants.split(",")]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    say = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    rows = run_all(shapes, variants, seeds, say)
    summary = summarize(rows, args.baseline)
    table = Table(title=f"ablation: mean ± 95% over {len(seeds)} seeds; vs {args.baseline}")
    for column in ("shape", "variant", "hit", "p50 s", "p99 s", "Δhit pt", "p50 ×", "p99 ×"):
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
        )
    Console(width=160).print(table)
    if args.json is not None:
        document = {"seeds": seeds, "baseline": args.baseline, "rows": rows, "summary": summary}
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Judge ``default`` against the peers by a fixed protocol (issue 46): every shape, many seeds.

Per scenario (``kvgate.judge.scenarios``: a registered workload, its fleet and its
bars), ``default``, the peers' modelled rule (``cache_aware``) and round robin run
in the simulator on every seed; ``--live`` adds runs with the real peers
(sglang-router, smg from PyPI) in front of emulated workers. Per metric, the ratio
to the best peer with its 95% interval over the seeds (paired by seed); a shape is
a LOSS only where an interval lies wholly past one of its bars. Every request counts:
one a router refused or failed is a miss and a TTFT of +inf, so a percentile that
falls on it is unbounded and loses its bar (``kvgate.judge.protocol``); the JSON
writes such a figure as ``Infinity``.

    .venv/bin/python benchmarks/judge.py                                  # 8 seeds, sim
    .venv/bin/python benchmarks/judge.py --scenarios uniform-mixed --seeds 1-8 --jobs 2
    .venv/bin/python benchmarks/judge.py --own default --option warm_min_blocks=0
    .venv/bin/python benchmarks/judge.py --rows docs/runs/judge_sim.json  # re-judge, no runs
    .venv/bin/python benchmarks/judge.py --rows old.json --rows one_shape.json --json new.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from kvgate.judge.live import LIVE_ROUTERS, run_all_live
from kvgate.judge.protocol import Routers, document, judge, merge_runs, parse_seeds
from kvgate.judge.report import markdown, tables
from kvgate.judge.scenarios import by_names, judged
from kvgate.judge.simulated import SIM_ROUTERS, run_all
from kvgate.workload.synthetic import parse_options

SIM_SEEDS = "500-507"
"""Held-out seeds: tune on others, judge on these."""
LIVE_SEEDS = "500-502"


def commit() -> str | None:
    """The checkout's commit (the tree the runs judged), when git can tell."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or None


def main(argv: Sequence[str] | None = None) -> None:
    """Run (or reload) the runs, print the judgment, write ``--json``/``--markdown``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--scenarios", default=None, help="comma-separated (default: every judged scenario)"
    )
    parser.add_argument("--seeds", default=SIM_SEEDS, help="simulator seeds, e.g. 500-507,600")
    parser.add_argument("--own", default=SIM_ROUTERS.own, help="the judged policy (simulator)")
    parser.add_argument(
        "--option", action="append", default=[], help="KEY=VALUE option of the judged policy"
    )
    parser.add_argument("--jobs", type=int, default=1, help="simulations run at once")
    parser.add_argument(
        "--live",
        action="store_true",
        help="also run live: kvgate, sglang-router and smg in front of emulated workers",
    )
    parser.add_argument("--live-seeds", default=LIVE_SEEDS, help="seeds of the live runs")
    parser.add_argument(
        "--live-scenarios", default=None, help="scenarios run live (default: --scenarios)"
    )
    parser.add_argument(
        "--live-requests",
        type=int,
        default=None,
        help="requests per live run instead of the scenario's (e.g. its simulator length)",
    )
    parser.add_argument("--no-sim", action="store_true", help="only the live runs")
    parser.add_argument("--logs", type=Path, default=None, help="keep the live runs' logs here")
    parser.add_argument(
        "--rows",
        type=Path,
        action="append",
        default=[],
        help="re-judge a saved --json's runs (repeatable: a later file's run of the same "
        "scenario, seed and router replaces an earlier one's)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write plan, runs and verdicts")
    parser.add_argument("--markdown", type=Path, default=None, help="write the tables")
    args = parser.parse_args(argv)
    try:
        scenarios = by_names(args.scenarios.split(",")) if args.scenarios else judged()
        seeds = parse_seeds(args.seeds)
        live_seeds = parse_seeds(args.live_seeds)
        live = by_names(args.live_scenarios.split(",")) if args.live_scenarios else scenarios
        if args.live_requests is not None:
            live = [dataclasses.replace(s, live_requests=args.live_requests) for s in live]
    except ValueError as exc:
        parser.error(str(exc))
    console = Console(width=200)
    started = time.monotonic()
    if args.rows:
        saved = [json.loads(path.read_text(encoding="utf-8")) for path in args.rows]
        runs = merge_runs(*(s["runs"] for s in saved))
        plan = {}
        for s in saved:  # a later file's settings win, unless empty
            plan.update({k: v for k, v in s.get("plan", {}).items() if v or k not in plan})
    else:
        options: dict[str, object] = {}
        for item in args.option:
            options.update(parse_options(item))
        routers = Routers(args.own, SIM_ROUTERS.peers, SIM_ROUTERS.baseline, options)
        runs = [] if args.no_sim else run_all(scenarios, seeds, routers, jobs=args.jobs,
                                               progress=console.print)  # fmt: skip
        plan: dict[str, object] = {"sim_seeds": [] if args.no_sim else seeds, "own": args.own,
                                   "own_options": options, "commit": commit()}  # fmt: skip
        if args.live:
            with contextlib.ExitStack() as stack:
                logs = args.logs or Path(stack.enter_context(tempfile.TemporaryDirectory()))
                runs += asyncio.run(run_all_live(live, live_seeds, logs, progress=console.print))
            plan.update(live_seeds=live_seeds, live_routers=list(LIVE_ROUTERS.all))
            if args.live_requests is not None:
                plan.update(live_requests=args.live_requests)
    judgments = judge(scenarios, runs)
    for table in tables(judgments, f"{plan.get('own', 'default')} against the best peer"):
        console.print(table)
    console.print(f"{len(runs)} runs in {time.monotonic() - started:.0f} s")
    if args.json is not None:
        doc = document(scenarios, runs, judgments, **plan)
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if args.markdown is not None:
        args.markdown.write_text(markdown(judgments), encoding="utf-8")


if __name__ == "__main__":
    main()

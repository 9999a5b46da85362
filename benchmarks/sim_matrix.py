"""The simulator's regression matrix: every workload a routing change must not make worse.

Runs ``kvgate sim`` (virtual time, deterministic: contention cannot move a figure) on a
fixed list of workloads and seeds, and prints hit rate, TTFT p99, load max/mean and
requests shed per workload and policy. Two sets:

- ``regression``: the issue-11 shapes at their peers.py KV sizes (with ``vary=0.5``
  variants), the older synthetic workloads, the Mooncake and RAGPulse traces; ``default``
  only by default.
- ``unseen``: shapes no one tuned on (headerless bursty agents, long system prompts,
  32 KiB preambles, tight KV under overload), with ``default``, ``cache_aware`` (the
  live peers' rule), ``prefix_affinity`` and ``least_request`` side by side.

``--compare OLD.json`` puts a saved run's figures beside this one's (before -> after), so a
change is judged on the whole matrix at once, and sums the change up per policy: the mean
change of hit rate in points with its 95% interval over the rows (a row is one workload and
seed; placement on a shared cache is chaotic, so single rows swing by points on changes
that do nothing on average), the rows ahead and behind by more than half a point, the worst
and best row, and the geometric mean of the p99 ratios. ``--rows NEW.json`` compares two
saved runs without simulating::

    .venv/bin/python benchmarks/sim_matrix.py --json before.json          # on the old tree
    .venv/bin/python benchmarks/sim_matrix.py --compare before.json       # on the new one
    .venv/bin/python benchmarks/sim_matrix.py --compare before.json --rows after.json

The traces are read from ``../shared/traces`` beside the checkout (``--traces``); their
rows are skipped when it is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
UNSEEN_POLICIES = ("default", "cache_aware", "prefix_affinity", "least_request")


@dataclass(frozen=True)
class Case:
    """One ``kvgate sim`` invocation: a row name and its arguments (policies added later)."""

    name: str
    args: tuple[str, ...]
    trace: str | None = None  # a trace under --traces instead of a synthetic workload


def _shape(name: str, workload: str, requests: int, kv: int, seed: int) -> Case:
    args = ("--workload", workload, "--requests", str(requests), "--kv-blocks", str(kv))
    return Case(f"{name} s{seed}", (*args, "--block-size", "16", "--seed", str(seed)))


def regression_cases() -> list[Case]:
    """The regression set (see the module docs)."""
    cases = [_shape("agent-preamble", "agent-preamble", 240, 2000, s) for s in range(4)]
    cases += [_shape("agent-preamble 600", "agent-preamble", 600, 2000, s) for s in (0, 1)]
    vary = "agent-preamble:vary=0.5"
    cases += [_shape("agent-preamble:vary", vary, 240, 2000, s) for s in range(10)]
    trace = "shared-opening-trace"
    cases += [_shape(trace, trace, 600, 10_000, s) for s in (0, 1, 3)]
    cases += [_shape(f"{trace}:vary", f"{trace}:vary=0.5", 600, 10_000, s) for s in range(3)]
    groups = "shared-prefix-groups:rate=2000"
    cases.append(_shape("shared-prefix-groups", groups, 128, 0, 0))
    cases += [_shape("shared-prefix-groups:vary", f"{groups},vary=0.5", 128, 0, s) for s in (1, 2)]
    cases += [_shape("headerless-chat", "headerless-chat", 600, 2000, s) for s in (0, 1)]
    chat = "headerless-chat:vary=0.5"
    cases += [_shape("headerless-chat:vary", chat, 600, 2000, s) for s in (4, 5)]
    cases += [_shape("session-docs", "session-docs", 600, 3000, s) for s in (0, 1)]
    demo = "chat:rate=8,think_s=2,turns_mean=6,user_tokens=300,output_tokens=60"
    cases += [_shape("demo workload", demo, 240, 1000, s) for s in range(3)]
    for workload, seeds in (("chat", (0,)), ("system-prompt", (0,)), ("rag", (0,))):
        cases += [
            Case(f"{workload} 2000 s{s}", ("--workload", workload, "--requests", "2000"))
            for s in seeds
        ]
    cases += [
        Case(f"agent 2000 s{s}", ("--workload", "agent", "--requests", "2000", "--seed", str(s)))
        for s in (0, 1)
    ]
    cases.append(Case("mooncake (8 workers)", ("--workers", "8"), "mooncake/synthetic_trace.jsonl"))
    cases.append(Case("ragpulse", (), "ragpulse"))
    return cases


def unseen_cases() -> list[Case]:
    """The unseen set (see the module docs)."""
    shapes = (
        ("agent-hdrless-bursty", "agent:session_ids=False,arrival=bursty,rate=10", 600, 2000),
        ("agent-preamble-bursty", "agent-preamble:arrival=bursty", 400, 2000),
        ("agent-preamble-32k", "agent-preamble:tools_tokens=8000,rate=6", 300, 3000),
        (
            "agent-preamble-small",
            "agent-preamble:tools_tokens=1500,task_tokens=200,rate=15",
            400,
            1000,
        ),
        ("chat-hdrless-long-sys", "headerless-chat:system_tokens=6000", 400, 2000),
        ("chat-hdrless-1sys", "chat:session_ids=False,rate=8,think_s=5", 400, 1500),
        ("session-docs-12k", "session-docs:doc_tokens=12000,sessions=16", 300, 4000),
        ("sysprompt-tight", "system-prompt:prompts=64,rate=40", 800, 1000),
        ("rag-tight", "rag:rate=12", 600, 1500),
        # SGLang's shared-prefix groups where each worker's KV (16k tokens) holds a quarter
        # of the 16 group prompts (32k tokens): the twenty-fifth session's unseen loss.
        ("groups-tight", "shared-prefix-groups", 128, 1000),
    )
    return [_shape(n, w, r, kv, s) for s in (0, 1) for n, w, r, kv in shapes]


def run_case(
    case: Case, policies: Sequence[str], traces: Path, options: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Run one case; a row per policy (empty when its trace is missing).

    ``options`` are ``KEY=VALUE`` policy options, passed to ``kvgate sim --option``.
    """
    args = list(case.args)
    if case.trace is not None:
        path = traces / case.trace
        if not path.exists():
            return []
        args = ["--trace", str(path), *args]
    kvgate = shutil.which("kvgate", path=str(Path(sys.executable).parent)) or "kvgate"
    command = [kvgate, "sim", *args, "--policies", ",".join(policies)]
    command += [arg for option in options for arg in ("--option", option)]
    command += ["--no-progress", "--format", "json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    document = json.loads(done.stdout)
    rows = []
    for policy, result in document["policies"].items():
        rows.append(
            {
                "case": case.name,
                "policy": policy,
                "finished": result["finished"],
                "requests": result["requests"],
                "hit_rate": result["hit_rate"],
                "ttft_p99": result["ttft_p99"],
                "load_max_over_mean": result["load_max_over_mean"],
                "shed": result["shed"],
            }
        )
    return rows


def _ms(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"


def _cell(row: dict[str, Any]) -> str:
    return (
        f"{row['hit_rate']:.1%} / {_ms(row['ttft_p99'])} / {row['load_max_over_mean']:.2f}"
        f" / {row['shed']}"
    )


def table(rows: Sequence[dict[str, Any]], before: Sequence[dict[str, Any]] | None) -> Table:
    """Hit / TTFT p99 / load max/mean / shed per case and policy, with ``before`` beside."""
    out = Table(title="kvgate sim: hit / TTFT p99 / load max-over-mean / shed")
    out.add_column("workload")
    out.add_column("policy")
    if before is not None:
        out.add_column("before", justify="right")
    out.add_column("now", justify="right")
    old = {(r["case"], r["policy"]): r for r in before or ()}
    for row in rows:
        cells = [row["case"], row["policy"]]
        if before is not None:
            was = old.get((row["case"], row["policy"]))
            cells.append(_cell(was) if was is not None else "-")
        cells.append(_cell(row))
        out.add_row(*cells)
    return out


MARGIN = 0.005
"""A row counts as ahead or behind when its hit rate moved by more than half a point."""

T_95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 10: 2.23, 20: 2.09, 30: 2.04}
"""Student's t at 97.5% by degrees of freedom (between entries, the next lower one's, a
slightly wider interval); past 30, 2.0."""


def _t95(df: int) -> float:
    known = [d for d in T_95 if d <= df]
    return T_95[max(known)] if df <= 30 else 2.0


def changes(
    rows: Sequence[dict[str, Any]], before: Sequence[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per policy, how the rows present in both runs moved (see the module docs).

    Hit changes are in points; ``interval`` is the mean's 95% interval over the rows
    (``None`` with fewer than two); ``p99_ratio`` the geometric mean of now / before.
    """
    old = {(r["case"], r["policy"]): r for r in before}
    paired: dict[str, list[tuple[str, float, float]]] = {}
    for row in rows:
        was = old.get((row["case"], row["policy"]))
        if was is None:
            continue
        delta = 100 * (row["hit_rate"] - was["hit_rate"])
        ratio = row["ttft_p99"] / was["ttft_p99"] if was["ttft_p99"] > 0 else 1.0
        paired.setdefault(row["policy"], []).append((row["case"], delta, ratio))
    out: dict[str, dict[str, Any]] = {}
    for policy, items in paired.items():
        deltas = [d for _, d, _ in items]
        mean = statistics.fmean(deltas)
        interval = None
        if len(deltas) > 1:
            half = _t95(len(deltas) - 1) * statistics.stdev(deltas) / math.sqrt(len(deltas))
            interval = (mean - half, mean + half)
        worst = min(items, key=lambda item: item[1])
        best = max(items, key=lambda item: item[1])
        ratios = [max(r, 1e-9) for _, _, r in items]
        out[policy] = {
            "rows": len(items),
            "mean": mean,
            "interval": interval,
            "ahead": sum(d > 100 * MARGIN for d in deltas),
            "behind": sum(d < -100 * MARGIN for d in deltas),
            "worst": (worst[0], worst[1]),
            "best": (best[0], best[1]),
            "p99_ratio": math.exp(statistics.fmean(math.log(r) for r in ratios)),
        }
    return out


def changes_table(summary: dict[str, dict[str, Any]]) -> Table:
    """``changes`` for people: one line per policy."""
    out = Table(title="change against the saved run (hit in points, rows in both)")
    for column in ("policy", "rows", "mean", "95% interval", "ahead", "behind", "worst", "best"):
        out.add_column(column, justify="left" if column in ("policy", "worst", "best") else "right")
    out.add_column("p99 now/before", justify="right")
    for policy, c in summary.items():
        low_high = c["interval"]
        out.add_row(
            policy,
            str(c["rows"]),
            f"{c['mean']:+.2f}",
            f"{low_high[0]:+.2f} .. {low_high[1]:+.2f}" if low_high else "-",
            str(c["ahead"]),
            str(c["behind"]),
            f"{c['worst'][1]:+.2f} {c['worst'][0]}",
            f"{c['best'][1]:+.2f} {c['best'][0]}",
            f"{c['p99_ratio']:.3f}x",
        )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Run the chosen set, print its table, write ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--set", choices=("regression", "unseen", "all"), default="regression")
    parser.add_argument("--policies", default=None, help="comma-separated (default: per set)")
    parser.add_argument("--jobs", type=int, default=1, help="simulations run at once")
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--compare", type=Path, default=None, help="a saved --json to compare")
    parser.add_argument(
        "--rows", type=Path, default=None, help="a saved --json to use instead of running"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        help="KEY=VALUE policy option for every run (kvgate sim --option; repeatable)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if args.rows is not None and args.compare is None:
        parser.error("--rows needs --compare")
    before = json.loads(args.compare.read_text())["rows"] if args.compare else None
    document: dict[str, Any] = {"set": args.set, "options": args.option}
    if args.rows is not None:
        saved = json.loads(args.rows.read_text())
        document.update(set=saved.get("set"), options=saved.get("options", []))
        rows = saved["rows"]
    else:
        rows = _run(args)
    document["rows"] = rows
    console = Console(width=140)
    console.print(table(rows, before))
    if before is not None:
        summary = changes(rows, before)
        console.print(changes_table(summary))
        document["changes"] = summary
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=2) + "\n")


def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every case of ``--set`` with its policies, ``--jobs`` at once, in the set's order."""
    plan: list[tuple[Case, Sequence[str]]] = []
    chosen = args.policies.split(",") if args.policies else None
    if args.set in ("regression", "all"):
        plan += [(c, chosen or ("default",)) for c in regression_cases()]
    if args.set in ("unseen", "all"):
        plan += [(c, chosen or UNSEEN_POLICIES) for c in unseen_cases()]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(
            pool.map(lambda item: run_case(item[0], item[1], args.traces, args.option), plan)
        )
    return [row for group in results for row in group]


if __name__ == "__main__":
    main()

"""KV events: tokenizing a 4k-token chat prompt, and a decision on the exact index.

    .venv/bin/python benchmarks/kv_events_bench.py [--tokenizer DIR] [--workers 64]
                                                   [--runs 2000] [--json PATH]
                                                   [--tokenize-runs 200] [--tokenize-only]
                                                   [--traces ../shared/traces]
    .venv/bin/python benchmarks/kv_events_bench.py --eviction 1-8 [--kv-blocks 150]
                                                   [--peers cache_aware] [--jobs 2]
                                                   [--losses] [--shapes chat,...]
                                                   [--replicas 2 [--store-each]
                                                    [--split client|request]]
                                                   [--restarts 4]

Tokenizing: the bundled Gemma 3 270M's vocabulary (262,144 pieces) as a
``tokenizer.json`` built from its GGUF (``realengine.tokenizer``; or ``--tokenizer``
a folder of your own), ~3,500-token chats rendered through ChatML and tokenized
(``tokenizers: {kind: hf}``) by each library side by side (``tokenizers``, the
reference, then ``fastokens`` and ``gigatoken`` where installed;
``kvgate.bench.tokenizing``), their prose drawn from
the words of MT-Bench's questions at their frequency (``--traces``:
``mt_bench/question.jsonl``): cold (every chat new, generated before the clock starts),
source code, Python's docs, the rendered text alone (the library's cost), chats
opening with one of 8 shared system prompts, and a conversation's next turn
(``tokens.spans``); wall and CPU time, the load average; and loading the tokenizer in a
fresh process (CPU, the reference child's, RSS). Target: p50 <= 0.5 ms, judged on the
``cold`` row of the library ``auto`` picks (``cold_gigatoken``, else
``cold_fastokens``); the last line says
whether it is met. ``--tokenize-only``: just these.

Decision: 64 workers each holding 200 chains of 4,096 tokens (16-token blocks, 16
shared 2,048-token openings), the request's token chain looked up
(``ExactIndex.held_tokens``: hashing at the block size, then the match), then the
default policy's ``pick`` with that residency. Tokenizing excluded. Target: p99 <=
100 µs for the decision. ``--faults``: the simulator with 10% of event batches lost, the subscriber
restarted and a worker restarted (``sim.kvfeed.fault_run``): how many
batches until the index equalled the engine again, and the share of placements
that credited a block the worker no longer held. ``--redis``: the same lookup if
the index lived in Redis (one pipelined MGET of the prompt's 256 blocks on a local server: a floor).

``--eviction SEEDS``: only the simulator's comparison of precise and approximate
routing on caches under eviction (``kvgate.sim.eviction``: shared-prefix groups at
KV 1.2x their working set, chat and headerless chat on ``--kv-blocks`` a worker, the
judge's conversation trace on 2,500 blocks),
each figure with its 95% interval over the seeds. ``--losses``: where each policy's
hits were lost against the reference's (``workload.losses``: held on another worker,
evicted where it was sent, evicted elsewhere, new), and its placement with copies free.
``--shapes``: only these (``sim.eviction.SHAPES``). What the approximate index cannot see
(``eviction.Scenario``): ``--replicas N`` gateway replicas, the clients split between them
(``--split``: by conversation, the default, or any request anywhere), sharing the store
unless ``--store-each``; ``--restarts K`` worker restarts spread over the run, each
clearing a worker's cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from kvgate.bench.kvevents import exact_decision, store_lookup
from kvgate.bench.tokenizing import tokenize_timings, verdict
from kvgate.judge.protocol import parse_seeds
from kvgate.sim.eviction import SHAPES, Scenario, compare, lines
from kvgate.sim.kvfeed import fault_run

TRACES = next(
    (p / "shared" / "traces" for p in Path(__file__).resolve().parents
     if (p / "shared" / "traces").is_dir()),
    Path("../shared/traces"),
)  # fmt: skip
"""Where the public traces lie: ``shared/traces`` beside the checkout or above it (a
worktree)."""


def mt_bench_texts(questions: Path) -> list[str]:
    """The turns of MT-Bench's questions: real prompts, the prose's vocabulary."""
    lines = questions.read_text(encoding="utf-8").splitlines()
    return [turn for line in lines if line.strip() for turn in json.loads(line)["turns"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--tokenize-runs", type=int, default=200, help="chats timed a workload")
    parser.add_argument("--tokenize-only", action="store_true", help="only the tokenizing timings")
    parser.add_argument(
        "--traces", type=Path, default=TRACES, help="the public traces (MT-Bench's questions)"
    )
    parser.add_argument(
        "--faults", action="store_true", help="also run the simulator's fault scenario"
    )
    parser.add_argument(
        "--redis", action="store_true", help="also time the index-in-Redis alternative"
    )
    parser.add_argument("--eviction", default=None, help="seeds, e.g. 1-8: only the comparison")
    parser.add_argument("--kv-blocks", type=int, default=150, help="with --eviction: a worker's")
    parser.add_argument("--peers", default="", help="with --eviction: policies run beside")
    parser.add_argument("--jobs", type=int, default=1, help="with --eviction: processes")
    parser.add_argument(
        "--losses", action="store_true", help="with --eviction: where the hits were lost"
    )
    parser.add_argument("--shapes", default=",".join(SHAPES), help="with --eviction: which")
    parser.add_argument("--replicas", type=int, default=1, help="with --eviction: gateways")
    parser.add_argument(
        "--store-each", action="store_true", help="with --replicas: no store shared"
    )
    parser.add_argument("--split", default="client", help="with --replicas: client | request")
    parser.add_argument("--restarts", type=int, default=0, help="with --eviction: of workers")
    args = parser.parse_args()
    if args.eviction is not None:
        peers = [p for p in args.peers.split(",") if p]
        found = compare(
            parse_seeds(args.eviction),
            kv_blocks=args.kv_blocks,
            shapes=[s for s in args.shapes.split(",") if s],
            peers=peers,
            jobs=args.jobs,
            lost=args.losses,
            scenario=Scenario(args.replicas, not args.store_each, args.split, args.restarts),
        )
        print("\n".join(lines(found)))
        if args.json is not None:
            args.json.write_text(json.dumps(found, indent=2))
        return
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.tokenizer
        if folder is None:
            from kvgate.realengine.model import default_model_path
            from kvgate.realengine.tokenizer import write_tokenizer

            folder = write_tokenizer(default_model_path(), Path(tmp))
        texts = mt_bench_texts(args.traces / "mt_bench" / "question.jsonl")
        timings = tokenize_timings(folder, texts, runs=args.tokenize_runs)
        results.update(timings)
    if not args.tokenize_only:
        results.update(exact_decision(workers=args.workers, runs=args.runs))
    if args.redis and not args.tokenize_only:
        from kvgate.testing_redis import RedisServer

        server = RedisServer()
        server.start()
        try:
            results["redis_lookup"] = asyncio.run(store_lookup(server.url))
        finally:
            server.stop()
    if args.faults and not args.tokenize_only:
        for seed in (1, 2, 3):
            results[f"faults_spg_seed{seed}"] = fault_run(
                "shared-prefix-groups:groups=16,prompts=8,system_tokens=2048",
                workers=4, kv_blocks=154, seed=seed,
            )  # fmt: skip
            results[f"faults_chat_seed{seed}"] = fault_run(
                "chat", workers=4, kv_blocks=150, seed=seed
            )
    for name, row in results.items():
        print(f"{name:>10}: " + ", ".join(f"{k} {v:,.1f}" for k, v in row.items()))  # type: ignore[attr-defined]
    print(verdict(timings))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

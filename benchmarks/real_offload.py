"""Real KV offload on llama.cpp: a returning session's TTFT after restore vs recompute.

Part 1, **returning session** (one llama.cpp worker with one slot, behind the
gateway with slot offload on): for sessions of about ``--sizes`` tokens, in one
run and interleaved (size by size, repeat by repeat), so CPU contention on the
shared machine hits every case alike:

- ``cold``: the session's first turn (its context computed);
- ``restore``: another session took the slot (the gateway saved this one's KV to
  disk first); the session's next turn restores it and then is served;
- ``slot``: the turn after that, its KV still in the slot;
- ``recompute``: the same prompt as the ``slot`` turn, under a new session whose
  first token differs, so nothing is reused: what a returning session costs
  without offload.

Part 2, **fleet under slot pressure**: 2 workers of 2 slots, ``--sessions``
sessions (more than the 4 slots) of ``--fleet-words`` words, each coming back
``--turns`` times in a seeded shuffled order, ``--concurrency`` at a time; the
same sessions with slot offload off (llama.cpp reuses slots itself and
recomputes) and on. TTFT p50/p99, cached-token ratio, failed requests.

Part 3, **the model's prediction**: ``engine.slots`` (llama.cpp's per-slot cache
as the engine model sees it) calibrated on part 1 by ``fit_prefill`` (cold and
warm turns; each size predicted from a fit that holds that size out) and the
gateway's measured save/restore means, predicts part 1's returning turns and
replays part 2 in virtual time with the gateway's placements; the fleet's share
of the host's CPU is fitted on a separate calibration wave (4 cold first turns
of other sessions at once), so neither fleet run is fitted. Its TTFT is
compared with the measured one, beside the old calibration (cold turns only,
one coefficient for every attention pair).

TTFT here is the wall time of a 1-token answer through the gateway (the
gateway's save/restore calls included). ``prompt_ms`` is llama.cpp's own prompt
time for the turn. The machine is 2 shared cores: ratios within one run are
what to read, not absolute seconds.

    .venv/bin/python benchmarks/real_offload.py [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam
from rich.console import Console
from rich.table import Table

from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.realengine import DEFAULT_MODEL_NAME, LlamaCppFleet, running_llamacpp_fleet
from kvgate.realengine.process import small_options
from kvgate.testing import wait_until
from real_offload_model import percentile, prediction, timeline

WORDS = (
    "river", "stone", "lantern", "orchard", "copper", "meadow", "harbor", "violet",
    "thunder", "cedar", "glacier", "compass", "velvet", "ember", "falcon", "quarry",
    "saddle", "beacon", "willow", "prism",
)  # fmt: skip


def filler(seed: int, words: int) -> str:
    """``words`` seeded words; Gemma's tokenizer makes about one token of each."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass(frozen=True, slots=True)
class Turn:
    """One measured turn."""

    case: str
    size: int
    session: str
    worker: str
    tier: str
    prompt_tokens: int
    cached_tokens: int
    prompt_ms: float
    ttft_s: float
    ok: bool = True


class Conversation:
    """One session's messages, sent turn by turn through the gateway."""

    def __init__(self, client: AsyncOpenAI, key: str, opening: str) -> None:
        self.client = client
        self.key = key
        self.messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": opening}]

    async def turn(self, case: str, size: int, question: str | None = None) -> Turn:
        """Send the next turn (``question`` after the first) and measure it."""
        if question is not None:
            self.messages.append({"role": "user", "content": question})
        started = time.perf_counter()
        try:
            raw = await self.client.chat.completions.with_raw_response.create(
                model=DEFAULT_MODEL_NAME,
                messages=self.messages,
                max_tokens=1,
                temperature=0,
                extra_headers={"X-Session-ID": self.key},
            )
        except Exception:  # counted as a failed request, and the run goes on
            return Turn(case, size, self.key, "", "", 0, 0, 0.0, 0.0, ok=False)
        ttft = time.perf_counter() - started
        completion = raw.parse()
        usage = completion.usage
        assert usage is not None
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        timings: dict[str, Any] = (completion.model_extra or {}).get("timings", {})
        self.messages.append(
            {"role": "assistant", "content": completion.choices[0].message.content or "ok"}
        )
        return Turn(
            case,
            size,
            self.key,
            raw.headers.get("X-Kvgate-Worker", ""),
            raw.headers.get("X-Kvgate-KV-Tier", "-"),
            usage.prompt_tokens,
            cached or 0,
            float(timings.get("prompt_ms", 0.0)),
            ttft,
        )


def _config(fleet: LlamaCppFleet, slot_dir: Path, offload: bool) -> dict[str, Any]:
    return {
        "workers": [{"url": url, "engine": "llamacpp"} for url in fleet.urls],
        "policy": {"name": "default"},
        "health": {"interval_s": 0.5, "timeout_s": 5.0},
        "timeouts": {"first_byte_s": 600, "total_s": 900},
        "slots": {"enabled": offload, "dir": str(slot_dir), "max_saved": 32},
    }


def _metric(gateway: GatewayHandle, name: str) -> float:
    return sum(
        s.value
        for family in gateway.gateway.metrics.registry.collect()
        for s in family.samples
        if s.name == name
    )


def _mean(gateway: GatewayHandle, histogram: str) -> float:
    count = _metric(gateway, histogram + "_count")
    return _metric(gateway, histogram + "_sum") / count if count else 0.0


async def returning(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Part 1: cold, restore, slot and recompute turns, interleaved."""
    slot_dir = root / "slots-1"
    options = small_options(parallel=1, ctx=max(args.sizes) + 1_024)
    async with (
        running_llamacpp_fleet(1, options, workdir=root / "p1", slot_dir=slot_dir) as fleet,
        running_gateway(_config(fleet, slot_dir, offload=True)) as gateway,
    ):
        await wait_until(gateway.gateway.ready, timeout=60, message="gateway ready")
        async with AsyncOpenAI(
            base_url=gateway.url + "/v1", api_key="unused", max_retries=0
        ) as client:
            turns = await returning_turns(client, args)
        return {
            "turns": [asdict(t) for t in turns],
            "gateway_restore_s_mean": _mean(gateway, "kvgate_slot_restore_seconds"),
            "gateway_save_s_mean": _mean(gateway, "kvgate_slot_save_seconds"),
        }


async def returning_turns(client: AsyncOpenAI, args: argparse.Namespace) -> list[Turn]:
    """Every size, every repeat: cold, restore, slot, recompute, in that order."""
    turns: list[Turn] = []
    for rep in range(args.repeats):
        for size in args.sizes:
            seed = rep * 1_000 + size
            x = Conversation(client, f"x{size}-{rep}", filler(seed, size))
            turns.append(await x.turn("cold", size))
            # Another session takes the only slot: the gateway saves x's KV first.
            y = Conversation(client, f"y{size}-{rep}", filler(-seed, 16))
            turns.append(await y.turn("other", 16))
            turns.append(await x.turn("restore", size, "Which word came first?"))
            turns.append(await x.turn("slot", size, "And which came last?"))
            # The slot turn's prompt again, but its first token differs: nothing reused.
            z = Conversation(client, f"z{size}-{rep}", "")
            z.messages = list(x.messages[:-1])
            z.messages[0] = {"role": "user", "content": "Z " + str(x.messages[0].get("content"))}
            turns.append(await z.turn("recompute", size))
            print(f"  part 1: repeat {rep + 1}, {size} words done", flush=True)
    return turns


async def fleet_run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Part 2: the same sessions with offload off, then on, on one fleet made cold between."""
    slot_dir = root / "slots-2"
    options = small_options(parallel=2, ctx=2 * (args.fleet_words + 512))
    results: dict[str, Any] = {}
    rng = random.Random(args.seed)
    order = [s for _ in range(args.turns + 1) for s in range(args.sessions)]
    # Each session's first turn comes first; its returns follow in a shuffled order.
    first, later = order[: args.sessions], order[args.sessions :]
    rng.shuffle(later)
    order = first + later
    async with running_llamacpp_fleet(2, options, workdir=root / "p2", slot_dir=slot_dir) as fleet:
        results["calibration"] = await calibration_wave(fleet, slot_dir, args)
        print("  part 2: calibration wave done", flush=True)
        for mode in ("off", "on"):
            await fleet.reset()
            async with running_gateway(_config(fleet, slot_dir, offload=mode == "on")) as gw:
                await wait_until(gw.gateway.ready, timeout=60, message="gateway ready")
                async with AsyncOpenAI(
                    base_url=gw.url + "/v1", api_key="unused", max_retries=0
                ) as client:
                    started = time.perf_counter()
                    turns = await fleet_turns(client, mode, order, args)
                    wall = time.perf_counter() - started
            results[mode] = summarize(turns, wall)
            results[mode]["order"] = order
            print(f"  part 2: offload {mode} done", flush=True)
    return results


async def calibration_wave(
    fleet: LlamaCppFleet, slot_dir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Cold first turns of sessions not in the runs, ``--concurrency`` at once, offload off.

    How fast the fleet computes with all its workers busy at once on this
    machine (part 1 ran one worker): part 3 fits the host's share of CPU on it,
    so neither fleet run is fitted.
    """
    await fleet.reset()
    async with running_gateway(_config(fleet, slot_dir, offload=False)) as gw:
        await wait_until(gw.gateway.ready, timeout=60, message="gateway ready")
        async with AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0) as client:
            talks = [
                Conversation(client, f"cal{i}", filler(20_000 + i, args.fleet_words))
                for i in range(args.concurrency)
            ]
            turns = await asyncio.gather(*(t.turn("calibration", args.fleet_words) for t in talks))
    return {"turns": [asdict(t) for t in turns]}


async def fleet_turns(
    client: AsyncOpenAI, mode: str, order: list[int], args: argparse.Namespace
) -> list[Turn]:
    """Every turn of ``order`` (session indexes), ``--concurrency`` at a time."""
    talks = [
        Conversation(client, f"f{i}", filler(10_000 + i, args.fleet_words))
        for i in range(args.sessions)
    ]
    locks = [asyncio.Lock() for _ in talks]
    gate = asyncio.Semaphore(args.concurrency)
    seen = [0] * len(talks)
    turns: list[Turn] = []

    async def one(i: int) -> None:
        # A session's own turns stay in order (its lock); other sessions run alongside.
        async with gate, locks[i]:
            question = None if seen[i] == 0 else f"Question {seen[i]}: which word?"
            seen[i] += 1
            turns.append(await talks[i].turn(mode, args.fleet_words, question))

    await asyncio.gather(*(one(i) for i in order))
    return turns


def summarize(turns: list[Turn], wall: float) -> dict[str, Any]:
    """TTFT p50/p99, cached ratio, failures of one fleet run."""
    ok = [t for t in turns if t.ok]
    ttfts = [t.ttft_s for t in ok]
    prompt = sum(t.prompt_tokens for t in ok)
    return {
        "requests": len(turns),
        "failed": len(turns) - len(ok),
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p99": percentile(ttfts, 99),
        "cached_ratio": sum(t.cached_tokens for t in ok) / prompt if prompt else 0.0,
        "tiers": {tier: sum(1 for t in ok if t.tier == tier) for tier in {t.tier for t in ok}},
        "wall_s": wall,
        "turns": [asdict(t) for t in turns],
    }


def part1_summary(turns: list[dict[str, Any]], sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Per size: median TTFT per case, the spread, and restore / recompute ratios per repeat."""
    rows = []
    for size in sizes:
        cases = {
            case: [t for t in turns if t["size"] == size and t["case"] == case and t["ok"]]
            for case in ("cold", "restore", "slot", "recompute")
        }
        ratios = [
            r["ttft_s"] / c["ttft_s"]
            for r, c in zip(cases["restore"], cases["recompute"], strict=True)
        ]
        rows.append(
            {
                "size": size,
                "prompt_tokens": statistics.median(t["prompt_tokens"] for t in cases["restore"]),
                **{
                    f"{case}_ttft_s": statistics.median(t["ttft_s"] for t in ts)
                    for case, ts in cases.items()
                },
                "restore_cached": statistics.median(
                    t["cached_tokens"] / t["prompt_tokens"] for t in cases["restore"]
                ),
                "restore_tiers": sorted({t["tier"] for t in cases["restore"]}),
                "restore_vs_recompute": statistics.median(ratios),
                "restore_vs_recompute_max": max(ratios),
                "slot_vs_recompute": statistics.median(
                    s["ttft_s"] / c["ttft_s"]
                    for s, c in zip(cases["slot"], cases["recompute"], strict=True)
                ),
            }
        )
    return rows


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def tables(results: dict[str, Any]) -> list[Table]:
    """Part 1, part 2 and the model's prediction as tables."""
    out = []
    t1 = Table(
        title="Returning session on llama.cpp (1 slot): TTFT medians, ratios per repeat",
        title_justify="left",
    )
    for c in ("words", "prompt tok", "cold", "restore", "slot", "recompute",
              "restore/recompute (max)", "slot/recompute", "restored cached"):  # fmt: skip
        t1.add_column(c, justify="right")
    for r in results["returning_summary"]:
        t1.add_row(
            str(r["size"]),
            f"{r['prompt_tokens']:.0f}",
            _s(r["cold_ttft_s"]),
            _s(r["restore_ttft_s"]),
            _s(r["slot_ttft_s"]),
            _s(r["recompute_ttft_s"]),
            f"{r['restore_vs_recompute']:.3f} ({r['restore_vs_recompute_max']:.3f})",
            f"{r['slot_vs_recompute']:.3f}",
            f"{r['restore_cached']:.1%}",
        )
    out.append(t1)
    if results.get("fleet"):
        t2 = Table(title="Fleet under slot pressure (2 workers x 2 slots)", title_justify="left")
        for c in ("offload", "requests", "failed", "cached", "TTFT p50", "TTFT p99", "tiers",
                  "wall"):  # fmt: skip
            t2.add_column(c, justify="right")
        for mode, s in results["fleet"].items():
            t2.add_row(
                mode, str(s["requests"]), str(s["failed"]), f"{s['cached_ratio']:.1%}",
                _s(s["ttft_p50"]), _s(s["ttft_p99"]),
                " ".join(f"{k}:{v}" for k, v in sorted(s["tiers"].items())), f"{s['wall_s']:.0f} s",
            )  # fmt: skip
        out.append(t2)
    p = results.get("prediction")
    if p:
        t3 = Table(
            title="engine.slots model vs real TTFT (model: held-out fit on cold + warm turns; "
            "cold-only: the old calibration)",
            title_justify="left",
        )
        for c in ("case", "real", "model", "error", "cold-only model", "cold-only error"):
            t3.add_column(c, justify="right")
        t3.caption = (
            "after the first wave: the turns after each run's first wave; the last two "
            "columns there are the model with the host's share refitted on that run's own "
            "first wave (not held out: it tells the mechanism from the machine's load)"
        )
        for r in p["returning"]:
            t3.add_row(f"{r['size']} words {r['case']}", _s(r["real"]), _s(r["model"]),
                       f"{r['error']:+.0%}", _s(r["cold_model"]),
                       f"{r['cold_error']:+.0%}")  # fmt: skip
        for mode, f in p["fleet"].items():
            for stat in ("p50", "mean"):
                real, model, cold = f[f"real_{stat}"], f[f"model_{stat}"], f[f"cold_model_{stat}"]
                t3.add_row(f"fleet offload {mode} {stat}", _s(real), _s(model),
                           f"{model / real - 1:+.0%}", _s(cold),
                           f"{cold / real - 1:+.0%}")  # fmt: skip
            for stat in ("p50", "mean"):
                real, model, own = (f[f"rest_{k}_{stat}"] for k in ("real", "model", "own"))
                cores = f["own_wave_cores"]
                t3.add_row(f"fleet offload {mode} {stat}, after the first wave", _s(real),
                           _s(model), f"{model / real - 1:+.0%}", _s(own),
                           f"{own / real - 1:+.0%} (own wave: {cores} cores)")  # fmt: skip
        out.append(t3)
    return out


def timeline_table(mode: str, turns: list[dict[str, Any]]) -> Table:
    """One fleet run's turns as they finished: when sent, started in llama.cpp, answered."""
    table = Table(title=f"Fleet turns, offload {mode} (seconds from the run's start)",
                  title_justify="left")  # fmt: skip
    for c in ("session", "worker", "tier", "new tokens", "sent", "start", "answered", "wait",
              "prompt_ms", "overlapping on its worker"):  # fmt: skip
        table.add_column(c, justify="right")
    for t in turns:
        beside = [
            o["session"]
            for o in turns
            if o is not t and o["worker"] == t["worker"]
            and o["start"] < t["done"] and o["done"] > t["start"]
        ]  # fmt: skip
        table.add_row(
            t["session"], t["worker"][-4:], t["tier"],
            str(t["prompt_tokens"] - t["cached_tokens"]), f"{t['sent']:.2f}",
            f"{t['start']:.2f}", f"{t['done']:.2f}", f"{t['wait']:.2f}",
            f"{t['prompt_ms'] / 1000:.2f}", " ".join(beside),
        )  # fmt: skip
    return table


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both parts on fresh workers (the model's prediction comes after)."""
    root = Path(tempfile.mkdtemp(prefix="kvgate-real-offload-"))
    skip = ("json", "predict_from")
    results: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k not in skip}}
    results["returning"] = await returning(args, root)
    results["returning_summary"] = part1_summary(results["returning"]["turns"], args.sizes)
    if args.sessions > 0:
        fleet = await fleet_run(args, root)
        results["calibration"] = fleet.pop("calibration")
        results["fleet"] = fleet
    return results


def main() -> None:
    """Parse arguments, run, print the tables, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[500, 1_500, 3_000], help="session sizes in words")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3, help="repeats of part 1")
    parser.add_argument("--sessions", type=int, default=8, help="part 2 sessions (0: skip)")
    parser.add_argument("--turns", type=int, default=2, help="part 2 returns per session")
    parser.add_argument("--fleet-words", type=int, default=600, help="part 2 context size")
    parser.add_argument("--concurrency", type=int, default=4, help="part 2 requests at once")
    parser.add_argument("--seed", type=int, default=0, help="part 2 order")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    parser.add_argument(
        "--predict-from", type=Path, default=None, help="only redo part 3 from a saved run"
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="with --predict-from: print each fleet turn's send, start and answer times",
    )
    args = parser.parse_args()
    if args.predict_from is not None:
        results = json.loads(args.predict_from.read_text())
        for key, value in results["config"].items():
            if key != "predict_from":
                setattr(args, key, value)
        results["prediction"] = prediction(results, args)
    else:
        results = asyncio.run(run(args))
        if args.json is not None:  # the measurements first, whatever part 3 does
            args.json.write_text(json.dumps(results, indent=2))
        results["prediction"] = prediction(results, args)
    console = Console(width=160)
    if args.timeline:
        for mode, fleet_run in results.get("fleet", {}).items():
            console.print(timeline_table(mode, timeline(fleet_run, args.concurrency)))
    for t in tables(results):
        console.print(t)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""kvgate in front of real llama.cpp workers: round robin vs the default policy.

Two (or three) llama.cpp workers serving Gemma 3 270M, one CPU thread and a few
slots each, no host-RAM prompt cache, behind the real gateway. The sessions are
MT-Bench's (``/work/shared/traces/mt_bench/question.jsonl``): two real turns
each, the second re-sending the first with the answer the worker gave, all
behind one shared system prompt of about ``--system-tokens`` tokens (measured
with the worker's own tokenizer). Sessions start on a seeded Poisson schedule;
a session's second turn follows its first after a seeded think time. Every
policy replays the same schedule on the same fleet, made cold in between (every
slot erased), and the policies take turns at going first (``run_order``: seed 0 runs
them in the order given, seed 1 starts from the second, ...), so a machine whose load
drifts during a seed favours none of them.

The gateway is configured as kvgate's docs say for llama.cpp (``engine: llamacpp``,
docs/configuration.md): it pins every request to a slot (``id_slot``), saves an idle
session's slot to a folder all workers share before another session takes it, and
restores it (or migrates it from the other worker) when the session returns, for every
policy alike. ``--plain-workers`` configures them as any OpenAI server instead (the
engine then picks the slot, and a session's second turn finds its own KV only if no
other session took that slot meanwhile: how the runs before 2026-12-07 were made).

Reported per policy: the prompt tokens the workers prefilled (uncached: prompt less cached,
summed; the work done, which contention cannot fake), TTFT p50/p99 (all turns and second
turns), the cached-token
ratio (cached prompt tokens / prompt tokens, summed, as the workers report them
in ``usage.prompt_tokens_details.cached_tokens``), errors and requests per worker,
and for a policy that learns each worker's speed (``core.speed``) the median error
of the TTFT it predicted at each send (issue 46's bar: 35% on llama.cpp), over requests
(the gateway's prediction against the TTFT it observed, from ``FleetSpeed.log``: its
books are keyed by its own request ids, not the client's) and per worker. Each
llama.cpp worker serves one short request before the runs (``prime``), so its
``/metrics`` report its prefill rate as a worker that has served does. ``--rate``
sets the session rate (0.1/s: the rate of the runs in docs/benchmarks.md; 4x: 0.4).

``--engine emulated`` runs the same sessions on kvgate's emulated workers with
the ``cpu-small`` profile instead (the simulator's engine model, in real time
compressed by ``--time-scale``; latencies in model seconds): how well the model
predicts the real fleet. Prompt sizes there follow the emulator's 4 characters
per token, not Gemma's tokenizer.

Two shared cores: other processes slow llama.cpp down several-fold at times, so
absolute latencies are noisy; the comparison is within one run.

    .venv/bin/python benchmarks/real_engine.py [--workers 2] [--sessions 16] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from kvgate.bench.client import Answer, BenchClient
from kvgate.bench.payloads import CHAT_PATH, Payload
from kvgate.core.speed import FleetSpeed
from kvgate.demo.fleet import Fleet, FleetSpec, emulated_fleet
from kvgate.gateway.testing import running_gateway
from kvgate.realengine import DEFAULT_MODEL_NAME, running_llamacpp_fleet, small_options
from kvgate.testing import wait_until

QUESTIONS = (
    Path(__file__).resolve().parents[2] / "shared" / "traces" / "mt_bench" / "question.jsonl"
)
SLOT_CTX = 2_048
"""Context tokens per slot: the system prompt, two questions and an answer fit."""

SYSTEM_OPENING = (
    "You are a careful, friendly assistant for a community help desk. Answer the user's "
    "question directly and briefly, in plain language; say so when you are unsure, and "
    "never invent facts, names or numbers. Keep a neutral, respectful tone. When a "
    "question is about writing, follow the requested form exactly. When it is about "
    "maths or code, show the key step. Below are questions other users asked this week, "
    "for context about what people need; do not answer them unless asked again.\n\n"
)


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation: its two questions, when it starts, and the think time between."""

    key: str
    questions: tuple[str, str]
    start_s: float
    think_s: float


@dataclass(slots=True)
class Turn:
    """One answered (or failed) turn as the client measured it."""

    session: str
    index: int
    answer: Answer

    @property
    def ttft(self) -> float | None:
        """Seconds from sending to the first content, when the turn succeeded."""
        if not self.answer.ok or self.answer.first_token is None:
            return None
        return self.answer.first_token - self.answer.sent


@dataclass
class PolicyRun:
    """Every turn one policy served, and how long the run took."""

    policy: str
    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0
    position: int = 0
    """Where it ran in its seed's order (0: first; ``run_order``)."""
    load: tuple[float, float] = (0.0, 0.0)
    """The machine's 1-minute load average as the run started and as it ended."""
    learned: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """Per worker URL, what the policy learned of its speed (``core.speed``; empty: a policy
    that learns none): observations, median |predicted - observed| / observed TTFT, rates."""
    predictions: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """Per request the policy observed, by the gateway's own id (``X-Kvgate-Request-ID``):
    the TTFT it predicted at the send, the one it observed, and the uncached tokens it
    booked the request at, its guess (``FleetSpeed.log``; empty: a policy that predicts none)."""


def run_order(policies: Sequence[str], seed: int) -> list[str]:
    """``policies`` in the order seed ``seed`` runs them: rotated by the seed, so over
    consecutive seeds each goes first as often (two policies: alternately)."""
    if not policies:
        return []
    shift = seed % len(policies)
    return [*policies[shift:], *policies[:shift]]


def request_id(session: str, index: int) -> str:
    """The request id of ``session``'s turn ``index`` (0-based)."""
    return f"{session}-t{index + 1}"


def load_questions(path: Path) -> list[tuple[str, str]]:
    """MT-Bench's two-turn questions, in file order."""
    pairs = []
    for line in path.read_text().splitlines():
        if line.strip():
            turns = json.loads(line)["turns"]
            pairs.append((str(turns[0]), str(turns[1])))
    return pairs


def schedule(
    pairs: Sequence[tuple[str, str]], sessions: int, rate: float, think_s: float, seed: int
) -> tuple[list[Session], list[tuple[str, str]]]:
    """``sessions`` seeded sessions on a Poisson schedule, and the questions left over."""
    rng = random.Random(seed)
    order = list(pairs)
    rng.shuffle(order)
    if sessions > len(order) - 4:
        raise ValueError(f"at most {len(order) - 4} sessions: the rest fill the system prompt")
    chosen, rest = order[:sessions], order[sessions:]
    at = 0.0
    out = []
    for n, questions in enumerate(chosen):
        out.append(Session(f"s{n}", questions, at, rng.expovariate(1.0 / think_s)))
        at += rng.expovariate(rate)
    return out, rest


def system_prompt(
    rest: Sequence[tuple[str, str]], tokens: int, count: Callable[[str], int]
) -> tuple[str, int]:
    """The opening plus other sessions' questions until about ``tokens`` tokens.

    ``count(text)`` gives a text's size in the engine's tokens.
    """
    text = SYSTEM_OPENING
    for n, (first, _) in enumerate(rest, start=1):
        candidate = text + f"{n}. {first}\n"
        if count(candidate) > tokens:
            break
        text = candidate
    return text, count(text)


def llamacpp_token_counter(url: str) -> Callable[[str], int]:
    """``count(text)`` through a llama.cpp worker's ``/tokenize``."""

    def count(text: str) -> int:
        request = urllib.request.Request(
            url + "/tokenize",
            data=json.dumps({"content": text}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return len(json.loads(response.read())["tokens"])

    return count


def prime(url: str) -> None:
    """One short request on a fresh llama.cpp worker, so that its ``/metrics`` report its
    prefill rate (``prompt_seconds_total``) as a worker that has served does; the fleet is
    made cold again before every policy (``Fleet.reset``) but keeps these counters."""
    body = {
        "model": DEFAULT_MODEL_NAME,
        "messages": [{"role": "user", "content": SYSTEM_OPENING}],
        "max_tokens": 4,
        "temperature": 0,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


def emulated_token_count(text: str) -> int:
    """Tokens of ``text`` as the emulated worker counts them (4 characters each)."""
    return len(text) // 4


def payload(
    session: Session,
    system: str,
    history: list[dict[str, str]],
    max_tokens: int,
    *,
    headerless: bool = False,
    index: int = 0,
) -> Payload:
    """One streamed chat request of ``session`` with the conversation so far (without
    its ``X-Session-ID`` when ``headerless``: followed by its prefix chain alone)."""
    body = {
        "model": DEFAULT_MODEL_NAME,
        "messages": [{"role": "system", "content": system}, *history],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"X-Request-ID": request_id(session.key, index)}
    if not headerless:
        headers["X-Session-ID"] = session.key
    return Payload(CHAT_PATH, body, headers)


async def run_session(
    client: BenchClient,
    session: Session,
    *,
    system: str,
    max_tokens: int,
    time_scale: float,
    origin: float,
    headerless: bool = False,
) -> list[Turn]:
    """Both turns of ``session``, the second re-sending the first's answer."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, origin + session.start_s / time_scale - loop.time()))
    history: list[dict[str, str]] = []
    turns = []
    for index, question in enumerate(session.questions):
        if index:
            await asyncio.sleep(session.think_s / time_scale)  # the user's own pause
        history.append({"role": "user", "content": question})
        answer = await client.send(
            payload(session, system, history, max_tokens, headerless=headerless, index=index)
        )
        turns.append(Turn(session.key, index, answer))
        if not answer.ok:
            break
        history.append({"role": "assistant", "content": answer.text})
    return turns


def policy_options(specs: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``POLICY.KEY=VALUE`` options by policy name; values parsed as JSON where they are."""
    found: dict[str, dict[str, Any]] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        policy, dot, key = name.partition(".")
        if not sep or not dot or not key:
            raise SystemExit(f"--option {spec!r}: expected POLICY.KEY=VALUE")
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        found.setdefault(policy, {})[key] = parsed
    return found


def gateway_config(
    urls: Sequence[str], policy: str, options: dict[str, Any] | None, slot_dir: Path | None
) -> dict[str, Any]:
    """The gateway's config for one policy run: with ``slot_dir`` (the folder every
    llama.cpp worker saves its slots in) the workers are ``engine: llamacpp``, whose slots
    the gateway pins, saves and restores (docs/configuration.md, ``slots``)."""
    worker: dict[str, Any] = {"model": DEFAULT_MODEL_NAME}
    if slot_dir is not None:
        worker["engine"] = "llamacpp"
    config: dict[str, Any] = {
        "workers": [{"url": url, **worker} for url in urls],
        "expose_worker_urls": True,  # answers are attributed to worker URLs
        "policy": {"name": policy, "options": options or {}},
        "health": {"interval_s": 0.5, "timeout_s": 5.0},
    }
    if slot_dir is not None:
        config["slots"] = {"dir": str(slot_dir)}
    return config


async def run_policy(
    fleet: Fleet,
    policy: str,
    sessions: Sequence[Session],
    *,
    system: str,
    max_tokens: int,
    time_scale: float,
    options: dict[str, Any] | None = None,
    headerless: bool = False,
    slot_dir: Path | None = None,
) -> PolicyRun:
    """The sessions through a fresh gateway with ``policy`` on the (reset) fleet."""
    await fleet.reset()
    config = gateway_config(fleet.urls, policy, options, slot_dir)
    run = PolicyRun(policy)
    load_at_start = os.getloadavg()[0]
    async with running_gateway(config) as gateway:
        await wait_until(gateway.gateway.ready, timeout=60, interval=0.1, message="gateway")
        async with BenchClient(gateway.url, concurrency=64) as client:
            origin = asyncio.get_running_loop().time()
            started = time.perf_counter()
            done = await asyncio.gather(
                *(
                    run_session(
                        client,
                        s,
                        system=system,
                        max_tokens=max_tokens,
                        time_scale=time_scale,
                        origin=origin,
                        headerless=headerless,
                    )
                    for s in sessions
                )
            )
            run.wall_s = time.perf_counter() - started
            run.load = (load_at_start, os.getloadavg()[0])
        run.learned = {
            str(worker): {
                "observations": r.observations,
                "ttft_error": r.ttft_error,
                "prefill_tokens_per_s": 1.0 / r.speed.prefill_s if r.speed.prefill_s else None,
                "overhead_s": r.speed.overhead_s,
                "decode_s": r.speed.decode_s,
                "queue_s": r.speed.queue_s,
                # What its /metrics said at the end: the fit's start (speed_replay.py's).
                "engine_tokens_per_s": _engine_rate(gateway.gateway.pool.get(worker)),
            }
            for worker, r in gateway.gateway.policy.speeds().items()
        }
        speed = getattr(gateway.gateway.policy, "speed", None)
        log = speed.log if isinstance(speed, FleetSpeed) else ()
        # Keyed by the gateway's own request ids (never the client's ``X-Request-ID``):
        # each request's prediction at its send beside the TTFT the gateway observed.
        run.predictions = {rid: (p, t, booked) for rid, _, p, t, booked in log}
    run.turns = [turn for turns in done for turn in turns]
    return run


def _engine_rate(worker: Any) -> float | None:
    """The prefill tokens a second a worker's ``/metrics`` last reported (None: none)."""
    signals = getattr(worker, "signals", None)
    per_token = getattr(signals, "prefill_s_per_token", None)
    return 1.0 / per_token if per_token else None


def _predicted(entry: tuple[float, float, float] | None) -> dict[str, float | None]:
    """A turn's prediction, observed TTFT (the gateway's) and booked uncached tokens."""
    predicted, observed, booked = entry if entry is not None else (None, None, None)
    return {"predicted": predicted, "gateway_ttft": observed, "booked_uncached": booked}


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(run: PolicyRun, urls: Sequence[str], time_scale: float) -> dict[str, Any]:
    """TTFT percentiles (model seconds), cached-token ratios, errors, load per worker, turns."""
    ok = [t for t in run.turns if t.answer.ok]
    ttfts = [t.ttft * time_scale for t in ok if t.ttft is not None]
    second = [t.ttft * time_scale for t in ok if t.ttft is not None and t.index > 0]

    def ratio(turns: Sequence[Turn]) -> float:
        prompt = sum(t.answer.prompt_tokens or 0 for t in turns)
        cached = sum(t.answer.cached_tokens or 0 for t in turns)
        return cached / prompt if prompt else 0.0

    served = Counter(t.answer.worker for t in ok)
    tiers = Counter(t.answer.kv_tier for t in ok if t.answer.kv_tier is not None)
    errors = [e for w in run.learned.values() if (e := w["ttft_error"]) is not None]
    # Each request's |predicted - observed| / observed: the gateway's prediction at the
    # send against the TTFT it observed (its books are keyed by its own request ids, so a
    # turn is not matched to its prediction by the client's id).
    misses = [abs(p - ttft) / ttft for p, ttft, _ in run.predictions.values() if ttft > 0]
    # The guess: the uncached tokens each turn was booked at against those usage reported.
    guessed = [
        (entry[2], (t.answer.prompt_tokens or 0) - (t.answer.cached_tokens or 0))
        for t in ok
        if (entry := run.predictions.get(t.answer.gateway_id or "")) is not None
    ]
    origin = min((t.answer.sent for t in run.turns), default=0.0)  # the run's first send
    return {
        "requests": len(run.turns),
        "errors": len(run.turns) - len(ok),
        "ttft_p50": _pct(ttfts, 50),
        "ttft_p99": _pct(ttfts, 99),
        "ttft_mean": statistics.fmean(ttfts) if ttfts else None,
        "turn2_ttft_p50": _pct(second, 50),
        "turn2_ttft_p99": _pct(second, 99),
        "cached_ratio": ratio(ok),
        # The prefill work done: contention cannot fake it (llama.cpp's own count).
        "uncached_tokens": sum(
            (t.answer.prompt_tokens or 0) - (t.answer.cached_tokens or 0) for t in ok
        ),
        "turn2_cached_ratio": ratio([t for t in ok if t.index > 0]),
        "prompt_tokens_mean": statistics.fmean(t.answer.prompt_tokens or 0 for t in ok)
        if ok
        else 0.0,
        "served": [served.get(url, 0) for url in urls],
        "kv_tiers": dict(sorted(tiers.items())),
        "position": run.position,
        "load_average": list(run.load),
        "wall_s": run.wall_s * time_scale,
        "learned": run.learned,
        "ttft_error": statistics.median(errors) if errors else None,
        "request_ttft_error": statistics.median(misses) if misses else None,
        "predicted": len(misses),
        # Median |booked - true| uncached tokens, and the median relative to the prompt.
        "guess_error_tokens": statistics.median(abs(b - u) for b, u in guessed)
        if guessed
        else None,
        "turns": [
            {
                "session": t.session,
                "turn": t.index + 1,
                "worker": t.answer.worker,
                "prompt_tokens": t.answer.prompt_tokens,
                "cached_tokens": t.answer.cached_tokens,
                "kv_tier": t.answer.kv_tier,
                "ttft": None if t.ttft is None else t.ttft * time_scale,
                # When it was sent and ended, from the run's first send (a replay's clock).
                "sent_s": (t.answer.sent - origin) * time_scale,
                "finished_s": (t.answer.finished - origin) * time_scale,
                "error": t.answer.error,
                # What the gateway predicted at the send, observed, and booked (its guess of
                # the uncached tokens), by its own id (``X-Kvgate-Request-ID``).
                "gateway_id": t.answer.gateway_id,
                **_predicted(run.predictions.get(t.answer.gateway_id or "")),
            }
            for t in run.turns
        ],
    }


@contextlib.asynccontextmanager
async def open_fleet(args: argparse.Namespace) -> AsyncIterator[tuple[Fleet, Path | None]]:
    """The fleet ``--engine`` names: real llama.cpp workers, or emulated cpu-small ones;
    and the folder all its workers save slots in (``None``: slots are not the gateway's)."""
    if args.engine == "llamacpp":
        options = small_options(threads=1, parallel=args.slots, ctx=SLOT_CTX * args.slots)
        root = Path(tempfile.mkdtemp(prefix="kvgate-real-engine-"))
        slot_dir = None if args.plain_workers else root / "slots"
        async with running_llamacpp_fleet(
            args.workers, options, workdir=root, slot_dir=slot_dir
        ) as fleet:
            await asyncio.gather(*(asyncio.to_thread(prime, url) for url in fleet.urls))
            yield fleet, slot_dir
        return
    spec = FleetSpec(
        workers=args.workers,
        profile=args.profile,
        time_scale=args.time_scale,
        kv_blocks=args.slots * SLOT_CTX // 16,
        model=DEFAULT_MODEL_NAME,
        seed=args.seed,
    )
    factory: AbstractAsyncContextManager[Fleet] = emulated_fleet(spec)
    async with factory as emulated:
        yield emulated, None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the fleet, size the system prompt, run every policy; the results document."""
    sessions, rest = schedule(
        load_questions(args.questions), args.sessions, args.rate, args.think_s, args.seed
    )
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    time_scale = args.time_scale if args.engine == "emulated" else 1.0
    async with open_fleet(args) as (fleet, slot_dir):
        count = (
            llamacpp_token_counter(fleet.urls[0])
            if args.engine == "llamacpp"
            else emulated_token_count
        )
        system, system_tokens = await asyncio.to_thread(
            system_prompt, rest, args.system_tokens, count
        )
        order = run_order(policies, args.seed)
        runs: dict[str, PolicyRun] = {}
        for position, p in enumerate(order):
            runs[p] = await run_policy(
                fleet,
                p,
                sessions,
                system=system,
                max_tokens=args.max_tokens,
                time_scale=time_scale,
                options=policy_options(args.option).get(p),
                headerless=args.headerless,
                slot_dir=slot_dir,
            )
            runs[p].position = position
        urls = fleet.urls
    return {
        "config": {
            "engine": args.engine,
            "headerless": args.headerless,
            "slot_plane": slot_dir is not None,
            "order": order,
            "model": DEFAULT_MODEL_NAME,
            "workers": args.workers,
            "threads": 1,
            "slots": args.slots,
            "cache_ram_mib": 0,
            "sessions": args.sessions,
            "turns": 2,
            "rate": args.rate,
            "think_s": args.think_s,
            "max_tokens": args.max_tokens,
            "system_tokens": system_tokens,
            "seed": args.seed,
            "time_scale": time_scale,
            "profile": args.profile if args.engine == "emulated" else None,
            "cpu_count": os.cpu_count(),
            "load_average": os.getloadavg()[:2],
        },
        "policies": {p: summarize(runs[p], urls, time_scale) for p in policies},
    }


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def table(results: dict[str, Any]) -> Table:
    """One row per policy."""
    c = results["config"]
    engine = "llama.cpp" if c["engine"] == "llamacpp" else f"emulated {c['profile']}"
    title = (
        f"{c['workers']} {engine} workers ({c['model']}, 1 thread, {c['slots']} slots), "
        f"{c['sessions']} MT-Bench sessions x 2 turns, system prompt {c['system_tokens']} tokens"
    )
    out = Table(
        title=title,
        caption="TTFT in seconds (model seconds for emulated workers); a shared machine is noisy. "
        "Prediction error: the median over requests of |predicted - observed| / observed TTFT, "
        "as the policy predicted it when it sent each (core.speed); in brackets per worker, "
        "on the gateway's clock.",
        title_justify="left",
        caption_justify="left",
    )
    columns = (
        "policy", "done", "errors", "prefilled", "cached", "turn-2 cached", "TTFT p50", "TTFT p99",
        "turn-2 p50", "turn-2 p99", "served", "prediction error", "KV tiers", "run", "load",
        "wall",
    )  # fmt: skip
    for column in columns:
        out.add_column(column, justify="left" if column == "policy" else "right")
    for policy, s in results["policies"].items():
        out.add_row(
            policy,
            f"{s['requests'] - s['errors']}/{s['requests']}",
            str(s["errors"]),
            f"{s['uncached_tokens']:,}",
            f"{s['cached_ratio']:.1%}",
            f"{s['turn2_cached_ratio']:.1%}",
            _s(s["ttft_p50"]),
            _s(s["ttft_p99"]),
            _s(s["turn2_ttft_p50"]),
            _s(s["turn2_ttft_p99"]),
            "/".join(str(n) for n in s["served"]),
            ("-" if (e := s.get("request_ttft_error")) is None else f"{e:.0%} (")
            + " ".join(
                "-" if (e := w["ttft_error"]) is None else f"{e:.0%}" for w in s["learned"].values()
            )
            + ("" if s.get("request_ttft_error") is None else ")"),
            " ".join(f"{k} {n}" for k, n in s["kv_tiers"].items()) or "-",
            f"{s['position'] + 1}",
            "-".join(f"{x:.1f}" for x in s["load_average"]),
            f"{s['wall_s']:.0f} s",
        )
    return out


def main() -> None:
    """Parse arguments, run, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("llamacpp", "emulated"), default="llamacpp")
    parser.add_argument("--workers", type=int, default=2, help="workers in the fleet")
    parser.add_argument("--slots", type=int, default=4, help="slots (parallel requests) a worker")
    parser.add_argument("--sessions", type=int, default=16, help="two-turn sessions")
    parser.add_argument("--rate", type=float, default=0.1, help="session starts per second")
    parser.add_argument("--think-s", type=float, default=2.0, help="mean pause between turns")
    parser.add_argument("--max-tokens", type=int, default=32, help="answer length cap")
    parser.add_argument("--system-tokens", type=int, default=1_000, help="system prompt size")
    parser.add_argument("--policies", default="round_robin,default", help="comma-separated")
    parser.add_argument("--seed", type=int, default=0, help="seed of the schedule")
    parser.add_argument("--questions", type=Path, default=QUESTIONS, help="MT-Bench JSONL")
    parser.add_argument("--profile", default="cpu-small", help="emulated workers' profile")
    parser.add_argument(
        "--time-scale", type=float, default=10.0, help="emulated: model s per real s"
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="POLICY.KEY=VALUE",
        help="a policy option, e.g. default.prefill_tokens_per_s=150 (repeatable)",
    )
    parser.add_argument(
        "--headerless",
        action="store_true",
        help="send no X-Session-ID: a second turn is followed by its prefix chain alone",
    )
    parser.add_argument(
        "--plain-workers",
        action="store_true",
        help="configure the llama.cpp workers as plain OpenAI servers: no slot pinning, "
        "offload or restore by the gateway (the engine picks each request's slot)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    console = Console()
    if not console.is_terminal:
        console = Console(width=180)
    console.print(table(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

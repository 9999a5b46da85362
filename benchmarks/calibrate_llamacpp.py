"""Calibrate the "cpu-small" latency profile against a real llama.cpp worker.

Starts one worker per thread count (Gemma 3 270M unless ``--model``), then measures:

- cold prefill: prompts of ~500 and ~1,500 tokens that share nothing cached
  (server-side ``timings.prompt_ms`` and wall-clock time to the first token);
- cached prompt: the same prompt again with a short new tail, so only the tail
  is computed (what a cache hit costs end to end);
- decode: milliseconds per output token (one engine step) at batch 1 with ~64,
  ~500 and ~1,500 tokens of context, and at batch 2 (two streams decoding
  together, ~64 tokens of context each).

The table shows medians of ``--repeats`` runs. The profile's parameters (see
``kvgate.engine.profiles``) are derived from the best run of each measurement,
the one least disturbed by other processes: on a shared machine other load
only ever slows a run down. The load average is recorded beside them.
Prompts are token ids, so sizes are exact.

    .venv/bin/python benchmarks/calibrate_llamacpp.py [--threads 1,2] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvgate.realengine import LlamaCppOptions, running_llamacpp

SHORT = 64
SIZES = (500, 1_500)
TAIL_TOKENS = 16
DECODE_TOKENS = 48


@dataclass(frozen=True)
class Calibration:
    """What one thread count measured (medians), and the profile parameters (best runs)."""

    threads: int
    cold_prefill_tokens_per_s: dict[int, float]
    cold_ttft_s: dict[int, float]
    cached_ttft_s: dict[int, float]
    cached_tokens: dict[int, int]
    decode_ms_per_token: dict[int, float]
    decode_ms_per_token_batch2: float
    prefill_tokens_per_s: float
    step_base_s: float
    decode_per_seq_s: float
    attention_per_ctx_token_s: float
    load_average: tuple[float, float]


def _post(url: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        result: dict[str, Any] = json.loads(response.read())
    return result


class Probe:
    """Exact-size prompts and timed completions against one worker."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._vocab = self._sample_vocabulary()

    def _sample_vocabulary(self) -> list[int]:
        # Tokens of ordinary words, so prompts look like text to the model.
        text = (
            "the river carried stone and lantern light past the orchard while copper "
            "bells rang over meadow and harbor under violet thunder and cedar smoke"
        )
        tokens: list[int] = _post(self.url + "/tokenize", {"content": text})["tokens"]
        return sorted(set(tokens))

    def prompt(self, seed: int, size: int) -> list[int]:
        """``size`` token ids; different seeds differ from the first token on."""
        rng = random.Random(seed)
        return [rng.choice(self._vocab) for _ in range(size)]

    def complete(self, prompt: list[int], max_tokens: int) -> tuple[float, dict[str, Any]]:
        """Wall seconds of one non-streamed completion, and llama.cpp's own timings."""
        started = time.perf_counter()
        answer = _post(
            self.url + "/v1/completions",
            {
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            },
        )
        return time.perf_counter() - started, answer["timings"]


def calibrate(threads: int, repeats: int, model: Path | None, seed: int) -> Calibration:
    """Run every measurement against a fresh worker with ``threads`` threads."""
    options = LlamaCppOptions(model=model, port=0, threads=threads, parallel=2, ctx=8_192)
    cold_rate: dict[int, list[float]] = {n: [] for n in SIZES}
    cold_ttft: dict[int, list[float]] = {n: [] for n in SIZES}
    cached_ttft: dict[int, list[float]] = {n: [] for n in SIZES}
    cached_tokens: dict[int, list[float]] = {n: [] for n in SIZES}
    decode: dict[int, list[float]] = {n: [] for n in (SHORT, *SIZES)}
    batch2: list[float] = []
    with running_llamacpp(options) as worker:
        probe = Probe(worker.url)
        probe.complete(probe.prompt(seed - 1, SHORT), 4)  # first-request costs, not measured
        for rep in range(repeats):
            for size in SIZES:
                prompt = probe.prompt(seed + 1_000 * rep + size, size)
                wall, timings = probe.complete(prompt, 1)
                cold_ttft[size].append(wall)
                cold_rate[size].append(timings["prompt_n"] / (timings["prompt_ms"] / 1e3))
                prompt += probe.prompt(seed + 7 + rep, TAIL_TOKENS)
                wall, timings = probe.complete(prompt, 1)
                cached_ttft[size].append(wall)
                cached_tokens[size].append(timings["cache_n"])
                decode[size].append(_step_ms(probe.complete(prompt, DECODE_TOKENS)[1]))
            # Two short prompts, cached first so that the timed requests only decode:
            # one alone (batch 1), then both at once (batch 2).
            pair = [probe.prompt(seed + 50_000 + 2 * rep + i, SHORT) for i in range(2)]
            for prompt in pair:
                probe.complete(prompt, 1)
            decode[SHORT].append(_step_ms(probe.complete(pair[0], DECODE_TOKENS)[1]))
            with ThreadPoolExecutor(2) as pool:
                results = list(pool.map(lambda p: probe.complete(p, DECODE_TOKENS), pair))
            batch2.append(statistics.mean(_step_ms(timings) for _, timings in results))

    # Best runs (fastest steps, highest rate): other processes only ever add time.
    step_short, step_long = min(decode[SHORT]) / 1e3, min(decode[SIZES[-1]]) / 1e3
    attention = max(0.0, (step_long - step_short) / (SIZES[-1] - SHORT))
    per_seq = max(0.0, min(batch2) / 1e3 - step_short)
    base = max(0.0, step_short - per_seq - attention * SHORT)
    load1, load5, _ = os.getloadavg()
    med = statistics.median
    return Calibration(
        threads=threads,
        cold_prefill_tokens_per_s={n: med(v) for n, v in cold_rate.items()},
        cold_ttft_s={n: med(v) for n, v in cold_ttft.items()},
        cached_ttft_s={n: med(v) for n, v in cached_ttft.items()},
        cached_tokens={n: round(med(v)) for n, v in cached_tokens.items()},
        decode_ms_per_token={n: med(v) for n, v in decode.items()},
        decode_ms_per_token_batch2=med(batch2),
        prefill_tokens_per_s=max(rate for rates in cold_rate.values() for rate in rates),
        step_base_s=base,
        decode_per_seq_s=per_seq,
        attention_per_ctx_token_s=attention,
        load_average=(load1, load5),
    )


def _step_ms(timings: dict[str, Any]) -> float:
    """Milliseconds per decoded token: one engine step while this request decoded."""
    return float(timings["predicted_ms"]) / float(timings["predicted_n"])


def _table(results: list[Calibration]) -> Table:
    table = Table(title="llama.cpp worker calibration (medians; a shared machine is noisy)")
    table.add_column("measure")
    for result in results:
        table.add_column(f"{result.threads} thread(s)", justify="right")

    def row(name: str, values: list[str]) -> None:
        table.add_row(name, *values)

    for size in SIZES:
        row(
            f"cold prefill {size} tok (tok/s)",
            [f"{r.cold_prefill_tokens_per_s[size]:.0f}" for r in results],
        )
        row(f"cold TTFT {size} tok (s)", [f"{r.cold_ttft_s[size]:.2f}" for r in results])
        row(
            f"cached TTFT {size}+{TAIL_TOKENS} tok (s)",
            [f"{r.cached_ttft_s[size]:.3f}" for r in results],
        )
        row(f"  cached tokens of {size}", [str(r.cached_tokens[size]) for r in results])
    for size in (SHORT, *SIZES):
        row(
            f"decode ms/token, ctx ~{size}",
            [f"{r.decode_ms_per_token[size]:.1f}" for r in results],
        )
    row(
        f"decode ms/token, batch 2, ctx ~{SHORT}",
        [f"{r.decode_ms_per_token_batch2:.1f}" for r in results],
    )
    table.add_section()
    row(
        "profile (best runs): prefill_tokens_per_s",
        [f"{r.prefill_tokens_per_s:.0f}" for r in results],
    )
    row("-> step_base_s", [f"{r.step_base_s:.4f}" for r in results])
    row("-> decode_per_seq_s", [f"{r.decode_per_seq_s:.4f}" for r in results])
    row("-> attention_per_ctx_token_s", [f"{r.attention_per_ctx_token_s:.2e}" for r in results])
    row(
        "load average at the end (1, 5 min)",
        [f"{r.load_average[0]:.1f}, {r.load_average[1]:.1f}" for r in results],
    )
    return table


def main() -> None:
    """Parse arguments, calibrate each thread count, print a table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement")
    parser.add_argument("--model", type=Path, default=None, help="GGUF file (default: Gemma)")
    parser.add_argument("--seed", type=int, default=11, help="seed for prompt tokens")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()

    results = [
        calibrate(int(t), args.repeats, args.model, args.seed) for t in args.threads.split(",")
    ]
    Console().print(_table(results))
    if args.json is not None:
        payload = {"cpu_count": os.cpu_count(), "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()

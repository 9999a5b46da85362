"""Part 3 of ``real_offload.py``: the engine model's prediction of the measured TTFTs.

``engine.slots`` calibrated on part 1 by ``fit_prefill`` (cold and warm turns,
each size predicted from a fit holding that size out), and the fleet's share of
the host's CPU fitted on the calibration wave, predicts part 1's returning turns
and replays part 2's fleet runs in the order the client sent their turns,
through llama.cpp's server loop (``engine.slots.ServerLoop``); beside it the
calibration before issue 16 (cold turns only, one coefficient for every
attention pair). A diagnostic, not a prediction: the same replay with the
host's share refitted on each run's own first wave (4 cold turns at once, the
calibration wave's work), judged on the turns after it, to tell a wrong
mechanism from a machine whose load moved between the wave and the run.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from kvgate.engine.slots import (
    GEMMA3_270M,
    ModelTurn,
    PrefillSample,
    SlotCosts,
    fit_prefill,
    predict_returning,
    replay_fleet,
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values``, None for none."""
    return float(np.percentile(values, q)) if values else None


def prefill_samples(
    turns: Sequence[dict[str, Any]], save_s: float, restore_s: float
) -> list[PrefillSample]:
    """Part 1 turns as prefill samples: new tokens, cached context, TTFT less the KV moves.

    Every turn but a ``slot`` turn (and the run's very first) found another
    session in the only slot, which the gateway saved first; a ``restore`` turn
    also waited for its restore. Those measured means are taken off, so what is
    fitted is the prefill (and the request's fixed overhead).
    """
    out = []
    for i, t in enumerate(turns):
        if not t["ok"]:
            continue
        moves = (save_s if t["case"] != "slot" and i > 0 else 0.0) + (
            restore_s if t["case"] == "restore" else 0.0
        )
        tokens = t["prompt_tokens"] - t["cached_tokens"]
        out.append(PrefillSample(tokens, t["cached_tokens"], max(t["ttft_s"] - moves, 1e-3)))
    return out


def sent_order(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A fleet run's answered turns in the order the client sent them.

    The run records turns as they finish; its ``order`` says which session each
    send was (a session's k-th send is its k-th recorded turn). A run without
    ``order`` (the calibration wave: all at once) stays as recorded.
    """
    done = [t for t in run["turns"] if t["ok"]]
    if "order" not in run:
        return done
    by_session: dict[str, list[dict[str, Any]]] = {}
    for t in done:
        by_session.setdefault(t["session"], []).append(t)
    out = []
    for s in run["order"]:
        mine = by_session.get(f"f{s}", [])
        if mine:
            out.append(mine.pop(0))
    return out


def timeline(run: dict[str, Any], concurrency: int) -> list[dict[str, Any]]:
    """A fleet run's turns with when each was sent, started in llama.cpp and answered.

    Rebuilt from the records, as the client schedules: the k-th send takes a
    permit when the (k - concurrency)-th turn finishes (the records are in
    finishing order) and waits for its session's previous turn. ``start`` is
    the answer less llama.cpp's own ``prompt_ms``; ``wait`` is from send to
    start (the gateway's calls, a slot, the loop's running step).
    """
    order: dict[tuple[str, int], int] = {}
    seen: dict[str, int] = {}
    for k, s in enumerate(run["order"]):
        key = f"f{s}"
        order[(key, seen.get(key, 0))] = k
        seen[key] = seen.get(key, 0) + 1
    seen.clear()
    finished: list[float] = []
    last: dict[str, float] = {}
    out = []
    for t in run["turns"]:
        n = seen.get(t["session"], 0)
        seen[t["session"]] = n + 1
        k = order[(t["session"], n)]
        permit = finished[k - concurrency] if k >= concurrency else 0.0
        sent = max(permit, last.get(t["session"], 0.0))
        done = sent + t["ttft_s"]
        finished.append(done)
        last[t["session"]] = done
        start = done - t["prompt_ms"] / 1000
        out.append({**t, "sent": sent, "start": start, "done": done, "wait": start - sent})
    return out


HOST_CORES = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)
"""Candidate CPU shares of the fleet's machine (2 cores here, shared with other jobs)."""

ATTENTION = GEMMA3_270M
"""The real engine's model: 5 of 6 layers attend within a 512-token window (its GGUF)."""


def replay_run(
    costs: SlotCosts,
    turns: Sequence[dict[str, Any]],
    args: argparse.Namespace,
    *,
    offload: bool,
    share: float | None,
) -> list[ModelTurn]:
    """``replay_fleet`` of a fleet run's turns (in sent order) on its workers, 2 slots each."""
    urls = sorted({t["worker"] for t in turns})
    return replay_fleet(
        costs,
        [(t["session"], t["prompt_tokens"], urls.index(t["worker"])) for t in turns],
        workers=len(urls),
        slots=2,
        concurrency=args.concurrency,
        offload=offload,
        host_cores=share,
    )


def host_cores(
    costs: SlotCosts, turns: Sequence[dict[str, Any]], args: argparse.Namespace
) -> float | None:
    """The host's CPU share that best replays the calibration wave (relative error).

    None (each worker its own core) without a wave. Ties go to more cores.
    """
    done = [t for t in turns if t["ok"]]
    if not done:
        return None
    best: tuple[float, float] | None = None
    for cores in HOST_CORES:
        sim = replay_run(costs, done, args, offload=False, share=cores)
        error = sum((m.ttft_s / t["ttft_s"] - 1) ** 2 for m, t in zip(sim, done, strict=True))
        if best is None or error <= best[0] + 1e-12:
            best = (error, cores)
    assert best is not None
    return best[1]


def _fitted_for(cold_cases: tuple[str, ...], predicted: int, case: str, size: int) -> bool:
    """Whether a part 1 turn is fitted when ``predicted`` words are predicted."""
    return case in cold_cases or size != predicted


def prediction(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Part 3: calibrate ``engine.slots`` on part 1, predict held-out turns, compare.

    Two calibrations, both by ``fit_prefill`` (relative non-negative least squares):

    - ``warm`` (the model): per predicted size, fitted on every cold turn (the
      sessions' first turns and the other sessions' 16-word turns, of every size)
      and on the restore, slot and recompute turns of the *other* sizes: the size
      predicted is held out (leave one size out). The fleet (part 2) is predicted
      from a fit on all of part 1: none of its turns is fitted.
    - ``cold`` (the calibration before issue 16's model fix): cold turns only.
    """
    p1 = results["returning"]["turns"]
    save_s = results["returning"]["gateway_save_s_mean"]
    restore_s = results["returning"]["gateway_restore_s_mean"]
    samples = prefill_samples(p1, save_s, restore_s)
    ok = [t for t in p1 if t["ok"]]
    kinds = [(t["case"], t["size"]) for t in ok]
    cold_cases = ("cold", "other")

    def fit(keep: Callable[[str, int], bool]) -> SlotCosts:
        chosen = [s for s, (case, size) in zip(samples, kinds, strict=True) if keep(case, size)]
        return SlotCosts(fit_prefill(chosen, ATTENTION), save_s=save_s, restore_s=restore_s)

    def cold_fit() -> SlotCosts:
        chosen = [s for s, (case, _) in zip(samples, kinds, strict=True) if case in cold_cases]
        return SlotCosts(fit_prefill(chosen, ATTENTION, tied=True), save_s, restore_s)

    cold_only = cold_fit()
    everything = fit(lambda _case, _size: True)
    out: dict[str, Any] = {
        "costs": asdict(everything),
        "costs_cold_only": asdict(cold_only),
        "returning": [],
        "fleet": {},
    }
    for size in args.sizes:
        held_out = fit(functools.partial(_fitted_for, cold_cases, size))
        for case in ("restore", "slot", "recompute"):
            real = [t for t in ok if t["size"] == size and t["case"] == case]
            if not real:
                continue
            row: dict[str, Any] = {"size": size, "case": case}
            row["real"] = statistics.median(t["ttft_s"] for t in real)
            for name, costs in (("model", held_out), ("cold_model", cold_only)):
                row[name] = statistics.median(
                    predict_returning(
                        costs,
                        t["prompt_tokens"],
                        t["cached_tokens"],
                        restored=case == "restore",
                        saved=case != "slot",
                    )
                    for t in real
                )
            row["error"] = row["model"] / row["real"] - 1
            row["cold_error"] = row["cold_model"] / row["real"] - 1
            out["returning"].append(row)
    cores = {
        name: host_cores(costs, results.get("calibration", {}).get("turns", []), args)
        for name, costs in (("model", everything), ("cold_model", cold_only))
    }
    out["host_cores"] = cores["model"]
    for mode, run in results.get("fleet", {}).items():
        done = sent_order(run)
        first = args.concurrency  # the run's own first wave: cold turns, all at once
        entry: dict[str, Any] = {
            "real_p50": run["ttft_p50"],
            "real_mean": statistics.fmean(t["ttft_s"] for t in done),
            "real_cached": run["cached_ratio"],
            "rest_real_p50": percentile([t["ttft_s"] for t in done[first:]], 50),
            "rest_real_mean": statistics.fmean(t["ttft_s"] for t in done[first:]),
            # Not held out: the host's share refitted on this run's first wave (the
            # same work as the calibration wave), to tell the mechanism from the load.
            "own_wave_cores": host_cores(everything, done[:first], args),
        }

        for name, costs in (("model", everything), ("cold_model", cold_only)):
            sim = replay_run(costs, done, args, offload=mode == "on", share=cores[name])
            ttfts = [t.ttft_s for t in sim]
            entry[f"{name}_p50"] = percentile(ttfts, 50)
            entry[f"{name}_mean"] = statistics.fmean(ttfts)
            entry[f"{name}_cached"] = sum(t.cached_tokens for t in sim) / sum(
                t.prompt_tokens for t in sim
            )
            if name == "model":
                entry["rest_model_p50"] = percentile(ttfts[first:], 50)
                entry["rest_model_mean"] = statistics.fmean(ttfts[first:])
        own = replay_run(
            everything, done, args, offload=mode == "on", share=entry["own_wave_cores"]
        )
        entry["rest_own_p50"] = percentile([t.ttft_s for t in own[first:]], 50)
        entry["rest_own_mean"] = statistics.fmean(t.ttft_s for t in own[first:])
        out["fleet"][mode] = entry
    return out

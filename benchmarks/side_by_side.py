"""kvgate beside the routers it is measured against, on the same workers, interleaved.

Targets: the workers directly, HAProxy (the floor: no routing logic), kvgate with
one process and with N (sharing a Redis store), with ``--routers ...,kvgate-redis``
also one process on Redis beside the one on the memory store, sglang-router and vllm-router,
all round robin by default over the same fast mock workers
(``kvgate.bench.mock_worker``); the peers are installed and started by ``kvgate.bench.routers``
(PyPI releases in throwaway virtualenvs, HAProxy from Debian) with their policy
swapped for ``--peer-policy``. For each load (plain or streamed, at each concurrency)
and each repeat, every target gets one ``wrk`` run, in an order that alternates
between repeats, so drift in the machine's load falls on all of them alike.

What to trust on a shared machine: router CPU milliseconds per request (from
``/proc``: the router's whole process tree, plus Redis for kvgate's N processes)
and ratios between routers within one repeat. Absolute requests per second move
with whatever else runs. Streams carry ``--events`` events plus ``[DONE]``; the
relay cost is given as events per router CPU-second. With ``--event-gap-ms 0``
events coalesce into fewer reads when a router lags; with a gap each arrives in
its own read and is relayed on its own, as tokens are.

    .venv/bin/python benchmarks/overhead.py --side-by-side --duration 3 --repeat 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate.bench import routers as peer_routers
from kvgate.bench import wrk
from kvgate.bench.processes import tree_cpu_seconds
from kvgate.testing import free_port, wait_until_sync
from kvgate.testing_redis import RedisServer, find_redis_server

KVGATE = str(Path(sys.executable).parent / "kvgate")
MOCK = ("-m", "kvgate.bench.mock_worker")


@dataclass
class Target:
    """Something ``wrk`` can load: the workers themselves, or a router in front."""

    name: str
    urls: list[str]
    pid: int | None
    """The router process whose tree's CPU counts (None for the direct runs)."""
    store_pid: int | None = None
    """A store process (Redis) whose CPU counts as the router's too."""

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the router's process tree and its store."""
        pids = [p for p in (self.pid, self.store_pid) if p is not None]
        return sum(tree_cpu_seconds(p) for p in pids)


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def _process(argv: list[str], ready_url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        with contextlib.suppress(TimeoutError):
            wait_until_sync(
                lambda: proc.poll() is not None or _ok(ready_url), timeout=90, interval=0.2
            )
        if proc.poll() is not None or not _ok(ready_url):
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"{argv[0]} did not get ready at {ready_url}:\n{tail}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _spread(values: list[float]) -> float:
    """(max - min) / median, in percent."""
    mid = statistics.median(values)
    return 100 * (max(values) - min(values)) / mid if mid else 0.0


@dataclass(frozen=True)
class RouterSpec:
    """How to start one router in front of the workers."""

    name: str
    command: Callable[[int, list[str], Path], list[str]]
    """(port, worker URLs, scratch folder) -> argv."""
    ready_path: str = "/health"


def kvgate_spec(
    policy: str,
    processes: int,
    store: str | None,
    server: str,
    source: tuple[str, str] | None = None,
) -> RouterSpec:
    """``kvgate serve`` with ``processes`` server processes (``store`` when several) and
    ``server`` serving the generation endpoints (``--server``); with ``source`` (a name
    and a ``src`` folder), that tree's kvgate instead (a before/after in one run)."""

    def command(port: int, urls: list[str], _scratch: Path) -> list[str]:
        argv = [KVGATE, "serve", "--port", str(port), "--policy", policy]
        if source is not None:
            argv = ["env", f"PYTHONPATH={source[1]}", *argv]
        argv += ["--processes", str(processes), "--server", server]
        if store is not None:
            argv += ["--store", store]
        for url in urls:
            argv += ["--worker", url]
        return argv

    name = "kvgate" if processes == 1 else f"kvgate x{processes}"
    if processes == 1 and store is not None:
        name = "kvgate redis"  # one process on Redis, beside the memory store's row
    if source is not None:
        name += f" {source[0]}"
    return RouterSpec(f"{name} {server}", command, "/readyz")


def peer_spec(router: peer_routers.Router, policy: str, venv: Path | None) -> RouterSpec:
    """A router of ``peer_routers`` (installed by it), with ``policy`` instead of its own."""

    def command(port: int, urls: list[str], scratch: Path) -> list[str]:
        launch = peer_routers.Launch(urls, port, free_port(), scratch, venv=venv)
        argv = router.argv(launch)
        if "--policy" in argv:
            argv[argv.index("--policy") + 1] = policy
            # No admission limit of their own: kvgate's is off by default too.
            argv += ["--max-concurrent-requests", "100000"]
        return argv

    return RouterSpec(router.name, command, "/health")


def _specs(opts: argparse.Namespace, redis_url: str | None) -> list[RouterSpec]:
    specs = []
    routers = peer_routers.ROUTERS

    def prepared(name: str) -> tuple[bool, Path | None]:
        try:
            return True, peer_routers.prepare(routers[name])
        except RuntimeError as exc:
            print(f"{name} left out: {exc}")
            return False, None

    wanted = set(opts.routers.split(",")) if opts.routers else None

    def want(name: str) -> bool:
        return wanted is None or name in wanted

    if want("haproxy") and (found := prepared("haproxy"))[0]:
        specs.append(peer_spec(routers["haproxy"], opts.peer_policy, found[1]))
    for server in opts.servers.split(","):
        if want("kvgate"):
            for source in opts.kvgate_src:
                name, _, path = source.partition("=")
                specs.append(kvgate_spec(opts.policy, 1, None, server, (name, path)))
            specs.append(kvgate_spec(opts.policy, 1, None, server))
        if wanted is not None and "kvgate-redis" in wanted and redis_url is not None:
            for source in opts.kvgate_src:
                name, _, path = source.partition("=")
                specs.append(kvgate_spec(opts.policy, 1, redis_url, server, (name, path)))
            specs.append(kvgate_spec(opts.policy, 1, redis_url, server))
        if opts.processes > 1 and want("kvgate-n"):
            if redis_url is None:
                print("redis-server not installed: kvgate with several processes is left out")
            else:
                specs.append(kvgate_spec(opts.policy, opts.processes, redis_url, server))
    for name in ("sglang-router", "vllm-router"):
        if want(name) and (found := prepared(name))[0]:
            specs.append(peer_spec(routers[name], opts.peer_policy, found[1]))
    return specs


def _measure(targets: list[Target], opts: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    levels = [int(x) for x in opts.concurrency.split(",")]
    print(f"{'load':<14}{'run':>4}  " + "".join(f"{t.name:>22}" for t in targets))
    print(f"{'':<14}{'':>4}  " + "".join(f"{'req/s  cpu ms/req':>22}" for t in targets))
    for stream in (False, True):
        for level in levels:
            load = f"{'stream' if stream else 'plain'} c={level}"
            for run in range(1, opts.repeat + 1):
                order = targets if run % 2 else targets[::-1]
                measured: dict[str, dict[str, Any]] = {}
                for target in order:
                    before = target.cpu_seconds()
                    result = wrk.run_wrk(target.urls, level, opts.duration, stream, opts.sessions)
                    cpu = target.cpu_seconds() - before
                    row = {
                        "load": load,
                        "stream": stream,
                        "concurrency": level,
                        "run": run,
                        "target": target.name,
                        "rps": result.rps,
                        "requests": result.requests,
                        "p50_ms": result.p50_ms,
                        "p99_ms": result.p99_ms,
                        "errors": result.errors,
                        "non2xx": result.non2xx,
                        "cpu_ms_per_req": 1e3 * cpu / result.requests if target.pid else None,
                        "events_per_cpu_s": (
                            result.requests * (opts.events + 1) / cpu
                            if target.pid and stream and cpu
                            else None
                        ),
                    }
                    measured[target.name] = row
                    rows.append(row)
                cells = []
                for target in targets:
                    row = measured[target.name]
                    cpu_text = (
                        f"{row['cpu_ms_per_req']:.3f}" if row["cpu_ms_per_req"] is not None else "-"
                    )
                    flag = "!" if row["errors"] else " "
                    cells.append(f"{row['rps']:>12,.0f}{flag}{cpu_text:>8}")
                print(f"{load:<14}{run:>4}  " + "".join(f"{c:>22}" for c in cells))
    return rows


def _first_events(targets: list[Target], opts: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for run in range(1, opts.repeat + 1):
        order = targets if run % 2 else targets[::-1]
        for target in order:
            times = wrk.first_event_times(target.urls[0], opts.ttft_requests)
            rows.append(
                {
                    "run": run,
                    "target": target.name,
                    "first_event_p50_ms": 1e3 * statistics.median(times) if times else None,
                    "samples": len(times),
                }
            )
    return rows


def _summary(
    targets: list[Target], rows: list[dict[str, Any]], firsts: list[dict[str, Any]], opts: Any
) -> list[dict[str, Any]]:
    """One line per router, as in issue 17's table: medians over repeats, and the spread."""
    levels = [int(x) for x in opts.concurrency.split(",")]
    main_level = 32 if 32 in levels else levels[len(levels) // 2]
    low = min(levels)

    def pick(target: str, stream: bool, level: int, key: str) -> list[float]:
        return [
            r[key]
            for r in rows
            if r["target"] == target and r["stream"] == stream and r["concurrency"] == level
            and r[key] is not None
        ]  # fmt: skip

    def by_run(target: str, stream: bool, level: int, key: str) -> dict[int, float]:
        return {
            r["run"]: r[key]
            for r in rows
            if r["target"] == target and r["stream"] == stream and r["concurrency"] == level
        }

    direct_p50 = by_run("direct", False, low, "p50_ms")
    direct_first = {r["run"]: r["first_event_p50_ms"] for r in firsts if r["target"] == "direct"}
    print()
    print(
        f"{'router':<16}{'req/s c=' + str(main_level):>16}{'spread':>8}"
        f"{'cpu ms/req plain/stream':>26}{'spread':>14}"
        f"{'added p50 c=' + str(low):>15}{'added ttft':>12}{'events/cpu-s':>14}"
    )
    summary = []
    for target in targets:
        rps = pick(target.name, False, main_level, "rps")
        cpu_plain = pick(target.name, False, main_level, "cpu_ms_per_req")
        cpu_stream = pick(target.name, True, main_level, "cpu_ms_per_req")
        chunks = pick(target.name, True, main_level, "events_per_cpu_s")
        p50 = by_run(target.name, False, low, "p50_ms")
        added = [p50[r] - direct_p50[r] for r in p50 if r in direct_p50]
        mine = {r["run"]: r["first_event_p50_ms"] for r in firsts if r["target"] == target.name}
        ttft = [
            mine[r] - direct_first[r]
            for r in mine
            if r in direct_first and mine[r] is not None and direct_first[r] is not None
        ]
        line: dict[str, Any] = {
            "target": target.name,
            "rps": statistics.median(rps),
            "rps_spread_pct": _spread(rps),
            "cpu_ms_plain": statistics.median(cpu_plain) if cpu_plain else None,
            "cpu_ms_stream": statistics.median(cpu_stream) if cpu_stream else None,
            "cpu_spread_pct": [_spread(cpu_plain), _spread(cpu_stream)] if cpu_plain else None,
            "added_p50_ms": statistics.median(added) if target.pid else None,
            "added_ttft_ms": statistics.median(ttft) if target.pid and ttft else None,
            "events_per_cpu_s": statistics.median(chunks) if chunks else None,
        }
        summary.append(line)
        cpu_text = f"{line['cpu_ms_plain']:.3f} / {line['cpu_ms_stream']:.3f}" if cpu_plain else "-"
        spread_text = (
            f"{line['cpu_spread_pct'][0]:.0f}% / {line['cpu_spread_pct'][1]:.0f}%"
            if cpu_plain
            else "-"
        )
        p50_text = f"{line['added_p50_ms']:.3f}" if target.pid else "-"
        ttft_text = f"{line['added_ttft_ms']:.3f}" if line["added_ttft_ms"] is not None else "-"
        events_text = f"{line['events_per_cpu_s']:,.0f}" if chunks else "-"
        print(
            f"{target.name:<16}{line['rps']:>16,.0f}{line['rps_spread_pct']:>7.0f}%"
            f"{cpu_text:>26}{spread_text:>14}{p50_text:>15}{ttft_text:>12}{events_text:>14}"
        )
    _pair_ratios(rows, levels)
    _store_ratios(rows, levels)
    return summary


def _store_ratios(rows: list[dict[str, Any]], levels: list[int]) -> None:
    """kvgate on Redis against kvgate on the memory store (same code), per interleaved run:
    the gateway's CPU per request, median and range over the repeats."""
    names = {r["target"] for r in rows}
    pairs = [(n, n.replace("kvgate redis", "kvgate", 1)) for n in sorted(names)]
    pairs = [(a, b) for a, b in pairs if a.startswith("kvgate redis") and b in names]
    if not pairs:
        return
    print("\nkvgate on Redis / on the memory store, gateway CPU per request, per run")
    for redis_name, memory_name in pairs:
        for stream in (False, True):
            for level in levels:
                ratios = []
                for run in sorted({r["run"] for r in rows}):
                    a = _row(rows, redis_name, stream, level, run)
                    b = _row(rows, memory_name, stream, level, run)
                    if a and b and a["cpu_ms_per_req"] and b["cpu_ms_per_req"]:
                        ratios.append(a["cpu_ms_per_req"] / b["cpu_ms_per_req"])
                if ratios:
                    load = f"{'stream' if stream else 'plain'} c={level}"
                    print(
                        f"  {redis_name:<28}{load:<14}median {statistics.median(ratios):.2f}x "
                        f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x; "
                        + ", ".join(f"{x:.2f}" for x in ratios)
                        + ")"
                    )


def _pair_ratios(rows: list[dict[str, Any]], levels: list[int]) -> None:
    """kvgate against sglang-router, one ratio per interleaved pair of runs."""
    names = {r["target"] for r in rows}
    if "sglang-router" not in names:
        return
    print("\nkvgate / sglang-router per interleaved pair (throughput ratio; CPU/request ratio)")
    for mine in sorted(n for n in names if n.startswith("kvgate")):
        for stream in (False, True):
            for level in levels:
                cells = []
                for run in sorted({r["run"] for r in rows}):
                    a = _row(rows, mine, stream, level, run)
                    b = _row(rows, "sglang-router", stream, level, run)
                    if a is None or b is None:
                        continue
                    cpu = a["cpu_ms_per_req"] / b["cpu_ms_per_req"] if b["cpu_ms_per_req"] else 0
                    cells.append(f"{a['rps'] / b['rps']:.2f}x; {cpu:.2f}x")
                load = f"{'stream' if stream else 'plain'} c={level}"
                print(f"  {mine:<19}{load:<14}" + "   ".join(cells))


def _row(
    rows: list[dict[str, Any]], target: str, stream: bool, level: int, run: int
) -> dict[str, Any] | None:
    for r in rows:
        if (r["target"], r["stream"], r["concurrency"], r["run"]) == (target, stream, level, run):
            return r
    return None


def run(opts: argparse.Namespace) -> None:
    """Start workers and routers, measure everything interleaved, print, maybe write JSON."""
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvgate-sbs-")))
        urls = []
        for i in range(opts.workers):
            port = free_port()
            argv = [sys.executable, *MOCK, "--port", str(port), "--events", str(opts.events)]
            argv += ["--gap-ms", str(opts.event_gap_ms)]
            url = f"http://127.0.0.1:{port}"
            stack.enter_context(_process(argv, url + "/health", scratch / f"worker{i}.log"))
            urls.append(url)
        redis: RedisServer | None = None
        wanted = set(opts.routers.split(",")) if opts.routers else {"kvgate-n"}
        if find_redis_server() is not None and (
            (opts.processes > 1 and "kvgate-n" in wanted) or "kvgate-redis" in wanted
        ):
            redis = stack.enter_context(RedisServer())
        targets = [Target("direct", urls, None)]
        for spec in _specs(opts, redis.url if redis is not None else None):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            log = scratch / f"{spec.name.replace(' ', '_')}.log"
            proc = stack.enter_context(
                _process(spec.command(port, urls, scratch), url + spec.ready_path, log)
            )
            shared = redis is not None and spec.name.startswith("kvgate x")
            targets.append(
                Target(spec.name, [url], proc.pid, redis.pid if shared and redis else None)
            )
        # Warm every path (connections, caches) before anything is measured.
        for target in targets:
            wrk.run_wrk(target.urls, 8, 1, False)
            wrk.run_wrk(target.urls, 8, 1, True)
        print(
            f"{opts.workers} mock workers ({opts.events} events per stream, "
            f"{opts.event_gap_ms:g} ms apart), wrk -t1, "
            f"{opts.duration:g}s per run, {opts.repeat} repeats interleaved, "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
            f"kvgate policy {opts.policy}, peers {opts.peer_policy}"
        )
        started = time.monotonic()
        rows = _measure(targets, opts)
        print("! = errors in that run: non-2xx answers or socket errors (the JSON has both)")
        firsts = _first_events(targets, opts)
        summary = _summary(targets, rows, firsts, opts)
        print(
            f"\n{time.monotonic() - started:.0f}s; load average at the end "
            f"{os.getloadavg()[0]:.2f}. Trust CPU per request and the pair ratios; "
            "absolute req/s move with the machine's other load."
        )
        if opts.json is not None:
            meta = {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), **vars(opts)}
            meta["json"] = str(opts.json)
            opts.json.write_text(
                json.dumps(
                    {"options": meta, "rows": rows, "first_events": firsts, "summary": summary},
                    indent=2,
                )
                + "\n"
            )

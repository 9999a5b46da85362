"""What the operator's view costs: CPU per access-log line, per /metrics scrape, per state.

    .venv/bin/python benchmarks/observe_bench.py [--workers 64] [--lines 20000]
                                                 [--repeats 5] [--json PATH]

- Access log: CPU time of ``AccessLog.write`` per request, plain and JSON, through
  the process's real logging set-up (``configure_logging``) to a handler writing to
  /dev/null; and when the logger drops INFO (the line is not even built).
- Scrape: CPU time of one ``GatewayMetrics.render()`` with ``--workers`` workers'
  scrape-time gauges (nothing of it is on the request path).
- Traffic ring: CPU time of one ``TrafficWindow.record`` (on every request).

CPU time (``time.process_time``), not wall time, so other jobs on the machine
change the figures little; the spread over ``--repeats`` is shown. Reference: a
request costs the gateway about 330-450 µs of CPU (benchmarks/overhead.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvgate.gateway.observe.logs import AccessLog, AccessRecord, configure_logging
from kvgate.gateway.observe.metrics import GatewayMetrics, WorkerGaugeRow
from kvgate.gateway.observe.traffic import TrafficWindow

RECORD = AccessRecord(
    request_id="0b83cba7fa4bf4710000000000000005",
    model="llama-3-8b",
    worker="http://10.0.0.17:8000",
    version="v2",
    reason="affinity_hit",
    status=200,
    ttft=0.0231,
    duration=0.4812,
    retries=0,
    path="/v1/chat/completions",
    session="header",
    stream=True,
    prompt_tokens=1834,
    cached_tokens=1792,
    completion_tokens=128,
)


def per_call_us(fn: Callable[[], object], calls: int, repeats: int) -> list[float]:
    """CPU µs per call of ``fn``, one figure per repeat."""
    out = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            fn()
        out.append((time.process_time() - start) / calls * 1e6)
    return out


def access_log_us(json_lines: bool, dropped: bool, lines: int, repeats: int) -> list[float]:
    """Per-line CPU µs of the access log as ``kvgate serve`` sets logging up."""
    configure_logging(json_lines, level=logging.WARNING if dropped else logging.INFO)
    log = AccessLog(True, json_lines=json_lines)
    return per_call_us(lambda: log.write(RECORD), lines, repeats)


def scrape_us(workers: int, repeats: int) -> list[float]:
    """CPU µs of one full ``/metrics`` render with ``workers`` workers' gauges."""
    rows = [
        WorkerGaugeRow(
            worker=f"http://10.0.0.{i}:8000",
            model="llama-3-8b",
            version="v1",
            in_flight=3,
            health="healthy",
            ejected=False,
            max_in_flight=256,
            running=3,
            waiting=0,
            kv_usage=0.5,
            kv_capacity_tokens=65536,
            gpu_temp_c=60.0,
            gpu_mem_used_mib=40000.0,
            gpu_mem_total_mib=81920.0,
            scrape_age_s=0.2,
            signals_fresh=True,
        )
        for i in range(workers)
    ]
    metrics = GatewayMetrics(lambda: rows)
    for row in rows:  # a few request-path series per worker, as after some traffic
        for reason in ("affinity_hit", "prefix_match", "least_loaded"):
            metrics.requests.labels("llama-3-8b", "v1", row.worker, "200", reason).inc()
        metrics.ttft.labels("llama-3-8b", "v1", row.worker).observe(0.1)
        metrics.request_duration.labels("llama-3-8b", "v1", row.worker).observe(0.5)
    return per_call_us(metrics.render, 20, repeats)


def traffic_us(calls: int, repeats: int) -> list[float]:
    """CPU µs of one ``TrafficWindow.record``."""
    window = TrafficWindow()
    clock = iter(range(10**9))

    def record() -> None:
        window.record(
            next(clock) * 0.001,
            status=200,
            worker="http://10.0.0.17:8000",
            reason="affinity_hit",
            prompt_tokens=1834,
            cached_tokens=1792,
        )

    return per_call_us(record, calls, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    console = Console()
    real_stderr = sys.stderr
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the log handler writes here
    try:
        cases = {
            "access log, plain": access_log_us(False, False, args.lines, args.repeats),
            "access log, JSON": access_log_us(True, False, args.lines, args.repeats),
            "access log, INFO dropped": access_log_us(False, True, args.lines, args.repeats),
            "traffic ring record": traffic_us(args.lines, args.repeats),
            f"/metrics render, {args.workers} workers": scrape_us(args.workers, args.repeats),
        }
    finally:
        sys.stderr.close()
        sys.stderr = real_stderr
    load = float(Path("/proc/loadavg").read_text().split()[0])
    table = Table(title=f"observe costs, CPU µs per call (load average {load:.1f})")
    for column in ("case", "median", "min", "max"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for name, values in cases.items():
        table.add_row(
            name,
            f"{statistics.median(values):.1f}",
            f"{min(values):.1f}",
            f"{max(values):.1f}",
        )
    console.print(table)
    if args.json is not None:
        args.json.write_text(
            json.dumps({"load_average": load, "cpu_us": cases}, indent=2) + "\n", encoding="utf-8"
        )


if __name__ == "__main__":
    main()

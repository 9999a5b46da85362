"""What one plain request costs the gateway, in counts a busy machine cannot move.

Wall-clock CPU per request on a shared 2-core box moves by 10-30% between runs of
the same tree; these two figures do not:

- user-space instructions per request: ``kvgate serve`` under callgrind
  (``--instr-atstart=no``), instrumentation switched on for ``--requests``
  sequential keep-alive plain requests after ``--warmup`` (the same tree repeats
  within about 1%);
- system calls per request, by kind: ``strace -c -f`` on a plain ``kvgate serve``
  over the same requests (each one a kernel entry, a few microseconds here).

The gateway runs round robin in front of two mock workers (``mock_worker.py``) with
its health checks an hour apart (each probe round under callgrind would add ~30k
instructions a request). ``--kvgate-src NAME=SRC`` measures other source trees
beside this one, interleaved over ``--repeat`` rounds (the order reversed every
other round).

    .venv/bin/python benchmarks/instructions.py --kvgate-src before=/tmp/base/src --repeat 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from kvgate.testing import free_port, wait_until_sync

MOCK = str(Path(__file__).with_name("mock_worker.py"))
KVGATE = str(Path(sys.executable).parent / "kvgate")
BODY = b'{"model":"demo","prompt":"hello world","max_tokens":4}'
REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


def _answered(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5) as sock:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def send_plain(port: int, count: int) -> None:
    """``count`` plain requests one after another on one keep-alive connection."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            sock.sendall(REQUEST)
            data = b""
            while True:
                data += sock.recv(65536)
                end = data.find(b"\r\n\r\n")
                if end < 0:
                    continue
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", data[: end + 2])
                assert length is not None, data[:200]
                if len(data) >= end + 4 + int(length[1]):
                    break


@contextlib.contextmanager
def started(argv: list[str], env: dict[str, str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """A gateway process, once ``/readyz`` answers; stopped (SIGTERM) after the block."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_sync(lambda: _answered(port), timeout=180, message=f"gateway on {port}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serve(src: str | None, config: Path, port: int) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    argv = [KVGATE, "serve", "--port", str(port), "--config", str(config), "--server", "llhttp"]
    return argv, env


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def instructions(src: str | None, config: Path, scratch: Path, opts: argparse.Namespace) -> float:
    """User-space instructions per plain request of the gateway from ``src``."""
    port = free_port()
    argv, env = _serve(src, config, port)
    out = scratch / f"callgrind.{port}"
    grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    with started([*grind, sys.executable, *argv], env, port) as proc:
        send_plain(port, opts.warmup)
        _control(proc.pid, "-i", "on")
        send_plain(port, opts.requests)
        _control(proc.pid, "-i", "off")
        _control(proc.pid, "-d")  # dump the counts now, not at exit
        wait_until_sync(
            lambda: any(scratch.glob(f"callgrind.{port}.*")), timeout=60, message="the dump"
        )
        time.sleep(1.0)  # written whole
    total = 0
    for dump in scratch.glob(f"callgrind.{port}*"):
        # ``summary:`` in the head is 0 in a dump on request; ``totals:`` closes it.
        found = re.findall(r"^(?:summary|totals): (\d+)", dump.read_text(errors="replace"), re.M)
        total += max(map(int, found), default=0)
        dump.unlink()
    return total / opts.requests


def syscalls(
    src: str | None, config: Path, scratch: Path, opts: argparse.Namespace
) -> dict[str, float]:
    """System calls per plain request of the gateway from ``src``, by name."""
    port = free_port()
    argv, env = _serve(src, config, port)
    report = scratch / f"strace.{port}"
    with started(argv, env, port) as proc:
        send_plain(port, opts.warmup)
        tracer = subprocess.Popen(
            ["strace", "-f", "-c", "-o", str(report), "-p", str(proc.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached to every thread
        send_plain(port, opts.requests)
        tracer.terminate()
        tracer.wait(30)
    calls: dict[str, float] = {}
    for line in report.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            calls[parts[-1]] = int(parts[3]) / opts.requests
    return {name: n for name, n in calls.items() if n >= 0.01}


def main() -> None:
    """Parse options, start the workers, measure every tree, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds")
    parser.add_argument(
        "--kvgate-src",
        action="append",
        default=[],
        metavar="NAME=SRC",
        help="also measure kvgate from this source tree (repeatable)",
    )
    parser.add_argument("--no-syscalls", action="store_true", help="skip the strace count")
    opts = parser.parse_args()
    for tool in ("valgrind", "callgrind_control") + (() if opts.no_syscalls else ("strace",)):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (Debian: apt-get install -y valgrind strace)")
    trees: list[tuple[str, str | None]] = [
        (name, path) for name, _, path in (s.partition("=") for s in opts.kvgate_src)
    ]
    trees.append(("this tree", None))
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvgate-ir-")))
        ports = [free_port(), free_port()]
        for port in ports:
            worker = subprocess.Popen([sys.executable, MOCK, "--port", str(port)])
            stack.callback(worker.wait)
            stack.callback(worker.terminate)
        config = scratch / "gateway.yaml"
        config.write_text(
            "policy: {name: round_robin}\nhealth: {interval_s: 3600.0}\nworkers:\n"
            + "".join(f'  - {{url: "http://127.0.0.1:{port}"}}\n' for port in ports)
        )
        counts: dict[str, list[float]] = {name: [] for name, _ in trees}
        calls: dict[str, dict[str, float]] = {}
        for round_ in range(opts.repeat):
            for name, src in trees if round_ % 2 == 0 else trees[::-1]:
                counts[name].append(instructions(src, config, scratch, opts))
                print(f"round {round_ + 1}: {name}: {counts[name][-1]:,.0f}", flush=True)
        if not opts.no_syscalls:
            for name, src in trees:
                calls[name] = syscalls(src, config, scratch, opts)
    print(f"\nper plain request ({opts.requests} sequential keep-alive, after {opts.warmup})")
    for name, _ in trees:
        runs = " / ".join(f"{c / 1000:,.0f}k" for c in counts[name])
        line = f"{name:>14}: {statistics.median(counts[name]) / 1000:,.1f}k instructions ({runs})"
        if name in calls:
            kinds = ", ".join(f"{k} {v:.2f}" for k, v in sorted(calls[name].items()))
            line += f"; {sum(calls[name].values()):.2f} system calls ({kinds})"
        print(line)


if __name__ == "__main__":
    main()

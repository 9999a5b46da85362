"""What one plain (or streamed) request costs the gateway, in counts a busy machine cannot move.

Wall-clock CPU per request on a shared 2-core box moves by 10-30% between runs of
the same tree; these figures do not:

- user-space instructions per request, in total and by shared object (the
  interpreter, uvloop, llhttp, xxhash, ``_json``, libc, and mypyc's compiled
  modules when the tree has them): ``kvgate serve`` under callgrind
  (``--instr-atstart=no``), instrumentation switched on for ``--requests``
  sequential keep-alive plain requests after ``--warmup`` (the same tree repeats
  within about 1%), split by ``callgrind_annotate``;
- system calls per request, by kind: ``strace -c -f`` on a plain ``kvgate serve``
  over the same requests (each one a kernel entry, a few microseconds here).

The gateway runs ``--policy`` (round robin by default, as ``overhead.py``) in front
of two mock workers (``kvgate.bench.mock_worker``) with its health checks an hour apart (each
probe round under callgrind would add ~30k instructions a request).
``--kvgate-src NAME=SRC`` measures other source trees beside this one (first on
``PYTHONPATH``, so a mypyc build's extension modules load in place of the ``.py``
files), interleaved over ``--repeat`` rounds (the order reversed every other
round). ``--keep DIR`` keeps callgrind's files there. ``--py-spy SECONDS`` samples
each tree's gateway with py-spy (``pip install py-spy``) instead, for a split by
Python module. Needs Debian's ``valgrind`` and ``strace``; a tree takes about a
minute (the gateway starts some 50x slower under callgrind).

With ``--stream`` each request is a streamed completion instead (``"stream": true``,
no ``stream_options``: the gateway asks the worker for usage and strips it, as on
the benchmarks' streams): the workers send ``--events`` SSE events, each its own
write ``--gap-ms`` apart (so they reach the gateway one by one even under
callgrind, as tokens do), then the usage event and ``[DONE]`` in one last write
(right after the last event, so the two often arrive together: about 16 chunks a
stream of 16 events).
The client parses the gateway's chunked framing and counts the chunks relayed;
the figures are per streamed request and per relayed chunk (that count, so a
gateway that coalesced events would show it, not hide it).

    .venv/bin/python benchmarks/instructions.py
    .venv/bin/python benchmarks/instructions.py --stream --requests 300 --warmup 100
    .venv/bin/python benchmarks/instructions.py --kvgate-src before=/tmp/base/src --repeat 2
    .venv/bin/python benchmarks/instructions.py --py-spy 20
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
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from kvgate.testing import free_port, wait_until_sync

MOCK = ("-m", "kvgate.bench.mock_worker")
BODY = b'{"model":"demo","prompt":"hello world","max_tokens":4}'
STREAM_BODY = b'{"model":"demo","prompt":"hello world","max_tokens":16,"stream":true}'


def _post(body: bytes) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


REQUEST = _post(BODY)
STREAM_REQUEST = _post(STREAM_BODY)


def _answered(port: int, path: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5) as sock:
            sock.sendall(
                b"GET %s HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n" % path.encode()
            )
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


@contextlib.contextmanager
def started(
    argv: list[str], port: int, ready: str, log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A process, once ``GET ready`` on ``port`` answers 200; stopped (SIGTERM) after
    the block. One that exits or never gets ready ends the run with its log's tail."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        with contextlib.suppress(TimeoutError):
            wait_until_sync(
                lambda: proc.poll() is not None or _answered(port, ready), timeout=300, interval=0.5
            )
        if proc.poll() is not None or not _answered(port, ready):
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"{argv[0]} did not get ready on {port}{ready}:\n{tail}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def send_plain(port: int, count: int) -> None:
    """``count`` plain requests one after another on one keep-alive connection."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            sock.sendall(REQUEST)
            data = b""
            while b"\r\n\r\n" not in data:
                data += _recv(sock)
            head, _, rest = data.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"gateway answered {head[:80]!r}")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            if length is None:
                raise SystemExit(f"gateway answered without a length: {head[:200]!r}")
            while len(rest) < int(length[1]):
                rest += _recv(sock)


def send_stream(port: int, count: int) -> int:
    """``count`` streamed requests one after another on one keep-alive connection, each
    read to its last chunk; the number of chunks (events, whole or not) relayed in all."""
    chunks = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = b""
        for _ in range(count):
            sock.sendall(STREAM_REQUEST)
            while b"\r\n\r\n" not in data:
                data += _recv(sock)
            head, _, data = data.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"gateway answered {head[:80]!r}")
            if not re.search(rb"(?i)\r\ntransfer-encoding: *chunked", head):
                raise SystemExit(f"gateway answered a stream unchunked: {head[:200]!r}")
            while True:
                while b"\r\n" not in data:
                    data += _recv(sock)
                size_line, _, data = data.partition(b"\r\n")
                size = int(size_line.split(b";", 1)[0], 16)
                while len(data) < size + 2:
                    data += _recv(sock)
                data = data[size + 2 :]
                if size == 0:
                    break
                chunks += 1
    return chunks


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise SystemExit("gateway closed the connection")
    return chunk


def _serve(
    src: str | None, config: Path, port: int, policy: str
) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    argv = [sys.executable, "-m", "kvgate.cli", "serve", "--config", str(config)]
    argv += ["--port", str(port), "--policy", policy, "--processes", "1", "--server", "llhttp"]
    return argv, env


def _control(pid: int, *args: str) -> None:
    """Send callgrind in process ``pid`` a command (``-i on``, ``-i off``, ``-d``)."""
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def dump_total(text: str) -> int:
    """A callgrind file's instruction count; 0 while it is not written whole (the
    ``totals:`` line closes it; ``summary:`` in the head is 0 in a dump on request)."""
    found = re.findall(r"^(?:summary|totals): (\d+)", text, re.M)
    return max(map(int, found), default=0) if re.search(r"^totals:", text, re.M) else 0


def send(port: int, count: int, opts: argparse.Namespace) -> int:
    """``count`` requests of the kind measured (``--stream`` or plain); chunks relayed."""
    if opts.stream:
        return send_stream(port, count)
    send_plain(port, count)
    return 0


def instructions(
    src: str | None, config: Path, out: Path, opts: argparse.Namespace
) -> tuple[int, dict[str, int], int]:
    """User-space instructions of the gateway from ``src`` over ``--requests`` requests:
    the total, the exclusive count of each shared object, and the chunks relayed."""
    port = free_port()
    argv, env = _serve(src, config, port, opts.policy)
    grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    for stale in _dumps(out):  # of an earlier run into the same --keep folder
        stale.unlink()
    with started([*grind, *argv], port, "/readyz", out.with_suffix(".log"), env) as proc:
        send(port, opts.warmup, opts)
        _control(proc.pid, "-i", "on")
        chunks = send(port, opts.requests, opts)
        _control(proc.pid, "-i", "off")
        _control(proc.pid, "-d")  # dump the counts now, not at exit
        wait_until_sync(
            lambda: any(dump_total(d.read_text(errors="replace")) for d in _dumps(out)),
            timeout=120,
            interval=0.5,
            message="callgrind's dump",
        )
    total = 0
    objects: dict[str, int] = defaultdict(int)
    for dump in _dumps(out):
        if dump_total(dump.read_text(errors="replace")):
            count, split = by_object(dump)
            total += count
            for label, n in split.items():
                objects[label] += n
    return total, dict(objects), chunks


def _dumps(out: Path) -> list[Path]:
    """callgrind's dumps on request into ``out`` (``out.1``, ...)."""
    return sorted(out.parent.glob(f"{out.name}.*"))


def by_object(out_file: Path) -> tuple[int, dict[str, int]]:
    """Total instructions and the exclusive count of each shared object."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", str(out_file)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return split_objects(text)


def split_objects(text: str) -> tuple[int, dict[str, int]]:
    """``callgrind_annotate --inclusive=no`` output -> (total, instructions by object)."""
    total_match = re.search(r"^\s*([\d,]+).*PROGRAM TOTALS", text, re.M)
    if total_match is None:
        raise SystemExit(f"could not read callgrind_annotate's totals:\n{text[:2000]}")
    total = int(total_match[1].replace(",", ""))
    objects: dict[str, int] = defaultdict(int)
    line = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+(\S+?):(.+?)(?: \[(.+)\])?$", re.M)
    for match in line.finditer(text):
        count = int(match[1].replace(",", ""))
        name = _object_name(match[4]) if match[4] else _object_name(match[2], match[3])
        objects[name] += count
    return total, dict(objects)


def _object_name(path: str, function: str = "") -> str:
    """Group a shared object's path under a short name; for code inlined from a source
    file (no object named), by that file's path or the function it was inlined into
    (CPython's headers inline into every extension module: ``__pyx_f_6uvloop_...``)."""
    name = Path(path).name
    if "__mypyc" in name or ("kvgate" in path and ".so" in name):
        return "kvgate compiled (mypyc)"
    for key, label in (
        ("uvloop", "uvloop"),
        ("httptools", "httptools/llhttp"),
        ("xxhash", "xxhash"),
        ("_json", "_json"),
        ("pydantic_core", "pydantic_core"),
        ("yarl", "yarl"),
        ("multidict", "multidict"),
        ("propcache", "propcache"),
        ("aiohttp", "aiohttp"),
        ("libc.so", "libc"),
        ("libc-", "libc"),
        ("ld-linux", "ld.so"),
        ("libpython", "interpreter"),
        ("Python-3", "interpreter"),
        ("/lib-dynload/", "stdlib C modules"),
        ("vgpreload", "valgrind"),
    ):
        if key in path or key in function:
            return label
    return name


def syscalls(
    src: str | None, config: Path, scratch: Path, opts: argparse.Namespace
) -> dict[str, float]:
    """System calls per request of the gateway from ``src``, by name."""
    port = free_port()
    argv, env = _serve(src, config, port, opts.policy)
    report = scratch / f"strace.{port}"
    with started(argv, port, "/readyz", scratch / f"strace.{port}.log", env) as proc:
        send(port, opts.warmup, opts)
        tracer = subprocess.Popen(
            ["strace", "-f", "-c", "-o", str(report), "-p", str(proc.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached to every thread
        send(port, opts.requests, opts)
        tracer.terminate()
        tracer.wait(30)
    return split_syscalls(report.read_text(), opts.requests)


def split_syscalls(report: str, requests: int) -> dict[str, float]:
    """``strace -c`` output -> calls per request by name (the ones of at least 0.01)."""
    calls: dict[str, float] = {}
    for line in report.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            calls[parts[-1]] = int(parts[3]) / requests
    return {name: n for name, n in calls.items() if n >= 0.01}


GROUPS = (
    ("kvgate/core/", "core"),
    ("kvgate/gateway/observe/", "gateway/observe"),
    ("kvgate/gateway/dataplane/", "gateway/dataplane"),
    ("kvgate/gateway/upstream/", "gateway/upstream"),
    ("kvgate/gateway/", "gateway (other)"),
    ("kvgate/", "kvgate (other)"),
    ("asyncio/", "asyncio"),
    ("aiohttp/", "aiohttp"),
    ("prometheus_client/", "prometheus_client"),
    ("pydantic", "pydantic"),
)


SYSCALLS = {"write", "send", "sendto", "writev", "read", "recv", "recvfrom", "epoll_wait"}


def split_samples(raw: str) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """py-spy's raw output (``frame;frame;... count``, innermost last) -> samples by the
    innermost frame's group (system calls apart), by the innermost kvgate frame's group,
    and by the innermost kvgate module."""
    leaf: dict[str, int] = defaultdict(int)
    owner: dict[str, int] = defaultdict(int)
    modules: dict[str, int] = defaultdict(int)
    for row in raw.splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack:
            continue
        files = re.findall(r"\(([^():]+\.py)(?::\d+)?\)", stack)
        if stack.rsplit(";", 1)[-1].split(" ", 1)[0] in SYSCALLS:
            leaf["system calls (kernel time)"] += int(count)
            continue
        leaf[_group(files[-1]) if files else "native, no Python frame"] += int(count)
        mine = [f for f in files if "kvgate/" in f]
        owner[_group(mine[-1]) if mine else "no kvgate frame"] += int(count)
        if mine:
            modules[mine[-1].split("kvgate/", 1)[1]] += int(count)
    return dict(leaf), dict(owner), dict(modules)


def _group(path: str) -> str:
    for key, label in GROUPS:
        if key in path:
            return label
    return "other Python (stdlib, libraries)"


def _py_spy() -> str:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else "py-spy"


def python_split(
    name: str, src: str | None, config: Path, scratch: Path, opts: argparse.Namespace
) -> None:
    """Sample the gateway from ``src`` with py-spy (``--native``, samples holding the
    GIL) while it serves sequential plain requests; print the share of samples in system
    calls, and of the rest by the module group of the innermost Python frame (its
    bytecode and the C functions it calls) and by the innermost kvgate module on the stack."""
    port = free_port()
    argv, env = _serve(src, config, port, opts.policy)
    out = scratch / f"py-spy.{port}.txt"
    with started(argv, port, "/readyz", scratch / f"py-spy.{port}.log", env) as proc:
        send(port, opts.warmup, opts)
        spy = [_py_spy(), "record", "--pid", str(proc.pid), "--rate", "500", "--format", "raw"]
        spy += ["--gil", "--native", "--duration", str(opts.py_spy), "--output", str(out)]
        sampler = subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while sampler.poll() is None:
            send(port, 200, opts)
    leaf, owner, modules = split_samples(out.read_text())
    total = sum(leaf.values()) or 1
    print(f"{name}: py-spy, {total} samples at c=1")
    for title, table in (
        ("by the innermost frame", leaf),
        ("outside system calls, by the innermost kvgate frame", owner),
        ("outside system calls, the innermost kvgate module", modules),
    ):
        print(f"  {title}:")
        rows = sorted(table.items(), key=lambda item: -item[1])
        for label, count in rows[:14]:
            print(f"    {label:<44}{100 * count / total:>6.1f}%")


def _print_objects(objects: dict[str, int], requests: int) -> None:
    total = sum(objects.values()) or 1
    for label, count in sorted(objects.items(), key=lambda item: -item[1]):
        if count / total >= 0.002:
            print(f"  {label:<28}{count / requests / 1e3:>8.1f}k {100 * count / total:>6.1f}%")


def main() -> None:
    """Parse options, start the workers, measure every tree, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds")
    parser.add_argument("--policy", default="round_robin", help="as overhead.py's default")
    parser.add_argument("--stream", action="store_true", help="streamed requests, not plain")
    parser.add_argument("--events", type=int, default=16, help="SSE events per stream")
    parser.add_argument(
        "--gap-ms", type=float, default=5.0, help="the workers' pause between events"
    )
    parser.add_argument(
        "--kvgate-src",
        action="append",
        default=[],
        metavar="NAME=SRC",
        help="also measure kvgate from this source tree (repeatable)",
    )
    parser.add_argument("--no-syscalls", action="store_true", help="skip the strace count")
    parser.add_argument(
        "--py-spy",
        type=int,
        default=0,
        metavar="SECONDS",
        help="instead of callgrind and strace, sample with py-spy this long (by Python module)",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep callgrind's files here")
    opts = parser.parse_args()
    if opts.py_spy:
        tools: tuple[str, ...] = (_py_spy(),)
    else:
        tools = ("valgrind", "callgrind_control", "callgrind_annotate")
        tools += () if opts.no_syscalls else ("strace",)
    for tool in tools:
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (Debian: apt-get install -y valgrind strace; pip: py-spy)")
    trees: list[tuple[str, str | None]] = [
        (name, path) for name, _, path in (s.partition("=") for s in opts.kvgate_src)
    ]
    trees.append(("this tree", None))
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvgate-ir-")))
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            argv = [sys.executable, *MOCK, "--port", str(port), "--events", str(opts.events)]
            argv += ["--gap-ms", str(opts.gap_ms if opts.stream else 0.0)]
            stack.enter_context(started(argv, port, "/health", scratch / f"worker{i}.log"))
        config = scratch / "gateway.yaml"
        config.write_text(
            "health: {interval_s: 3600.0}\nworkers:\n"
            + "".join(f'  - {{url: "http://127.0.0.1:{port}"}}\n' for port in ports)
        )
        if opts.py_spy:
            for name, src in trees:
                python_split(name, src, config, scratch, opts)
            return
        keep = opts.keep or scratch
        keep.mkdir(parents=True, exist_ok=True)
        counts: dict[str, list[int]] = {name: [] for name, _ in trees}
        relayed: dict[str, list[int]] = {name: [] for name, _ in trees}
        objects: dict[str, dict[str, int]] = {name: defaultdict(int) for name, _ in trees}
        calls: dict[str, dict[str, float]] = {}
        for round_ in range(opts.repeat):
            for name, src in trees if round_ % 2 == 0 else trees[::-1]:
                slug = re.sub(r"[^\w.-]+", "-", name)
                out = keep.resolve() / f"callgrind.{slug}.{round_ + 1}.out"
                begun = time.monotonic()
                total, split, chunks = instructions(src, config, out, opts)
                counts[name].append(total)
                relayed[name].append(chunks)
                for label, n in split.items():
                    objects[name][label] += n
                seconds = time.monotonic() - begun
                per_request = f"{total / opts.requests:,.0f}"
                if chunks:
                    per_request += f", {total / chunks:,.0f} a chunk of {chunks / opts.requests:g}"
                print(f"round {round_ + 1}: {name}: {per_request} ({seconds:.0f} s)", flush=True)
        if not opts.no_syscalls:
            for name, src in trees:
                calls[name] = syscalls(src, config, scratch, opts)
    kind = f"streamed request ({opts.events} events)" if opts.stream else "plain request"
    print(f"\nper {kind} ({opts.requests} sequential keep-alive, after {opts.warmup})")
    for name, _ in trees:
        runs = " / ".join(f"{c / opts.requests / 1000:,.0f}k" for c in counts[name])
        median = statistics.median(counts[name]) / opts.requests / 1000
        line = f"{name:>14}: {median:,.1f}k instructions ({runs})"
        if opts.stream:
            pairs = zip(counts[name], relayed[name], strict=True)
            per_chunk = statistics.median(c / max(n, 1) for c, n in pairs)
            chunks = statistics.median(relayed[name]) / opts.requests
            line += f", {per_chunk / 1000:,.1f}k a relayed chunk ({chunks:g} a stream)"
        if name in calls:
            kinds = ", ".join(f"{k} {v:.2f}" for k, v in sorted(calls[name].items()))
            line += f"; {sum(calls[name].values()):.2f} system calls ({kinds})"
        print(line)
    for name, _ in trees:
        print(f"\n{name}, by shared object (mean of {opts.repeat} round(s)):")
        _print_objects(objects[name], opts.requests * opts.repeat)
    if opts.keep:
        print(f"\ncallgrind's files: {opts.keep}")


if __name__ == "__main__":
    main()

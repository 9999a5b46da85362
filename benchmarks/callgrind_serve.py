"""Instructions per plain request of a ``kvgate serve`` process, counted by callgrind.

Contention on a shared machine moves wall-clock CPU per request by 10-20%; an
instruction count does not move. This starts two mock workers
(``mock_worker.py``) and ``kvgate serve`` under ``valgrind --tool=callgrind
--instr-atstart=no``, sends ``--warmup`` sequential keep-alive plain requests
with instrumentation off, switches it on (``callgrind_control -i on``) for
``--requests`` more, and prints user-space instructions per request, in total and
by shared object (the interpreter, uvloop, llhttp, xxhash, ``_json``, libc, and
mypyc's compiled modules when the tree has them), from ``callgrind_annotate``.

    .venv/bin/python benchmarks/callgrind_serve.py
    .venv/bin/python benchmarks/callgrind_serve.py --src before=/tmp/pure/src --src after=src

With ``--src NAME=SRC`` the gateway runs from that source tree (``PYTHONPATH``),
one tree after another, so a before/after is one command. Needs Debian's
``valgrind``; a run takes about a minute (the gateway starts some 50x slower).
``--py-spy SECONDS`` samples the gateway with py-spy (``pip install py-spy``)
instead, for a split by Python module.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from kvgate.testing import free_port, wait_until_sync

MOCK = str(Path(__file__).with_name("mock_worker.py"))
BODY = b'{"model":"demo","prompt":"hello world","max_tokens":4}'


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def _process(
    argv: list[str], ready_url: str, log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        with contextlib.suppress(TimeoutError):
            wait_until_sync(
                lambda: proc.poll() is not None or _ok(ready_url), timeout=300, interval=0.5
            )
        if proc.poll() is not None or not _ok(ready_url):
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"{argv[0]} did not get ready at {ready_url}:\n{tail}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def send(port: int, count: int) -> None:
    """``count`` sequential plain requests on one keep-alive connection."""
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(count):
            sock.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data:
                data += _recv(sock)
            head, _, rest = data.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"gateway answered {head[:80]!r}")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
            while len(rest) < length:
                rest += _recv(sock)


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise SystemExit("gateway closed the connection")
    return chunk


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
    line = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+(\S+?):.+?(?: \[(.+)\])?$", re.M)
    for match in line.finditer(text):
        count = int(match[1].replace(",", ""))
        objects[_object_name(match[3] or match[2])] += count
    return total, dict(objects)


def _object_name(path: str) -> str:
    """Group a shared object's path (or, for inlined code, a source file's) under a short name."""
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
        if key in path:
            return label
    return name


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


def python_split(pid: int, port: int, opts: argparse.Namespace, out: Path) -> None:
    """Sample the gateway with py-spy (``--native``, samples holding the GIL) while it
    serves sequential plain requests; print the share of samples in system calls, and of
    the rest by the module group of the innermost Python frame (its bytecode and the C
    functions it calls) and by the innermost kvgate module on the stack."""
    beside = Path(sys.executable).with_name("py-spy")
    argv = [
        str(beside) if beside.exists() else "py-spy",
        "record",
        "--pid",
        str(pid),
        "--rate",
        "500",
        "--format",
        "raw",
        "--gil",
        "--native",
    ]
    argv += ["--duration", str(opts.py_spy), "--output", str(out)]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while spy.poll() is None:
        send(port, 200)
    leaf, owner, modules = split_samples(out.read_text())
    total = sum(leaf.values()) or 1
    print(f"py-spy: {total} samples at c=1")
    for title, table in (
        ("by the innermost frame", leaf),
        ("outside system calls, by the innermost kvgate frame", owner),
        ("outside system calls, the innermost kvgate module", modules),
    ):
        print(f"  {title}:")
        rows = sorted(table.items(), key=lambda item: -item[1])
        for label, count in rows[:14]:
            print(f"    {label:<44}{100 * count / total:>6.1f}%")


def _group(path: str) -> str:
    for key, label in GROUPS:
        if key in path:
            return label
    return "other Python (stdlib, libraries)"


def _control(switch: str, pid: int) -> None:
    """Switch callgrind's instrumentation of ``pid`` on or off."""
    subprocess.run(["callgrind_control", "-i", switch, str(pid)], check=True, capture_output=True)


def measure(name: str, src: str | None, opts: argparse.Namespace, scratch: Path) -> int:
    """Run one tree's gateway under callgrind; print and return instructions per request."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    workers = []
    with contextlib.ExitStack() as stack:
        for i in range(2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            argv = [sys.executable, MOCK, "--port", str(port)]
            stack.enter_context(_process(argv, url + "/health", scratch / f"w{i}.log"))
            workers.append(url)
        gport = free_port()
        out_file = scratch / f"callgrind.{name}.out"
        argv = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out_file}",
            sys.executable,
            "-m",
            "kvgate.cli",
            "serve",
            "--port",
            str(gport),
            "--policy",
            opts.policy,
            "--processes",
            "1",
        ]
        if opts.py_spy:
            argv = argv[argv.index(sys.executable) :]
        for url in workers:
            argv += ["--worker", url]
        gateway = stack.enter_context(
            _process(argv, f"http://127.0.0.1:{gport}/readyz", scratch / f"{name}.log", env)
        )
        send(gport, opts.warmup)
        if opts.py_spy:
            python_split(gateway.pid, gport, opts, scratch / f"py-spy.{name}.txt")
            return 0
        _control("on", gateway.pid)
        started = time.monotonic()
        send(gport, opts.requests)
        _control("off", gateway.pid)
        seconds = time.monotonic() - started
    total, objects = by_object(out_file)
    per_request = total / opts.requests
    print(f"{name}: {per_request / 1e3:,.0f}k instructions per request ({seconds:.0f} s)")
    for label, count in sorted(objects.items(), key=lambda item: -item[1]):
        if count / total >= 0.002:
            share = 100 * count / total
            print(f"  {label:<28}{count / opts.requests / 1e3:>8.1f}k {share:>6.1f}%")
    if opts.keep:
        print(f"  callgrind output: {out_file}")
    return round(per_request)


def main() -> None:
    """Parse options and measure each tree."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--policy", default="round_robin", help="as overhead.py's default")
    parser.add_argument(
        "--src",
        action="append",
        default=[],
        metavar="NAME=SRC",
        help="run the gateway from this source tree (repeatable; default: the installed one)",
    )
    parser.add_argument(
        "--py-spy",
        type=int,
        default=0,
        metavar="SECONDS",
        help="instead of callgrind, sample with py-spy this long (a split by Python module)",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep callgrind files here")
    opts = parser.parse_args()
    trees = [tuple(item.split("=", 1)) for item in opts.src] or [("installed", None)]
    with tempfile.TemporaryDirectory() as tmp:
        scratch = opts.keep or Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        for name, src in trees:
            measure(name, src, opts, scratch)


if __name__ == "__main__":
    main()

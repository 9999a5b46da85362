"""A copy of ``src`` with the request path compiled by mypyc, out of tree, for measuring.

Issue 17 asked whether compiling the hot pure-Python modules pays. This builds
the experiment that answered it: it copies ``src`` to ``DEST/src`` (never
building in the checkout, so no compiled ``.so`` can shadow an edited ``.py``
there), applies to the copy the small rewrites mypyc needs (listed in
``rewrite``), and compiles ``MODULES`` with ``mypyc`` (PyPI ``mypy``, the test
extra). Then measure the copy beside the tree it came from:

    .venv/bin/python benchmarks/mypyc_tree.py --dest /tmp/kvgate-mypyc
    .venv/bin/python benchmarks/instructions.py --kvgate-src mypyc=/tmp/kvgate-mypyc/src
    .venv/bin/python benchmarks/overhead.py --side-by-side --servers llhttp --routers kvgate \\
        --concurrency 1,32 --duration 3 --repeat 2 --kvgate-src before=src \\
        --kvgate-src after=/tmp/kvgate-mypyc/src

(``--kvgate-src`` puts the copy first on ``PYTHONPATH``; the extension modules
beside the ``.py`` files load in their place; ``instructions.py`` measures this
tree beside it.) Takes 2.5 to 7 minutes on two cores.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

MODULES = (
    "kvgate/core/chain.py",
    "kvgate/core/decision.py",
    "kvgate/core/features.py",
    "kvgate/core/hashing.py",
    "kvgate/core/holders.py",
    "kvgate/core/policies/claims.py",
    "kvgate/core/policies/lives.py",
    "kvgate/core/policies/running.py",
    "kvgate/core/route.py",
    "kvgate/core/session.py",
    "kvgate/core/speed.py",
    "kvgate/core/slotmap.py",
    "kvgate/core/versions.py",
    "kvgate/core/window.py",
    "kvgate/gateway/dataplane/errors.py",
    "kvgate/gateway/dataplane/exchange.py",
    "kvgate/gateway/dataplane/http_answer.py",
    "kvgate/gateway/dataplane/models.py",
    "kvgate/gateway/dataplane/queue.py",
    "kvgate/gateway/dataplane/relay.py",
    "kvgate/gateway/dataplane/retry.py",
    "kvgate/gateway/dataplane/router.py",
    "kvgate/gateway/dataplane/usage.py",
    "kvgate/gateway/observe/cells.py",
    "kvgate/gateway/observe/logs.py",
    "kvgate/gateway/observe/metrics.py",
    "kvgate/gateway/observe/pool.py",
    "kvgate/gateway/observe/traffic.py",
    "kvgate/gateway/timers.py",
    "kvgate/gateway/upstream/http1.py",
    "kvgate/types.py",
)
"""Compiled: the plain request's path, less what mypyc cannot take (``LEFT_OUT``)."""

LEFT_OUT = {
    "every module with a pydantic model (all policies' configs, prefix.py's FeatureConfig, "
    "pressure, admission, outlier, gates, prefix_index, registry, rollout*)": (
        "mypyc checks a field's default against its annotation at import: "
        "'float object expected; got FieldInfo', native_class=False or not"
    ),
    "core/policy.py": "@runtime_checkable refuses a compiled Protocol",
    "core/fleet.py, core/routed.py": (
        "WorkerState and Routed are copied through their instance dict (the fourth pass); "
        "a native class has none, and mypyc's frozen dataclass keeps the interpreted "
        "__init__ (17 object.__setattr__), so compiled they cost more"
    ),
    "gateway/dataplane/listener.py": "mypyc crashes on a closure in a non-native class",
    "gateway/dataplane/proxy.py": "'continue inside try/finally block is unimplemented'",
    "gateway/upstream/transport.py": "'async generators are unimplemented'",
    "gateway/dataplane/connection.py, middleware.py, passthrough.py": (
        "aiohttp subclasses and decorators (and not on the llhttp request path)"
    ),
}
"""What is not compiled, and why."""

_NON_NATIVE_BASES = re.compile(
    r"^(class \w+\([^)]*\b(?:Protocol|BufferedProtocol|Enum|IntEnum|StrEnum)\b[^)]*\):)", re.M
)


def rewrite(text: str) -> str:
    """The changes mypyc needs in one module, none of which changes what it does.

    - Protocol and Enum classes become non-native (``mypyc_attr(native_class=False)``).
    - ``import asyncio.protocols`` beside ``asyncio.Protocol`` subclasses: without it
      the generated C names a module it never declared.
    - ``self._thread`` renamed: mypyc prefixes attribute names with ``_``, and
      ``__thread`` is a C keyword.
    """
    text, marked = _NON_NATIVE_BASES.subn(r"@mypyc_attr(native_class=False)\n\1", text)
    if marked:
        text = text.replace(
            "from __future__ import annotations\n",
            "from __future__ import annotations\n\nfrom mypy_extensions import mypyc_attr\n",
            1,
        )
    if "asyncio.Protocol" in text or "asyncio.BufferedProtocol" in text:
        text = re.sub(
            r"^import asyncio$",
            "import asyncio\nimport asyncio.protocols",
            text,
            count=1,
            flags=re.M,
        )
    return re.sub(r"\bself\._thread\b", "self._loop_thread", text)


def build(src: Path, dest: Path) -> float:
    """Copy ``src`` to ``dest/src``, rewrite and compile ``MODULES``; the seconds it took."""
    tree = dest / "src"
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(src, tree, ignore=shutil.ignore_patterns("__pycache__", "*.so", "build"))
    for module in MODULES:
        path = tree / module
        path.write_text(rewrite(path.read_text()))
    mypyc = Path(sys.executable).with_name("mypyc")
    started = time.monotonic()
    with (dest / "build.log").open("w") as log:
        done = subprocess.run([str(mypyc), *MODULES], check=False, cwd=tree, stdout=log, stderr=log)
    if done.returncode:
        raise SystemExit(f"mypyc failed: see {dest / 'build.log'}")
    return time.monotonic() - started


def main() -> None:
    """Parse options, build, check the copy imports, say how to measure it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", type=Path, default=SRC, help="the tree to copy")
    parser.add_argument("--dest", type=Path, default=Path("/tmp/kvgate-mypyc"))
    opts = parser.parse_args()
    opts.dest.mkdir(parents=True, exist_ok=True)
    seconds = build(opts.src.resolve(), opts.dest)
    probe = "import kvgate.cli, kvgate.core.route as r; print(r.__file__)"
    env = {"PYTHONPATH": str(opts.dest / "src")}
    where = subprocess.run(
        [sys.executable, "-c", probe], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    print(f"compiled {len(MODULES)} modules in {seconds:.0f} s; kvgate.core.route: {where}")
    for what, why in LEFT_OUT.items():
        print(f"  not compiled: {what}: {why}")


if __name__ == "__main__":
    main()

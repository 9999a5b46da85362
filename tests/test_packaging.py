"""The package builds, passes ``twine check``, and the gateway runs without the sim extras."""

from __future__ import annotations

import subprocess
import sys
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

"""The docs check: every command of the README's path from the demo to Kubernetes is exercised.

Commands that run offline in seconds are run here for real; the others name the
test that exercises them, and that test must exist. What cannot run here (a
cluster for ``kubectl apply``, an image registry for the base image) is listed
in ``NEEDS_OUTSIDE`` with what is checked in its place.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## From the demo to Kubernetes in front of vLLM"
KVGATE = str(Path(sys.executable).parent / "kvgate")

EXERCISED_BY = {
    "bash scripts/demo.sh":
        "tests/test_demo.py::test_demo_command_prints_the_table_and_writes_results",
    ".venv/bin/kvgate worker-sim --port 8001 --model llama-3.1-8b":
        "tests/workersim/test_command.py::test_serves_until_terminated",
    ".venv/bin/kvgate serve --worker http://127.0.0.1:8001 --port 8000":
        "tests/gateway/test_server.py::test_sigterm_drains_streams_refuses_new_requests_and_exits_zero",
    "KVGATE_ADMIN_TOKEN=s3cret .venv/bin/kvgate serve --config deploy/base/kvgate.yaml "
    "--log-level debug": "tests/test_readme.py::test_step_3_serves_the_base_config_and_reloads",
    'curl -X POST -H "Authorization: Bearer s3cret" http://127.0.0.1:8000/admin/reload':
        "tests/test_readme.py::test_step_3_serves_the_base_config_and_reloads",
    "podman build -t kvgate:0.1.0 .":
        "tests/test_deploy.py::test_the_dockerfile_runs_the_gateway_unprivileged_with_a_healthcheck",
    "kubectl kustomize deploy/examples/vllm":
        "tests/test_readme.py::test_step_5_renders_the_vllm_example",
    "kubectl apply -k deploy/examples/vllm":
        "tests/test_deploy.py::test_every_resource_validates_against_the_kubernetes_schemas",
    "kubectl -n llm port-forward svc/kvgate 8000:8000":
        "tests/test_deploy.py::test_the_vllm_example_discovers_the_headless_vllm_service",
}  # fmt: skip

NEEDS_OUTSIDE = {
    "podman build -t kvgate:0.1.0 .": "a base image from a registry (checked: the Dockerfile; "
    "built for real with KVGATE_IMAGE_TEST=1)",
    "kubectl apply -k deploy/examples/vllm": "a cluster (checked: the same kustomization "
    "rendered and validated against the schemas)",
    "kubectl -n llm port-forward svc/kvgate 8000:8000": "a cluster (checked: the Service "
    "and namespace it names exist in the example)",
}


def section_commands() -> list[str]:
    """The command lines in the section's ```bash blocks."""
    text = (ROOT / "README.md").read_text()
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", body, re.S):
        commands += [line.strip() for line in block.splitlines() if line.strip()]
    return commands


def test_every_command_is_exercised_by_a_named_test() -> None:
    commands = section_commands()
    assert commands, "the README lost its path from the demo to Kubernetes"
    assert sorted(commands) == sorted(EXERCISED_BY), "README commands and EXERCISED_BY differ"
    for command in commands:
        path, _, name = EXERCISED_BY[command].partition("::")
        source = (ROOT / path).read_text()
        assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{path} has no {name}"
    assert set(NEEDS_OUTSIDE) <= set(commands)


PICKER_SECTION = "## Behind an Envoy-based gateway: kvgate as the endpoint picker"
PICKER_EXERCISED_BY = {
    ".venv/bin/kvgate epp --worker http://127.0.0.1:8001 --port 9002": "tests/gateway/epp/"
    "test_command.py::test_kvgate_epp_serves_health_and_picks_then_drains_on_sigterm",
    "kubectl kustomize deploy/overlays/inference-pool":
        "tests/test_deploy.py::test_the_inference_pool_overlay_routes_through_the_picker",
}  # fmt: skip


def test_the_endpoint_picker_sections_commands_are_exercised_by_named_tests() -> None:
    text = (ROOT / "README.md").read_text()
    body = text.split(PICKER_SECTION, 1)[1].split("\n## ", 1)[0]
    commands = [
        line.strip()
        for block in re.findall(r"```bash\n(.*?)```", body, re.S)
        for line in block.splitlines()
        if line.strip()
    ]
    assert sorted(commands) == sorted(PICKER_EXERCISED_BY)
    for command in commands:
        path, _, name = PICKER_EXERCISED_BY[command].partition("::")
        source = (ROOT / path).read_text()
        assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{path} has no {name}"


def test_step_5_renders_the_vllm_example() -> None:
    (command,) = [c for c in section_commands() if c.startswith("kubectl kustomize")]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl not found: scripts/test.sh installs it")
    args = shlex.split(command)
    out = subprocess.run(
        [kubectl, *args[1:]], cwd=ROOT, check=True, capture_output=True, text=True, timeout=60
    )
    assert "kind: Deployment" in out.stdout and "name: vllm" in out.stdout


def test_step_3_serves_the_base_config_and_reloads() -> None:
    (serve,) = [c for c in section_commands() if "--config deploy/base" in c]
    env_part, *argv = shlex.split(serve)
    name, _, value = env_part.partition("=")
    env = {**os.environ, name: value}
    argv[0] = KVGATE
    proc = subprocess.Popen(
        [*argv, "--port", "0"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            if found := re.search(r"listening on http://[^:]+:(\d+)", line):
                url = f"http://127.0.0.1:{found.group(1)}"
        assert url is not None, "the gateway did not start"
        (curl,) = [c for c in section_commands() if c.startswith("curl")]
        token = re.search(r"Bearer (\S+?)\"", curl)
        assert token is not None and token.group(1) == value
        reload = urllib.request.Request(
            url + "/admin/reload", method="POST", headers={"Authorization": f"Bearer {value}"}
        )
        with urllib.request.urlopen(reload, timeout=10) as resp:
            assert resp.status == 200
        try:
            urllib.request.urlopen(url + "/readyz", timeout=10)
        except urllib.error.HTTPError as exc:  # no worker behind the DNS name here: 503
            assert exc.code == 503
        else:
            raise AssertionError("/readyz answered ready with no workers")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0

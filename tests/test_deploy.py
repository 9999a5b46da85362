"""The container image and the Kubernetes manifests: they render, validate, and agree.

``kubectl kustomize`` renders every kustomization (``scripts/test.sh`` installs
kubectl where it is missing) and ``kubernetes-validate`` checks each resource
against the Kubernetes schemas; the ServiceMonitor (a CRD without a schema
there) is checked against the Service it selects. The configuration each
ConfigMap carries is validated by kvgate's own config models.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvgate.gateway.config import parse_config

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZATIONS = [
    "deploy/base",
    "deploy/overlays/redis",
    "deploy/overlays/inference-pool",
    "deploy/examples/vllm",
]
CRD_GROUPS = (
    "monitoring.coreos.com/",
    "inference.networking.k8s.io/",
    "gateway.networking.k8s.io/",
)
"""Custom resources: no schema in kubernetes-validate's (offline) set; each is checked below
against what it refers to, and the InferencePool against its published v1 field rules."""
K8S_VERSION = "1.30.0"


def _kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: scripts/test.sh installs it (Debian kubernetes-client)")
    return found


def render(path: str) -> list[dict[str, Any]]:
    """``kubectl kustomize path`` as a list of resources."""
    out = subprocess.run(
        [_kubectl(), "kustomize", str(ROOT / path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def _find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for doc in docs:
        found = doc["metadata"]["name"]
        hashed = kind == "ConfigMap" and found.startswith(name + "-")  # generator suffix
        if doc["kind"] == kind and (found == name or hashed):
            return doc
    raise AssertionError(f"no {kind} {name}")


@pytest.fixture(scope="module", params=KUSTOMIZATIONS)
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


def test_every_resource_validates_against_the_kubernetes_schemas(
    rendered: list[dict[str, Any]],
) -> None:
    checked = 0
    for doc in rendered:
        if doc["apiVersion"].startswith(CRD_GROUPS):
            continue  # a CRD: checked below against what it selects
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked += 1
    assert checked >= 5  # base: ConfigMap, Secret, Service, Deployment, PDB


def test_the_gateway_pod_probes_drains_and_runs_unprivileged(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    deployment = _find(rendered, "Deployment", "kvgate")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = (c for c in pod["containers"] if c["name"] == "kvgate")
    ready, live = container["readinessProbe"], container["livenessProbe"]
    if "grpc" in ready:  # the endpoint picker: gRPC health, the services it answers for
        assert (ready["grpc"]["service"], live["grpc"]["service"]) == ("readiness", "liveness")
        ports = {p["containerPort"] for p in container["ports"]}
        assert ready["grpc"]["port"] in ports and live["grpc"]["port"] in ports
    else:
        assert ready["httpGet"]["path"] == "/readyz"
        assert live["httpGet"]["path"] == "/healthz"
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    config = _gateway_config(rendered, tmp_path)
    assert pod["terminationGracePeriodSeconds"] > pause + config.drain_timeout_s
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # the Secret the pod reads exists, with the key it reads
    secret = _find(rendered, "Secret", "kvgate-secrets")
    for env in container["env"]:
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            assert ref["name"] == secret["metadata"]["name"]
            assert ref["key"] in secret["stringData"]
    pdb = _find(rendered, "PodDisruptionBudget", "kvgate")
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]


def test_the_service_monitor_selects_the_gateway_service(rendered: list[dict[str, Any]]) -> None:
    monitor = _find(rendered, "ServiceMonitor", "kvgate")
    service = _find(rendered, "Service", "kvgate")
    wanted = monitor["spec"]["selector"]["matchLabels"]
    assert wanted.items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def _gateway_config(rendered: list[dict[str, Any]], tmp: Path | None = None) -> Any:
    config_map = _find(rendered, "ConfigMap", "kvgate-config")
    text = config_map["data"]["kvgate.yaml"]
    if tmp is not None:  # the Secret's mount, here as files
        (tmp / "api-keys").write_text("sk-test\n")
        text = text.replace("/etc/kvgate/secrets", str(tmp))
    env = {"KVGATE_ADMIN_TOKEN": "t", "KVGATE_STORE_URL": "redis://kvgate-redis:6379/0"}
    return parse_config(yaml.safe_load(text), env)


def test_the_configmaps_hold_valid_gateway_configs(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    config = _gateway_config(rendered, tmp_path)
    assert config.listen.host == "0.0.0.0"
    assert config.admin_token == "t"
    found = config.discovery.dns or config.discovery.inference_pools
    assert found, "the gateway finds its workers through DNS or an InferencePool"


def test_the_vllm_example_discovers_the_headless_vllm_service(tmp_path: Path) -> None:
    docs = render("deploy/examples/vllm")
    service = _find(docs, "Service", "vllm")
    assert service["spec"]["clusterIP"] == "None"
    namespace = service["metadata"]["namespace"]
    config = _gateway_config(docs, tmp_path)
    (target,) = config.discovery.dns
    assert target.name == f"vllm.{namespace}.svc.cluster.local"
    assert target.port == service["spec"]["ports"][0]["port"]
    vllm = _find(docs, "Deployment", "vllm")["spec"]["template"]["spec"]["containers"][0]
    served = next(a.split("=", 1)[1] for a in vllm["args"] if a.startswith("--served-model-name"))
    assert target.model == served  # the model kvgate expects is the one vLLM serves
    # The KV event ports kvgate follows are the ones vLLM publishes on and the Service opens.
    events = json.loads(next(a.split("=", 1)[1] for a in vllm["args"] if "kv-events" in a))
    assert events["endpoint"].endswith(f":{target.kv_events_port}")
    assert events["replay_endpoint"].endswith(f":{target.kv_events_replay_port}")
    opened = {p["port"] for p in service["spec"]["ports"]}
    assert {target.kv_events_port, target.kv_events_replay_port} <= opened
    assert config.tokenizers[served].kind == "worker"
    assert config.api_keys == ["sk-test"]
    gateway = _find(docs, "Deployment", "kvgate")["spec"]["template"]["spec"]["containers"][0]
    store = {e["name"]: e.get("value") for e in gateway["env"]}["KVGATE_STORE_URL"]
    assert store == "redis://kvgate-redis:6379/0"
    _find(docs, "Service", "kvgate-redis")


def test_the_inference_pool_overlay_routes_through_the_picker(tmp_path: Path) -> None:
    docs = render("deploy/overlays/inference-pool")
    pool = _find(docs, "InferencePool", "vllm-llama3-8b")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    spec = pool["spec"]
    # The v1 API's field rules (its CRD is not available offline; these are its published ones)
    assert set(spec) <= {"selector", "targetPorts", "endpointPickerRef"}
    labels = spec["selector"]["matchLabels"]
    assert 1 <= len(labels) <= 64 and set(spec["selector"]) == {"matchLabels"}
    (port,) = spec["targetPorts"]  # exactly one
    assert set(port) == {"number"} and 1 <= port["number"] <= 65535
    ref = spec["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service" and ref.get("group", "") == ""
    assert ref.get("failureMode", "FailClose") in ("FailOpen", "FailClose")
    # ... naming the picker's Service on its gRPC port, which reaches the container's
    service = _find(docs, "Service", ref["name"])
    (grpc_port,) = (p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    deployment = _find(docs, "Deployment", "kvgate")
    pod = deployment["spec"]["template"]
    (container,) = (c for c in pod["spec"]["containers"] if c["name"] == "kvgate")
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[grpc_port["targetPort"]] == ref["port"]["number"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert not labels.items() <= pod["metadata"]["labels"].items()  # the pool is not the picker
    assert container["command"] == ["kvgate", "epp"]
    # The route's backend is the pool
    route = _find(docs, "HTTPRoute", "llm")
    backends = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert backends == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "vllm-llama3-8b"}
    ]
    assert route["spec"]["parentRefs"]
    # The picker's config listens where the pool says, and watches this pool's pods ...
    config = _gateway_config(docs, tmp_path)
    assert config.epp.port == ref["port"]["number"]
    assert [p.name for p in config.discovery.inference_pools] == ["vllm-llama3-8b"]
    pool_target = config.discovery.inference_pools[0]
    assert (pool_target.kv_events_port, pool_target.kv_events_replay_port) == (5557, 5558)
    assert config.store.url.startswith("redis://")  # replicas are active-active over Redis
    # ... with a service account allowed to read exactly that
    assert pod["spec"]["serviceAccountName"] == "kvgate-epp"
    role = _find(docs, "Role", "kvgate-epp")
    grants = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    assert {
        ("inference.networking.k8s.io", "inferencepools", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
    } == grants
    binding = _find(docs, "RoleBinding", "kvgate-epp")
    assert binding["subjects"][0]["name"] == "kvgate-epp"


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_dockerfile_runs_the_gateway_unprivileged_with_a_healthcheck() -> None:
    steps = _instructions(ROOT / "Dockerfile")
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    words = dict(final)
    user = words["USER"].split(":")[0]
    assert user.isdigit() and int(user) >= 1000  # numeric: runAsNonRoot can check it
    assert yaml.safe_load(words["ENTRYPOINT"]) == ["kvgate", "serve"]
    assert "/healthz" in words["HEALTHCHECK"]
    assert words["EXPOSE"] == "8000"
    for _, source in (s for s in steps if s[0] == "COPY" and "--from" not in s[1]):
        for item in source.split()[:-1]:
            assert (ROOT / item).exists(), item
    # the image's default config parses (given its one required secret)
    text = (ROOT / "deploy/base/kvgate.yaml").read_text()
    assert parse_config(yaml.safe_load(text), {"KVGATE_ADMIN_TOKEN": "t"}).store.url == "memory"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ignored[ignored.index("*") + 1 :][:4] == [
        "!pyproject.toml",
        "!README.md",
        "!LICENSE",
        "!src/",
    ]


@pytest.mark.skipif(
    not os.environ.get("KVGATE_IMAGE_TEST"), reason="set KVGATE_IMAGE_TEST=1 to build the image"
)
def test_the_image_builds_and_serves() -> None:  # pragma: no cover - needs podman and a base
    base = os.environ.get("KVGATE_IMAGE_BASE", "python:3.11-slim-bookworm")
    extra = shlex.split(os.environ.get("KVGATE_IMAGE_BUILD_ARGS", ""))  # e.g. --isolation chroot
    subprocess.run(
        ["podman", "build", *extra, "--build-arg", f"BASE={base}", "-t", "kvgate:test", str(ROOT)],
        check=True,
        timeout=900,
    )
    out = subprocess.run(
        ["podman", "run", "--rm", "--entrypoint", "kvgate", "kvgate:test", "--version"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    from kvgate import __version__

    assert out.stdout.strip() == f"kvgate {__version__}"

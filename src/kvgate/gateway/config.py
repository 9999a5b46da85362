"""The gateway's configuration: one YAML file validated by typed models.

Every option has a default that works on one machine with no external service,
so ``kvgate serve --worker URL`` needs nothing else. Unknown keys and bad values
are refused at start-up with a message naming the key.

Example ``kvgate.yaml``::

    listen: {host: 0.0.0.0, port: 8000}
    policy: {name: prefix_affinity, options: {}}
    store: {url: "redis://127.0.0.1:6379/0"}
    workers:
      - {url: "http://10.0.0.5:8000", model: llama-3-8b, version: v2.1}
      - {url: "http://10.0.0.6:8000", dcgm_url: "http://10.0.0.6:9400/metrics"}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from yarl import URL

from kvgate.core.admission import AdmissionConfig
from kvgate.core.outlier import HealthCheckConfig, OutlierConfig
from kvgate.core.policies import DEFAULT_POLICY, default_registry, with_feature_blocks
from kvgate.core.prefix import FeatureConfig
from kvgate.core.pressure import MigrationCostModel, PressureConfig
from kvgate.gateway.control.config import (
    AdminConfig,
    ModelVersionsConfig,
    RolloutsConfig,
    is_loopback,
)


class ConfigError(ValueError):
    """The configuration is unreadable or invalid; the message names the key."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_url(value: str) -> str:
    """An http(s) URL with a host (and a valid port), no query or fragment; no "/" at the end.

    What a worker URL must be before it is probed or forwarded to: ``http://``
    alone, ``http://:80`` or ``http://h:99999`` would only fail later, per request.
    """
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"must be an http(s) URL, got {value!r}")
    if any(c.isspace() or ord(c) < 0x20 for c in value):
        raise ValueError(
            f"must be an http(s) URL without spaces or control characters, got {value!r}"
        )
    try:
        url = URL(value)
        port = url.port
    except (ValueError, TypeError):
        raise ValueError(f"not a valid URL: {value!r}") from None
    if not url.host:
        raise ValueError(f"must name a host, got {value!r}")
    if port is None or not 0 < port < 65536:
        raise ValueError(f"must have a port from 1 to 65535, got {value!r}")
    if url.query_string or url.fragment:
        raise ValueError(f"must have no query or fragment, got {value!r}")
    return value.rstrip("/")


class WorkerConfig(_Model):
    """One worker: where it is and what it serves (learned from /v1/models if unset)."""

    url: str
    name: str | None = Field(default=None, min_length=1, max_length=64)
    """What clients see in ``X-Kvgate-Worker`` (default: an id derived from the URL)."""
    model: str | None = None
    version: str | None = None
    metrics_url: str | None = None
    dcgm_url: str | None = None
    max_in_flight: int | None = Field(default=None, ge=1)
    """Overrides ``admission.worker_max_in_flight`` for this worker."""
    labels: dict[str, str] = Field(default_factory=dict)
    api_key: str | None = None
    offload_url: str | None = None

    _url = field_validator("url")(_check_url)

    @field_validator("metrics_url", "dcgm_url", "offload_url")
    @classmethod
    def _optional_url(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value)

    @property
    def scrape_url(self) -> str:
        """The worker's engine metrics endpoint (``url + /metrics`` by default)."""
        return self.metrics_url or f"{self.url}/metrics"

    @property
    def offload_endpoint(self) -> str:
        """Where to ask the worker to offload sessions' KV (``url + /kv/offload`` by default)."""
        return self.offload_url or f"{self.url}/kv/offload"


class ListenConfig(_Model):
    """Where the gateway listens and how many server processes share the port."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    processes: int = Field(default=1, ge=1, le=256)


class PolicyConfig(_Model):
    """The routing policy, chosen by name from the registry, and its options."""

    name: str = DEFAULT_POLICY
    options: dict[str, Any] = Field(default_factory=dict)


class StoreConfig(_Model):
    """Where affinities live: ``memory`` (one process) or ``redis://HOST:PORT/DB``."""

    url: str = "memory"
    affinity_ttl_s: float = Field(default=3600.0, gt=0)

    @field_validator("url")
    @classmethod
    def _store_url(cls, value: str) -> str:
        if value != "memory" and not value.startswith(("redis://", "rediss://")):
            raise ValueError(f"must be 'memory' or a redis:// URL, got {value!r}")
        return value


class TimeoutsConfig(_Model):
    """Upstream timeouts in seconds: connect, first byte (and between bytes), whole request."""

    connect_s: float = Field(default=2.0, gt=0)
    first_byte_s: float = Field(default=120.0, gt=0)
    total_s: float = Field(default=600.0, gt=0)


class RetriesConfig(_Model):
    """Retries on another worker before the first byte, within an Envoy-style budget."""

    count: int = Field(default=2, ge=0)
    budget_ratio: float = Field(default=0.2, ge=0, le=1)
    budget_min: int = Field(default=3, ge=0)
    backoff_base_s: float = Field(default=0.025, ge=0)
    backoff_max_s: float = Field(default=0.25, ge=0)


class HealthConfig(_Model):
    """Active checks: ``GET /health`` plus a metrics scrape on an interval.

    ``fall`` failed probes in a row take a worker out, ``rise`` passed ones bring
    it back (HAProxy).
    """

    interval_s: float = Field(default=2.0, gt=0)
    timeout_s: float = Field(default=1.0, gt=0)
    stale_after_s: float | None = Field(default=None, gt=0)
    """Scraped signals older than this count as unknown; default three intervals."""
    fall: int = Field(default=3, ge=1)
    rise: int = Field(default=2, ge=1)
    max_scrape_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """A worker's metrics page larger than this is not read (its signals are unknown)."""

    @property
    def stale_after(self) -> float:
        """The effective staleness limit in seconds."""
        return self.stale_after_s if self.stale_after_s is not None else 3 * self.interval_s

    def tracker_config(self) -> HealthCheckConfig:
        """The ``fall``/``rise`` thresholds for ``core.outlier.HealthTracker``."""
        return HealthCheckConfig(fall=self.fall, rise=self.rise, initially_healthy=True)


class LimitsConfig(_Model):
    """Request limits: sizes (413 over the body limit, 431 over the header limits), read
    deadlines (408 and the connection closed) and connections per client address (429)."""

    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1)
    max_header_bytes: int = Field(default=8190, ge=256)
    max_headers: int = Field(default=128, ge=1)
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A request's head must be complete this long after the connection opened (or after
    its first byte on a kept-alive connection)."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """A request's body must be complete this long after its head."""
    keepalive_s: float = Field(default=75.0, gt=0)
    """An idle kept-alive client connection is closed after this long."""
    max_connections_per_client: int = Field(default=1024, ge=0)
    """Open connections from one client address (0: no bound)."""


class PressureSettings(PressureConfig):
    """The ``pressure:`` section: watermarks (``core.pressure``) and how the gateway acts.

    With ``enabled: false`` every worker stays ``NORMAL`` and nothing is migrated.
    ``relieve_interval_s`` spaces migration rounds on one ``HARD`` worker (default:
    the health interval, i.e. at most one round per scrape).
    """

    enabled: bool = True
    migration: MigrationCostModel = Field(default_factory=MigrationCostModel)
    max_sessions_scanned: int = Field(default=1000, ge=1)
    relieve_interval_s: float | None = Field(default=None, gt=0)
    offload: bool = True
    offload_timeout_s: float = Field(default=2.0, gt=0)
    tracked_sessions: int = Field(default=65_536, ge=1)
    default_context_tokens: int = Field(default=1024, ge=1)
    kv_gate_max_wait_s: float = Field(default=10.0, gt=0)
    """Longest a request is held for KV headroom on its worker before it is sent anyway."""


class GatewayConfig(_Model):
    """The whole gateway configuration (the root of ``kvgate.yaml``)."""

    listen: ListenConfig = Field(default_factory=ListenConfig)
    workers: list[WorkerConfig] = Field(default_factory=list)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    features: FeatureConfig = Field(default_factory=FeatureConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    retries: RetriesConfig = Field(default_factory=RetriesConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    outlier: OutlierConfig = Field(default_factory=OutlierConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    pressure: PressureSettings = Field(default_factory=PressureSettings)
    api_keys: list[str] = Field(default_factory=list)
    metrics_auth: Literal["open", "api_key", "admin_token"] | None = None
    """Who may read ``/metrics``: anyone, a client API key, or the admin token. Unset: a
    client API key when ``api_keys`` are set (the fleet's names and load are not public),
    else open."""
    expose_worker_urls: bool = False
    """``X-Kvgate-Worker`` names the worker by its URL (else by its ``name`` or an id)."""
    admin_token: str | None = None
    response_headers: bool = True
    stream_usage: bool = True
    """Ask workers for ``usage`` on every stream (the policy's cache feedback); a client
    that did not set ``stream_options.include_usage`` still gets no usage chunk."""
    json_logs: bool = False
    access_log: bool = True
    """One line per request on the ``kvgate.access`` logger (JSON with ``json_logs``)."""
    metrics_created: bool = False
    """Export prometheus_client's ``*_created`` series (noise for most dashboards)."""
    drain_timeout_s: float = Field(default=30.0, ge=0)
    seed: int = 0
    models: dict[str, ModelVersionsConfig] = Field(default_factory=dict)
    rollouts: RolloutsConfig = Field(default_factory=RolloutsConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)

    @field_validator("workers")
    @classmethod
    def _unique_workers(cls, value: list[WorkerConfig]) -> list[WorkerConfig]:
        seen: set[str] = set()
        for worker in value:
            if worker.url in seen:
                raise ValueError(f"worker {worker.url} listed twice")
            seen.add(worker.url)
        return value

    @model_validator(mode="after")
    def _metrics_auth_has_a_secret(self) -> GatewayConfig:
        if self.metrics_auth == "api_key" and not self.api_keys:
            raise ValueError("metrics_auth: 'api_key' needs api_keys")
        if self.metrics_auth == "admin_token" and not self.admin_token:
            raise ValueError("metrics_auth: 'admin_token' needs admin_token")
        return self

    @property
    def metrics_keys(self) -> list[str]:
        """The bearer tokens that may read ``/metrics`` (empty: open)."""
        auth = self.metrics_auth or ("api_key" if self.api_keys else "open")
        if auth == "api_key":
            return list(self.api_keys)
        if auth == "admin_token" and self.admin_token:
            return [self.admin_token]
        return []

    @model_validator(mode="after")
    def _admin_needs_token(self) -> GatewayConfig:
        # The admin API moves traffic between model versions: never open to a network.
        if self.admin.enabled and not self.admin_token and not is_loopback(self.listen.host):
            raise ValueError(
                f"admin_token: required when the admin API is enabled and listen.host "
                f"{self.listen.host!r} is not a loopback address (set admin_token, or "
                "admin.enabled: false)"
            )
        return self

    @model_validator(mode="after")
    def _index_blocks_match_features(self) -> GatewayConfig:
        # A prefix index counting other blocks than the features hash never matches.
        self.policy_options()
        return self

    def policy_options(self) -> dict[str, Any]:
        """The policy's options, its prefix index sized by ``features`` (see
        ``core.policies.with_feature_blocks``); ``ValueError`` when they disagree."""
        registry = default_registry()
        if self.policy.name not in registry:
            return dict(self.policy.options)  # refused by name when the gateway starts
        return with_feature_blocks(registry, self.policy.name, self.policy.options, self.features)


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(part) for part in err["loc"]) or "(root)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{key}: {msg}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def parse_config(data: Mapping[str, Any] | None) -> GatewayConfig:
    """Validate a configuration mapping; raise ``ConfigError`` naming bad keys."""
    try:
        return GatewayConfig.model_validate(dict(data or {}))
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a YAML configuration file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError(f"config {path}: the top level must be a mapping")
    return parse_config(data)


def with_overrides(
    config: GatewayConfig,
    *,
    workers: Sequence[str] = (),
    policy: str | None = None,
    host: str | None = None,
    port: int | None = None,
    store: str | None = None,
    processes: int | None = None,
    json_logs: bool | None = None,
) -> GatewayConfig:
    """``config`` with command-line options applied on top (validated again)."""
    data = config.model_dump(mode="python")
    if workers:
        data["workers"] = [{"url": url} for url in workers]
    if policy is not None and policy != config.policy.name:
        data["policy"] = {"name": policy, "options": {}}
    if json_logs is not None:
        data["json_logs"] = json_logs
    listen = data["listen"]
    if host is not None:
        listen["host"] = host
    if port is not None:
        listen["port"] = port
    if processes is not None:
        listen["processes"] = processes
    if store is not None:
        data["store"]["url"] = store
    return parse_config(data)

"""The gateway's configuration: one YAML file validated by typed models.

Every option has a default that works on one machine with no external service,
so ``kvgate serve --worker URL`` needs nothing else. Unknown keys and bad values
are refused at start-up with a message naming the key.

Example ``kvgate.yaml``::

    listen: {host: 0.0.0.0, port: 8000}
    policy: {name: prefix_affinity, options: {}}
    store: {url: "redis://redis:6379/0", password_file: /run/secrets/redis-password}
    admin_token: "${KVGATE_ADMIN_TOKEN}"      # from the environment
    discovery: {dns: [{name: vllm.default.svc.cluster.local, port: 8000}]}
    workers:
      - {url: "http://10.0.0.5:8000", model: llama-3-8b, version: v2.1}
      - {url: "http://10.0.0.6:8000", dcgm_url: "http://10.0.0.6:9400/metrics"}
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from kvgate.core.hints import resolved
from kvgate.core.outlier import HealthCheckConfig, OutlierConfig
from kvgate.core.policies import DEFAULT_POLICY, default_registry, with_feature_blocks
from kvgate.core.prefix import FeatureConfig
from kvgate.core.pressure import MigrationCostModel, PressureConfig
from kvgate.core.registry import PolicyRegistry
from kvgate.core.session import HeaderScope
from kvgate.gateway import secrets
from kvgate.gateway.apikeys import ApiKey, keyed_hints, secrets_of
from kvgate.gateway.control.config import (
    AdminConfig,
    DiscoveryConfig,
    ModelVersionsConfig,
    RolloutsConfig,
    is_loopback,
)
from kvgate.gateway.storeconfig import StoreConfig
from kvgate.redaction import redact, without_userinfo
from kvgate.tokens.config import TokenizerConfig

LogLevel = Literal["debug", "info", "warning", "error"]


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
        raise ValueError(f"must be an http(s) URL, got {redact(value)!r}")
    if any(c.isspace() or ord(c) < 0x20 for c in value):
        raise ValueError(
            f"must be an http(s) URL without spaces or control characters, got {redact(value)!r}"
        )
    try:
        url = URL(value)
        port = url.port
    except (ValueError, TypeError):
        raise ValueError(f"not a valid URL: {redact(value)!r}") from None
    if not url.host:
        raise ValueError(f"must name a host, got {redact(value)!r}")
    if port is None or not 0 < port < 65536:
        raise ValueError(f"must have a port from 1 to 65535, got {redact(value)!r}")
    if url.query_string or url.fragment:
        raise ValueError(f"must have no query or fragment, got {redact(value)!r}")
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
    api_key: str | None = Field(default=None, repr=False)
    """The worker's own key (``${ENV}``, ``api_key_file``), sent as its bearer token."""
    offload_url: str | None = None  # set: the worker keeps what it offloads (core.toolcalls)
    engine: Literal["openai", "llamacpp"] = "openai"
    """``llamacpp``: a llama.cpp server whose slots the gateway pins, saves and restores
    (``slots:`` section; the server needs ``--slot-save-path``)."""
    kv_events: str | None = Field(default=None, pattern=r"^tcp://[^\s]+:\d+$")
    """The worker's KV event publisher (vLLM's and SGLang's ``--kv-events-config``
    ``endpoint``), e.g. ``tcp://10.0.0.5:5557``: its cache is then known exactly."""
    kv_events_replay: str | None = Field(default=None, pattern=r"^tcp://[^\s]+:\d+$")
    """Its replay socket (``replay_endpoint``, e.g. ``tcp://10.0.0.5:5558``): gaps are
    asked for there; without it a gap clears what is known of the worker's cache."""

    _url = field_validator("url")(_check_url)

    @field_validator("metrics_url", "dcgm_url", "offload_url")
    @classmethod
    def _optional_url(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value)

    @property
    def id(self) -> str:
        """The worker's id: its URL without user information. Metrics labels, logs,
        admin views, the dashboard and ``X-Kvgate-Worker`` show this, never a password."""
        return without_userinfo(self.url)

    @property
    def scrape_url(self) -> str:
        """The worker's engine metrics endpoint (``url + /metrics`` by default)."""
        return self.metrics_url or f"{self.url}/metrics"

    @property
    def offload_endpoint(self) -> str:
        """Where to ask the worker to offload sessions' KV (``url + /kv/offload`` by default)."""
        return self.offload_url or f"{self.url}/kv/offload"


class ListenConfig(_Model):
    """Where the gateway listens and how many server processes share the port.

    ``processes`` unset means one per core available to the gateway when the
    store is shared (Redis), and one with the memory store: processes behind one
    port must agree on placement, and separate in-memory stores cannot.
    """

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    processes: int | None = Field(default=None, ge=1, le=256)
    server: Literal["llhttp", "aiohttp"] = "llhttp"
    """What serves the generation endpoints: the data plane's own protocol-level server
    on llhttp and uvloop (the default), which hands every other request's connection
    to aiohttp on the same port; or aiohttp's server, as for every other path."""


class PolicyConfig(_Model):
    """The routing policy, chosen by name from the registry, and its options."""

    name: str = DEFAULT_POLICY
    """One of the registered policies (an unknown name is refused at start-up)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The policy's own options (its config class in ``core/policies/``); live on reload."""


class TimeoutsConfig(_Model):
    """Upstream timeouts in seconds: connect, first byte (and between bytes), whole request."""

    connect_s: float = Field(default=2.0, gt=0)
    first_byte_s: float = Field(default=120.0, gt=0)
    total_s: float = Field(default=600.0, gt=0)


class RetriesConfig(_Model):
    """Retries on another worker before the first byte, within an Envoy-style budget.

    The budget (``budget_ratio`` of the requests in flight, at least ``budget_min``
    retries in flight) is shared fairly between tenants (an API key, or the session scope
    of ``features.session_scope``): each retry is charged to the tenant whose request
    needed it, and a tenant takes the budget's last free retries only while no other
    tenant with requests in flight holds fewer. One tenant's requests failing on every
    worker then leave the others their retries; with one tenant the budget is Envoy's.
    """

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


class SlotSettings(_Model):
    """The ``slots:`` section: llama.cpp slot offload and migration (``engine: llamacpp``).

    Every request to such a worker is pinned to a slot: its session's, else an idle one
    sharing most (over 10%) of its prefix, else an empty one seeded from a saved slot that
    shares it (or, bounded, the busy slot computing it), so a shared prefix is computed once.
    An idle session's slot is saved to a file before another takes it, and restored when it
    returns, here or on a worker reading the folder (``--slot-save-path``); saved slots reuse
    ``max_saved`` file names (bounded disk use), ``dir`` (the folder here) lets it delete.
    Gateway replicas sharing the workers and the folder through one store set
    ``replicas`` to their number: each claims an index in the store, pins only its
    share of every worker's slots (``slot % replicas == index``) and names its files
    ``<file_prefix>-r<index>-<cell>.bin``; a replica finding no index free refuses to
    start (or give each replica its own ``file_prefix``).

    Example::

        workers:
          - {url: "http://127.0.0.1:8081", engine: llamacpp}
        slots: {dir: /var/lib/kvgate/slots, max_saved: 64, max_bytes: 4294967296}
    """

    enabled: bool = True
    dir: str | None = None
    file_prefix: str = Field(default="kvgate", pattern=r"^[A-Za-z0-9_-]{1,40}$")
    replicas: int = Field(default=1, ge=1)
    """Gateway replicas sharing these workers' slots and save folder (one store)."""
    max_saved: int = Field(default=64, ge=1)
    max_bytes: int = Field(default=4 * 1024**3, ge=1)
    max_age_s: float = Field(default=3600.0, gt=0)
    action_timeout_s: float = Field(default=30.0, gt=0)


class EppConfig(_Model):
    """The endpoint picker (``kvgate epp``): Envoy's ext_proc over gRPC, beside the HTTP port.

    ``request_body_mode`` is assumed only when Envoy does not say its mode on the
    stream (``ProtocolConfiguration``, sent by recent Envoys); it must match the
    gateway's ``processingMode``. ``fallbacks``: endpoints after the picked one in
    the answer (same model and version), which the proxy tries in order. Example::

        epp: {port: 9002, fallbacks: 2, request_body_mode: full_duplex_streamed}
    """

    host: str | None = None
    """Address of the gRPC server (unset: ``listen.host``)."""
    port: int = Field(default=9002, ge=0, le=65535)
    fallbacks: int = Field(default=2, ge=0, le=16)
    request_body_mode: Literal["full_duplex_streamed", "buffered"] = "full_duplex_streamed"


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
    slots: SlotSettings = Field(default_factory=SlotSettings)
    discovery: DiscoveryConfig = Field(default_factory=DiscoveryConfig)
    model_aliases: dict[str, str] = Field(default_factory=dict)
    """Other names clients may use for a model: ``{gpt-4o-mini: llama-3-8b}``."""
    api_keys: list[str | ApiKey] = Field(default_factory=list, repr=False)
    """Client keys (``Authorization: Bearer``); none: the API is open. ``api_keys_file``.
    An entry may be ``{key, name, priority, client_hints}``: the key's own default
    priority and whether its hints are believed under ``client_hints: auto``
    (``gateway.apikeys``)."""
    metrics_auth: Literal["open", "api_key", "admin_token"] | None = None
    """Who may read ``/metrics``: anyone, a client API key, or the admin token. Unset: a
    client API key when ``api_keys`` are set (the fleet's names and load are not public),
    else open."""
    expose_worker_urls: bool = False
    """``X-Kvgate-Worker`` names the worker by its URL (else by its ``name`` or an id)."""
    admin_token: str | None = Field(default=None, repr=False)
    """The admin API's bearer token; required off loopback. ``admin_token_file`` or ``${ENV}``."""
    response_headers: bool = True
    """Add ``X-Kvgate-Worker``, ``-Model-Version``, ``-Route-Reason`` and ``-Request-ID``
    (the gateway's own id of the request, the key of its books) to answers."""
    stream_usage: bool = True
    """Ask workers for ``usage`` on every stream (the policy's cache feedback); a client
    that did not set ``stream_options.include_usage`` still gets no usage chunk."""
    json_logs: bool = False
    """One JSON line per request (access log) and per log record."""
    log_level: LogLevel = "info"
    """The process's log level (``kvgate serve --log-level``)."""
    access_log: bool = True
    """One line per request on the ``kvgate.access`` logger (JSON with ``json_logs``)."""
    metrics_created: bool = False
    """Export prometheus_client's ``*_created`` series (noise for most dashboards)."""
    drain_timeout_s: float = Field(default=30.0, ge=0)
    """On SIGTERM, and for removed workers: how long in-flight requests may finish."""
    seed: int = 0
    """Seeds the gateway's randomness (retry jitter, version splits by request id)."""
    models: dict[str, ModelVersionsConfig] = Field(default_factory=dict)
    tokenizers: dict[str, TokenizerConfig] = Field(default_factory=dict)
    """Per model, how its prompts become the engine's tokens (``kvgate.tokens``)."""
    rollouts: RolloutsConfig = Field(default_factory=RolloutsConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    epp: EppConfig = Field(default_factory=EppConfig)

    @field_validator("workers")
    @classmethod
    def _unique_workers(cls, value: list[WorkerConfig]) -> list[WorkerConfig]:
        seen: set[str] = set()
        for worker in value:
            if worker.id in seen:
                raise ValueError(f"worker {worker.id} listed twice")
            seen.add(worker.id)
        return value

    @field_validator("model_aliases")
    @classmethod
    def _plain_aliases(cls, value: dict[str, str]) -> dict[str, str]:
        for alias, target in value.items():
            if not alias or not target:
                raise ValueError("aliases and their models must be non-empty")
            if alias == target:
                raise ValueError(f"{alias!r} is an alias of itself")
            if target in value:
                raise ValueError(f"{alias!r} -> {target!r}: an alias must name a model")
        return value

    def features_in_force(self) -> FeatureConfig:
        """``features`` as the gateway runs them: ``client_hints: auto`` resolved (``none``
        with client ``api_keys`` or an identity header scope: several tenants)."""
        features = self.features
        tenants = bool(self.api_keys) or isinstance(features.session_scope, HeaderScope)
        trust = resolved(features.client_hints, tenants=tenants)
        own = keyed_hints(self.api_keys, features.client_hints, trust, features.default_priority)
        if own is not None:  # keys of their own settings: looked up per request
            return features.model_copy(update={"client_hints": own})
        if trust == features.client_hints:
            return features
        return features.model_copy(update={"client_hints": trust})

    @property
    def client_keys(self) -> list[str]:
        """The client API keys themselves (``api_keys`` without their settings)."""
        return secrets_of(self.api_keys)

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
            return self.client_keys
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
    def _slots_need_one_process(self) -> GatewayConfig:
        # Each process would pin and save the same slots without knowing of the others.
        llamacpp = any(w.engine == "llamacpp" for w in self.workers)
        if llamacpp and self.slots.enabled and self.server_processes() > 1:
            raise ValueError(
                "slots: llama.cpp slot offload keeps the slot map in one process; "
                "use listen.processes: 1, or slots.enabled: false"
            )
        return self

    @model_validator(mode="after")
    def _processes_share_a_store(self) -> GatewayConfig:
        # Each process would keep its own affinities, rollouts and drains: the same
        # session would land on different workers depending on which process the
        # kernel handed its connection to.
        if (self.listen.processes or 1) > 1 and self.store.url == "memory":
            raise ValueError(
                f"listen.processes: {self.listen.processes} processes cannot share the "
                "memory store (each would route on its own affinities); set store.url "
                "to a redis:// URL, or run one process"
            )
        return self

    def server_processes(self) -> int:
        """How many server processes to run: ``listen.processes``, or the default for the
        store (the cores this process may run on with Redis, one with the memory store)."""
        if self.listen.processes is not None:
            return self.listen.processes
        if self.store.url == "memory":
            return 1
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)

    @model_validator(mode="after")
    def _index_blocks_match_features(self) -> GatewayConfig:
        # A prefix index counting other blocks than the features hash never matches.
        self.policy_options()
        return self

    def policy_options(self, registry: PolicyRegistry | None = None) -> dict[str, Any]:
        """The policy's options in ``registry`` (default: the default one), its prefix index
        sized by ``features`` (``with_feature_blocks``); ``ValueError`` if they disagree."""
        registry = registry if registry is not None else default_registry()
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


def parse_config(
    data: Mapping[str, Any] | None, env: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Validate a configuration mapping; raise ``ConfigError`` naming bad keys.

    ``${NAME}`` and ``X_file`` values are resolved first (``gateway.secrets``),
    from ``env`` (default: the process environment).
    """
    try:
        resolved = secrets.resolve(dict(data or {}), env)
    except secrets.SecretError as exc:
        raise ConfigError(f"invalid configuration:\n  {exc}") from None
    try:
        return GatewayConfig.model_validate(resolved)
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
    server: str | None = None,
    json_logs: bool | None = None,
    log_level: str | None = None,
) -> GatewayConfig:
    """``config`` with command-line options applied on top (validated again)."""
    data = config.model_dump(mode="python", exclude={"discovery"})
    data["discovery"] = config.discovery
    if workers:
        data["workers"] = [{"url": url} for url in workers]
    if policy is not None and policy != config.policy.name:
        data["policy"] = {"name": policy, "options": {}}
    if json_logs is not None:
        data["json_logs"] = json_logs
    if log_level is not None:
        data["log_level"] = log_level.lower()
    listen = data["listen"]
    if host is not None:
        listen["host"] = host
    if port is not None:
        listen["port"] = port
    if processes is not None:
        listen["processes"] = processes
    if server is not None:
        listen["server"] = server
    if store is not None:
        data["store"]["url"] = store
    try:  # already resolved: a secret holding "${" must not be expanded again
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


@dataclass(frozen=True, slots=True)
class ConfigSource:
    """Where the configuration in force came from, so a reload can read it again.

    The file, plus the command-line options applied on top of it (they still
    win after a reload). Picklable: server processes get it when spawned.
    """

    path: Path
    overrides: tuple[tuple[str, Any], ...] = ()

    def __call__(self) -> GatewayConfig:
        """Read and validate the file again, with the same overrides."""
        return with_overrides(load_config(self.path), **dict(self.overrides))

"""Service discovery: workers found in DNS (or an ``InferencePool``, ``control.kube``),
joining and leaving without a restart.

Every ``discovery.interval_s`` each configured name is resolved (A and AAAA
records of a headless Service, or SRV records) and the result compared with the
workers this discovery added: new addresses are added through ``Membership``
(probed before they take traffic), vanished ones are removed through it
(drained: no new requests, in-flight ones finish). A lookup that fails
(timeout, SERVFAIL, no answer from any nameserver) changes nothing, so a DNS
hiccup never empties a fleet; a name that does not exist (NXDOMAIN) or has no
records of the type asked means its workers are gone.

Resolution uses dnspython's asyncio resolver: aiohttp's and asyncio's resolvers
go through ``getaddrinfo`` (no SRV, no choice of nameserver or port), and
aiodns would add a C dependency for the same answers.

The comparison is a pure function (``plan``); the loop only carries it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver

from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.control.config import DiscoveryConfig, DnsTarget, split_host_port
from kvgate.gateway.control.kube import PoolWatch, kv_event_endpoints
from kvgate.gateway.control.membership import Membership
from kvgate.gateway.dataplane.errors import GatewayError
from kvgate.tasks import cancel_and_wait

log = logging.getLogger("kvgate.gateway.control.discovery")


class LookupFailedError(Exception):
    """A DNS lookup got no usable answer (not the same as "no such name")."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What one discovery round changes: URLs to add (with their config), URLs to drain."""

    add: tuple[WorkerConfig, ...]
    remove: tuple[str, ...]


def worker_url(target: DnsTarget, host: str, port: int) -> str:
    """The base URL of a worker found at ``host:port`` (IPv6 in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"{target.scheme}://{shown}:{port}"


def worker_config(target: DnsTarget, url: str) -> WorkerConfig:
    """The worker config of one found address: the target's worker fields, this URL."""
    events, replay = kv_event_endpoints(url, target.kv_events_port, target.kv_events_replay_port)
    return WorkerConfig(
        url=url,
        model=target.model,
        version=target.version,
        api_key=target.api_key,
        labels={**target.labels, "discovered_from": target.name},
        max_in_flight=target.max_in_flight,
        kv_events=events,
        kv_events_replay=replay,
    )


def plan(
    owned: Mapping[str, str],
    found: Mapping[str, frozenset[str] | None],
    configs: Mapping[str, WorkerConfig],
    taken: Iterable[str],
) -> Plan:
    """Compare what discovery owns (URL -> name) with what each name resolved to now.

    ``found[name]`` is ``None`` when its lookup failed: that name's workers are
    kept. ``taken`` are URLs already in the pool that discovery does not own
    (static or admin-added): never added twice, never removed.
    """
    in_pool = set(taken)
    add: list[WorkerConfig] = []
    remove: list[str] = []
    for url, name in owned.items():
        urls = found.get(name)
        if urls is not None and url not in urls:
            remove.append(url)
    for urls in found.values():
        for url in sorted(urls or ()):
            if url not in owned and url not in in_pool:
                add.append(configs[url])
                in_pool.add(url)
    return Plan(tuple(add), tuple(sorted(remove)))


class DnsResolver:
    """A/AAAA and SRV lookups against the system's or the configured nameservers."""

    def __init__(self, config: DiscoveryConfig) -> None:
        self.resolver = dns.asyncresolver.Resolver(configure=not config.nameservers)
        if config.nameservers:
            servers: list[str | dns.nameserver.Nameserver] = []
            for text in config.nameservers:
                host, port = split_host_port(text, 53)
                servers.append(dns.nameserver.Do53Nameserver(host, port))
            self.resolver.nameservers = servers
        self.resolver.lifetime = config.timeout_s
        self.resolver.timeout = config.timeout_s

    async def addresses(self, target: DnsTarget) -> frozenset[str]:
        """The worker URLs ``target`` names now; ``LookupFailedError`` when DNS did not answer."""
        if target.record == "SRV":
            answers = await self._query(target.name, "SRV")
            found: set[str] = set()
            for record in answers:
                host = record.target.to_text().rstrip(".")
                found.add(worker_url(target, host, int(record.port)))
            return frozenset(found)
        assert target.port is not None  # validated: record A needs a port
        hosts: set[str] = set()
        for rdtype in ("A", "AAAA"):
            hosts.update(r.to_text() for r in await self._query(target.name, rdtype))
        return frozenset(worker_url(target, host, target.port) for host in hosts)

    async def _query(self, name: str, rdtype: str) -> list[Any]:
        try:
            answer = await self.resolver.resolve(name, rdtype, search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except (dns.exception.DNSException, OSError) as exc:
            raise LookupFailedError(f"{rdtype} {name}: {type(exc).__name__}: {exc}") from None
        return list(answer)


class Discovery:
    """Keeps the pool's discovered workers in step with DNS, every ``interval_s``."""

    def __init__(
        self,
        config: DiscoveryConfig,
        membership: Membership,
        resolver: DnsResolver | None = None,
    ) -> None:
        self.config = config
        self.membership = membership
        self.resolver = resolver or DnsResolver(config)
        self.owned: dict[str, str] = {}
        """URL -> the DNS name that found it, for the workers this discovery added."""
        self.rounds = 0
        self.failures = 0
        self._task: asyncio.Task[None] | None = None
        self.pools = [PoolWatch(target, membership) for target in config.inference_pools]
        """One list-and-watch per ``InferencePool`` (``control.kube``)."""

    async def resolve_once(self) -> Plan:
        """One round: resolve every name, add what appeared, drain what left."""
        found: dict[str, frozenset[str] | None] = {}
        configs: dict[str, WorkerConfig] = {}
        for target in self.config.dns:
            try:
                urls = await self.resolver.addresses(target)
            except LookupFailedError as exc:
                self.failures += 1
                log.warning("discovery: lookup failed, keeping its workers: %s", exc)
                found.setdefault(target.name, None)
                continue
            found[target.name] = (found.get(target.name) or frozenset()) | urls
            for url in urls:
                configs.setdefault(url, worker_config(target, url))
        pool = self.membership.pool
        taken = [w.id for w in pool if w.id not in self.owned]
        change = plan(self.owned, found, configs, taken)
        for url in change.remove:
            name = self.owned.pop(url)
            with contextlib.suppress(GatewayError):  # already removed by the admin API
                await self.membership.remove(url)
            log.info("discovery: worker %s left %s; draining it", url, name)
        for worker in change.add:
            name = worker.labels["discovered_from"]
            try:
                await self.membership.add(worker)
            except GatewayError as exc:
                log.warning("discovery: cannot add %s: %s", worker.url, exc)
                continue
            self.owned[worker.url] = name
            log.info("discovery: worker %s joined from %s", worker.url, name)
        self.rounds += 1
        return change

    def start(self) -> None:
        """Resolve now and then every ``interval_s`` in the background; watch the pools."""
        if self.config.dns and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="kvgate-discovery")
        for pool in self.pools:
            pool.start()

    async def _loop(self) -> None:
        while True:
            try:
                await self.resolve_once()
            except Exception:  # a bug here must not stop discovery for good
                log.exception("discovery round failed")
            await asyncio.sleep(self.config.interval_s)

    async def reconfigure(self, config: DiscoveryConfig) -> None:
        """Resolve with a new configuration from now on (a reload)."""
        await self.stop()
        self.config = config
        self.resolver = DnsResolver(config)
        self.pools = [PoolWatch(target, self.membership) for target in config.inference_pools]
        self.start()

    async def stop(self) -> None:
        """Stop resolving (the workers found stay in the pool until it closes)."""
        for pool in self.pools:
            await pool.stop()
        await cancel_and_wait(self._task)
        self._task = None

"""A real DNS server on loopback for discovery tests (``dnslib``), with records a test edits."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dnslib import AAAA, QTYPE, RCODE, RR, SRV, A, DNSLabel, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer


@dataclass
class Zone:
    """The records served: name -> A/AAAA addresses, name -> SRV (target, port) pairs."""

    a: dict[str, list[str]] = field(default_factory=dict)
    srv: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    failing: bool = False
    """Answer SERVFAIL to everything (a sick DNS server)."""
    queries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Resolver(BaseResolver):  # type: ignore[misc]
    def __init__(self, zone: Zone) -> None:
        self.zone = zone

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        reply = request.reply()
        name = str(request.q.qname).rstrip(".")
        qtype = QTYPE[request.q.qtype]
        zone = self.zone
        with zone.lock:
            zone.queries += 1
            if zone.failing:
                reply.header.rcode = RCODE.SERVFAIL
                return reply
            if name not in zone.a and name not in zone.srv:
                reply.header.rcode = RCODE.NXDOMAIN
                return reply
            if qtype == "SRV":
                for target, port in zone.srv.get(name, []):
                    rdata = SRV(priority=0, weight=1, port=port, target=DNSLabel(target))
                    reply.add_answer(RR(request.q.qname, QTYPE.SRV, rdata=rdata, ttl=1))
            for address in zone.a.get(name, []):
                if qtype == "A" and ":" not in address:
                    reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=1))
                elif qtype == "AAAA" and ":" in address:
                    reply.add_answer(RR(request.q.qname, QTYPE.AAAA, rdata=AAAA(address), ttl=1))
        return reply


@contextmanager
def dns_server() -> Iterator[tuple[Zone, str]]:
    """A UDP DNS server on a free loopback port; yields the zone and ``host:port``."""
    zone = Zone()
    server = DNSServer(
        _Resolver(zone), address="127.0.0.1", port=0, logger=DNSLogger("-request,-reply")
    )
    server.start_thread()
    try:
        port = server.server.server_address[1]
        yield zone, f"127.0.0.1:{port}"
    finally:
        server.stop()
        server.server.server_close()

"""Backends from DNS, through dnspython's asyncio resolver: every address of a name (A or AAAA
records, at the configured port), or every target and port of its SRV records (each target's
address looked up in turn), re-resolved every `interval_s`, sooner when the answer's TTL runs
out sooner (never more often than `min_interval_s`). A Kubernetes headless Service's name
answers with its ready pods' addresses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from gateway.backends.discovery.source import Found, url_of
from gateway.config.settings import DnsDiscovery

__all__ = ["DnsSource", "nameserver"]


def nameserver(spec: str) -> dns.nameserver.Do53Nameserver:
    """A DNS server given as host, host:port, [v6] or [v6]:port."""
    host, port = spec, 53
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else 53
    elif spec.count(":") == 1:
        host, _, number = spec.partition(":")
        port = int(number)
    return dns.nameserver.Do53Nameserver(host, port)


class DnsSource:
    def __init__(self, cfg: DnsDiscovery) -> None:
        self.cfg = cfg
        self.resolver = dns.asyncresolver.Resolver(configure=not cfg.nameservers)
        if cfg.nameservers:
            self.resolver.nameservers = [nameserver(s) for s in cfg.nameservers]
        self.resolver.lifetime = cfg.timeout_s
        self.resolver.cache = None  # each round asks the server: the TTL is honoured here

    async def resolve(self) -> tuple[frozenset[str], float]:
        """The backends' URLs now, and the answer's TTL in seconds."""
        cfg = self.cfg
        answer = await self.resolver.resolve(cfg.name, cfg.record, search=False)
        ttl = float(answer.rrset.ttl) if answer.rrset is not None else cfg.interval_s
        if cfg.record != "SRV":
            assert cfg.port is not None
            return frozenset(url_of(cfg.scheme, r.address, cfg.port) for r in answer), ttl
        urls: set[str] = set()
        for srv in answer:
            target = srv.target.to_text(omit_final_dot=True)
            addresses = await self.resolver.resolve(target, "A", search=False)
            ttl = min(ttl, float(addresses.rrset.ttl) if addresses.rrset else ttl)
            urls.update(url_of(cfg.scheme, a.address, srv.port) for a in addresses)
        return frozenset(urls), ttl

    async def answers(self) -> AsyncIterator[Found]:
        cfg = self.cfg
        while True:
            wait = cfg.interval_s
            try:
                urls, ttl = await self.resolve()
                wait = min(cfg.interval_s, max(cfg.min_interval_s, ttl))
                yield Found(urls)
            except (dns.exception.DNSException, OSError) as e:
                yield Found(error=f"{type(e).__name__}: {e}")
            await asyncio.sleep(wait)

    async def aclose(self) -> None:
        return None

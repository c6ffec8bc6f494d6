"""Which backends a request may go to at all: the first stage of every policy."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.routing.types import UNKNOWN_LOAD, Backend, LoadSnapshot, Role, RouteRequest

__all__ = ["eligible", "of_role", "pinned", "split_roles"]


def eligible(req: RouteRequest, snap: LoadSnapshot) -> list[Backend]:
    """Healthy, not excluded, serving the model; unique by url; in configuration order.

    A url listed twice counts once, by its first listing, even if that one is filtered out:
    the url is the backend's identity, so its two listings are the same engine.
    """
    out: list[Backend] = []
    exclude, model, get = req.exclude, req.model, snap.by_url.get
    if snap.distinct:  # no second listing to look for: no set built and searched per decision
        for b in snap.backends:
            url = b.url
            if model in b.models and get(url, UNKNOWN_LOAD).healthy and url not in exclude:
                out.append(b)
        return out
    seen: set[str] = set()
    for b in snap.backends:
        url = b.url
        if url in seen:
            continue
        seen.add(url)
        if model in b.models and get(url, UNKNOWN_LOAD).healthy and url not in exclude:
            out.append(b)
    return out


def of_role(pool: Iterable[Backend], role: Role) -> list[Backend]:
    return [b for b in pool if b.role is role]


def split_roles(pool: Sequence[Backend]) -> tuple[list[Backend], list[Backend]]:
    """(latency, throughput), each in the pool's order."""
    # Two comprehensions beat one loop of appends: this runs on every decision.
    latency = [b for b in pool if b.role is Role.LATENCY]
    return latency, [b for b in pool if b.role is not Role.LATENCY]


def pinned(req: RouteRequest, pool: list[Backend]) -> list[Backend]:
    """The pool an ``x-tiergate-tier`` pin leaves: strictly its tier, never a failover to the
    other one (an empty pool then, if the tier has no usable backend)."""
    return pool if req.pinned is None else of_role(pool, req.pinned)

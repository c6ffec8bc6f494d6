"""Which backends a request may go to at all: the first stage of every policy."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from gateway.routing.types import UNKNOWN_LOAD, Backend, LoadSnapshot, Role, RouteRequest

__all__ = ["eligible", "of_role", "pinned", "serving", "split_roles"]


def eligible(req: RouteRequest, snap: LoadSnapshot) -> list[Backend]:
    """Healthy, not excluded, serving the model; unique by url; in configuration order.

    A url listed twice counts once, by its first listing, even if that one is filtered out:
    the url is the backend's identity, so its two listings are the same engine.
    """
    # (A snapshot that lists each url once has no second listing to look for: no set built
    # and searched per decision.)
    listed = snap.backends if snap.distinct else _first_listings(snap.backends)
    return serving(req, listed, snap)


def serving(req: RouteRequest, backends: Iterable[Backend], snap: LoadSnapshot) -> list[Backend]:
    """Those of `backends` that are healthy in `snap`, not excluded and serve the request's
    model, in their order."""
    out: list[Backend] = []
    exclude, model, get = req.exclude, req.model, snap.by_url.get
    for b in backends:  # (a loop, not a comprehension: one frame less, on every decision)
        url = b.url
        if model in b.models and get(url, UNKNOWN_LOAD).healthy and url not in exclude:
            out.append(b)
    return out


def _first_listings(backends: Iterable[Backend]) -> Iterator[Backend]:
    seen: set[str] = set()
    for b in backends:
        if b.url not in seen:
            seen.add(b.url)
            yield b


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

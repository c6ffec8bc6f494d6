"""Tenants: who is calling, known by an API key.

Keys are configured as their SHA-256 only (`tiergate keys create` makes one and prints both), so
neither the config nor the gateway's memory holds a key. A presented key is hashed and looked
up by its hash; every presented key, right or wrong, costs the same steps: one SHA-256, one
dict probe, one constant-time comparison (against a digest no key has when nothing matched).
The plain `api_keys` of earlier configurations are tenants too, all named `default`.

Nothing here is logged with a key in it: a tenant is named by its name.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from gateway.config.settings import LimitsConfig, Settings
from gateway.routing import Slo

__all__ = ["ANONYMOUS", "Tenant", "Tenants", "hash_key", "new_key"]

_BEARER = b"bearer "
# No SHA-256 output is all zeros: what a key that matched nothing is compared against.
_NO_DIGEST = bytes(32)


@dataclass(frozen=True, slots=True, eq=False)
class Tenant:
    name: str
    rank: int  # priority: higher goes first (interactive 2, standard 1, batch 0)
    limits: LimitsConfig
    models: frozenset[str]  # the models it may use; empty: all
    slo: Slo | None  # its default SLO, None: the gateway's
    digest: bytes = _NO_DIGEST

    @property
    def limited(self) -> bool:
        lim = self.limits
        return bool(lim.requests_per_minute or lim.tokens_per_minute or lim.max_concurrent)


# Every request when the gateway asks for no key.
ANONYMOUS = Tenant("anonymous", 1, LimitsConfig(), frozenset(), None)
_NOBODY = Tenant("", 0, LimitsConfig(), frozenset(), None)


def hash_key(key: str) -> str:
    """A key's SHA-256 in hex: what the config holds (`key_sha256`)."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(prefix: str = "sk-") -> str:
    """A new random key (256 bits)."""
    return prefix + secrets.token_urlsafe(32)


class Tenants:
    def __init__(self, settings: Settings) -> None:
        table: dict[bytes, Tenant] = {}
        for t in settings.tenants:
            slo = t.slo.slo() if t.slo is not None else None
            digest = bytes.fromhex(t.key_sha256)
            table[digest] = Tenant(t.name, t.rank, t.limits, frozenset(t.models), slo, digest)
        for key in settings.api_keys:
            digest = hashlib.sha256(key.get_secret_value().encode()).digest()
            table.setdefault(digest, Tenant("default", 1, LimitsConfig(), frozenset(), None,
                                            digest))  # fmt: skip
        self.table = table
        self.open = not table  # no key asked for

    def identify(self, authorization: bytes | None) -> Tenant | None:
        """The tenant whose key `authorization` (the header's value) carries; None: no such
        key. ANONYMOUS when the gateway asks for none."""
        if self.open:
            return ANONYMOUS
        value = authorization or b""
        token = value[len(_BEARER) :] if value[: len(_BEARER)].lower() == _BEARER else b""
        digest = hashlib.sha256(token.strip()).digest()
        found = self.table.get(digest, _NOBODY)
        return found if hmac.compare_digest(digest, found.digest) else None

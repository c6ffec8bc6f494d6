"""The admin API and run-time changes: gray releases' weights and shadow share
(PUT /admin/releases/{model}), and a reload of the config file's releases without a restart
(POST /admin/reload, or SIGHUP to the gateway).

Every admin request carries `Authorization: Bearer <admin_key>`; without a configured key the
admin API is off (403), so it can never be open by omission. A reload applies the `releases`
section only: the rest of the file (tiers, policy, ...) takes a restart, and the answer and the
log say which sections changed. A reload that fails (bad YAML, a variant no backend serves)
changes nothing.

Under `tiergate serve --workers N` one worker gets the admin request: it applies the change and
`publish`es the whole release table to its supervisor, which relays it to every worker in one
order (the sender included), so all end on the same table, and gives the latest to a worker it
restarts. SIGHUP goes to every worker, each rereading the same file.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from typing import Any, Literal, NoReturn, Protocol

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import TypeAdapter, ValidationError

from gateway.config.settings import (
    ConfigError,
    ReleaseConfig,
    Settings,
    ShadowConfig,
    load_settings,
    release_problems,
)
from gateway.core import api
from gateway.observe.telemetry import Telemetry
from gateway.pipeline.releases import Release, ReleaseError, Releases

__all__ = ["RELEASES_MESSAGE", "Control", "ops_guard", "router"]

# A worker's release table after an admin change, relayed to every worker (gateway.serve.workers).
RELEASES_MESSAGE = b"releases "

log = logging.getLogger(__name__)

_TABLE = TypeAdapter(list[ReleaseConfig])
# Sections a reload reports as changed but does not apply.
_RESTART_SECTIONS = ("tiers", "policy", "retry", "monitor", "outlier", "continuation", "hedge",
                     "slo", "learning", "planner", "server", "shutdown", "redis_url", "tenants",
                     "api_keys", "admin_key", "protect_ops")  # fmt: skip


class Control:
    """Changes to the gateway's releases while it runs."""

    def __init__(
        self,
        settings: Settings,
        releases: Releases,
        served: frozenset[str],
        telemetry: Telemetry,
        publish: Callable[[bytes], None] | None = None,
    ) -> None:
        self.settings, self.releases, self.served = settings, releases, served
        # A worker of several: what hands the release table to the others.
        self.telemetry, self.publish = telemetry, publish
        self.declare()

    def declare(self) -> None:
        """Every variant's series in the metrics, at 0 until its first request."""
        self.telemetry.declare_variants(
            (r.model, v.name) for r in self.releases.table.values() for v in r.variants
        )

    def update(self, model: str, change: api.ReleaseUpdate) -> Release:
        shadow: ShadowConfig | Literal["keep"] | None = "keep"
        if "shadow" in change.model_fields_set:
            sent = change.shadow
            try:
                shadow = None if sent is None else ShadowConfig(**sent.model_dump())
            except ValidationError as e:
                raise ReleaseError(400, f"shadow: {e.errors()[0]['msg']}") from None
        release = self.releases.update(model, change.weights, shadow)
        log.info("release changed", extra={"fields": {
            "model": model, "weights": _weights(release),
            "shadow": release.shadow and release.shadow.model_dump()}})  # fmt: skip
        self.publish_table()
        return release

    def reload(self) -> api.ReloadResult:
        """Reread the config file's releases; a ReleaseError (nothing changed) if it cannot."""
        path = self.settings.config
        if path is None:
            raise ReleaseError(409, "The gateway was started without a config file to reload.")
        try:
            fresh = load_settings(path)
        except ConfigError as e:
            raise ReleaseError(400, f"Config not reloaded: {e}") from None
        problems = release_problems(fresh.releases, self.served)
        if problems:
            raise ReleaseError(400, "Config not reloaded: " + "; ".join(problems))
        changed = self.releases.load(fresh.releases)
        self.declare()
        restart = [s for s in _RESTART_SECTIONS
                   if getattr(fresh, s) != getattr(self.settings, s)]  # fmt: skip
        log.info("config reloaded", extra={"fields": {
            "file": str(path), "releases_changed": ",".join(changed) or "none",
            "needs_restart": ",".join(restart) or "none"}})  # fmt: skip
        return api.ReloadResult(file=str(path), releases_changed=changed, needs_restart=restart)

    def reload_logged(self) -> None:
        """A reload on a signal: its failure is logged, not raised."""
        try:
            self.reload()
        except ReleaseError as e:
            log.error("config reload failed: nothing changed", extra={"fields": {
                "error": str(e)}})  # fmt: skip

    def received(self, message: bytes) -> None:
        """The release table another worker published (relayed by the supervisor)."""
        try:
            configs = _TABLE.validate_json(message.removeprefix(RELEASES_MESSAGE))
        except ValidationError as e:
            log.error("bad release table from the supervisor", extra={"fields": {
                "error": str(e)}})  # fmt: skip
            return
        self.releases.load(configs)
        self.declare()

    def publish_table(self) -> None:
        """Hand the release table to the other workers (nothing when there are none)."""
        if self.publish is not None:
            table = [r.config().model_dump(mode="json") for r in self.releases.table.values()]
            self.publish(RELEASES_MESSAGE + json.dumps(table).encode())


def view(release: Release) -> api.ReleaseView:
    total = sum(v.weight for v in release.variants)
    return api.ReleaseView(
        model=release.model,
        variants=[
            api.VariantView(name=v.name, model=v.model, weight=v.weight, share=v.weight / total)
            for v in release.variants
        ],
        shadow=None
        if release.shadow is None
        else api.ShadowView(variant=release.shadow.variant, share=release.shadow.share),
    )


def _weights(release: Release) -> dict[str, float]:
    return {v.name: v.weight for v in release.variants}


class Served(Protocol):
    """What the admin API reads of the gateway it serves (gateway.serve.assembly.Gateway)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def control(self) -> Control: ...


def _gateway(request: Request) -> Served:
    gw: Served = request.state.gateway
    return gw


def _authorized(request: Request) -> None:
    key = _gateway(request).settings.admin_key
    if key is None:
        raise HTTPException(403, "The admin API is off: set admin_key (TIERGATE_ADMIN_KEY).")
    sent = request.headers.get("authorization", "")
    want = f"Bearer {key.get_secret_value()}"
    if not hmac.compare_digest(sent.encode(), want.encode()):
        raise HTTPException(401, "Missing or invalid admin key (Authorization: Bearer ...).",
                            headers={"www-authenticate": "Bearer"})  # fmt: skip


def ops_guard(request: Request) -> None:
    """/metrics and /state: the admin key, when `protect_ops` asks for it."""
    if _gateway(request).settings.protect_ops:
        _authorized(request)


def _raise(e: ReleaseError) -> NoReturn:
    raise HTTPException(e.status, str(e)) from None


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": api.ErrorResponse, "description": text}
    for code, text in (
        (401, "Missing or wrong admin key."),
        (403, "No admin key is configured: the admin API is off."),
    )
}

router = APIRouter(prefix="/admin", tags=["Admin"], dependencies=[Depends(_authorized)],
                   responses=_ERRORS)  # fmt: skip


@router.get("/releases")
async def releases(request: Request) -> api.ReleaseList:
    """Every gray release with its variants' weights and shares, and its shadow mode."""
    table = _gateway(request).control.releases.table
    return api.ReleaseList(data=[view(r) for r in table.values()])


@router.put(
    "/releases/{model}",
    responses={
        400: {"model": api.ErrorResponse, "description": "Unknown variant or bad weights."},
        404: {"model": api.ErrorResponse, "description": "No release for this model."},
    },
)
async def update_release(
    model: str, change: api.ReleaseUpdate, request: Request
) -> api.ReleaseView:
    """Change a release's weights (variants left out keep theirs) and, if given, its shadow
    mode (null turns it off). Requests already on their way keep the variant they got."""
    try:
        return view(_gateway(request).control.update(model, change))
    except ReleaseError as e:
        _raise(e)


@router.post(
    "/reload",
    responses={
        400: {"model": api.ErrorResponse, "description": "The file is invalid: nothing changed."},
        409: {"model": api.ErrorResponse, "description": "No config file to reload."},
    },
)
async def reload(request: Request) -> api.ReloadResult:
    """Reread the config file and apply its `releases`; the answer lists what changed and which
    other sections changed but need a restart."""
    control = _gateway(request).control
    try:
        result = control.reload()
    except ReleaseError as e:
        _raise(e)
    control.publish_table()
    return result

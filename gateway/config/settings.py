"""Gateway configuration: a YAML tiers file, overridden by ``TIERGATE_*`` environment variables,
overridden by explicit arguments. ``load_settings`` is the one entry point that turns any invalid
input into a ``ConfigError`` naming the field and the file."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from gateway.planner import PlanParams
from gateway.routing import DEFAULT_POLICY, ParamError, PolicyName, PolicyParams, Slo
from gateway.wire import EngineKind
from gateway.wire.kinds import BUILTIN

__all__ = [
    "BackendConfig",
    "BackendTemplate",
    "ConfigError",
    "ContinuationConfig",
    "DiscoveryConfig",
    "DnsDiscovery",
    "HedgeConfig",
    "KubernetesDiscovery",
    "LimitsConfig",
    "MonitorConfig",
    "OutlierConfig",
    "PolicyConfig",
    "ReleaseConfig",
    "RetryConfig",
    "Settings",
    "ShadowConfig",
    "TenantConfig",
    "TierConfig",
    "VariantConfig",
    "kind_options",
    "kind_problems",
    "load_settings",
    "read_tenants",
    "release_problems",
    "url_host",
    "validation_problems",
]

ENV_PREFIX = "TIERGATE_"
CONFIG_ENV_VAR = f"{ENV_PREFIX}CONFIG"

LogLevel = Literal["debug", "info", "warning", "error", "critical"]
NonEmptyStr = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
KindName = Annotated[str, StringConstraints(strip_whitespace=True, pattern=r"^[a-z][a-z0-9_-]*$")]
# Tier names end up as Prometheus label values and in response headers: keep them plain.
TierName = Annotated[
    str, StringConstraints(strip_whitespace=True, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
]


class ConfigError(Exception):
    """Invalid configuration. The message lists every problem as ``field.path: reason``."""

    def __init__(self, message: str, *, file: Path | None = None, problems: Sequence[str] = ()):
        super().__init__(message)
        self.file = file
        self.problems = tuple(problems)


# Raised by model-level validators so the report names the offending field, not the model; the
# routing parameters' relations (PolicyParams) raise the same error.
_FieldError = ParamError


class _Model(BaseModel):
    # Frozen: settings are shared by every request; forbid extras: a typo in YAML must not pass.
    model_config = ConfigDict(frozen=True, extra="forbid")


class BackendConfig(_Model):
    # The engine's base URL, e.g. http://vllm-0:8000: its identity everywhere.
    url: str
    # Sent to the engine as `Authorization: Bearer <api_key>`.
    api_key: SecretStr | None = None
    # The model names it serves (vLLM's --served-model-name).
    models: list[NonEmptyStr] = Field(min_length=1)
    # The engine's protocol: the name of an engine kind (gateway/wire/<kind>/: vllm, triton).
    # Its own options sit beside these fields (see the kinds' sections below).
    kind: KindName = "vllm"
    # Where the monitor reads load; default <url>/metrics. Triton serves metrics on a port of
    # their own (8002 by default), e.g. http://host:8002/metrics.
    metrics_url: str | None = None
    # What the monitor GETs on <url> for health (200: can serve); default: its kind's (vllm:
    # /health). An engine without that path names another (Ollama's: /, which answers 200).
    health_path: str | None = Field(default=None, pattern=r"^/")

    # Extras are the kind's options, checked against the kind by `kind_problems`.
    model_config = ConfigDict(frozen=True, extra="allow")

    @field_validator("url", "metrics_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        try:
            parts = urlsplit(value)
            port = parts.port  # raises ValueError on a malformed or out-of-range port
        except ValueError as exc:
            raise ValueError(f"not a valid URL ({exc})") from None
        if parts.scheme.lower() not in ("http", "https"):
            raise ValueError("must be an http:// or https:// URL")
        if not parts.hostname:
            raise ValueError("must include a host")
        if port == 0:
            raise ValueError("port must be between 1 and 65535")
        # Credentials in a URL end up in logs and metric labels; api_key is the place for them.
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not contain credentials; use api_key")
        if parts.query or parts.fragment:
            raise ValueError("must be a base URL without query or fragment")
        return value.rstrip("/")

    @property
    def kind_options(self) -> dict[str, Any]:
        """The options given for its kind (validated by the kind's model: `kind_problems`)."""
        return dict(self.model_extra or {})

    @property
    def scrape_url(self) -> str:
        return self.metrics_url or self.url + "/metrics"


class BackendTemplate(_Model):
    """What each discovered backend of a tier is: a backend's fields but its URL (and with the
    metrics' port and path in place of their URL). Its kind's options sit beside these."""

    api_key: SecretStr | None = None
    models: list[NonEmptyStr] = Field(min_length=1)
    kind: KindName = "vllm"
    # Where the monitor reads load: this port of the discovered address (default: the
    # backend's own), at this path. Triton serves metrics on a port of their own (8002).
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_path: str = Field(default="/metrics", pattern=r"^/")
    # What the monitor GETs for health on each discovered backend (a backend's `health_path`).
    health_path: str | None = Field(default=None, pattern=r"^/")

    # Extras are the kind's options, checked against the kind by `kind_problems`.
    model_config = ConfigDict(frozen=True, extra="allow")

    def at(self, url: str) -> BackendConfig:
        """The backend discovered at `url` (scheme://host:port)."""
        parts = urlsplit(url)
        metrics = parts._replace(netloc=f"{url_host(parts.hostname or '')}:{self.metrics_port}"
                                 if self.metrics_port else parts.netloc,
                                 path=self.metrics_path)  # fmt: skip
        return BackendConfig(url=url, api_key=self.api_key, models=self.models, kind=self.kind,
                             metrics_url=metrics.geturl(), health_path=self.health_path,
                             **(self.model_extra or {}))  # fmt: skip


def url_host(host: str) -> str:
    """A host as a URL writes it: IPv6 addresses in brackets."""
    return f"[{host}]" if ":" in host else host


class DnsDiscovery(_Model):
    """Backends from DNS: every address of `name` (A or AAAA records, at `port`), or every
    target and port of its SRV records; re-resolved every `interval_s`, sooner when the
    answer's TTL runs out sooner (a Kubernetes headless Service's name gives its ready pods)."""

    name: NonEmptyStr
    record: Literal["A", "AAAA", "SRV"] = "A"
    port: int | None = Field(default=None, ge=1, le=65535)  # for A and AAAA: the engines' port
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(default=5.0, gt=0)
    # The fastest re-resolution a short TTL may ask for.
    min_interval_s: float = Field(default=0.2, gt=0)
    # host or host:port of the DNS servers to ask (default: the system's, /etc/resolv.conf).
    nameservers: list[NonEmptyStr] = []
    timeout_s: float = Field(default=2.0, gt=0)  # per resolution, every server tried

    @model_validator(mode="after")
    def _check_port(self) -> Self:
        if self.record == "SRV" and self.port is not None:
            raise _FieldError("port", "SRV records carry their own ports; leave port out")
        if self.record != "SRV" and self.port is None:
            raise _FieldError("port", f"{self.record} records carry no port: set the engines' port")
        if self.min_interval_s > self.interval_s:
            raise _FieldError("min_interval_s", "must not exceed interval_s")
        return self


class KubernetesDiscovery(_Model):
    """Backends from a Service's EndpointSlices, watched through the Kubernetes API: each ready
    endpoint's address at the named port; terminating or not-ready endpoints take no new
    requests. In a pod it uses the pod's service account (the Role in deploy/k8s/), elsewhere
    the kubeconfig."""

    service: NonEmptyStr
    namespace: NonEmptyStr | None = None  # default: the pod's own, else "default"
    port: NonEmptyStr | int  # the Service's port name, or a port number
    scheme: Literal["http", "https"] = "http"
    kubeconfig: Path | None = None  # outside a cluster: this file (default: $KUBECONFIG, ~/.kube)
    # A watch that ends (the API server closes it after a while) is started again after this.
    retry_s: float = Field(default=1.0, gt=0)


class FileDiscovery(_Model):
    """Backends listed in a file something else writes (YAML or JSON: a list of base URLs, or
    `backends:` with one), re-read every `interval_s`; write it whole and rename it over the
    old one. A missing or malformed file keeps the backends found last."""

    path: Path
    interval_s: float = Field(default=1.0, gt=0)


class DiscoveryConfig(_Model):
    """Where a tier's backends come from while it runs: DNS, the Kubernetes API or a file (one
    of the three), each found address a backend made from `backend`."""

    dns: DnsDiscovery | None = None
    kubernetes: KubernetesDiscovery | None = None
    file: FileDiscovery | None = None
    backend: BackendTemplate
    # A backend gone from discovery takes no new requests at once; its streams may finish
    # for this long, then the rest are cut and continue on another backend.
    drain_s: float = Field(default=30.0, ge=0)

    @model_validator(mode="after")
    def _check_source(self) -> Self:
        if sum(s is not None for s in (self.dns, self.kubernetes, self.file)) != 1:
            raise _FieldError("dns", "set exactly one source: dns, kubernetes or file")
        return self

    @property
    def source(self) -> str:
        if self.dns is not None:
            return "dns"
        return "kubernetes" if self.kubernetes is not None else "file"


class ReplicasConfig(_Model):
    """The replicas of a tier the planner may ask for (docs/autoscaling.md), and what one
    costs: the planner meets every SLO class's demand at the least total cost."""

    minimum: int = Field(default=1, ge=0, le=10_000)
    maximum: int = Field(default=10, ge=1, le=10_000)
    cost: float = Field(default=1.0, gt=0, le=1e6)  # per replica: GPUs, or any one unit

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        if self.minimum > self.maximum:
            raise _FieldError("minimum", f"must be at most maximum ({self.maximum})")
        return self


class TierConfig(_Model):
    name: TierName  # how metrics, logs and /state name the tier
    # latency: the fast tier (EAGLE), filled to its knee; throughput: the pool.
    role: Literal["latency", "throughput"]
    backends: list[BackendConfig] = []  # the tier's engines, listed
    # Or found while the gateway runs (beside any listed): docs/discovery.md.
    discovery: DiscoveryConfig | None = None
    replicas: ReplicasConfig = ReplicasConfig()  # the planner's bounds and cost

    @model_validator(mode="after")
    def _check_some_backends(self) -> Self:
        if not self.backends and self.discovery is None:
            raise _FieldError("backends", "list at least one backend, or set discovery")
        return self

    @property
    def models(self) -> frozenset[str]:
        """The models its backends serve, listed or to be discovered."""
        found = self.discovery.backend.models if self.discovery is not None else []
        return frozenset(m for b in self.backends for m in b.models) | frozenset(found)


class VariantConfig(_Model):
    """One deployment of a release: the model name its backends serve it under, and its share
    of the release's traffic (weights are relative: 95 and 5, or 0.95 and 0.05)."""

    name: TierName  # how metrics, headers and the admin API name the variant
    model: NonEmptyStr  # the model name its backends serve
    weight: float = Field(ge=0, le=1e6)  # its share, relative to the others'


class ShadowConfig(_Model):
    """Mirror a share of a release's requests to one variant and discard its answers: the new
    version sees real traffic before any client sees its answers."""

    variant: TierName  # the variant that gets the copies
    share: float = Field(gt=0, le=1)  # the share of the release's requests copied to it


class ReleaseConfig(_Model):
    """A gray release: the model name clients ask for, split over variants by weight. A request
    with an `x-session-id` header or a `user` field always lands on the same variant while the
    weights stay as they are; one with neither is split at random."""

    model: NonEmptyStr  # the model name clients ask for
    variants: list[VariantConfig] = Field(min_length=1)
    shadow: ShadowConfig | None = None  # null: no shadow traffic

    @model_validator(mode="after")
    def _check_variants(self) -> Self:
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise _FieldError("variants", f"variant names must be unique, got {names}")
        if not any(v.weight > 0 for v in self.variants):
            raise _FieldError("variants", "at least one variant needs a weight above 0")
        if self.shadow is not None and self.shadow.variant not in names:
            raise _FieldError("shadow", f"variant {self.shadow.variant!r} is not one of {names}")
        return self


class PolicyConfig(PolicyParams):
    """The routing policy's name and parameters (defined with the policies, in PolicyParams),
    and what the gateway does around its decisions. Frozen, extras forbidden, like _Model."""

    name: PolicyName = DEFAULT_POLICY  # the routing policy (docs/routing.md)
    # How long a request may wait for room while everything is saturated before its 429; 0
    # answers 429 at once instead of queueing.
    queue_deadline_s: float = Field(default=5.0, ge=0)
    seed: int | None = None  # of the policy's random draws (null: from the system), for replays


class RetryConfig(_Model):
    max_attempts: int = Field(default=3, ge=1)  # per request, the first included
    # Waits between attempts: exponential from the initial to the most, with jitter.
    backoff_initial_s: float = Field(default=0.05, gt=0)
    backoff_max_s: float = Field(default=1.0, gt=0)
    deadline_s: float = Field(default=30.0, gt=0)  # no new attempt after this long
    # Retries allowed as a share of requests, over this floor per second (a retry storm
    # cannot multiply the load on engines that are failing).
    budget_ratio: float = Field(default=0.2, ge=0)
    budget_min_per_s: float = Field(default=10, ge=0)
    # Backend answers that mean "try elsewhere" (before the first byte only). An engine's
    # 401/403 is tried elsewhere too, and answered 502: the gateway's credentials are wrong.
    retry_statuses: list[int] = Field(default=[408, 429, 500, 502, 503, 504])
    # Longest wait for a stream's first body bytes (its TTFT, queueing included) before the
    # attempt counts as failed and the next candidate is tried.
    first_byte_timeout_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _check_relations(self) -> Self:
        if self.backoff_max_s < self.backoff_initial_s:
            raise _FieldError(
                "backoff_max_s",
                f"must be >= backoff_initial_s ({self.backoff_initial_s}),"
                f" got {self.backoff_max_s}",
            )
        return self


class MonitorConfig(_Model):
    scrape_interval_s: float = Field(default=0.25, gt=0)  # each engine's /metrics this often
    scrape_timeout_s: float = Field(default=1.0, gt=0)
    eject_after_failures: int = Field(default=3, ge=1)  # failed scrapes in a row that eject
    probe_interval_s: float = Field(default=2.0, gt=0)  # health checks (and of the ejected)
    # A backend with work whose generated-token counter stays flat this long is ejected.
    stall_after_s: float = Field(default=5.0, gt=0)


class OutlierConfig(_Model):
    """Ejection on the outcomes of real requests (gateway.backends.outlier), after Envoy's outlier
    detection: consecutive failures or a failure ratio, back-off, probation, a cap per tier."""

    consecutive_failures: int = Field(default=3, ge=1)  # failed requests in a row that eject
    # ... or this share of failures over the last `window_s`, from `min_requests` on.
    failure_ratio: float = Field(default=0.3, gt=0, le=1)
    window_s: float = Field(default=10.0, gt=0)
    min_requests: int = Field(default=10, ge=1)
    # An ejection lasts this times the backend's recent ejections, up to the most (calm time
    # in full rotation forgives one per `max_ejection_s`).
    base_ejection_s: float = Field(default=5.0, gt=0)
    max_ejection_s: float = Field(default=60.0, gt=0)
    # Successes, one request at a time, that end a probation.
    trial_successes: int = Field(default=3, ge=1)
    # Share of a tier that may be out for its outcomes at once (one backend at least).
    max_ejected_share: float = Field(default=0.5, gt=0, le=1)

    @model_validator(mode="after")
    def _check_relations(self) -> Self:
        if self.max_ejection_s < self.base_ejection_s:
            raise _FieldError(
                "max_ejection_s",
                f"must be >= base_ejection_s ({self.base_ejection_s}), got {self.max_ejection_s}",
            )
        return self


class HedgeConfig(_Model):
    """Hedging a slow first token (pipeline.hedge): past `factor` times the TTFT predicted for
    its backend (`min_s` at least), a stream is also sent to the next candidate; the first to
    answer serves it."""

    enabled: bool = True
    factor: float = Field(default=3.0, ge=1)  # times the predicted TTFT before the hedge
    min_s: float = Field(default=1.0, gt=0)  # and never sooner than this


class ContinuationConfig(_Model):
    """Mid-stream continuation (gateway.pipeline.continuation): a stream that breaks after its first
    byte is continued on another backend; a client opts out with `x-tiergate-continue: off`."""

    enabled: bool = True
    max_continuations: int = Field(default=2, ge=1, le=10)  # per stream


_PLAN = PlanParams()  # the planner's defaults, defined once (gateway.planner.replicas)


class PlannerConfig(_Model):
    """The planner (gateway.planner, docs/autoscaling.md): every `interval_s` it turns the
    demand per SLO class and the learned curves into the replicas each tier needs, published
    as `tiergate_tier_desired_replicas` and in /state for an autoscaler to follow."""

    enabled: bool = True
    # Plans are cheap (about a millisecond); an autoscaler reads the latest, so a plan's age
    # adds to the time a surge takes to be answered.
    interval_s: float = Field(default=2.0, gt=0, le=3600)
    # The time constant of the demand's short average (its long one: 4x): shorter follows a
    # change sooner, longer is steadier.
    tau_s: float = Field(default=60.0, gt=0, le=86_400)
    # The time constant of the average that notices a surge (gateway.planner.demand): while it
    # stands far beyond the noise above the steadier rate, its rate is planned for. Short against
    # a replica's start-up; null: the shorter of 5 s and a quarter of tau_s.
    surge_tau_s: float | None = Field(default=None, gt=0, le=86_400)
    # Spare capacity over the forecast, for its error.
    headroom: float = Field(default=_PLAN.headroom, ge=0, le=10)
    # A surging class's forecast times this: replicas asked for at once start over a spread of
    # times, and asking for twice the need has the need served about halfway through the
    # start-up instead of at its end (1: no more than the forecast).
    surge_factor: float = Field(default=_PLAN.surge_factor, ge=1, le=10)
    # How long a new replica takes to serve: a rising demand is carried over it.
    startup_s: float = Field(default=_PLAN.startup_s, ge=0, le=86_400)
    # The share of a class's streams planned to meet its TPOT SLO.
    attainment: float = Field(default=_PLAN.attainment, gt=0, lt=1)
    # The answer length assumed for a class until one of its requests has finished.
    default_output_tokens: float = Field(default=256.0, gt=0, le=1_000_000)

    @model_validator(mode="after")
    def _check_surge(self) -> Self:
        if self.surge_tau_s is not None and self.surge_tau_s >= self.tau_s:
            raise _FieldError("surge_tau_s", "must be shorter than tau_s")
        return self

    @property
    def surge_s(self) -> float:
        """The surge average's time constant in effect."""
        return self.surge_tau_s if self.surge_tau_s is not None else min(5.0, self.tau_s / 4.0)

    @property
    def params(self) -> PlanParams:
        return PlanParams(self.headroom, self.startup_s, self.attainment, self.surge_factor)


class SloConfig(_Model):
    """The service level a request asks for unless it says otherwise (x-tiergate-slo-ttft-ms,
    x-tiergate-slo-tpot-ms): the learned policy routes to meet it, metrics count who did."""

    ttft_ms: float = Field(default=1000.0, gt=0, le=3_600_000)  # time to the first token
    tpot_ms: float = Field(default=25.0, gt=0, le=3_600_000)  # time per output token after it

    def slo(self) -> Slo:
        return Slo(ttft_s=self.ttft_ms / 1000, tpot_s=self.tpot_ms / 1000)


class LearningConfig(_Model):
    """How the latency model learns each backend's curves (gateway.backends.latency_model)."""

    # Observations each knot of a curve remembers: fewer follow change faster, more are
    # steadier. 16 follows a shifted knot within a few seconds at tens of requests per second.
    memory: float = Field(default=16.0, ge=1)
    # Half-life of the speculative acceptance average: the whole TPOT curve rescales with it.
    acceptance_halflife_s: float = Field(default=3.0, gt=0)
    # The deviation of ln(a request's TPOT) around the curve assumed until a backend's own
    # finished streams show theirs (worth two of them).
    spread: float = Field(default=0.1, gt=0, le=2)
    # Past the most streams observed on a backend, the step may turn compute-bound anywhere:
    # the model takes its ridge as equally likely at any scale up to this many tokens per step
    # (vLLM's default budget of tokens per step, max_num_batched_tokens), and grows its doubt
    # with the distance.
    ridge_max_tokens: float = Field(default=2048.0, gt=1)
    # Past its own frontier a backend is also told what the tier-mate that has seen the most
    # streams saw there, scaled to its own level: a second guess, doubted by this deviation of
    # ln TPOT per e-fold of load past the backend's frontier (a tier's engines are replicas, but
    # may be unlike) on top of the mate's own doubt. 0: trusted as the backend's own.
    tier_unlike: float = Field(default=0.1, ge=0, le=2)


class ShutdownConfig(_Model):
    """What the gateway does on SIGTERM or SIGINT (serve.server): /ready turns 503 at once and
    new requests are still served for `pre_stop_delay_s` (load balancers take a moment to
    notice); then the listener closes and requests in flight get `drain_timeout_s` to finish.
    Those still running then end cleanly: a 503, or a stream's SSE error event and [DONE].
    A second signal skips what is left of both waits.

    The pre-stop delay is 0 by default: Kubernetes waits in the pod's preStop hook instead
    (deploy/k8s), and a gateway with nothing balancing in front of it (Compose, `tiergate up`,
    tests) has no one to wait for. Behind a load balancer without such a hook, set it to the
    time the balancer takes to notice /ready (e.g. 5 s)."""

    pre_stop_delay_s: float = Field(default=0.0, ge=0, le=3600)  # see above
    drain_timeout_s: float = Field(default=120.0, ge=0, le=86_400)  # see above


class ServerConfig(_Model):
    """What the gateway's HTTP server allows its clients (gateway.serve.server). Every refusal is an
    OpenAI error; a connection that sent nothing is closed without an answer."""

    # The request line and headers together; more is answered 431.
    max_header_bytes: int = Field(default=16_384, ge=1024, le=1_048_576)
    # From a connection's opening (or a request's first byte on a kept-alive connection) to
    # the end of its headers; past it the connection is closed (408 if it had sent anything).
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    # From the end of the headers to the end of the body; past it 408 and closed.
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    # A kept-alive connection idle this long between requests is closed.
    keepalive_timeout_s: float = Field(default=5.0, gt=0, le=3600)
    # Client connections open at once; requests on connections past it are answered 503.
    max_connections: int = Field(default=1000, ge=1)


PriorityClass = Literal["interactive", "standard", "batch"]
# A tenant's priority: a class, or a number (higher goes first; the classes are 2, 1 and 0).
PRIORITY_CLASSES: dict[str, int] = {"interactive": 2, "standard": 1, "batch": 0}


class LimitsConfig(_Model):
    """A tenant's limits; null: none of that kind."""

    # Requests started in any 60 s window.
    requests_per_minute: int | None = Field(default=None, ge=1)
    # Prompt + completion tokens per minute, as the engines' usage reports them: a bucket
    # refilled at this rate per minute, charged when each answer ends.
    tokens_per_minute: int | None = Field(default=None, ge=1)
    # Requests in flight at once.
    max_concurrent: int | None = Field(default=None, ge=1)


class TenantConfig(_Model):
    """A named API key: who is calling, how much it may, and how urgent its work is."""

    name: TierName  # how metrics and logs name the tenant (never by its key)
    # The key's SHA-256, hex (`tiergate keys create` makes a key and prints it): the gateway
    # never holds the key itself.
    key_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{64}$", to_lower=True)]
    # How urgent its work is: interactive (2), standard (1), batch (0), or a number; higher
    # goes first (see `priorities`).
    priority: PriorityClass | Annotated[int, Field(ge=-100, le=100)] = "standard"
    limits: LimitsConfig = LimitsConfig()
    # The models it may use (release names included); empty: all.
    models: list[NonEmptyStr] = []
    # Its default SLO; a request's x-tiergate-slo-* headers still win.
    slo: SloConfig | None = None

    @property
    def rank(self) -> int:
        return PRIORITY_CLASSES[self.priority] if isinstance(self.priority, str) else self.priority


def _split_keys(value: Any) -> Any:
    """Accept ``TIERGATE_API_KEYS`` as a JSON list or as comma-separated keys."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            # Never echo the text: it holds secrets.
            raise ValueError("looks like a JSON list but does not parse") from None
    return [key.strip() for key in text.split(",") if key.strip()]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    host: str = "0.0.0.0"  # the address the gateway listens on
    port: int = Field(default=8000, ge=0, le=65535)
    config: Path | None = None  # the YAML file these settings were read from (`--config`)
    tiers: list[TierConfig] = []  # the engines, by tier
    policy: PolicyConfig = PolicyConfig()
    retry: RetryConfig = RetryConfig()
    monitor: MonitorConfig = MonitorConfig()
    outlier: OutlierConfig = OutlierConfig()
    continuation: ContinuationConfig = ContinuationConfig()
    hedge: HedgeConfig = HedgeConfig()
    slo: SloConfig = SloConfig()
    learning: LearningConfig = LearningConfig()
    planner: PlannerConfig = PlannerConfig()
    # Redis, for in-flight counts shared by several gateway replicas and tenants' limits
    # across them; null: in this process (or shared by its workers). Hidden from repr: the URL
    # may carry a password.
    redis_url: str | None = Field(default=None, repr=False)
    max_body_bytes: int = Field(default=1_048_576, gt=0)  # larger request bodies get a 413
    # Keys a client must send (`Authorization: Bearer <key>`); none and no tenants: open.
    api_keys: Annotated[list[SecretStr], NoDecode] = []
    # Gray releases (gateway.pipeline.releases): model names split over variants.
    releases: list[ReleaseConfig] = []
    # The key of the admin API (/admin/...: release weights, config reload); without one the
    # admin API answers 403.
    admin_key: SecretStr | None = None
    # /metrics and /state ask for the admin key too (off: open to whoever reaches the port,
    # as suits local use; turn on where clients can reach the gateway's port).
    protect_ops: bool = False
    # Named API keys (gateway.pipeline.tenants), here and in `tenants_file` (a YAML file with a
    # `tenants:` list, e.g. a mounted secret), together; with `api_keys`, all are accepted.
    tenants: list[TenantConfig] = []
    tenants_file: Path | None = None  # more tenants, from a YAML file with a `tenants:` list
    # Tenants' priorities: batch-class keys (priority 0 or below) go to the throughput pool
    # only (or wait), the admission queue serves higher priorities first and tenants of one
    # fairly, and engines with `priority_scheduling` get vLLM's `priority` field. Off: every
    # request is equal (FIFO), as without tenants.
    priorities: bool = True
    log_level: LogLevel = "info"
    log_json: bool = False  # one JSON object per log line (else key=value text)
    # The longest a request to an engine may take, its whole answer included.
    request_timeout_s: float = Field(default=600, gt=0)
    connect_timeout_s: float = Field(default=2.0, gt=0)  # to open a connection to an engine
    # A stream whose engine sends nothing for this long after its first byte is cut and
    # counted as the backend's failure (a frozen engine must not freeze its clients).
    stream_idle_timeout_s: float = Field(default=2.5, gt=0)
    # Idle pooled connections to the engines are closed after this. Below the engines' own
    # keep-alive (vLLM's and uvicorn's: 5 s), or the gateway may send a request on a connection
    # the engine is closing at that moment, and the request fails for nothing.
    upstream_keepalive_s: float = Field(default=4.0, gt=0)
    shutdown: ShutdownConfig = ShutdownConfig()
    server: ServerConfig = ServerConfig()
    # Gateway processes serving the one port (gateway.serve.workers), sharing their in-flight
    # counts; 1: the gateway runs in the serve process itself.
    workers: int = Field(default=1, ge=1, le=256)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _parse_api_keys(cls, value: Any) -> Any:
        return _split_keys(value)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_log_level(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        scheme = urlsplit(value.strip()).scheme.lower()
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value.strip()

    @field_validator("tiers")
    @classmethod
    def _check_tiers_unique(cls, tiers: list[TierConfig]) -> list[TierConfig]:
        seen_names: set[str] = set()
        seen_urls: dict[str, str] = {}
        for tier in tiers:
            if tier.name in seen_names:
                raise ValueError(f"tier name {tier.name!r} is used more than once")
            seen_names.add(tier.name)
            for backend in tier.backends:
                key = backend.url.lower()
                if key in seen_urls:
                    raise ValueError(
                        f"backend URL {backend.url} appears in tier {seen_urls[key]!r}"
                        f" and in tier {tier.name!r}"
                    )
                seen_urls[key] = tier.name
        return tiers

    @model_validator(mode="after")
    def _check_protect_ops(self) -> Self:
        if self.protect_ops and self.admin_key is None:
            raise _FieldError(
                "protect_ops", "needs admin_key (the key /metrics and /state ask for)"
            )
        return self

    @field_validator("releases")
    @classmethod
    def _check_releases_unique(cls, releases: list[ReleaseConfig]) -> list[ReleaseConfig]:
        models = [r.model for r in releases]
        for model in models:
            if models.count(model) > 1:
                raise ValueError(f"model {model!r} has more than one release")
        return releases

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file is chosen at run time: an explicit ``config=`` argument, else TIERGATE_CONFIG.
        path: Any = None
        if isinstance(init_settings, InitSettingsSource):
            path = init_settings.init_kwargs.get("config")
        if path is None:
            path = os.environ.get(CONFIG_ENV_VAR) or None
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path is not None:
            sources.append(_YamlFileSource(settings_cls, Path(path)))
        return tuple(sources)


class _YamlLoadError(ConfigError):
    """The YAML file itself is unusable; a ConfigError so direct ``Settings()`` users see one."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"config file {path}: {reason}", file=path, problems=[f"config: {reason}"])
        self.reason = reason


class _YamlFileSource(YamlConfigSettingsSource):
    """The stock YAML source, made strict: a missing file, bad YAML or a non-mapping is an error
    (the stock source silently skips a missing file)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path):
        if not path.is_file():
            reason = "file not found" if not path.exists() else "not a regular file"
            raise _YamlLoadError(path, reason)
        super().__init__(settings_cls, yaml_file=path)

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            with file_path.open(encoding="utf-8") as handle:
                data = yaml.safe_load(handle)
        except yaml.YAMLError as exc:
            raise _YamlLoadError(file_path, f"invalid YAML: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise _YamlLoadError(file_path, f"cannot read: {exc}") from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            reason = f"top level must be a mapping, got {type(data).__name__}"
            raise _YamlLoadError(file_path, reason)
        return data


def _format_loc(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc) or "(settings)"


def validation_problems(exc: ValidationError) -> list[str]:
    """Each problem of a failed validation as `field.path: reason`."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = list(error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, ParamError):
            problems.append(f"{_format_loc([*loc, cause.field])}: {cause.reason}")
            continue
        message = error["msg"].removeprefix("Value error, ")
        problems.append(f"{_format_loc(loc)}: {message}")
    return problems


def kind_options(backend: BackendConfig, kind: EngineKind) -> BaseModel:
    """The backend's options as its kind's model; raises ValidationError."""
    return kind.options.model_validate(backend.kind_options, context={"models": backend.models})


def kind_problems(tiers: Sequence[TierConfig], kinds: Mapping[str, EngineKind]) -> list[str]:
    """Each backend's kind, known in `kinds`, and its options, valid for that kind."""
    problems = []
    for i, tier in enumerate(tiers):
        listed = [(f"tiers.{i}.backends.{j}", b) for j, b in enumerate(tier.backends)]
        if tier.discovery is not None:  # a backend as discovery would make it
            listed.append((f"tiers.{i}.discovery.backend",
                           tier.discovery.backend.at("http://discovered:1")))  # fmt: skip
        for where, backend in listed:
            kind = kinds.get(backend.kind)
            if kind is None:
                choices = ", ".join(sorted(kinds))
                problems.append(f"{where}.kind: unknown engine kind {backend.kind!r}; "
                                f"choose from {choices}")  # fmt: skip
                continue
            foreign = []
            for key in backend.kind_options:
                owners = [k.name for k in kinds.values() if key in k.options.model_fields]
                if owners and key not in kind.options.model_fields:
                    foreign.append(key)
                    kinds_of = " or ".join(sorted(owners))
                    problems.append(f"{where}.{key}: only applies to backends of kind {kinds_of}")
            if foreign:
                continue
            try:
                kind_options(backend, kind)
            except ValidationError as exc:
                problems += [f"{where}.{p}" for p in validation_problems(exc)]
    return problems


def _check_serving(settings: Settings) -> list[str]:
    """Rules that only apply to a gateway about to serve; ``Settings()`` alone may lack tiers."""
    if not settings.tiers:
        return [
            "tiers: at least one tier is required (in the config file or TIERGATE_TIERS)",
        ]
    problems = release_problems(settings.releases, _served(settings.tiers))
    problems += _tenant_problems(settings)
    if problems:
        return problems
    if settings.workers > 1 and settings.redis_url is None:
        for i, tier in enumerate(settings.tiers):
            if tier.discovery is not None:
                # The workers' shared table has a slot per backend, fixed when they start.
                return [f"tiers.{i}.discovery: with workers > 1 it needs redis_url (the workers "
                        "share discovered backends' counts through Redis)"]  # fmt: skip
    roles = {tier.role for tier in settings.tiers}
    if settings.policy.name == "latency-only" and "latency" not in roles:
        return ["policy.name: 'latency-only' needs a tier with role latency"]
    if settings.policy.name == "throughput-only" and "throughput" not in roles:
        return ["policy.name: 'throughput-only' needs a tier with role throughput"]
    return []


def _tenant_problems(settings: Settings) -> list[str]:
    problems = []
    names: set[str] = set()
    digests: set[str] = set()
    known = _served(settings.tiers) | {r.model for r in settings.releases}
    for i, t in enumerate(settings.tenants):
        if t.name in names:
            problems.append(f"tenants.{i}.name: {t.name!r} is used more than once")
        if t.key_sha256 in digests:
            problems.append(f"tenants.{i}.key_sha256: the same key as another tenant's")
        names.add(t.name)
        digests.add(t.key_sha256)
        unknown = sorted(set(t.models) - known)
        if unknown:
            problems.append(f"tenants.{i}.models: not served: {unknown}")
    return problems


def _served(tiers: Sequence[TierConfig]) -> frozenset[str]:
    return frozenset(m for t in tiers for m in t.models)


def release_problems(releases: Sequence[ReleaseConfig], served: frozenset[str]) -> list[str]:
    """Releases whose variants no backend serves (checked again when releases are reloaded)."""
    problems = []
    for i, release in enumerate(releases):
        for j, variant in enumerate(release.variants):
            if variant.model not in served:
                problems.append(
                    f"releases.{i}.variants.{j}.model: no backend serves {variant.model!r}"
                    f" (served: {', '.join(sorted(served))})"
                )
    return problems


def load_settings(
    config_path: Path | None = None,
    *,
    kinds: Mapping[str, EngineKind] = BUILTIN,
    **overrides: Any,
) -> Settings:
    """Build the gateway's settings.

    Precedence, highest first: ``overrides``, ``TIERGATE_*`` environment variables, the YAML file
    (``config_path``, else ``TIERGATE_CONFIG``), defaults. Backends' kinds are checked against
    `kinds`. Raises ``ConfigError`` on any problem.
    """
    if config_path is not None:
        overrides["config"] = Path(config_path)
    file = overrides.get("config")
    if file is None and os.environ.get(CONFIG_ENV_VAR):
        file = os.environ[CONFIG_ENV_VAR]
    file_path = Path(file) if file is not None else None
    where = f"config file {file_path}" if file_path is not None else "no config file"

    def fail(problems: list[str]) -> ConfigError:
        lines = "\n".join(f"  {problem}" for problem in problems)
        return ConfigError(
            f"invalid configuration ({where}):\n{lines}", file=file_path, problems=problems
        )

    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        raise fail(validation_problems(exc)) from None
    except _YamlLoadError as exc:
        raise fail([f"config: {exc.reason}"]) from None
    except SettingsError as exc:
        # Raised when an environment variable holding a list or object is not valid JSON.
        match = re.search(r'field "([^"]+)"', str(exc))
        field = match.group(1) if match else "(environment)"
        raise fail([f"{field}: cannot parse the environment variable's value as JSON"]) from None
    if settings.tenants_file is not None:
        try:
            more = read_tenants(settings.tenants_file)
        except ConfigError as exc:
            raise fail(list(exc.problems)) from None
        settings = settings.model_copy(update={"tenants": [*settings.tenants, *more]})
    problems = _check_serving(settings) or kind_problems(settings.tiers, kinds)
    if problems:
        raise fail(problems)
    return settings


_TENANTS = TypeAdapter(list[TenantConfig])


def read_tenants(path: Path) -> list[TenantConfig]:
    """The tenants of a tenants file (`tenants:` list); a ConfigError naming what is wrong."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(exc), problems=[f"tenants_file: cannot read {path}: {exc}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            str(exc), problems=[f"tenants_file: invalid YAML in {path}: {exc}"]
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("tenants", []), list):
        why = f"tenants_file: {path} must be a mapping with a `tenants:` list"
        raise ConfigError(why, problems=[why])
    try:
        return _TENANTS.validate_python(data.get("tenants") or [])
    except ValidationError as exc:
        problems = [f"tenants_file: {path}: tenants.{p}" for p in validation_problems(exc)]
        raise ConfigError("; ".join(problems), problems=problems) from None

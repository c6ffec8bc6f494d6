"""Backends from the Kubernetes API, through kubernetes_asyncio: the EndpointSlices of a
Service (label `kubernetes.io/service-name`), listed, then watched from the list's version.
Each endpoint that is ready (no condition set counts as ready, as the API documents) and not
terminating is a backend at the Service's named port; a slice deleted takes its endpoints
with it. A watch that fails or is closed is answered as an error (the tier keeps its
backends) and started again from a fresh list after `retry_s`."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from gateway.backends.discovery.source import Found, url_of
from gateway.config.settings import KubernetesDiscovery

__all__ = ["KubernetesSource", "endpoint_urls"]

_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def endpoint_urls(slice_: Any, port: str | int, scheme: str) -> frozenset[str]:
    """The URLs of an EndpointSlice's ready, not terminating endpoints at `port` (the port's
    name, or its number); none when the slice has no such port."""
    def named(p: Any) -> bool:
        return bool(p.name == port if isinstance(port, str) else p.port == port)

    number = next((p.port for p in slice_.ports or () if named(p)), None)
    if number is None:
        return frozenset()
    urls: set[str] = set()
    for ep in slice_.endpoints or ():
        cond = ep.conditions
        ready = cond is None or cond.ready is None or cond.ready
        if ready and not (cond is not None and cond.terminating):
            urls.update(url_of(scheme, address, number) for address in ep.addresses or ())
    return frozenset(urls)


class KubernetesSource:
    def __init__(self, cfg: KubernetesDiscovery) -> None:
        self.cfg = cfg
        self.namespace = cfg.namespace or (
            _NAMESPACE_FILE.read_text().strip() if _NAMESPACE_FILE.exists() else "default"
        )
        self.selector = f"kubernetes.io/service-name={cfg.service}"
        self._api_client: client.ApiClient | None = None

    async def _api(self) -> client.DiscoveryV1Api:
        if self._api_client is None:
            configuration = client.Configuration()
            in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ and self.cfg.kubeconfig is None
            if in_cluster:
                config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration)
            else:
                path = str(self.cfg.kubeconfig) if self.cfg.kubeconfig is not None else None
                await config.load_kube_config(config_file=path,
                                              client_configuration=configuration)  # fmt: skip
            self._api_client = client.ApiClient(configuration)
        return client.DiscoveryV1Api(self._api_client)

    async def answers(self) -> AsyncIterator[Found]:
        cfg = self.cfg
        while True:
            try:
                api = await self._api()
                listed = await api.list_namespaced_endpoint_slice(
                    self.namespace, label_selector=self.selector)
                slices = {s.metadata.name: endpoint_urls(s, cfg.port, cfg.scheme)
                          for s in listed.items}  # fmt: skip
                yield Found(frozenset().union(*slices.values()))
                events = watch.Watch().stream(
                    api.list_namespaced_endpoint_slice, self.namespace,
                    label_selector=self.selector,
                    resource_version=listed.metadata.resource_version)  # fmt: skip
                async for event in events:
                    kind, obj = event["type"], event["object"]
                    if kind == "DELETED":
                        slices.pop(obj.metadata.name, None)
                    elif kind in ("ADDED", "MODIFIED"):
                        slices[obj.metadata.name] = endpoint_urls(obj, cfg.port, cfg.scheme)
                    else:
                        continue  # BOOKMARK
                    yield Found(frozenset().union(*slices.values()))
                yield Found(error="the watch ended")
            except (ApiException, ConfigException, aiohttp.ClientError, OSError,
                    TimeoutError, ValueError) as e:  # fmt: skip
                yield Found(error=f"{type(e).__name__}: {e}")
            await asyncio.sleep(cfg.retry_s)

    async def aclose(self) -> None:
        if self._api_client is not None:
            with contextlib.suppress(Exception):
                await self._api_client.close()

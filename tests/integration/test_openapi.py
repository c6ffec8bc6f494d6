"""The gateway's published API over real sockets: /openapi.json is valid OpenAPI 3.1, lists
every endpoint with its request and response schemas and error statuses, describes the answers
the gateway really gives, and /docs and /redoc are served with their assets from the gateway."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate

from tests.integration.stack import MODEL, Stack, start_stack

PROXIED = {"/v1/completions": "CompletionRequest", "/v1/chat/completions": "ChatCompletionRequest"}
ERRORS = (400, 401, 404, 413, 429, 502, 503)
SIDE = ("/v1/models", "/health", "/ready", "/state", "/metrics")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("openapi"), latency=1, throughput=1, speedup=10)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def spec(stack: Stack) -> dict[str, Any]:
    r = httpx.get(stack.gateway.url + "/openapi.json")
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    return doc


def conforms(spec: dict[str, Any], instance: Any, schema: dict[str, Any]) -> None:
    """Validate `instance` against a schema of the document (its $refs resolved within it)."""
    root = {**schema, "components": spec["components"]}
    jsonschema.validate(instance, root, cls=jsonschema.Draft202012Validator)


def test_the_schema_is_valid_openapi_3_1(spec: dict[str, Any]) -> None:
    assert spec["openapi"].startswith("3.1")
    validate(spec)  # raises on any violation of the OpenAPI 3.1 schema


def test_every_endpoint_is_listed_with_its_models(spec: dict[str, Any]) -> None:
    paths = spec["paths"]
    for path, model in PROXIED.items():
        op = paths[path]["post"]
        body = op["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}
        ok = op["responses"]["200"]["content"]
        assert set(ok) == {"application/json", "text/event-stream"}
        for status in ERRORS:
            err = op["responses"][str(status)]["content"]["application/json"]["schema"]
            assert err == {"$ref": "#/components/schemas/ErrorResponse"}, (path, status)
    for path in SIDE:
        assert "200" in paths[path]["get"]["responses"], path
    one = paths["/v1/models/{model}"]["get"]["responses"]
    assert one["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ModelCard"}
    assert one["404"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"}
    assert "503" in paths["/ready"]["get"]["responses"]
    assert not any(p.startswith("/static") for p in paths)


def test_the_schema_describes_what_the_gateway_answers(stack: Stack, spec: dict[str, Any]) -> None:
    gw = stack.gateway.url

    def response_schema(path: str, method: str, status: int = 200) -> dict[str, Any]:
        content = spec["paths"][path][method]["responses"][str(status)]["content"]
        schema: dict[str, Any] = content["application/json"]["schema"]
        return schema

    for path in ("/v1/models", "/health", "/ready", "/state"):
        conforms(spec, httpx.get(gw + path).json(), response_schema(path, "get"))
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 4}
    conforms(spec, body, spec["paths"]["/v1/completions"]["post"]["requestBody"]["content"][
        "application/json"]["schema"])  # fmt: skip
    answer = httpx.post(gw + "/v1/completions", json=body).json()
    conforms(spec, answer, response_schema("/v1/completions", "post"))
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    answer = httpx.post(gw + "/v1/chat/completions", json=chat).json()
    conforms(spec, answer, response_schema("/v1/chat/completions", "post"))
    # A streamed chunk is a Completion as well (vLLM's text_completion chunks).
    with httpx.stream("POST", gw + "/v1/completions", json=body | {"stream": True}) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: {"))
    conforms(spec, json.loads(first[6:]), {"$ref": "#/components/schemas/CompletionChunk"})
    # The gateway's own errors are ErrorResponse.
    bad = httpx.post(gw + "/v1/completions", json=body | {"model": "nope"})
    assert bad.status_code == 404
    conforms(spec, bad.json(), response_schema("/v1/completions", "post", 404))


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/nowhere", 404), ("GET", "/v1/completions", 405), ("POST", "/health", 405),
     ("DELETE", "/v1/chat/completions", 405)],
)  # fmt: skip
def test_unknown_paths_and_methods_are_openai_errors(
    stack: Stack, method: str, path: str, status: int
) -> None:
    r = httpx.request(method, stack.gateway.url + path)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert (err["code"], set(err)) == (status, {"message", "type", "param", "code"})


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_are_served_whole_by_the_gateway(stack: Stack, page: str) -> None:
    gw = stack.gateway.url
    r = httpx.get(gw + page)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "/openapi.json" in html
    # Every script and stylesheet the page loads comes from the gateway itself, so the page
    # renders where the network stops at the cluster (no CDN).
    assets = [a for a in _assets(html) if not a.startswith("data:")]
    assert assets
    for asset in assets:
        assert asset.startswith("/"), asset
        got = httpx.get(gw + asset)
        assert got.status_code == 200, asset
        assert len(got.content) > 1000, asset
    js = [a for a in assets if a.endswith(".js")]
    assert js
    bundle = httpx.get(gw + js[0]).text
    # The bundled UI reads OpenAPI 3.1 (older Swagger UI releases refuse a 3.1 document).
    assert "isOAS31" in bundle or page == "/redoc"


# What each page shows once its script has drawn the API from /openapi.json.
RENDERED = {
    "/docs": ("OAS 3.1", 'class="opblock-summary-path"'),
    "/redoc": ("Download OpenAPI specification", "Request Body schema"),
}


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_render_in_a_browser(stack: Stack, page: str, tmp_path: Path) -> None:
    browser = shutil.which("chromium")
    if browser is None:
        pytest.skip("chromium is not installed (./scripts/test installs it)")
    # Headless Chromium runs the page's scripts and prints the DOM they built; the network
    # flags keep it from reaching anything but the gateway.
    r = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path}", "--virtual-time-budget=10000", "--dump-dom",
         stack.gateway.url + page],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    dom = r.stdout
    for marker in RENDERED[page]:
        assert marker in dom, (page, marker, r.stderr[-2000:])
    for path in (*PROXIED, *SIDE):
        assert path in dom, (page, path)
    assert "Unable to render" not in dom
    assert "Something went wrong" not in dom


def _assets(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html)

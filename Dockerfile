# syntax=docker/dockerfile:1
# tiergate: the gateway, the engine simulator and the Locust load generator in one image.
#
#   docker build -t tiergate:0.1.0 .
#   docker run --rm -p 8000:8000 tiergate:0.1.0                      # gateway + simulated tiers
#   docker run --rm -p 8000:8000 -v "$PWD/tiers.yaml:/etc/tiergate/tiers.yaml:ro" \
#       tiergate:0.1.0 serve --config /etc/tiergate/tiers.yaml       # gateway in front of vLLM
#   docker run --rm -p 8201:8000 tiergate:0.1.0 sim --profile v4 --host 0.0.0.0 --port 8000
#   docker run --rm --entrypoint locust tiergate:0.1.0 -f loadtests/locust/locustfile.py --help
#
# Dependencies come from uv.lock (--frozen: the lock is used as is, never re-resolved).
# tests/e2e/test_dockerfile.py replays the COPY/WORKDIR/ENV/RUN steps below in a temporary
# directory and starts the entrypoint from there: keep every RUN step runnable that way.
FROM python:3.11-slim

ARG UV_VERSION=0.13.9

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv \
    PATH=/app/.venv/bin:/opt/uv/bin:$PATH

# uv itself, pinned, outside the application's environment.
RUN python -m pip install --no-cache-dir --disable-pip-version-check --target /opt/uv \
        "uv==${UV_VERSION}"

WORKDIR /app

# Third-party dependencies first: this layer is rebuilt only when the lock changes.
COPY pyproject.toml uv.lock ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --extra load --no-install-project

# Then the project itself, installed from its sources in /app (uv's default, editable: the
# environment points at /app, which also holds the Locust files in loadtests/, the Triton model
# repository in engines/triton/ and the sample tiers file in examples/).
COPY README.md ./
COPY gateway ./gateway
COPY engines ./engines
COPY loadtests ./loadtests
COPY tiergate ./tiergate
COPY examples ./examples
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --extra load

# An unprivileged user; it owns only the folders the commands write to (Locust's runs/ and the
# simulators' logs of `tiergate up`).
RUN groupadd --system --gid 10001 tiergate \
    && useradd --system --uid 10001 --gid tiergate --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin tiergate \
    && mkdir -p /app/runs /app/.tiergate \
    && chown tiergate:tiergate /app/runs /app/.tiergate

USER 10001:10001

EXPOSE 8000

# /health of the gateway (or of a simulator) on TIERGATE_PORT, 8000 by default. Services that
# run something else from this image (a Locust worker) override or disable it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('TIERGATE_PORT', '8000'), timeout=2)"]

ENTRYPOINT ["tiergate"]
CMD ["up"]

# syntax=docker/dockerfile:1.7
# Context Gateway image: `docker build -t context-gateway .`
# Stage one builds the project's wheel and a wheel for every dependency (compilers, if any
# dependency ever needs one, stay here); stage two installs those wheels alone, offline,
# into a slim base and runs as a non-root user.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
# Read-only root filesystems: bytecode is compiled at install time, never written at run time.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/context-gateway \
    PATH=/opt/context-gateway/bin:$PATH \
    GATEWAY_SERVER_PORT=8080 \
    GATEWAY_SERVER_LOG_FORMAT=json
# The wheels come from stage one through a bind mount, so they leave no layer behind; no index
# is consulted. tiktoken's encodings ship inside the litellm package (gateway/offline.py points
# tiktoken at them), and the last step proves they load with the network switched off.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv "$VIRTUAL_ENV" \
    && pip install --no-index --find-links=/wheels /wheels/context_gateway-*.whl \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent gateway
RUN --network=none python -c "from gateway.tokens.encodings import warm_up; warm_up()"

USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
# Liveness of the process itself; Kubernetes uses the chart's /healthz and /readyz probes instead.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GATEWAY_SERVER_PORT', '8080'), timeout=4)"]
# Configure with GATEWAY_* environment variables, or mount a file and set GATEWAY_CONFIG.
ENTRYPOINT ["context-gateway"]
CMD ["serve", "--host", "0.0.0.0"]

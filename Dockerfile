# faithproxy: the proxy only (vLLM runs in its own image; deploy/docker-compose.yml runs the stack).
# Two stages: the first builds the proxy into a virtual environment (/opt/venv) and removes pip,
# setuptools and wheel from it; the final image copies that venv, so no build tool or wheel file is in
# any of its layers. It runs as an unprivileged user.
#
#   docker build --build-arg VERSION=0.1.0 -t faithproxy:0.1.0 .
#   docker build --build-arg EXTRAS=probe ...   (the probe and cascade detectors: numpy, safetensors)
#   docker build --build-arg BASE=IMAGE ...     (any Debian-based image with python3 and its venv module;
#                                               scripts/build_images.sh makes one when Docker Hub is out of reach)
#
# A venv, not the base's Python: Debian's system Python refuses `pip install` (PEP 668), and both stages
# share the BASE, so the venv's interpreter links are the same in each.
# EXTRAS (default none) picks extras of pyproject.toml: the image is the proxy, so only `probe` fits it;
# bench and train are the offline tools and stay out.
#
# Environment (all settings are FAITHPROXY_* variables; README "Settings" has the full table):
#   FAITHPROXY_UPSTREAM_URL       vLLM's base URL (default here: http://vllm:8000)
#   FAITHPROXY_UPSTREAM_API_KEY   key for vLLM, if it wants one
#   FAITHPROXY_JUDGES             JSON list of judges; keys by "api_key_env" (e.g. ANTHROPIC_API_KEY)
#   FAITHPROXY_DEFAULT_MODE / _DEFAULT_DETECTOR / _DEFAULT_JUDGE / _MAX_RETRIES / _ON_DETECTOR_ERROR
#   FAITHPROXY_TRACE_PATH         JSON-lines traces; /var/log/faithproxy is writable by the app user
#   FAITHPROXY_HOST, FAITHPROXY_PORT   listen address (here 0.0.0.0:8080)
# `docker stop` sends SIGTERM to `faithproxy serve` (PID 1, exec form): uvicorn finishes in-flight
# requests within its graceful timeout and exits 0 (faithproxy.server.runtime.cli).
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY faithproxy faithproxy
COPY faithcore faithcore
COPY server server
COPY detectors detectors
COPY regenerators regenerators
COPY clients clients
COPY benchmarks benchmarks
COPY flywheel flywheel
# ".[]" is not a valid requirement: no extras means the plain "." (the server's dependencies only).
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install ".${EXTRAS:+[$EXTRAS]}" \
    && /opt/venv/bin/pip uninstall --yes setuptools wheel pip \
    && find /opt/venv -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="faithproxy" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="OpenAI-compatible proxy that checks and corrects a reasoning VLM's perception steps"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
COPY --from=build /opt/venv /opt/venv
RUN useradd --create-home --uid 10001 faithproxy \
    && mkdir -p /var/log/faithproxy \
    && chown faithproxy:faithproxy /var/log/faithproxy
USER faithproxy
WORKDIR /home/faithproxy
ENV FAITHPROXY_HOST=0.0.0.0 \
    FAITHPROXY_PORT=8080 \
    FAITHPROXY_UPSTREAM_URL=http://vllm:8000
EXPOSE 8080
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('FAITHPROXY_PORT', '8080'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["faithproxy", "serve"]

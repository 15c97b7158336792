# faithproxy: the proxy only (vLLM runs in its own image; deploy/docker-compose.yml runs the stack).
# Two stages: wheels are built in the first; the final image installs them and then removes pip,
# setuptools and wheel, so no build tool is left; it runs as an unprivileged user.
#
#   docker build --build-arg VERSION=0.1.0 -t faithproxy:0.1.0 .
#   docker build --build-arg EXTRAS=probe ...   (the probe and cascade detectors: numpy, safetensors)
#
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
FROM python:3.11-slim AS build
ARG EXTRAS=""
WORKDIR /src
COPY pyproject.toml README.md ./
COPY faithproxy faithproxy
COPY faithcore faithcore
COPY server server
COPY detectors detectors
COPY regenerators regenerators
COPY clients clients
COPY benchmarks benchmarks
COPY tinyvlm tinyvlm
COPY shapesworld shapesworld
# ".[]" is not a valid requirement: no extras means the plain "." (the server's dependencies only).
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".${EXTRAS:+[$EXTRAS]}"

FROM python:3.11-slim
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="faithproxy" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="OpenAI-compatible proxy that checks and corrects a reasoning VLM's perception steps"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && pip uninstall --yes setuptools wheel pip \
    && useradd --create-home --uid 10001 faithproxy \
    && mkdir -p /var/log/faithproxy \
    && chown faithproxy:faithproxy /var/log/faithproxy
USER faithproxy
WORKDIR /home/faithproxy
ENV FAITHPROXY_HOST=0.0.0.0 \
    FAITHPROXY_PORT=8080 \
    FAITHPROXY_UPSTREAM_URL=http://vllm:8000
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('FAITHPROXY_PORT', '8080'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["faithproxy", "serve"]

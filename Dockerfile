# faithproxy: the proxy only (vLLM runs in its own image). Two stages: wheels are built in the first,
# the final image has no compiler and runs as an unprivileged user.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY faithcore faithcore
COPY server server
COPY detectors detectors
COPY regenerators regenerators
COPY clients clients
COPY benchmarks benchmarks
COPY tinyvlm tinyvlm
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="faithproxy" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="OpenAI-compatible proxy that checks and corrects a reasoning VLM's perception steps"
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --create-home --uid 10001 faithproxy
USER faithproxy
WORKDIR /home/faithproxy
# Settings (all FAITHPROXY_*; see README): upstream vLLM, judges (JSON list), traces, defaults.
ENV FAITHPROXY_HOST=0.0.0.0 \
    FAITHPROXY_PORT=8080 \
    FAITHPROXY_UPSTREAM_URL=http://vllm:8000
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"
ENTRYPOINT ["faithproxy", "serve"]

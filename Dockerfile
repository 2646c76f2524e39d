# syntax=docker/dockerfile:1.7
# NInfer images. Targets:
#   server    (default)  ninfer-serve, ninfer-artifact, ninfer-monitor on a CUDA PyTorch runtime base;
#                        the operator's verification Job and the monitor sidecar use it too
#   operator             the kopf operator only: kopf + kubernetes + pyyaml on a slim Python
# Build:  docker build -t ninfer-server .      docker build --target operator -t ninfer-operator .
# Run:    docker run --gpus all -p 8080:8080 -v /models:/artifacts:ro ninfer-server /artifacts/m.ninfer
#         docker run ninfer-server ninfer-artifact verify /artifacts/m.ninfer --sha256 HEX
# Both run as the non-root user `ninfer` (uid/gid 10001), which the operator's pod specs expect.

# RTX 5090 (sm_120) needs CUDA >= 12.8; Hopper works with the same image.
ARG TORCH_IMAGE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- wheel: build the ninfer wheel once, without dependencies ------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
RUN pip install --no-cache-dir "setuptools==80.9.0" "wheel==0.45.1"
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY kernels ./kernels
COPY api ./api
COPY monitor ./monitor
RUN pip wheel --no-deps --no-build-isolation -w /wheels .

# ---- operator ------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS operator
RUN groupadd --gid 10001 ninfer && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin ninfer
WORKDIR /app
COPY pyproject.toml /tmp/pyproject.toml
# The requirement pins come from pyproject's `operator` extra, so there is one source of truth.
RUN python -c "import tomllib; d = tomllib.load(open('/tmp/pyproject.toml', 'rb')); \
print('\n'.join(d['project']['optional-dependencies']['operator']))" > /tmp/operator.txt \
 && pip install --no-cache-dir -r /tmp/operator.txt && rm /tmp/operator.txt /tmp/pyproject.toml
COPY operator ./operator
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["kopf"]
CMD ["run", "--standalone", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz", "/app/operator/main.py"]

# ---- server (default target) ---------------------------------------------------------------------
FROM ${TORCH_IMAGE} AS server
RUN groupadd --gid 10001 ninfer && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin ninfer
COPY --from=wheel /wheels /wheels
# The base's CUDA torch satisfies the project's torch range, so pip keeps it; `gpu` adds Triton and
# flash-linear-attention, which belong only in GPU images.
# DL3013 (pin versions): this is the project's own wheel, whose dependency ranges pyproject.toml pins.
# hadolint ignore=DL3013
RUN WHEEL=$(ls /wheels/ninfer-*.whl) && pip install --no-cache-dir "${WHEEL}[gpu]" && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    TRITON_CACHE_DIR=/tmp/triton-cache HF_HOME=/tmp/hf-home
RUN mkdir -p /var/log/ninfer /artifacts && chown 10001:10001 /var/log/ninfer
USER 10001:10001
EXPOSE 8080 8090
COPY --chmod=0755 scripts/docker-entrypoint.sh /usr/local/bin/ninfer-entrypoint
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4)"]
# `docker run IMAGE` serves; `docker run IMAGE ninfer-serve|ninfer|ninfer-artifact ... ARGS` runs that command
# (scripts/docker-entrypoint.sh); other arguments go to ninfer-serve.
ENTRYPOINT ["ninfer-entrypoint"]
CMD []

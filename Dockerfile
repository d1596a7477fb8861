# syntax=docker/dockerfile:1
#
# The actorlearner image: one entry point for the learner, actors and env servers.
#
#   CPU (default):  docker build -t actorlearner:0.1.0 .
#   CUDA:           docker build -t actorlearner:0.1.0-cuda \
#                     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#                     --build-arg TORCH_INDEX_URL=<a CUDA 12.8 wheel index for torch> .
#
# BASE_IMAGE needs Python >= 3.11, or an apt-based image where apt's python3 is >= 3.11
# (it is installed then). TORCH is the pip requirement for torch, installed before the
# project so pip never picks another build; TORCH_INDEX_URL, when set, is the index it is
# fetched from (a CPU-only or a CUDA wheel index).

ARG BASE_IMAGE=python:3.12-slim-bookworm

# --- shared: Python (when the base lacks it) and the unprivileged user -------------------
FROM ${BASE_IMAGE} AS base
RUN set -eux; \
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version'; \
    groupadd --system --gid 10001 actorlearner; \
    useradd --system --uid 10001 --gid 10001 --home-dir /home/actorlearner --create-home \
        --shell /usr/sbin/nologin actorlearner

# --- builder: the project and its dependencies in a venv ---------------------------------
FROM base AS builder
ARG TORCH=torch==2.13.0
ARG TORCH_INDEX_URL=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/actorlearner
ENV PATH=/opt/actorlearner/bin:$PATH
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY actorlearner ./actorlearner
RUN pip install . && python -c "import actorlearner.cli, torch; print('torch', torch.__version__)"

# --- runtime: the venv, no build tree, no root --------------------------------------------
FROM base AS runtime
COPY --from=builder /opt/actorlearner /opt/actorlearner
# Caches go to /tmp: Kubernetes mounts an emptyDir there and keeps the root read-only.
ENV PATH=/opt/actorlearner/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/actorlearner \
    XDG_CACHE_HOME=/tmp/.cache \
    CUDA_CACHE_PATH=/tmp/.nv/ComputeCache
USER 10001:10001
WORKDIR /home/actorlearner
# learner gRPC, actor health, env server gRPC, Prometheus metrics
EXPOSE 50051 50052 50061 9100
ENTRYPOINT ["actorlearner"]
# A self-contained demo: learner and two actors on loopback until CartPole is solved.
CMD ["run", "--env", "CartPole-v1", "--actors", "2"]

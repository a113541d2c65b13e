#!/bin/sh
# `make gpu-carry`: what `k25 bench gpu` needs on a GPU machine whose Python 3.12 already holds
# CUDA's PyTorch, Triton, numpy, tokenizers, transformers, httpx and the like, but that has no
# network and gets no .venv (a CPU build of torch, and gigabytes): the wheels of K25's other
# dependencies, redis-server with the libraries it links beyond the C and C++ runtimes, the
# SmolLM2 GGUF and the commit. They are packed into parts of at most $PART_SIZE
# (.gpu-carry/part-aa, -ab, ...) with a manifest of their checksums, so that each transfer to
# that machine carries one part and the manifest; bench/gpu_device.sh gathers them there.
set -eu
PY=${PYTHON:-.venv/bin/python}
PART_SIZE=${PART_SIZE:-56M}
OUT=.gpu-carry
STAGE=$OUT/stage
# K25's dependencies (pyproject.toml: the core, engine, gateway and bench) and theirs that such an
# image lacks, with protobuf and typing-extensions, whose versions there may be older than ours
WHEELS="pyzmq protobuf llguidance redis fastapi starlette pydantic pydantic-core annotated-types typing-inspection
typing-extensions uvicorn bm25s jsonschema jsonschema-specifications referencing rpds-py googleapis-common-protos
opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-proto
opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-otlp-proto-common opentelemetry-exporter-http-transport
opentelemetry-exporter-otlp-common"

rm -rf $OUT
mkdir -p $STAGE/wheels $STAGE/bin $STAGE/lib
# the versions installed here, which the tests pass with, built for CPython 3.12 on x86-64 Linux with
# a glibc up to 2.35 (pip matches each manylinux tag exactly, so every one is named)
pins=$(for name in $WHEELS; do $PY -c 'import importlib.metadata as m, sys; print(f"{sys.argv[1]}=={m.version(sys.argv[1])}")' "$name"; done)
platforms=$(for minor in $(seq 5 35); do printf -- '--platform manylinux_2_%s_x86_64 ' "$minor"; done)
# shellcheck disable=SC2086 # one argument a pin, a flag or its value
$PY -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $platforms --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d $STAGE/wheels $pins

# redis-server for `k25 up`, run through a wrapper that finds the libraries copied beside it
server=$(command -v redis-server)
cp "$server" $STAGE/lib/redis-server
ldd "$server" | awk '$3 ~ /^\// {print $3}' | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so' \
    | xargs -I{} cp -L {} $STAGE/lib/
cat > $STAGE/bin/redis-server <<'EOF'
#!/bin/sh
here=$(dirname "$0")/../lib
LD_LIBRARY_PATH=$here exec "$here/redis-server" "$@"
EOF
chmod +x $STAGE/bin/redis-server

cp "$($PY -c 'from common.model_source import resolve_model; print(resolve_model("smollm2-135m").path)')" $STAGE/smollm2-135m.gguf
echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- || echo +dirty)" > $STAGE/COMMIT

tar -czf - -C $STAGE . | split -b "$PART_SIZE" - $OUT/part-
rm -rf $STAGE
(cd $OUT && sha256sum part-* > manifest)
ls -l $OUT

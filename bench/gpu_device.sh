#!/bin/sh
# On the GPU machine, in the repository's root, once for each part that `make gpu-carry` made
# (bench/gpu_carry.sh), each time with that part and the manifest in .gpu-carry/: keeps the part
# in $KEEP; once every part is there, unpacks them, installs the wheels beside the machine's own
# PyTorch and runs `k25 bench gpu`, writing $OUT/gpu-check.json (the current folder's if OUT is unset).
set -eu
KEEP=${KEEP:-/tmp/k25-gpu-carry}
mkdir -p "$KEEP"
cp .gpu-carry/manifest .gpu-carry/part-* "$KEEP"/
cd "$KEEP"
if ! sha256sum --quiet --check manifest >/dev/null 2>&1; then
    echo "gpu_device.sh: kept $(ls part-* | wc -l) of $(wc -l < manifest) parts in $KEEP; run it again with the next" >&2
    exit 0
fi
cd - >/dev/null
rm -rf "$KEEP/stage" "$KEEP/site" && mkdir -p "$KEEP/stage"
cat "$KEEP"/part-* | tar -xzf - -C "$KEEP/stage"
python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$KEEP/site" "$KEEP"/stage/wheels/*.whl
PYTHONPATH="$PWD:$KEEP/site" PATH="$KEEP/stage/bin:$PATH" PYTHONUNBUFFERED=1 python3 -m k25.cli bench gpu \
    --model "$KEEP/stage/smollm2-135m.gguf" --git-commit "$(cat "$KEEP/stage/COMMIT")" --out "${OUT:-.}/gpu-check.json"

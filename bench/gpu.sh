#!/bin/sh
# bench/gpu.sh - dsv4 on a GPU through Vulkan, in one run of at most 10 minutes (issue 37):
# builds (unless DSV4_BIN names a binary), lists the Vulkan devices (`dsv4 ops --backend
# vulkan`: stops here, saying so, when the machine has no Vulkan driver), makes the
# flash-shaped synthetic model (real V4-Flash layer sizes, GPU_LAYERS layers, default 2) unless
# GPU_MODEL names one, and runs `dsv4 bench --backend vulkan` on it: the device's read
# bandwidth and FMA peak, then decode at batch 1, 8, 32 and 64 and prefill of 512 and 2048
# tokens, all into OUT/gpu.csv (OUT defaults to build/gpu). Every step's output is kept in OUT.
#
# usage: bench/gpu.sh [OUT]
# environment: DSV4_BIN (a built dsv4 with the Vulkan backend), GPU_MODEL (a flash-shaped
#              checkpoint directory), GPU_LAYERS (2), GPU_ARGS (more options for dsv4 bench)
# exit status: 0 the bench ran; 1 a step failed (its log is named); 2 no Vulkan device.
set -u
out=${1:-build/gpu}
mkdir -p "$out" || exit 1
start=$(date +%s)
step() { echo "gpu.sh [$(($(date +%s) - start)) s] $*"; }

bin=${DSV4_BIN:-}
if [ -z "$bin" ]; then
    step "building (make VULKAN=1)"
    if ! make -j"$(nproc)" VULKAN=1 dsv4 >"$out/build.log" 2>&1; then
        echo "gpu.sh: the build failed: $out/build.log" >&2
        tail -20 "$out/build.log" >&2
        exit 1
    fi
    bin=./dsv4
fi
step "devices"
if ! "$bin" ops --backend vulkan >"$out/ops.txt" 2>&1; then
    echo "gpu.sh: no usable Vulkan device (dsv4 ops --backend vulkan):" >&2
    cat "$out/ops.txt" >&2
    exit 2
fi
sed -n '1,/^  linear/p' "$out/ops.txt"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv \
    >"$out/nvidia-smi.txt" 2>&1

model=${GPU_MODEL:-$out/flash-shaped}
if [ ! -f "$model/config.json" ]; then
    step "generating the flash-shaped model (${GPU_LAYERS:-2} layers) into $model"
    if ! "$bin" gen --preset flash-shaped --layers "${GPU_LAYERS:-2}" -q -o "$model" >"$out/gen.log" 2>&1; then
        echo "gpu.sh: dsv4 gen failed: $out/gen.log" >&2
        exit 1
    fi
fi
step "bench"
# shellcheck disable=SC2086 # GPU_ARGS is a list of options
"$bin" bench -m "$model" --backend vulkan --batch-list 1,8,32,64 --ctx-list 512,2048 --chunk 2048 \
    --decode-steps 8 --csv "$out/gpu.csv" ${GPU_ARGS:-} >"$out/bench.txt" 2>&1
rc=$?
cat "$out/bench.txt"
if [ "$rc" -ne 0 ]; then
    echo "gpu.sh: dsv4 bench failed (exit $rc): $out/bench.txt" >&2
    exit 1
fi
step "done: $out/gpu.csv"

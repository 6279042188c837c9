#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, PyTorch, CMake and ninja, but none of our
# Debian packages and no network (run through the device tool; scripts/prepare-gpu-carry.sh
# fills third_party/ beforehand). Configures against that machine's LibTorch, builds the GPU
# tests, the Fashion-MNIST example, bench_step and bench_staging, runs the tests labelled gpu,
# the example with bf16 and fp16, and both benchmarks on the GPU, writing logs and JSON to one
# folder.
#   scripts/gpu-check.sh [results-dir]        (default: $OUT when set, else gpu-results)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-results}}"
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1
start=$SECONDS
status=0
step() { echo "== $* ($((SECONDS - start)) s)"; }

python=$(command -v python3)
step "machine"
nvidia-smi || true
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'
prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')

step "configure"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DACCELERATE_PYTHON="$python" -DACCELERATE_THIRD_PARTY_DIR="$PWD/third_party" \
  -DACCELERATE_TEST_PYTHON="$python" || exit 1
step "build"
cmake --build build-gpu -j "$(nproc)" --target gpu_tests nccl_train fashion_mnist bench_step bench_staging || exit 1

step "tests labelled gpu"
ctest --test-dir build-gpu -L gpu --output-on-failure --output-junit "$PWD/$out/gpu-tests.xml" || status=1
for precision in bf16 fp16; do
  step "fashion_mnist --precision $precision"
  ./build-gpu/examples/fashion_mnist --epochs 1 --no-progress --precision "$precision" \
    --data third_party/fashion-mnist | tee "$out/fashion_mnist_$precision.txt" || status=1
  tail -1 "$out/fashion_mnist_$precision.txt" > "$out/fashion_mnist_$precision.json"
done
step "bench_step on the GPU"
ACCELERATE_BENCH_DEVICE=cuda ./build-gpu/bench/bench_step --benchmark_repetitions=5 \
  --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2 \
  --benchmark_format=json --benchmark_out="$out/bench_step_gpu.json" || status=1
step "bench_staging: host-to-GPU copies by kind"
./build-gpu/bench/bench_staging --rounds 3 --steps 50 | tee "$out/bench_staging.jsonl" || status=1
step "done (status $status)"
exit $status

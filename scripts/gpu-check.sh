#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU, PyTorch, CMake and ninja, but none of our
# Debian packages and no network (run through the device tool; scripts/prepare-gpu-carry.sh
# fills third_party/ beforehand). Configures against that machine's LibTorch, takes the
# programs prepare-gpu-carry.sh built when they run with it, else builds the GPU tests, the
# Fashion-MNIST example, bench_step and bench_staging there; then runs the tests labelled gpu,
# bench_staging, the example with bf16 and fp16 and bench_step, most wanted first, writing logs
# and JSON to one folder as it goes (a run cut short keeps what it did).
#   scripts/gpu-check.sh [results-dir]        (default: $OUT when set, else gpu-results)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-results}}"
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: ctest writes its JUnit file from inside the build folder
exec > >(tee "$out/gpu-check.log") 2>&1
start=$SECONDS
status=0
step() { echo "== $* ($((SECONDS - start)) s)"; }

python=$(command -v python3)
step "machine"
nvidia-smi || true
# One import of torch (1.3-2 s each here): what the log shows, then what the steps below use.
mapfile -t torch_facts < <("$python" -c 'import os, torch, torch.utils
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())
print(torch.__version__)
print(os.path.join(os.path.dirname(torch.__file__), "lib"))
print(torch.utils.cmake_prefix_path)')
echo "${torch_facts[0]:-torch: not importable}"
torch_version="${torch_facts[1]:-}" torch_lib="${torch_facts[2]:-}" prefix="${torch_facts[3]:-}"

step "configure"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DACCELERATE_PYTHON="$python" -DACCELERATE_THIRD_PARTY_DIR="$PWD/third_party" \
  -DACCELERATE_TEST_PYTHON="$python" || exit 1
# Programs prepare-gpu-carry.sh built from these sources against this LibTorch version: taken
# when they start here, which saves the build's minutes of device time; otherwise built here.
programs=(tests/gpu_tests tests/nccl_train examples/fashion_mnist bench/bench_step bench/bench_staging)
prebuilt=third_party/prebuilt
if [[ -n "$torch_version" && "$(cat $prebuilt/torch-version.txt 2>/dev/null)" == "$torch_version" ]] &&
   [[ "$(cat $prebuilt/sources.sha256 2>/dev/null)" == "$(scripts/source-fingerprint.sh)" ]] &&
   LD_LIBRARY_PATH="$torch_lib" "$prebuilt/tests/nccl_train" --version; then
  step "prebuilt programs"
  # Their run path names the machine they were built on; this LibTorch is found through this.
  export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for program in "${programs[@]}"; do cp "$prebuilt/$program" "build-gpu/$program" || exit 1; done
else
  step "build (no prebuilt programs for this LibTorch and these sources)"
  cmake --build build-gpu -j "$(nproc)" --target "${programs[@]##*/}" || exit 1
fi

step "tests labelled gpu"
# Bounded as a whole, so that a hanging run still leaves the device time for what follows.
timeout 360 ctest --test-dir build-gpu -L gpu --output-on-failure --output-junit "$out/gpu-tests.xml" || status=1
step "bench_staging: host-to-GPU copies by kind"
./build-gpu/bench/bench_staging --rounds 3 --steps 50 | tee "$out/bench_staging.jsonl" || status=1
for precision in bf16 fp16; do
  step "fashion_mnist --precision $precision"
  ./build-gpu/examples/fashion_mnist --epochs 1 --no-progress --precision "$precision" \
    --data third_party/fashion-mnist | tee "build-gpu/fashion_mnist_$precision.txt" || status=1
  # The run is in the log; its summary (the last line) is a file of its own. (The device tool
  # returns at most 8 files.)
  tail -1 "build-gpu/fashion_mnist_$precision.txt" > "$out/fashion_mnist_$precision.json"
done
step "bench_step on the GPU"
ACCELERATE_BENCH_DEVICE=cuda ./build-gpu/bench/bench_step --benchmark_repetitions=5 \
  --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2 \
  --benchmark_format=json --benchmark_out="$out/bench_step_gpu.json" || status=1
step "done (status $status)"
exit $status

#!/usr/bin/env bash
# Builds the whole project with AddressSanitizer and UndefinedBehaviorSanitizer (GCC) in
# build-asan/ and runs the test suite there (after scripts/quickstart.sh made .venv).
#   scripts/sanitize.sh [ctest arguments, e.g. -L unit]
# LibTorch itself is not instrumented: ODR and new/delete-mismatch reports from inside it are
# switched off, leaks are not reported (LibTorch keeps caches until exit).
set -euo pipefail
cd "$(dirname "$0")/.."
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DACCELERATE_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build build-asan -j "$(nproc)"
export ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0:alloc_dealloc_mismatch=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-asan --output-on-failure -j "$(nproc)" --timeout 1800 "$@"

#!/usr/bin/env bash
# Copies what a GPU machine lacks into third_party/ (git-ignored, under 64 MiB), so that
# scripts/gpu-check.sh can build there from the working tree alone: header-only Boost.Hana,
# range-v3 and nlohmann-json, Gloo's headers, GoogleTest's and Google Benchmark's sources, and
# the Fashion-MNIST files. Run here, after scripts/quickstart.sh; idempotent.
#
# It also builds the GPU check's programs here (gpu_tests, nccl_train, fashion_mnist, bench_step,
# bench_staging) into third_party/prebuilt/: against the same LibTorch wheel as the GPU machines
# (scripts/requirements.txt pins it), with the test frameworks from third_party/ and no yaml-cpp,
# so they need nothing there beyond LibTorch, the C and C++ runtimes and zlib. gpu-check.sh runs
# them when they start there and the sources have not changed since (scripts/source-fingerprint.sh;
# run this again after an edit), and builds its own otherwise: a build takes minutes of device time.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=third_party
mkdir -p "$dest/include/boost" "$dest/fashion-mnist"
copy() { rm -rf "$2"; cp -r "$1" "$2"; }
copy /usr/include/boost/hana "$dest/include/boost/hana"
cp /usr/include/boost/hana.hpp "$dest/include/boost/hana.hpp"
for dir in range meta concepts nlohmann gloo; do copy "/usr/include/$dir" "$dest/include/$dir"; done
copy /usr/src/googletest "$dest/googletest"
if [[ ! -f "$dest/benchmark/CMakeLists.txt" ]]; then
  # Debian 12's Google Benchmark, from Debian's archive (the binary package has no sources).
  url=http://deb.debian.org/debian/pool/main/b/benchmark/benchmark_1.7.1.orig.tar.gz
  curl -sSfL -o /tmp/benchmark_1.7.1.orig.tar.gz "$url"
  echo "6430e4092653380d9dc4ccb45a1e2dc9259d581f4866dc0759713126056bc1d7  /tmp/benchmark_1.7.1.orig.tar.gz" | sha256sum -c -
  rm -rf "$dest/benchmark" && mkdir -p "$dest/benchmark"
  tar xzf /tmp/benchmark_1.7.1.orig.tar.gz -C "$dest/benchmark" --strip-components=1
  rm -rf "$dest/benchmark/test" "$dest/benchmark/docs" "$dest/benchmark/.github"
fi
cp /usr/share/datasets/fashion-mnist/*.gz "$dest/fashion-mnist/"

# --- the GPU check's programs, prebuilt ---------------------------------------------------
programs=(tests/gpu_tests tests/nccl_train examples/fashion_mnist bench/bench_step bench/bench_staging)
cmake -S . -B build-gpu-prebuilt -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCELERATE_THIRD_PARTY_DIR="$PWD/$dest" \
  -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_yaml-cpp=ON > /dev/null
cmake --build build-gpu-prebuilt -j "$(nproc)" --target "${programs[@]##*/}"
# Only libraries every GPU machine has: LibTorch's (found there through LD_LIBRARY_PATH), the C
# and C++ runtimes, zlib.
allowed='^(libtorch.*|libc10.*|libstdc\+\+\.so\.6|libm\.so\.6|libgcc_s\.so\.1|libc\.so\.6|libz\.so\.1)$'
for program in "${programs[@]}"; do
  for needed in $(readelf -d "build-gpu-prebuilt/$program" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
    [[ "$needed" =~ $allowed ]] || { echo "prepare-gpu-carry: $program needs $needed, which a GPU machine may lack" >&2; exit 1; }
  done
done
rm -rf "$dest/prebuilt" && mkdir -p "$dest/prebuilt"
(cd build-gpu-prebuilt && cp --parents "${programs[@]}" ../"$dest/prebuilt"/)
.venv/bin/python -c 'import torch; print(torch.__version__)' > "$dest/prebuilt/torch-version.txt"
scripts/source-fingerprint.sh > "$dest/prebuilt/sources.sha256"
du -sh "$dest/prebuilt" && du -sh "$dest"

#!/usr/bin/env bash
# Copies what a GPU machine lacks into third_party/ (git-ignored, under 64 MiB), so that
# scripts/gpu-check.sh can build there from the working tree alone: header-only Boost.Hana,
# range-v3 and nlohmann-json, Gloo's headers, GoogleTest's and Google Benchmark's sources, and
# the Fashion-MNIST files. Run here, after scripts/quickstart.sh; idempotent.
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
du -sh "$dest"

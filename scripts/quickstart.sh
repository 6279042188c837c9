#!/usr/bin/env bash
# One-command set-up for a fresh Debian 12 machine (run as root), idempotent:
#   scripts/quickstart.sh example   install dependencies, build, train Fashion-MNIST
#   scripts/quickstart.sh test      install dependencies, build everything, run the test suite
# A second run installs and downloads nothing and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-example}"
case "$mode" in example|test) ;; *) echo "usage: $0 example|test" >&2; exit 2 ;; esac

# --- Debian packages ---------------------------------------------------------------------
packages=(
  cmake g++ ninja-build ccache python3-venv pkg-config
  libboost-dev librange-v3-dev libgtest-dev libgmock-dev libbenchmark-dev
  zlib1g-dev nlohmann-json3-dev libyaml-cpp-dev libgloo-dev
  dataset-fashion-mnist fortunes iproute2 valgrind gnuplot-nox clang libclang-rt-14-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "quickstart: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- Python packages (LibTorch comes from PyTorch's wheel) --------------------------------
python=python3
[[ -x /usr/bin/python3 ]] && python=/usr/bin/python3
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
stamp=.venv/.requirements.sha256
want="$(sha256sum scripts/requirements.txt | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "quickstart: installing Python packages into .venv (about 4.6 GB, once)"
  .venv/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements.txt
  echo "$want" > "$stamp"
fi

# --- configure and build -----------------------------------------------------------------
jobs="$(nproc)"
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
if [[ "$mode" == example ]]; then
  cmake --build build --target fashion_mnist -j "$jobs"
  ./build/examples/fashion_mnist --epochs 1
else
  cmake --build build -j "$jobs"
  ctest --test-dir build --output-on-failure -j "$jobs" --timeout 900
fi

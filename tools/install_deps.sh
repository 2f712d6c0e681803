#!/usr/bin/env bash
# Installs every build and test dependency of rollpack from Debian's archive.
# Idempotent: a second run installs nothing and takes about a second.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-dev python3-grpcio python3-protobuf python3-numpy pybind11-dev
)
if [[ "${ROLLPACK_WITH_TORCH:-1}" == 1 ]]; then
  packages+=(python3-torch)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
echo "install_deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

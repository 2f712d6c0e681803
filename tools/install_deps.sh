#!/usr/bin/env bash
# Installs every build and test dependency of rollpack from Debian's archive.
# Idempotent: a second run installs nothing and takes about a second.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libcpp-httplib-dev prometheus-cpp-dev libnghttp2-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-dev python3-grpcio python3-protobuf python3-numpy
)
# The Python package is tested as installed (issue 17): a venv over Debian's
# python3 and `pip install --no-build-isolation --no-index ./client/python`.
packages+=(python3-venv python3-pip python3-setuptools python3-wheel)
if [[ "${ROLLPACK_WITH_TORCH:-1}" == 1 ]]; then
  packages+=(python3-torch)
fi
# Operations tests (issue 7): a real Prometheus + promtool, openssl for test
# certificates, PyYAML to parse deploy/ manifests, npm for buf (below).
packages+=(prometheus openssl python3-yaml)
# Reliability (issue 8): clang + its libFuzzer/sanitizer runtimes for fuzz/.
packages+=(clang libclang-rt-14-dev)
# Cluster mode (issue 20): etcd for the tests (they start their own on
# 127.0.0.1; the package's system service is never used) and etcd's API
# .proto files with their imports, compiled at build time.
packages+=(etcd-server etcd-client golang-etcd-server-dev golang-github-gogo-protobuf-dev
           golang-github-grpc-ecosystem-grpc-gateway-dev)
# Bazel 4.2.3 for `make bazel-test` (docs/bazel.md), offline.
packages+=(bazel-bootstrap)
# The HTTP capture port (issue 37, docs/capture-design.md): Boost.Beast/Asio
# (header-only) for the proxy, simdjson for the engines' responses.
packages+=(libboost1.74-dev libsimdjson-dev)
# A compiler cache for the CMake trees (docs/build.md): CI runs right after a
# session on the same machine, so its compiles are usually cached.
packages+=(ccache)
# Debian's npm, unless a node/npm is already installed (e.g. NodeSource's
# nodejs, which conflicts with Debian's npm package).
if ! command -v npm >/dev/null; then packages+=(npm); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# buf (npm @bufbuild/buf) into .tools/npm, idempotent; after apt when npm is missing.
install_buf() { bash "$(dirname "$0")/install_buf.sh" >/dev/null; }
if ((${#missing[@]} == 0)); then
  install_buf
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
echo "install_deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
install_buf

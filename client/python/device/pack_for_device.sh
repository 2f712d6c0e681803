#!/bin/bash
# Run HERE (Debian 12, x86-64): puts what the GPU machine lacks into .device/
# (git-ignored), to be named in the device tool's `carry`:
#   .device/bin/rollpackd            the server, built here
#   .device/bin/rollpack             the CLI (bench transport on a host with
#                                    more cores than this one)
#   .device/lib/librollpack_trainer.so  the trainer client (gRPC + CUDA kernels,
#                                    cudart static; NCCL loaded at run time)
#   .device/lib/*.so*                every shared library those two need that is
#                                    not glibc/libstdc++/libgcc (gRPC, protobuf,
#                                    absl, OpenSSL, c-ares, re2, ...), from Debian
#   .device/py/*_pb2*.py             the generated Python stubs (git-ignored too)
# The GPU machine (Ubuntu 24.04, newer glibc and libstdc++) runs them with
# LD_LIBRARY_PATH=.device/lib; build_on_device.sh installs them into the
# Python package there (ctypes binding: nothing to compile). Usage:
#   client/python/device/pack_for_device.sh [BUILD_DIR]   (default build-gpu)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
B=${1:-$ROOT/build-gpu}
cd "$ROOT"
if [ ! -f "$B/CMakeCache.txt" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$B" -j2 --target rollpackd rollpack rollpack_trainer rollpack_python_stubs
grep -q '^/.device/' .gitignore .git/info/exclude 2>/dev/null || echo /.device/ >> .git/info/exclude
rm -rf .device && mkdir -p .device/bin .device/lib .device/py
cp "$B/bin/rollpackd" "$B/bin/rollpack" .device/bin/
strip .device/bin/rollpackd .device/bin/rollpack
cp "$B/lib/librollpack_trainer.so" .device/lib/
strip .device/lib/librollpack_trainer.so
cp client/python/rollpack/v1/*_pb2*.py .device/py/
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so)'
for f in .device/bin/rollpackd .device/bin/rollpack .device/lib/librollpack_trainer.so; do
  ldd "$f" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $skip ]]; then cp -L "$path" ".device/lib/$name"; fi
  done
done
du -sh .device
n=$(du -sm .device | cut -f1)
if [ "$n" -gt 40 ]; then echo "pack_for_device: .device is ${n} MiB (the device tool carries 64 MiB in all)" >&2; exit 1; fi

#!/bin/bash
# One call on the GPU machine (device tool) for the masked log-probabilities:
# build kernels/ standalone (the two targets needed), run the GPU test
# (CUDA vs the CPU reference) with two seeds, a compute-sanitizer memcheck
# pass, the Python binding on CUDA tensors (client/python/tests/
# gpu_sampling_mask.py, through a library of client/trainer/
# masked_logprob_capi.cc alone: this machine has no gRPC for the whole
# librollpack_trainer.so) and the benchmark against torch. Logs and the JSON
# go to $OUT.
#   bash kernels/bench/run_masked_logprob.sh [extra masked_logprob_bench.py flags]
set -u
OUT=${OUT:-/tmp/rollpack_masked_out}
mkdir -p "$OUT"
B=/tmp/kb
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv | tee "$OUT/gpu.txt"
{ cmake -S kernels/standalone -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release &&
  cmake --build $B -j 16 --target masked_logprob_gpu_test rollpack_kernels_capi; } \
  > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "build ok"
for seed in 39 2026; do
  timeout 200 $B/kernels/masked_logprob_gpu_test $seed 80 2>&1 | tee -a "$OUT/gpu_test.log" | tail -8
  r=${PIPESTATUS[0]}; echo "gpu test seed $seed rc=$r"; [ "$r" = 0 ] || rc=1
done
if command -v compute-sanitizer > /dev/null; then
  timeout 180 compute-sanitizer --tool memcheck --print-limit 5 $B/kernels/masked_logprob_gpu_test 7 12 \
    > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; tail -3 "$OUT/memcheck.log"
fi
nvcc -std=c++17 -O2 -shared -Xcompiler=-fPIC -DROLLPACK_WITH_CUDA -I. \
  client/trainer/masked_logprob_capi.cc $B/kernels/librollpack_kernels_cuda.a \
  $B/kernels/librollpack_kernels_cpu.a -o $B/libmasked_logprob_capi.so >> "$OUT/build.log" 2>&1
PYTHONUNBUFFERED=1 timeout 200 python3 client/python/tests/gpu_sampling_mask.py \
  $B/libmasked_logprob_capi.so 2>&1 | tee "$OUT/gpu_python.log"
r=${PIPESTATUS[0]}; echo "python gpu test rc=$r"; [ "$r" = 0 ] || rc=1
PYTHONUNBUFFERED=1 timeout 300 python3 kernels/bench/masked_logprob_bench.py \
  $B/kernels/librollpack_kernels_capi.so --json "$OUT/masked_logprob_bench.json" "$@" \
  2>&1 | tee "$OUT/bench.log"
r=${PIPESTATUS[0]}; echo "bench rc=$r"; [ "$r" = 0 ] || rc=1
exit $rc

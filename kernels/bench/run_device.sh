#!/bin/bash
# One call on the GPU machine (device tool): build kernels/ standalone, run the
# GPU fuzz test, the CUDA-event benchmark, the torch benchmark, and a short
# compute-sanitizer memcheck pass. Logs and bench.json go to $OUT.
#   bash kernels/bench/run_device.sh          # everything
#   bash kernels/bench/run_device.sh sweep    # build, fuzz, sanitizers, unpack knob sweep
#   bash kernels/bench/run_device.sh unpack   # build, fuzz, sanitizers, unpack benchmarks only
set -u
what=${1:-all}
OUT=${OUT:-/tmp/rollpack_kernels_out}
mkdir -p "$OUT"
B=/tmp/kb
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv | tee "$OUT/gpu.txt"
nvcc --version | tail -1
{ cmake -S kernels/standalone -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build $B -j 16; } \
  > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "build ok"
if [ -x $B/kernels/replay_kernels_test ]; then
  timeout 120 $B/kernels/replay_kernels_test --gtest_brief=1 > "$OUT/cpu_test.log" 2>&1; echo "cpu test rc=$?"
else
  echo "cpu test: no GoogleTest here, not built"
fi
seeds="12345 2026"
[ "$what" != all ] && seeds=12345
for seed in $seeds; do
  timeout 240 $B/kernels/replay_kernels_gpu_test $seed 100 2>&1 | tee -a "$OUT/gpu_test.log" | tail -25
  r=${PIPESTATUS[0]}; echo "gpu test seed $seed rc=$r"; [ "$r" = 0 ] || rc=1
done
if [ "$what" != all ]; then
  for tool in memcheck racecheck synccheck; do
    timeout 150 compute-sanitizer --tool $tool --print-limit 5 $B/kernels/replay_kernels_gpu_test 777 6 \
      > "$OUT/$tool.log" 2>&1
    echo "$tool rc=$?"; tail -3 "$OUT/$tool.log"
  done
  timeout 300 $B/kernels/replay_bench 20 --$what > "$OUT/sweep.log" 2>&1
  echo "sweep rc=$?"
  grep -E "^d2d|^unpack (auto  |tiled )" "$OUT/sweep.log"
  grep "^SWEEP" "$OUT/sweep.log"
  PYTHONUNBUFFERED=1 timeout 120 python3 kernels/bench/replay_bench.py $B/kernels/librollpack_kernels_capi.so \
    --sections unpack --unpack-variants 0,1 > "$OUT/bench_py.log" 2>&1
  echo "torch bench rc=$?"; grep "^|" "$OUT/bench_py.log"
  exit $rc
fi
timeout 120 $B/kernels/replay_bench 50 2>&1 | tee "$OUT/bench_cpp.log" | tail -60
PYTHONUNBUFFERED=1 timeout 240 python3 kernels/bench/replay_bench.py $B/kernels/librollpack_kernels_capi.so \
  --json "$OUT/bench.json" > "$OUT/bench_py.log" 2>&1
r=$?; echo "torch bench rc=$r"; [ "$r" = 0 ] || rc=1
if command -v compute-sanitizer > /dev/null; then
  timeout 150 compute-sanitizer --tool memcheck --print-limit 5 $B/kernels/replay_kernels_gpu_test 777 8 \
    > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; tail -4 "$OUT/memcheck.log"
fi
grep -v "^|" "$OUT/bench_py.log" | tail -30
grep "^|" "$OUT/bench_py.log"
exit $rc

#!/bin/bash
# One device-tool call (nvidia-h200): GPU tests, the R3 proof, the benchmark.
# Carry `.device` (pack_for_device.sh makes it). Logs/JSON go to $OUT.
#   bash client/python/device/run_device.sh [tests|proof|bench|all|tpbench|static]
# static (not in all): static replay buffers (issue 22): the kernel's GPU
# test (built here from kernels/standalone), its knob sweep, compute-sanitizer
# memcheck, tests/gpu_static_targets.py, and static_targets_bench.py.
# tpbench (nvidia-h200-x2, not in all): TP-leader per-step latency with and
# without NCCL communicator reuse.
# transport (any kind, not in all; no GPU used): `rollpack bench transport`
# on the device host's 16 cores, where the simulated ranks do not share two
# cores with the server; args after the mode go to the bench.
set -u
OUT=${OUT:-/tmp/rollpack_out}
mkdir -p "$OUT"
what=${1:-all}
if [ "$what" = transport ]; then
  shift
  export LD_LIBRARY_PATH=$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "cpus: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  for i in 1 2; do
    timeout 280 .device/bin/rollpack bench transport "$@" > "$OUT/transport_$i.log" 2>&1
    r=$?; echo "bench transport run $i rc=$r"; grep -v '^{' "$OUT/transport_$i.log"
    grep '^{' "$OUT/transport_$i.log" > "$OUT/transport_$i.json"
    [ $r = 0 ] || exit 1
  done
  exit 0
fi
source client/python/device/build_on_device.sh > "$OUT/build.log" 2>&1
cat "$OUT/build.log"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
export PYTHONUNBUFFERED=1
rc=0
if [ "$what" = static ]; then
  KB=/tmp/kb-static
  { cmake -S kernels/standalone -B $KB -G Ninja -DCMAKE_BUILD_TYPE=Release &&
    cmake --build $KB -j 16 --target unpack_static_gpu_test; } > "$OUT/kernels_build.log" 2>&1 ||
    { tail -40 "$OUT/kernels_build.log"; exit 1; }
  for seed in 12345 2026; do
    timeout 120 $KB/kernels/unpack_static_gpu_test $seed 400 2>&1 | tee -a "$OUT/static_gpu_test.log" | tail -12
    r=${PIPESTATUS[0]}; echo "static kernel test seed $seed rc=$r"; [ $r = 0 ] || rc=1
  done
  timeout 120 $KB/kernels/unpack_static_gpu_test --sweep > "$OUT/static_sweep.log" 2>&1
  echo "static sweep rc=$?"; grep -E "^copy|bps=0 " "$OUT/static_sweep.log"
  if command -v compute-sanitizer > /dev/null; then
    timeout 120 compute-sanitizer --tool memcheck --print-limit 5 $KB/kernels/unpack_static_gpu_test 777 40 \
      > "$OUT/static_memcheck.log" 2>&1
    echo "memcheck rc=$?"; tail -3 "$OUT/static_memcheck.log"
  fi
  (cd client/python && timeout 200 python3 -m unittest -v tests.gpu_static_targets) > "$OUT/gpu_static_tests.log" 2>&1
  r=$?; echo "gpu static tests rc=$r"; tail -12 "$OUT/gpu_static_tests.log"; [ $r = 0 ] || rc=1
  timeout 200 python3 client/python/device/static_targets_bench.py --json "$OUT/static_bench.json" \
    > "$OUT/static_bench.log" 2>&1
  r=$?; echo "static bench rc=$r"; tail -20 "$OUT/static_bench.log"; [ $r = 0 ] || rc=1
  exit $rc
fi
if [ "$what" = all ] || [ "$what" = tests ]; then
  (cd client/python && timeout 170 python3 -m unittest -v tests.gpu_trainer) > "$OUT/gpu_tests.log" 2>&1
  r=$?; echo "gpu tests rc=$r"; tail -8 "$OUT/gpu_tests.log"; [ $r = 0 ] || rc=1
fi
if [ "$what" = all ] || [ "$what" = proof ]; then
  timeout 150 python3 client/python/examples/r3_proof.py --device cuda --rollpackd "$ROLLPACKD" \
    --json "$OUT/r3_proof.json" > "$OUT/r3_proof.log" 2>&1
  r=$?; echo "proof rc=$r"; tail -60 "$OUT/r3_proof.log"; [ $r = 0 ] || rc=1
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  timeout 240 python3 client/python/bench/trainer_bench.py --rollpackd "$ROLLPACKD" \
    --json "$OUT/trainer_bench.json" > "$OUT/trainer_bench.log" 2>&1
  r=$?; echo "bench rc=$r"; tail -30 "$OUT/trainer_bench.log"; [ $r = 0 ] || rc=1
fi
if [ "$what" = tpbench ]; then
  ROLLPACK_TP_COMM_LOG=1 timeout 240 python3 client/python/bench/tp_leader_bench.py \
    --json "$OUT/tp_leader_bench.json" > "$OUT/tp_leader_bench.log" 2>&1
  r=$?; echo "tp bench rc=$r"; grep -v "^rollpack tp-leader" "$OUT/tp_leader_bench.log" | tail -20
  # Connect() times (rendezvous + communicator) from ROLLPACK_TP_COMM_LOG.
  python3 - "$OUT/tp_leader_bench.log" <<'PY'
import re, statistics, sys
d = {}
for l in open(sys.argv[1]):
    m = re.match(r"rollpack tp-leader (\S+) .* (tp\d): (\w+) communicator \S+ in ([\d.]+) ms", l)
    if m:
        d.setdefault((m.group(3), m.group(2)), []).append(float(m.group(4)))
for k, v in sorted(d.items()):
    print("connect %s %s: n=%d median %.1f ms min %.1f max %.1f" % (k + (len(v), statistics.median(v), min(v), max(v))))
PY
  [ $r = 0 ] || rc=1
fi
exit $rc

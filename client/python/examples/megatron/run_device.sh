#!/bin/bash
# The example's device run (README.md): from the repository root on a host
# with 2 GPUs. Carry .device (client/python/device/pack_for_device.sh:
# rollpackd, librollpack_trainer.so, the libraries they need, the Python
# stubs; or DEVICE_DIR=<a folder like it>) and build-gpu/megatron
# (core.tar.gz of megatron/core's Python files with MEGATRON_COMMIT,
# docs/integrations.md; or MEGATRON_TARBALL=<path>). Runs the three 2-GPU
# topologies, or on a host with 4 GPUs the two 4-GPU ones (TP=2 x PP=2 with
# sequence and expert parallelism, DP=2 x PP=2); each one's JSON and log go
# to $OUT.
#   bash client/python/examples/megatron/run_device.sh [tp|pp|dp|all|tp2pp2|dp2pp2|all4]
set -u
ROOT=$(pwd)
OUT=${OUT:-/tmp/megatron_out}
D=$(cd "${DEVICE_DIR:-.device}" && pwd)
mkdir -p "$OUT" /tmp/mlm
tar -xzf "${MEGATRON_TARBALL:-build-gpu/megatron/core.tar.gz}" -C /tmp/mlm
export MEGATRON_COMMIT=$(cat /tmp/mlm/MEGATRON_COMMIT)
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ROLLPACKD="$D/bin/rollpackd" ROLLPACK_TRAINER_LIBRARY="$D/lib/librollpack_trainer.so"
export PYTHONPATH="/tmp/mlm:$ROOT/client/python${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
cp "$D"/py/*_pb2*.py client/python/rollpack/v1/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)"
what=${1:-all}
rc=0
run() {
  name=$1; nproc=$2; shift 2
  timeout 240 torchrun --standalone --nproc_per_node "$nproc" \
    client/python/examples/megatron/train_step.py --json "$OUT/$name.json" --repeats 10 "$@" \
    > "$OUT/$name.log" 2>&1
  r=$?; echo "== $name ($*): rc=$r"; [ $r = 0 ] || { tail -40 "$OUT/$name.log"; rc=1; }
}
[ "$what" = all ] || [ "$what" = tp ] && run tp2_sp_ep2 2 --tp 2 --sequence-parallel --ep 2
[ "$what" = all ] || [ "$what" = pp ] && run pp2 2 --pp 2
[ "$what" = all ] || [ "$what" = dp ] && run dp2 2
[ "$what" = all4 ] || [ "$what" = tp2pp2 ] && run tp2_pp2_sp_ep2 4 --tp 2 --pp 2 --sequence-parallel --ep 2
[ "$what" = all4 ] || [ "$what" = dp2pp2 ] && run dp2_pp2 4 --pp 2
exit $rc

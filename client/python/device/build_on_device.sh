#!/bin/bash
# Run ON THE GPU MACHINE (device tool), from the repository root, after
# pack_for_device.sh here; source it so the environment stays:
#   source client/python/device/build_on_device.sh
# Installs .device/ into the Python package. Nothing is compiled there: the
# package reaches librollpack_trainer.so through ctypes (rollpack/_capi.py),
# so any Python of that machine can import it.
ROOT=$(pwd)
export LD_LIBRARY_PATH="$ROOT/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ROLLPACKD="$ROOT/.device/bin/rollpackd"
export PYTHONPATH="$ROOT/client/python${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0
cp .device/lib/librollpack_trainer.so client/python/rollpack/
cp .device/py/*_pb2*.py client/python/rollpack/v1/
PY=${PYTHON:-python3}
$PY -c "import rollpack.trainer as t; print('rollpack binding: ctypes, cuda:', t.has_cuda())"

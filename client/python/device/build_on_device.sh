#!/bin/bash
# Run ON THE GPU MACHINE (device tool), from the repository root, after
# pack_for_device.sh here; source it so the environment stays:
#   source client/python/device/build_on_device.sh
# Installs .device/ into the Python package and builds rollpack._trainer
# (pybind11 extension over librollpack_trainer.so) with that machine's
# Python, g++ and pip pybind11 (seconds). If its Python has no headers the
# package falls back to ctypes over the same library (rollpack/_capi.py).
ROOT=$(pwd)
export LD_LIBRARY_PATH="$ROOT/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ROLLPACKD="$ROOT/.device/bin/rollpackd"
export PYTHONPATH="$ROOT/client/python${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0
cp .device/lib/librollpack_trainer.so client/python/rollpack/
cp .device/py/*_pb2*.py client/python/rollpack/v1/
PY=${PYTHON:-python3}
EXT=$($PY -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
INC=$($PY -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if [ -f "$INC/Python.h" ] && $PY -m pybind11 --includes > /dev/null 2>&1; then
  if g++ -O2 -std=c++17 -shared -fPIC $($PY -m pybind11 --includes) -I"$ROOT" \
      client/python/ext/trainer_ext.cc -o "client/python/rollpack/_trainer$EXT" \
      -Lclient/python/rollpack -lrollpack_trainer -Wl,-rpath,'$ORIGIN' 2> /tmp/rollpack_ext.log; then
    echo "build_on_device: built rollpack/_trainer$EXT"
  else
    echo "build_on_device: extension build failed, using ctypes:"; tail -5 /tmp/rollpack_ext.log
  fi
else
  echo "build_on_device: no Python.h or pybind11 for $PY: using the ctypes binding"
fi
$PY -c "import rollpack.trainer as t; print('rollpack binding:', t.backend_name(), 'cuda:', t.has_cuda())"

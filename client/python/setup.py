"""Build hooks of the rollpack package; its metadata is in pyproject.toml.

The rollpack.v1 protobuf / gRPC stubs are never committed, so build_py
generates them from the .proto files of the repository (../../proto, or
$ROLLPACK_PROTO_DIR when building a copy of this folder elsewhere) into the
build tree: with grpc_tools (PyPI's grpcio-tools) when it is importable, else
with the protoc and grpc_python_plugin binaries (Debian: protobuf-compiler,
protobuf-compiler-grpc; $PROTOC and $GRPC_PYTHON_PLUGIN override them).
"""

import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_STUBS = os.path.join(HERE, "rollpack", "v1")
LIBRARY = os.path.join(HERE, "rollpack", "librollpack_trainer.so")


def _proto_root():
    """The folder holding rollpack/v1/*.proto, or None."""
    env = os.environ.get("ROLLPACK_PROTO_DIR")
    root = env or os.path.normpath(os.path.join(HERE, "..", "..", "proto"))
    if glob.glob(os.path.join(root, "rollpack", "v1", "*.proto")):
        return root
    if env:
        raise SystemExit("rollpack: ROLLPACK_PROTO_DIR=%s has no rollpack/v1/*.proto" % env)
    return None


def _generator():
    """The protoc command line (without outputs and inputs)."""
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        pass
    else:
        # Its bundled protoc lacks the well-known types' path; ours import none.
        return [sys.executable, "-m", "grpc_tools.protoc"]
    protoc = os.environ.get("PROTOC") or shutil.which("protoc") or "/usr/bin/protoc"
    plugin = (os.environ.get("GRPC_PYTHON_PLUGIN") or shutil.which("grpc_python_plugin")
              or "/usr/bin/grpc_python_plugin")
    for path, package in ((protoc, "protobuf-compiler"), (plugin, "protobuf-compiler-grpc")):
        if not os.access(path, os.X_OK):
            raise SystemExit("rollpack: %s not found: install grpcio-tools, or Debian's %s, "
                             "to generate the rollpack.v1 stubs" % (path, package))
    return [protoc, "--plugin=protoc-gen-grpc_python=" + plugin]


def _has_pyi(cmd):
    out = subprocess.run(cmd + ["--help"], capture_output=True, text=True)
    return "--pyi_out" in out.stdout + out.stderr


def generate_stubs(out_dir):
    """Writes rollpack/v1/*_pb2.py, *_pb2_grpc.py (and *_pb2.pyi where the
    protoc supports it) under out_dir. Returns False when this tree has no
    .proto files next to it (a copy of client/python alone)."""
    root = _proto_root()
    if root is None:
        return False
    protos = sorted(glob.glob(os.path.join(root, "rollpack", "v1", "*.proto")))
    cmd = _generator()
    outs = ["--python_out=" + out_dir, "--grpc_python_out=" + out_dir]
    if _has_pyi(cmd):
        outs.append("--pyi_out=" + out_dir)
    os.makedirs(os.path.join(out_dir, "rollpack", "v1"), exist_ok=True)
    subprocess.run(cmd + ["--proto_path=" + root] + outs + protos, check=True)
    return True


class BuildPy(build_py):
    """build_py that also generates the stubs (after copying the sources, so
    that fresh stubs replace any stale ones a CMake build left in the tree)."""

    def run(self):
        super().run()
        # An editable install imports from the source tree: generate there.
        out = HERE if getattr(self, "editable_mode", False) else self.build_lib
        if generate_stubs(out):
            return
        if glob.glob(os.path.join(PACKAGE_STUBS, "*_pb2.py")):
            self.announce("rollpack: no proto/ next to %s; packaging the stubs already in "
                          "rollpack/v1" % HERE, level=3)
            return
        raise SystemExit("rollpack: cannot find proto/rollpack/v1/*.proto (looked in %s): "
                         "build from the repository's client/python or set ROLLPACK_PROTO_DIR"
                         % os.path.normpath(os.path.join(HERE, "..", "..", "proto")))


cmdclass = {"build_py": BuildPy}

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # no wheel package: pip falls back to other routes
    bdist_wheel = None

if bdist_wheel is not None and os.path.exists(LIBRARY):
    class BdistWheel(bdist_wheel):
        """With librollpack_trainer.so inside, the wheel is for this platform
        only; the library is loaded by ctypes, so it still fits any CPython."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return ("py3", "none") + super().get_tag()[2:]

    cmdclass["bdist_wheel"] = BdistWheel



def _version():
    with open(os.path.join(HERE, "rollpack", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


setup(
    version=_version(),
    packages=["rollpack", "rollpack.adapters", "rollpack.v1"],
    # librollpack_trainer.so only when the tree has one (CMake's
    # rollpack_trainer target copies it here); .pyi where protoc writes them.
    package_data={"rollpack": ["py.typed", "librollpack_trainer.so"], "rollpack.v1": ["*.pyi"]},
    include_package_data=False,
    cmdclass=cmdclass,
)

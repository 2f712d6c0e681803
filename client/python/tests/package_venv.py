"""Installs the rollpack package into a venv the way a user does
(docs/producer.md): ``python3 -m venv --system-site-packages`` and
``pip install --no-build-isolation --no-index``, Debian's python3-grpcio,
-protobuf and -numpy serving the dependencies.

CTest's fixture python_package_venv runs it as a script (stdlib only, so it
imports nothing of the source tree) before the Python tests, which then run
on that venv's interpreter against the installed package:

    /usr/bin/python3 client/python/tests/package_venv.py --venv build/python-venv

test_package uses install() on a fresh venv of its own.

pip builds a local folder in place (build/, rollpack.egg-info/), so the
source is staged in a temporary folder first: concurrent builds (two build
folders, parallel tests) never share a setuptools build tree, and stubs left
in the tree by CMake cannot stand in for the ones the build must generate.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

# realpath: CTest reaches tests/ through a link in the build folder.
SOURCE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
LIBRARY = "librollpack_trainer.so"
# What a user's `pip install ./client/python` does not need from the folder.
_SKIP = ("build", "tests", "bench", "examples", "device", "__pycache__", "*.egg-info",
         "*_pb2.py", "*_pb2_grpc.py", "*_pb2.pyi", "CMakeLists.txt")


def base_python():
    """The interpreter venvs are made from: Debian's, whose dist-packages
    hold grpcio, protobuf and numpy (not the one of a venv this runs in)."""
    if os.access("/usr/bin/python3", os.X_OK):
        return "/usr/bin/python3"
    return getattr(sys, "_base_executable", sys.executable)


def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def create(venv):
    """Makes the venv unless it is there already."""
    if not os.access(venv_python(venv), os.X_OK):
        subprocess.run([base_python(), "-m", "venv", "--system-site-packages", venv],
                       check=True)


def stage(dest, source=SOURCE, library=None):
    """Copies the package's source to ``dest``. ``library``: a path copied
    in as rollpack/librollpack_trainer.so; None = none (the tree's own copy,
    tens of MB, is left out; $ROLLPACK_TRAINER_LIBRARY points at a library)."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(*_SKIP, LIBRARY))
    if library:
        shutil.copy(library, os.path.join(dest, "rollpack", LIBRARY))


def install(venv, source=SOURCE, library=None, proto_dir=None, quiet=True):
    """Creates ``venv`` if needed and (re)installs the package into it from a
    staged copy of ``source``. Returns pip's output; raises
    CalledProcessError (with the output) when pip fails."""
    create(venv)
    proto_dir = proto_dir or os.path.normpath(os.path.join(source, "..", "..", "proto"))
    with tempfile.TemporaryDirectory(prefix="rollpack-pkg-") as tmp:
        staged = os.path.join(tmp, "python")
        stage(staged, source, library)
        env = dict(os.environ, ROLLPACK_PROTO_DIR=proto_dir, PIP_NO_INPUT="1")
        env.pop("PYTHONPATH", None)
        cmd = [venv_python(venv), "-m", "pip", "install", "--no-build-isolation", "--no-index",
               "--disable-pip-version-check", staged]
        if quiet:
            cmd.insert(4, "--quiet")
        out = subprocess.run(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        raise subprocess.CalledProcessError(out.returncode, cmd, out.stdout)
    return out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", required=True, help="the venv to create / install into")
    ap.add_argument("--source", default=SOURCE, help="client/python (default: this tree's)")
    ap.add_argument("--library", help="a librollpack_trainer.so to package (default: none)")
    a = ap.parse_args()
    try:
        install(os.path.abspath(a.venv), a.source, a.library, quiet=False)
    except subprocess.CalledProcessError as e:
        sys.stderr.write(e.output or "")
        sys.exit("package_venv: pip install failed with status %d" % e.returncode)
    print("package_venv: rollpack installed into %s" % a.venv)


if __name__ == "__main__":
    main()

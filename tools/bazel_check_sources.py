#!/usr/bin/env python3
"""Lists C++/CUDA sources that a CMakeLists.txt builds but no BUILD.bazel
names (docs/bazel.md: the Bazel build mirrors the CMake one). Exit 1 if any.

A source counts as named when its path relative to the repository root, or
to the BUILD.bazel's package, appears as a string in that BUILD.bazel.
Generated files, client/python (the Python package's build steps) and fuzz/ (clang
and -DROLLPACK_FUZZ=ON only) are ignored.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = {"build", ".git", ".tools", ".bazel", "third_party"}
EXT = (".cc", ".cpp", ".cu")


def walk(name):
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in SKIP and not x.startswith(("build-", "bazel-"))]
        if name in files:
            yield os.path.relpath(d, ROOT)


cmake = set()
for d in walk("CMakeLists.txt"):
    if d.startswith("kernels/standalone"):
        continue  # configures kernels/ alone, same sources
    if d.startswith("fuzz"):
        continue  # libFuzzer targets: clang and -DROLLPACK_FUZZ=ON only
    if d.startswith("client/python"):
        continue  # the Python package's extension module: CMake only
    text = re.sub(r"#[^\n]*", "", open(os.path.join(ROOT, d, "CMakeLists.txt")).read())
    for tok in re.findall(r"[\w${}./+-]+(?:%s)\b" % "|".join(re.escape(e) for e in EXT), text):
        tok = tok.replace("${CMAKE_CURRENT_SOURCE_DIR}/", "")
        if "$" in tok or tok.startswith(("/", "gen/")):
            continue
        path = os.path.normpath(os.path.join(d, tok))
        if os.path.exists(os.path.join(ROOT, path)):
            cmake.add(path)

bazel = set()
for d in walk("BUILD.bazel"):
    text = open(os.path.join(ROOT, d, "BUILD.bazel")).read()
    for s in re.findall(r'"([^"]+)"', text):
        bazel.add(os.path.normpath(os.path.join(d, s.lstrip(":"))))
        bazel.add(os.path.normpath(s.lstrip("/").replace(":", "/")))
        bazel.add(os.path.normpath(os.path.join(d, s + ".cc")))  # rollpack_gtest(name)

missing = sorted(cmake - bazel)
for m in missing:
    print("bazel_check_sources: built by CMake, not named in any BUILD.bazel: " + m)
sys.exit(1 if missing else 0)

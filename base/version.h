// rollpack's release version, written here only: CMakeLists.txt reads it for
// project(VERSION), binaries print it (--version) and rollpackd exports it
// (rollpack_build_info). The Python package's __version__
// (client/python/rollpack/__init__.py) moves with it: tests/ops/test_deploy.py
// checks they agree.
#ifndef ROLLPACK_BASE_VERSION_H_
#define ROLLPACK_BASE_VERSION_H_

namespace rollpack {

inline constexpr char kRollpackVersion[] = "0.1.0";

// The short git commit the binary was built from: read by CMake at build
// time; "unknown" outside a git checkout and in Bazel builds.
const char* BuildCommit();

}  // namespace rollpack

#endif  // ROLLPACK_BASE_VERSION_H_

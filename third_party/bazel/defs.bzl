"""Shared settings of rollpack's BUILD.bazel files (mirror CMakeLists.txt)."""

# CMake: add_compile_options(-Wall -Wextra -Wno-unused-parameter).
COPTS = ["-Wall", "-Wextra", "-Wno-unused-parameter"]

# CMake links every GoogleTest binary with GTest::gtest GTest::gtest_main
# GTest::gmock; gtest_discover_tests becomes one cc_test per binary.
GTEST_DEPS = [
    "@system//:gmock",
    "@system//:gtest",
    "@system//:gtest_main",
]

def rollpack_gtest(name, srcs = None, deps = [], **kwargs):
    """A GoogleTest binary `name` from `name`.cc (or srcs), run by `bazel test`."""
    native.cc_test(
        name = name,
        srcs = srcs if srcs != None else [name + ".cc"],
        copts = COPTS,
        deps = deps + GTEST_DEPS,
        # Static like CMake's libraries (and one compile per source: a
        # dynamically linked test would need a second, PIC, compile of all).
        linkstatic = True,
        **kwargs
    )

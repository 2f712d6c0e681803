#!/bin/sh
echo "remote_coverage_tools shim: 'bazel coverage' is not supported offline (third_party/bazel/README.md)" >&2
exit 1

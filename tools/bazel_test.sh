#!/usr/bin/env bash
# `make bazel-test`: builds every C++ target and runs every C++ test with
# Bazel 4.2.3 (Debian bazel-bootstrap), offline, against the system libraries
# (docs/bazel.md), then prints one plain line from Bazel's test summary:
#   bazel: N passed, N failed
# Exits with Bazel's status. Extra arguments go to `bazel test`.
set -uo pipefail
cd "$(dirname "$0")/.."

BAZEL=${BAZEL:-bazel}
# Bazel's output tree: outside the repository (a root inside it would be
# walked as packages), per user; override with BAZEL_OUTPUT_USER_ROOT.
root=${BAZEL_OUTPUT_USER_ROOT:-/tmp/rollpack-bazel-$(id -u)}
# CI has 2 cores; BAZEL_JOBS overrides.
jobs=${BAZEL_JOBS:-2}
# Compiled actions are shared through a disk cache keyed by content, so a clone
# in another folder (CI's, right after a session) reuses what the session
# built; tests always run (--nocache_test_results). Bazel 4 never trims a
# disk cache: past ROLLPACK_BAZEL_CACHE_MB (default 8192) it is emptied first.
# ROLLPACK_BAZEL_DISK_CACHE= (empty) turns it off.
disk_cache=${ROLLPACK_BAZEL_DISK_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/rollpack-bazel-disk}
cache_flags=()
if [[ -n "$disk_cache" ]]; then
  if [[ -d "$disk_cache" ]] &&
     (($(du -sm "$disk_cache" | cut -f1) > ${ROLLPACK_BAZEL_CACHE_MB:-8192})); then
    echo "bazel_test: emptying the disk cache $disk_cache (over ${ROLLPACK_BAZEL_CACHE_MB:-8192} MB)"
    rm -rf "$disk_cache"
  fi
  cache_flags=(--disk_cache="$disk_cache")
fi

# Every C++ source CMake builds must be in a BUILD.bazel (fails at the end).
python3 tools/bazel_check_sources.py
sources_rc=$?

log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$BAZEL" --output_user_root="$root" test --keep_going \
  --jobs="$jobs" --local_cpu_resources="$jobs" "${cache_flags[@]}" --nocache_test_results \
  "$@" //... 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

# Bazel's own count: "Executed 9 out of 19 tests: 9 tests pass, 9 fail to
# build and 1 was skipped." (the per-target lines above it are truncated
# for failures to build). Passed includes cached passes; skipped are
# incompatible targets (CUDA without --config=cuda); everything else failed
# (locally, to build, remotely, timed out, no status, flaky).
summary=$(grep -E '^Executed [0-9]+ out of [0-9]+ tests?' "$log" | tail -n 1)
total=$(sed -nE 's/.* out of ([0-9]+) tests?.*/\1/p' <<<"$summary")
passed=$(sed -nE 's/.*[:,] ([0-9]+) tests? pass.*/\1/p' <<<"$summary")
skipped=$(sed -nE 's/.* ([0-9]+) (was|were) skipped.*/\1/p' <<<"$summary")
total=${total:-0} passed=${passed:-0} skipped=${skipped:-0}
failed=$((total - passed - skipped))
if ((skipped > 0)); then
  echo "($skipped Bazel test target(s) skipped as incompatible: the CUDA ones need --config=cuda)"
fi
if ((rc != 0 && passed + failed == 0)); then
  echo "Bazel failed before any test ran (exit $rc)"
fi
# Bazel prints a failed test's whole log before the summary, where a long
# log buries why it failed; CI shows the end of the output, so each failed
# test's assertions (GoogleTest's "Failure" blocks, its FAILED lines, a
# crash's signal) are repeated here, last.
while read -r target test_log; do
  [[ -r "$test_log" ]] || continue
  echo "==== why $target failed ($test_log)"
  grep -E -A6 ': Failure$|^\[  FAILED  \]|[Ss]egmentation fault|Aborted|AddressSanitizer|terminate called|-- Test timed out' \
    "$test_log" | grep -v -E '^\[[0-9-]+ [0-9:.]+\] \[(info|debug)\]' | head -n 60
done < <(sed -nE 's/^FAIL: (\/\/[^ ]+) .*\(see (.*test\.log)\).*/\1 \2/p' "$log" | sort -u)
echo "bazel: $passed passed, $failed failed"
if ((rc == 0 && sources_rc != 0)); then rc=1; fi
exit "$rc"

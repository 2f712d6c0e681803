#!/usr/bin/env bash
# Runs the CTest suite N times in a row, optionally under CPU load, and
# reports every failure by run and test: how a flaky test is found before
# CI finds it (docs/reliability.md).
#   tools/stress_ctest.sh [-n RUNS] [-l LOAD] [-j JOBS] [-b BUILD_DIR] [-- CTEST_ARGS...]
#     -n RUNS   runs of the whole suite (default 20)
#     -l LOAD   busy-loop processes kept running meanwhile (default: nproc)
#     -j JOBS   ctest -j (default: nproc, as `make test`)
#     CTEST_ARGS extra ctest arguments, e.g. -R cluster_test or -E bench_load
# Prints one line per run and a summary; exits 1 if any run failed.
set -u
runs=20
load=$(nproc)
jobs=$(nproc)
build=build
while getopts "n:l:j:b:" opt; do
  case $opt in
    n) runs=$OPTARG ;;
    l) load=$OPTARG ;;
    j) jobs=$OPTARG ;;
    b) build=$OPTARG ;;
    *) sed -n '2,11p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
cd "$(dirname "$0")/.." || exit 2
[ -f "$build/CTestTestfile.cmake" ] || { echo "stress_ctest: no $build/ (run make build)"; exit 2; }

burners=()
cleanup() { for p in "${burners[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT
for ((i = 0; i < load; i++)); do
  (while :; do :; done) &
  burners+=($!)
done

logdir=$(mktemp -d)
failed_runs=0
declare -A failures
for ((r = 1; r <= runs; r++)); do
  start=$(date +%s)
  (cd "$build" && ctest -j "$jobs" --timeout 600 --output-on-failure "$@") > "$logdir/run$r.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  names=$(grep -E '^\s*[0-9]+ - .* \((Failed|Timeout|SEGFAULT|Exception|Not Run)' "$logdir/run$r.log" |
          sed -E 's/^\s*[0-9]+ - ([^ ]+).*/\1/' | tr '\n' ' ')
  summary=$(grep -E 'tests passed' "$logdir/run$r.log" | tail -n 1)
  echo "run $r/$runs: rc=$rc ${secs}s ${summary:-no summary} ${names:+FAILED: $names}"
  if [ $rc -ne 0 ]; then
    failed_runs=$((failed_runs + 1))
    for n in $names; do failures[$n]=$(( ${failures[$n]:-0} + 1 )); done
    cp "$logdir/run$r.log" "$build/stress_run$r.log"
  fi
done
echo "stress_ctest: $((runs - failed_runs)) of $runs runs passed (load $load, ctest -j $jobs)"
for n in "${!failures[@]}"; do echo "  $n failed in ${failures[$n]} run(s)"; done
[ $failed_runs -gt 0 ] && echo "  logs of failed runs: $build/stress_run*.log"
rm -rf "$logdir"
[ $failed_runs -eq 0 ]

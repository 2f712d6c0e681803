#!/usr/bin/env bash
# Runs CI's phases in order, each given as NAME=COMMAND, and prints each one's
# wall time, the total and the budget, as a table and as one JSON line:
#
#   tools/ci_phases.sh "test=make test" "bazel-test=make bazel-test"
#
# CI's hard limit is 90 minutes and a run past it lands nothing; this script
# fails a run whose total passes ROLLPACK_CI_ALARM_SECONDS (default 3600, the
# 60-minute alarm of docs/build.md) even when every phase passed, so that the
# next overrun is seen while it still lands. A failing phase stops the run with
# its exit status, after the table of what ran.
set -uo pipefail

alarm=${ROLLPACK_CI_ALARM_SECONDS:-3600}
target=${ROLLPACK_CI_TARGET_SECONDS:-2400}
names=() seconds=() codes=()
run_start=$(date +%s)

report() {
  local total=$(( $(date +%s) - run_start )) i json=""
  echo
  printf '%-14s %8s %6s\n' phase seconds exit
  for i in "${!names[@]}"; do
    printf '%-14s %8d %6d\n' "${names[$i]}" "${seconds[$i]}" "${codes[$i]}"
    json+="${json:+, }{\"phase\": \"${names[$i]}\", \"seconds\": ${seconds[$i]}, \"exit\": ${codes[$i]}}"
  done
  printf '%-14s %8d   (target %d s, alarm %d s, hard limit 5400 s)\n' total "$total" \
    "$target" "$alarm"
  echo "ci-phases: {\"phases\": [$json], \"total_seconds\": $total," \
    "\"target_seconds\": $target, \"alarm_seconds\": $alarm}"
  TOTAL=$total
}

for spec in "$@"; do
  name=${spec%%=*} command=${spec#*=}
  if [[ -z "$name" || "$name" == "$spec" ]]; then
    echo "ci_phases: a phase is NAME=COMMAND, got '$spec'" >&2
    exit 2
  fi
  echo "==== phase $name: $command"
  phase_start=$(date +%s)
  bash -c "$command"
  code=$?
  names+=("$name") seconds+=($(( $(date +%s) - phase_start ))) codes+=("$code")
  echo "==== phase $name: exit $code after ${seconds[-1]} s"
  if ((code != 0)); then
    report
    exit "$code"
  fi
done

report
if ((TOTAL > alarm)); then
  echo "ci_phases: the run took $TOTAL s, past the alarm of $alarm s (hard limit 5400 s):" \
    "docs/build.md says what to do" >&2
  exit 1
fi

#!/usr/bin/env bash
# tools/ci_phases.sh: phases run in order and are timed, a failing phase stops
# the run with its status, and a run past the alarm budget fails even when
# every phase passed.
set -uo pipefail
script="$(dirname "$0")/ci_phases.sh"
failures=0
expect() {  # expect DESCRIPTION WANT_EXIT GOT_EXIT OUTPUT PATTERN...
  local what=$1 want=$2 got=$3 out=$4 pattern
  shift 4
  if ((want != got)); then
    echo "FAIL: $what: exit $got, want $want"; echo "$out"; failures=$((failures + 1)); return
  fi
  for pattern in "$@"; do
    if ! grep -qE -- "$pattern" <<<"$out"; then
      echo "FAIL: $what: output lacks /$pattern/"; echo "$out"; failures=$((failures + 1)); return
    fi
  done
  echo "ok: $what"
}

out=$(ROLLPACK_CI_ALARM_SECONDS=100 bash "$script" "one=echo first" "two=echo second" 2>&1)
expect "phases pass inside the alarm" 0 $? "$out" 'first' 'second' '^one +[0-9]+ +0$' \
  '^two +[0-9]+ +0$' '"total_seconds": [0-9]+' '"alarm_seconds": 100'

out=$(ROLLPACK_CI_ALARM_SECONDS=1 bash "$script" "slow=sleep 2" 2>&1)
expect "a run past the alarm fails" 1 $? "$out" 'past the alarm of 1 s' '^slow +[23] +0$'

out=$(ROLLPACK_CI_ALARM_SECONDS=100 bash "$script" "bad=exit 3" "never=echo reached" 2>&1)
expect "a failing phase stops the run with its status" 3 $? "$out" '^bad +[0-9]+ +3$'
if grep -q reached <<<"$out"; then
  echo "FAIL: the phase after a failing one ran"; failures=$((failures + 1))
fi

out=$(bash "$script" "no-equals-sign" 2>&1)
expect "a malformed phase is refused" 2 $? "$out" 'NAME=COMMAND'

echo "ci_phases: $((4 - failures)) passed, $failures failed"
((failures == 0))

#!/usr/bin/env bash
# The project's test command (README, .ci/run): the gates, then every test tier, fast first.
#   scripts/test.sh           gates + fast tiers + slow tiers (what CI runs)
#   scripts/test.sh --fast    gates + fast tiers only (no VM, no root needed: `make test-fast`)
# Extra arguments go to the pytest runs. The tiers and their order are tests/tiers.py's.
# VM tests need root (netns, tap) and build the `base` guest image once (cached by digest).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VENV:-.venv}/bin
fast=0
if [ "${1:-}" = "--fast" ]; then fast=1; shift; fi

read -r -a FAST <<<"$("$BIN/python" -c 'from tests.tiers import FAST; print(*FAST)')"
read -r -a SLOW <<<"$("$BIN/python" -c 'from tests.tiers import SLOW; print(*SLOW)')"
# every directory of tests/ holding tests must be in a tier, or it would silently never run
for d in tests/*/; do
    d=$(basename "$d")
    [[ " ${FAST[*]} ${SLOW[*]} " == *" $d "* ]] && continue
    if find "tests/$d" -name 'test_*.py' | grep -q .; then
        echo "scripts/test.sh: tests/$d holds tests but is in no tier (tests/tiers.py)" >&2; exit 2
    fi
done

# mypy takes 20-35 s of one core (a clean clone has no cache): it runs beside the other
# gates and the first tier instead of before them, says its verdict the moment it has one,
# and fails the run like any gate
mypy_log=$(mktemp)
(
    rc=0
    "$BIN/mypy" >"$mypy_log" 2>&1 || rc=$?
    echo "== mypy (run beside the gates and tests): exit $rc"
    cat "$mypy_log"
    exit "$rc"
) &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT
echo "== ruff format --check"; "$BIN/ruff" format --check .
echo "== ruff check (with the complexity gate: C901, PLR0915)"; "$BIN/ruff" check .
echo "== module size"; "$BIN/python" -m tests.lint.module_size
echo "== import rules"; "$BIN/lint-imports" --no-cache
tiers=("${FAST[@]}")
((fast)) || tiers+=("${SLOW[@]}")
echo "== pytest: ${tiers[*]}"
# --durations=30: the log ends with the 30 slowest phases (setups too), where the minutes go
rc=0
"$BIN/pytest" --durations=30 "${tiers[@]/#/tests/}" "$@" || rc=$?
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
if ((mypy_rc)); then
    echo "scripts/test.sh: mypy failed (exit $mypy_rc; its output is above)" >&2
    ((rc)) || rc=$mypy_rc
fi
exit "$rc"

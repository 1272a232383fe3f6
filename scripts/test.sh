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

echo "== ruff format --check"; "$BIN/ruff" format --check .
echo "== ruff check (with the complexity gate: C901, PLR0915)"; "$BIN/ruff" check .
echo "== module size"; "$BIN/python" -m tests.lint.module_size
echo "== mypy"; "$BIN/mypy"
echo "== import rules"; "$BIN/lint-imports" --no-cache
tiers=("${FAST[@]}")
((fast)) || tiers+=("${SLOW[@]}")
echo "== pytest: ${tiers[*]}"
# --durations=30: the log ends with the 30 slowest phases (setups too), where the minutes go
exec "$BIN/pytest" --durations=30 "${tiers[@]/#/tests/}" "$@"

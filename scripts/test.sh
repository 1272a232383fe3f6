#!/usr/bin/env bash
# The project's test command (README, .ci/run): the gates, then every test tier, fast first.
#   scripts/test.sh           gates + fast tiers + VM tiers (what CI runs)
#   scripts/test.sh --fast    gates + fast tiers only (no VM, no root needed: `make test-fast`)
# Extra arguments go to pytest. VM tests need root (netns, tap) and build the `base` guest
# image once (cached by digest).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VENV:-.venv}/bin
fast=0
if [ "${1:-}" = "--fast" ]; then fast=1; shift; fi

# The tiers in run order (tests/tiers.py says why): every directory of tests/ holding tests
# must be in one of them, or it would silently never run.
FAST=(unit golden deploy contract vmless)
SLOW=(integration e2e_cli e2e fleet reliability)
for d in tests/*/; do
    d=$(basename "$d")
    [[ " ${FAST[*]} ${SLOW[*]} " == *" $d "* ]] && continue
    if find "tests/$d" -name 'test_*.py' | grep -q .; then
        echo "scripts/test.sh: tests/$d holds tests but is in no tier" >&2; exit 2
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
exec "$BIN/pytest" "${tiers[@]/#/tests/}" "$@"

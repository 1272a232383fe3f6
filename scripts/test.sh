#!/usr/bin/env bash
# The project's test command (README, .ci/run): lint, types, then every test tier.
# VM tests need root (netns, tap) and build the `base` guest image once (cached by digest).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VENV:-.venv}/bin
echo "== ruff"; "$BIN/ruff" check .
echo "== mypy"; "$BIN/mypy"
echo "== import rules"; "$BIN/lint-imports" --no-cache
echo "== pytest"
exec "$BIN/pytest" tests "$@"

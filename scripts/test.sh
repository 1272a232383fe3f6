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
# The fast tiers wait on services far more than they compute (a VM-less stack's test is
# mostly HTTP, NATS and Postgres round trips), so they run on AENV_TEST_WORKERS pytest
# workers (xdist, 3 by default; each worker gets its own bus namespace and database, as
# every session does); one file stays on one worker, so a module's stack is started once.
# The slow tiers run after them: the VM tiers in one process (their VMs are CPU-bound
# under TCG), the VM-less slow tests beside it in another.
workers=${AENV_TEST_WORKERS:-3}
rc=0
echo "== pytest (${workers} workers): ${FAST[*]}"
# --durations=30: the log ends with the 30 slowest phases (setups too), where the minutes go
"$BIN/pytest" --durations=30 -n "$workers" --dist loadfile "${FAST[@]/#/tests/}" "$@" || rc=$?
if ((!fast)); then
    # Two lanes: the slow tests that start no VM (tests/tiers.py SLOW_VMLESS: restarts,
    # outages and deadlines waited out) run in a process of their own beside the VM tiers,
    # their output kept and printed when the VM lane is done; the VM lane stays one process
    # (its VMs are CPU-bound under TCG). A lane's failure fails the run; each lane's summary
    # is repeated at the very end, where CI's log tail shows it.
    read -r -a VMLESS_LANE <<<"$("$BIN/python" -c 'from pathlib import Path; from tests.tiers import slow_lanes; print(*slow_lanes(Path("tests"))[0])')"
    read -r -a VM_LANE <<<"$("$BIN/python" -c 'from pathlib import Path; from tests.tiers import slow_lanes; print(*slow_lanes(Path("tests"))[1])')"
    lane_dir=$(mktemp -d)
    trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"; rm -rf "$lane_dir"' EXIT
    echo "== pytest (VM-less slow lane, beside the VM lane; its log follows the VM lane): ${VMLESS_LANE[*]}"
    vmless_rc=0
    (
        "$BIN/pytest" --durations=15 -p no:cacheprovider --basetemp="$lane_dir/tmp" \
            "${VMLESS_LANE[@]}" "$@" >"$lane_dir/vmless.log" 2>&1
    ) &
    vmless_pid=$!
    echo "== pytest (VM lane): ${VM_LANE[*]}"
    vm_rc=0
    "$BIN/pytest" --durations=30 "${VM_LANE[@]}" "$@" 2>&1 | tee "$lane_dir/vm.log" || vm_rc=$?
    wait "$vmless_pid" || vmless_rc=$?
    echo "== pytest (VM-less slow lane): exit $vmless_rc"
    cat "$lane_dir/vmless.log"
    # the VM lane's slowest files again: CI's log keeps only its tail, which the VM-less
    # lane's log above would otherwise fill
    echo "== VM lane, slowest files (again)"
    awk '/= slowest files =/{on=1; next} on && /^=+ /{exit} on' "$lane_dir/vm.log"
    echo "== summary: VM-less slow lane exit $vmless_rc, VM lane exit $vm_rc"
    grep -hE '^(FAILED|ERROR) ' "$lane_dir/vmless.log" "$lane_dir/vm.log" || true
    tail -n 1 "$lane_dir/vmless.log"
    tail -n 1 "$lane_dir/vm.log"
    if ((vmless_rc)); then rc=$vmless_rc; fi
    if ((vm_rc)); then rc=$vm_rc; fi
fi
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
if ((mypy_rc)); then
    echo "scripts/test.sh: mypy failed (exit $mypy_rc; its output is above)" >&2
    ((rc)) || rc=$mypy_rc
fi
exit "$rc"

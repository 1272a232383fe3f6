#!/usr/bin/env bash
# Every benchmark, one after another (they share 2 cores: never in parallel). Each prints
# JSON and keeps a copy in bench/results/<name>.json. Runtime, API and Harbor benches need
# root; harbor_bench skips (a message, exit 0) without .venv-harbor (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
for b in envd_bench events_bench runtime_bench api_bench image_bench console_bench harbor_bench; do
    echo "== $b" >&2
    "$PY" -m "bench.$b"
done
echo "== rollout_bench (memory, then qemu)" >&2
"$PY" -m bench.rollout_bench --host memory
"$PY" -m bench.rollout_bench --host qemu

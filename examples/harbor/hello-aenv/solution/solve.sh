#!/bin/bash
# The oracle agent's reference solution: Harbor uploads solution/ to /solution and runs
# this as root in the sandbox (cwd: the Dockerfile's WORKDIR).
set -euo pipefail
wc -w < /app/words.txt | tr -d ' ' > /app/answer.txt

#!/bin/bash
# The verifier: Harbor uploads tests/ to /tests, runs this as root and reads the reward
# from /logs/verifier/reward.txt. Plain bash: nothing to download in the sandbox.
if [ "$(cat /app/answer.txt 2>/dev/null)" = "9" ]; then echo 1; else echo 0; fi \
    > /logs/verifier/reward.txt

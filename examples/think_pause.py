"""Pause while the model thinks: an agent loop whose sandbox costs no CPU and no RAM on
the node between its actions.

An RL rollout spends most of its wall time waiting for the policy's next action. Here the
sandbox is paused after each action (its memory and disk go to a capture) and resumed by
`Sandbox.connect` when the next action arrives; a process started in the first step keeps
counting across every pause, so the state the agent sees is exactly the one it left.

    E2B_API_URL=... E2B_API_KEY=... python examples/think_pause.py [STEPS]

Prints one JSON line: per step, the pause and resume times and what the sandbox held.
"""

from __future__ import annotations

import json
import sys
import time

from e2b import Sandbox

#: a background process the episode owns: counts in memory, shows the count in a file
COUNTER = (
    "nohup python3 -c 'import time\n"
    "n = 0\n"
    "while True:\n"
    "    n += 1\n"
    '    open("/tmp/count", "w").write(str(n))\n'
    "    time.sleep(0.2)\n' >/dev/null 2>&1 &"
)


def think(step: int) -> str:
    """Stands in for the policy: a model call that takes a while and returns a command."""
    time.sleep(0.5)
    return f"echo step-{step} >> /home/user/actions.log && wc -l < /home/user/actions.log"


def main(steps: int) -> dict[str, object]:
    sbx = Sandbox.create(timeout=300, metadata={"example": "think-pause"})
    sandbox_id = sbx.sandbox_id
    record = []
    try:
        sbx.commands.run(COUNTER)
        sbx.commands.run("until [ -s /tmp/count ]; do sleep 0.1; done", timeout=60)
        for step in range(steps):
            t0 = time.monotonic()
            sbx.pause()  # nothing runs while the model thinks
            t1 = time.monotonic()
            action = think(step)
            t2 = time.monotonic()
            sbx = Sandbox.connect(sandbox_id, timeout=300)  # resumes it
            t3 = time.monotonic()
            lines = sbx.commands.run(action).stdout.strip()
            count = sbx.files.read("/tmp/count")
            record.append(
                {
                    "step": step,
                    "pause_s": round(t1 - t0, 3),
                    "resume_s": round(t3 - t2, 3),
                    "actions_logged": int(lines),
                    "counter": int(count),
                }
            )
        return {"sandbox": sandbox_id, "steps": record}
    finally:
        sbx.kill()


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)))

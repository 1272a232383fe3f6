"""The shell a command runs in, when the image lacks the one asked for.

E2B's SDKs start every `commands.run(cmd)` as `/bin/bash -l -c cmd`. Images without bash
(Alpine, busybox, distroless) would fail every command; E2B's own templates all ship bash.
Here `/bin/bash` falls back to the image's `/bin/sh`, and an image with no shell at all to
the static busybox on envd's runtime disk — the command itself still runs on the image's
files. Any other program is started exactly as asked.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["RUNTIME_BUSYBOX", "resolve_argv"]

#: envd's runtime disk carries a static busybox (`workers/node/image/runtime.py`).
RUNTIME_BUSYBOX = "/opt/aenv/bin/busybox"
_BASH = ("/bin/bash", "/usr/bin/bash", "bash")


def resolve_argv(argv: list[str], exists: Callable[[str], bool] = os.path.exists) -> list[str]:
    """`argv` as it can run in this guest (`exists` is the file check, for tests)."""
    check = exists
    if not argv or argv[0] not in _BASH or check("/bin/bash") or check("/usr/bin/bash"):
        return argv
    if check("/bin/sh"):
        return ["/bin/sh", *argv[1:]]
    if check(RUNTIME_BUSYBOX):
        return [RUNTIME_BUSYBOX, "sh", *argv[1:]]
    return argv

"""Import, after start-up, what envd imports lazily.

envd starts lean (template builds wait on its first answer), so the token check (hmac, which
drags in OpenSSL), signed URLs, uploads, PTYs and watchers import their modules on first use.
But every sandbox is a restore of a template captured right after envd's warm-up `/init`: a
module not imported by then is imported again in *every* sandbox, on its first request, under
TCG — the first token check alone cost a resumed sandbox ~280 ms. So envd imports them in the
background once it listens, and `/init` waits for that: the template capture then holds them.

One module per event-loop turn, never a thread: envd stays single-threaded (PTY children are
forked with a preexec hook). Then `then` runs (envd: one login shell, as a first command
would start it — `ProcessService.warm`), bounded: a template whose shell misbehaves gets a
warning, not an envd that never initialises.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable

from envd import log

MODULES = (
    "hmac",
    "hashlib",
    "zlib",
    "datetime",
    "fcntl",
    "struct",
    "termios",
    "pwd",
    "grp",
    "shutil",
    "uuid",
    "urllib.parse",
    "envd.multipart",
    "envd.inotify",
    "envd.volumes",
)


#: Bound on the warm-up after the imports (`/init` waits for it).
THEN_TIMEOUT_S = 15.0


class Preload:
    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def start(self, then: Callable[[], Awaitable[None]] | None = None) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(then), name="envd-preload")

    async def _run(self, then: Callable[[], Awaitable[None]] | None) -> None:
        for name in MODULES:
            try:
                importlib.import_module(name)
            except ImportError as e:  # a guest without one of them: imported (and failing) on use
                log.warn("preload failed", module=name, error=str(e))
            await asyncio.sleep(0)
        if then is not None:
            try:
                await asyncio.wait_for(then(), THEN_TIMEOUT_S)
            except Exception as e:  # e.g. an image without bash: its first command will say
                log.warn("warm-up failed", error=repr(e))

    async def wait(self) -> None:
        """Returns once the modules are in; at once when preloading was never started."""
        if self._task is not None:
            await asyncio.shield(self._task)  # a cancelled /init must not cancel the preload

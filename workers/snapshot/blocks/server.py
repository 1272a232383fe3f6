"""The block service's NBD server: a unix socket, many clients, one `Connection` each.

One asyncio loop serves every QEMU of the node; each connection parses its own requests and
answers warm reads where they arrive (`connection.py`). The server itself goes on serving
whatever a client does: a client's framing error or an unknown export ends that client only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from workers.snapshot.blocks.connection import MAX_INFLIGHT, Connection
from workers.snapshot.blocks.export import Exports
from workers.snapshot.blocks.stats import BlockStats

__all__ = ["MAX_INFLIGHT", "BlockServer"]

log = logging.getLogger(__name__)


class BlockServer:
    """Serves `exports` on the unix socket `path` until `stop`."""

    def __init__(self, path: Path, exports: Exports, stats: BlockStats):
        self.path = path
        self.exports = exports
        self.stats = stats
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[Connection] = set()

    def _connection(self) -> Connection:
        conn = Connection(self.exports, self.stats, self._connections.discard)
        self._connections.add(conn)
        return conn

    async def start(self) -> None:
        # a socket file left by a killed predecessor would make bind fail; the supervisor
        # runs one service per path, so whatever is there is stale
        self.path.unlink(missing_ok=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._connection, path=str(self.path))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
        self.path.unlink(missing_ok=True)

"""What a node knows of its guests between commands: their resource samples and their logs,
for E2B's `GET /sandboxes/{id}/metrics` and `/logs` (the API asks the node that holds the
sandbox, on its proxy port).

Every `every_s` the node asks each running guest's envd for a resource snapshot (envd
measures the guest: CPU, memory, disk) and reads what the guest wrote to its console since
the last look (envd's one-line JSON logs). Both are kept per sandbox in bounded rings, for
its whole life on this node: across pauses (a paused sandbox's history stays), dropped
when it is killed. A guest whose root disk fills is told once per episode (`on_disk_full`:
the node records a `SandboxDiskFull`), again only after it had room (`disk_full`). In
memory only: a node that restarts, or a sandbox resumed on another node, starts a new
history — the log, not this, is the record of a life.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from bus.tasks import cancel_and_wait
from workers.node.ports import Host

__all__ = ["DiskFull", "GuestObserver", "disk_full"]

log = logging.getLogger(__name__)

#: samples kept per sandbox (an hour at 5 s), and log lines
KEEP_SAMPLES = 720
KEEP_LINES = 2000
#: bytes of console read per look, at most (a guest that floods its console is cut)
READ_CHUNK = 256 << 10
#: a guest's root disk is full with this share of it or less free (`diskUsed ≥ diskTotal -
#: 1%`), and has room again only with more than `ROOM_AGAIN` free: a guest hovering at the
#: edge (a log rotating, a cache trimming itself) makes one episode, not one per sample
FULL_LEFT = 0.01
ROOM_AGAIN = 0.05
#: ...or with this little free, or less: ext4 keeps up to 16 MiB (`s_resv_clusters`) that
#: no write can take, which is more than 1% of a small disk (seen: a 1.25 GiB root filled
#: by `dd` still had 16 MiB free); room again takes twice that
FULL_LEFT_BYTES = 32 << 20

#: told (sandbox id, used bytes, total bytes) when a guest's root disk filled (an episode)
DiskFull = Callable[[str, int, int], Awaitable[None]]


def disk_full(was_full: bool, used: int, total: int) -> bool:
    """Whether a guest's root disk counts as full after a sample, given whether it did."""
    if total <= 0:
        return was_full  # envd could not measure it: nothing changed that we know of
    free = total - used
    if was_full:
        return free <= max(total * ROOM_AGAIN, 2 * FULL_LEFT_BYTES)
    return free <= max(total * FULL_LEFT, FULL_LEFT_BYTES)


class GuestObserver:
    def __init__(self, host: Host, every_s: float = 5.0) -> None:
        self.host = host
        self.every_s = every_s
        self._samples: dict[str, deque[dict[str, Any]]] = {}
        self._logs: dict[str, deque[dict[str, Any]]] = {}
        #: (console file's inode, bytes of it already read) per sandbox
        self._read: dict[str, tuple[int, int]] = {}
        self._task: asyncio.Task[None] | None = None
        #: guests whose disk is full now (an episode under way), and who hears of a new one
        self._full: set[str] = set()
        self.on_disk_full: DiskFull | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="guest-observer")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def forget(self, sandbox_id: str) -> None:
        """The sandbox was killed: its history goes."""
        self._samples.pop(sandbox_id, None)
        self._logs.pop(sandbox_id, None)
        self._read.pop(sandbox_id, None)
        self._full.discard(sandbox_id)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.look()
            except Exception:  # a bad look must not end the observer
                log.exception("observing the guests failed")

    async def look(self) -> None:
        """One round: a sample and the new console lines of every running guest."""
        ids = self.host.running_ids()
        answers = await asyncio.gather(
            *(self.host.guest_metrics(sid) for sid in ids), return_exceptions=True
        )
        for sid, sample in zip(ids, answers, strict=True):
            if isinstance(sample, dict):
                ring = self._samples.setdefault(sid, deque(maxlen=KEEP_SAMPLES))
                ring.append(metric := _metric(sample))
                await self._check_disk(sid, metric["diskUsed"], metric["diskTotal"])
            self._read_console(sid)

    async def _check_disk(self, sandbox_id: str, used: int, total: int) -> None:
        was = sandbox_id in self._full
        now = disk_full(was, used, total)
        if now == was:
            return
        if not now:
            self._full.discard(sandbox_id)
            return
        log.warning(
            "sandbox %s: its guest's disk is full (%d of %d bytes)", sandbox_id, used, total
        )
        if self.on_disk_full is not None:
            try:
                await self.on_disk_full(sandbox_id, used, total)
            except Exception:  # the next sample tries again: the episode is not begun yet
                log.exception("recording the full disk of %s failed", sandbox_id)
                return
        self._full.add(sandbox_id)

    def _read_console(self, sandbox_id: str) -> None:
        console = self.host.console_log(sandbox_id)
        if console is None:
            return
        path, start = console
        try:
            with open(path, "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                known, offset = self._read.get(sandbox_id, (inode, start))
                if known != inode:  # a new VM (a resume: the same path, another file)
                    offset = start
                f.seek(offset)
                data = f.read(READ_CHUNK)
        except OSError:
            return
        complete = data.rfind(b"\n") + 1
        if complete == 0 and len(data) == READ_CHUNK:
            complete = len(data)  # one line longer than a whole chunk: cut
        self._read[sandbox_id] = (inode, offset + complete)
        ring = self._logs.setdefault(sandbox_id, deque(maxlen=KEEP_LINES))
        for raw in data[:complete].splitlines():
            entry = _log_entry(raw)
            if entry is not None:
                ring.append(entry)

    def metrics(
        self, sandbox_id: str, start: float | None = None, end: float | None = None
    ) -> list[dict[str, Any]]:
        """Samples (E2B's `SandboxMetric`) between unix times `start` and `end`."""
        return [
            m
            for m in self._samples.get(sandbox_id, ())
            if (start is None or m["timestampUnix"] >= start)
            and (end is None or m["timestampUnix"] <= end)
        ]

    def latest(self, sandbox_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        return {sid: self._samples[sid][-1] for sid in sandbox_ids if self._samples.get(sid)}

    def logs(self, sandbox_id: str) -> list[dict[str, Any]]:
        """Log lines, oldest first: `{timestamp, level, message, fields}`."""
        return list(self._logs.get(sandbox_id, ()))


def _metric(s: dict[str, Any]) -> dict[str, Any]:
    """envd's snapshot in E2B's `SandboxMetric` shape."""
    ts = int(s.get("ts") or datetime.now(UTC).timestamp())
    return {
        "timestamp": datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z"),
        "timestampUnix": ts,
        "cpuCount": int(s.get("cpu_count") or 0),
        "cpuUsedPct": float(s.get("cpu_used_pct") or 0.0),
        "memUsed": int(s.get("mem_used") or 0),
        "memTotal": int(s.get("mem_total") or 0),
        "memCache": int(s.get("mem_cache") or 0),
        "diskUsed": int(s.get("disk_used") or 0),
        "diskTotal": int(s.get("disk_total") or 0),
    }


def _log_entry(raw: bytes) -> dict[str, Any] | None:
    """A console line: envd's JSON (`ts`, `level`, `msg`, fields), or any other text."""
    text = raw.decode(errors="replace").strip()
    if not text:
        return None
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    try:
        doc = json.loads(text)
    except ValueError:
        return {"timestamp": now, "level": "info", "message": text, "fields": {}}
    if not isinstance(doc, dict):
        return {"timestamp": now, "level": "info", "message": text, "fields": {}}
    message = str(doc.pop("msg", doc.pop("message", "")))
    level = str(doc.pop("level", "info")).lower()
    ts = doc.pop("ts", None)
    at = (
        datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
        if isinstance(ts, int | float)
        else now
    )
    fields = {k: str(v) for k, v in doc.items()}
    return {"timestamp": at, "level": level, "message": message, "fields": fields}

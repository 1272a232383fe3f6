"""Backup and restore of the event log (AENV_EVT): every message with its subject, headers,
time and stream sequence, in order, to files with a manifest and checksums — and back into
a fresh JetStream (`aenv log backup|restore`, docs/deploy.md).

The log is the fleet's only source of truth: read models, the timer's clocks and every
aggregate's state are folds of it. A backup is therefore the log alone; the command queue
(work in flight, ephemeral) and the KV buckets (heartbeats, routes: live facts the roles
write again) are not in it.

A restore must give back the same stream sequences: an aggregate's version is the stream
sequence of its last event (appends are guarded by `Nats-Expected-Last-Subject-Sequence`)
and projections checkpoint by sequence, so a shifted log would refuse the next append of
every sandbox. The stream is made with the backup's first sequence, messages are
published in order, and each acknowledged sequence is checked against the original; the
write-time guards (`Nats-Expected-*` headers) are dropped, `Nats-Msg-Id` is kept.

Format (`FORMAT`): `manifest.json` (stream, prefix, first and last sequence, message
count, and per data file its count, sequences, size and SHA-256) and `events-NNNNNN.jsonl`
files of one JSON object per message: `seq`, `subject`, `time`, `headers`, `data`
(base64). Restoring into a stack with another bus prefix rewrites the subjects' prefix.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from bus.errors import BusError
from bus.settings import BusSettings
from bus.setup import stream_configs
from bus.subjects import Names

__all__ = [
    "FORMAT",
    "MANIFEST",
    "BackupError",
    "Manifest",
    "backup_log",
    "restore_log",
    "verify",
]

FORMAT = "aenv-log-backup/1"
MANIFEST = "manifest.json"
#: Messages per data file: files of tens of MB, each checked on its own
PER_FILE = 100_000
#: Gets in flight while reading (one round trip each). Not direct gets: their answers add
#: the response's own headers (`Nats-Stream`, `Nats-Sequence`, …) to the message's, and a
#: backup keeps the message's headers exactly.
_WINDOW = 64
#: Headers that guard a write when it is made; replayed, they would only refuse it
_WRITE_GUARDS = "nats-expected-"


class BackupError(BusError):
    """A backup that cannot be taken, read or restored as it stands."""


@dataclass(frozen=True)
class Manifest:
    stream: str
    prefix: str
    first_seq: int
    last_seq: int
    messages: int
    files: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **self.__dict__, "files": list(self.files)}

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        try:
            doc = json.loads((directory / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise BackupError(f"{directory}: no readable {MANIFEST}: {e}") from e
        if doc.get("format") != FORMAT:
            raise BackupError(f"{directory}: format {doc.get('format')!r}, want {FORMAT}")
        return cls(
            doc["stream"],
            doc["prefix"],
            doc["first_seq"],
            doc["last_seq"],
            doc["messages"],
            tuple(doc["files"]),
        )


async def _messages(js: JetStreamContext, stream: str, first: int, last: int) -> AsyncIterator[Any]:
    """Messages `first..last` of `stream` in order (`_WINDOW` gets at a time)."""
    for start in range(first, last + 1, _WINDOW):
        seqs = range(start, min(start + _WINDOW, last + 1))
        got = await asyncio.gather(*(js.get_msg(stream, seq=s) for s in seqs))
        for msg in got:
            yield msg


async def backup_log(js: JetStreamContext, settings: BusSettings, out: Path) -> Manifest:
    """Write the event log as it is now (up to its last sequence at the start) to `out`,
    a new or empty directory."""
    stream = Names(settings.bus_prefix).event_stream
    if out.exists() and any(out.iterdir()):
        raise BackupError(f"{out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    info = await js.stream_info(stream)
    first, last = info.state.first_seq, info.state.last_seq
    if info.state.messages and info.state.messages != last - first + 1:
        raise BackupError(f"{stream} has gaps ({info.state.messages} messages in {first}..{last})")
    files: list[dict[str, Any]] = []
    writer: _File | None = None
    if info.state.messages:
        async for msg in _messages(js, stream, first, last):
            if writer is None or writer.count == PER_FILE:
                if writer is not None:
                    files.append(writer.close())
                writer = _File(out / f"events-{len(files) + 1:06d}.jsonl")
            writer.write(msg)
    if writer is not None:
        files.append(writer.close())
    manifest = Manifest(stream, settings.bus_prefix, first, last, info.state.messages, tuple(files))
    (out / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    return manifest


class _File:
    """One data file being written, with its running checksum."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle = path.open("wb")
        self.sha = hashlib.sha256()
        self.count = self.size = self.first = self.last = 0

    def write(self, msg: Any) -> None:
        line = json.dumps(
            {
                "seq": msg.seq,
                "subject": msg.subject,
                "time": msg.time.isoformat() if msg.time else None,
                "headers": dict(msg.headers or {}),
                "data": base64.b64encode(msg.data or b"").decode(),
            },
            separators=(",", ":"),
        ).encode()
        line += b"\n"
        self.handle.write(line)
        self.sha.update(line)
        self.size += len(line)
        self.first = self.first or msg.seq
        self.last = msg.seq
        self.count += 1

    def close(self) -> dict[str, Any]:
        self.handle.close()
        return {
            "name": self.path.name,
            "messages": self.count,
            "first_seq": self.first,
            "last_seq": self.last,
            "bytes": self.size,
            "sha256": self.sha.hexdigest(),
        }


def verify(directory: Path) -> Manifest:
    """The backup's manifest, once every data file matched its size and checksum."""
    manifest = Manifest.read(directory)
    for f in manifest.files:
        data = (directory / f["name"]).read_bytes()
        if len(data) != f["bytes"] or hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise BackupError(f"{f['name']}: size or checksum differs from the manifest")
    if sum(f["messages"] for f in manifest.files) != manifest.messages:
        raise BackupError("the data files do not hold the manifest's message count")
    return manifest


def _records(directory: Path, manifest: Manifest) -> Iterator[dict[str, Any]]:
    for f in manifest.files:
        with (directory / f["name"]).open("rb") as handle:
            for line in handle:
                yield json.loads(line)


def _resubject(subject: str, source: str, target: str) -> str:
    """`subject` of a stack prefixed `source` as the stack prefixed `target` names it."""
    bare = subject.removeprefix(f"{source}.") if source else subject
    return f"{target}.{bare}" if target else bare


async def restore_log(
    js: JetStreamContext, settings: BusSettings, directory: Path, *, force: bool = False
) -> Manifest:
    """Publish a verified backup into this stack's event stream, which must be empty or
    absent (`force`: delete a non-empty one first). Made with aenv's own stream config."""
    manifest = verify(directory)
    config = stream_configs(settings)[0]
    try:
        info = await js.stream_info(config.name or "")
    except NotFoundError:
        info = None
    if info is not None:
        if info.state.last_seq and not force:
            raise BackupError(
                f"{config.name} is not empty ({info.state.messages} messages, last sequence "
                f"{info.state.last_seq}): restore into a fresh NATS, or --force to replace it"
            )
        await js.delete_stream(config.name or "")
    if manifest.first_seq > 1:
        config.first_seq = manifest.first_seq
    await js.add_stream(config)
    for record in _records(directory, manifest):
        headers = {
            k: v for k, v in record["headers"].items() if not k.lower().startswith(_WRITE_GUARDS)
        }
        subject = _resubject(record["subject"], manifest.prefix, settings.bus_prefix)
        ack = await js.publish(
            subject,
            base64.b64decode(record["data"]),
            # no `stream=`: nats-py would send, and the stream store, Nats-Expected-Stream
            headers=headers or None,
            timeout=settings.request_timeout_s,
        )
        if ack.seq != record["seq"] or ack.duplicate or ack.stream != config.name:
            raise BackupError(
                f"message {record['seq']} was stored as {ack.stream} {ack.seq}"
                f"{' (a duplicate id)' if ack.duplicate else ''}: restore stopped"
            )
    return manifest

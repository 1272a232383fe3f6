"""The block service's connection over a real unix socket, in process, with a raw NBD client:
requests pipelined behind the handshake and split at any byte are each answered once, by
handle, whichever path serves them (warm on the spot, cold in a task); a write's payload is
skipped; DISC answers what came before it and closes."""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from workers.snapshot import ImageFiles, ImageRepository, PosixStore
from workers.snapshot.blocks import protocol as nbd
from workers.snapshot.blocks.chunkcache import ChunkCache
from workers.snapshot.blocks.export import Exports
from workers.snapshot.blocks.server import BlockServer
from workers.snapshot.blocks.stats import BlockStats

MiB = 1 << 20
REQUEST = struct.Struct(">IHHQQI")
REPLY = struct.Struct(">IIQ")


def request(cmd: int, handle: int, offset: int, length: int) -> bytes:
    return REQUEST.pack(nbd.REQUEST_MAGIC, 0, cmd, handle, offset, length)


async def go(sock: Path, name: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    await reader.readexactly(18)  # magic, IHAVEOPT, handshake flags
    writer.write(struct.pack(">I", nbd.FLAG_FIXED_NEWSTYLE | nbd.FLAG_NO_ZEROES))
    payload = struct.pack(">I", len(name)) + name.encode() + struct.pack(">H", 0)
    writer.write(struct.pack(">QII", nbd.IHAVEOPT, nbd.OPT_GO, len(payload)) + payload)
    while True:
        _, _, rtype, n = struct.unpack(">QIII", await reader.readexactly(20))
        await reader.readexactly(n)
        if rtype == nbd.REP_ACK:
            return reader, writer
        assert rtype == nbd.REP_INFO


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Path, str, bytes]]:
    """A 12 MiB image (its middle 4 MiB zeros) served on a socket: (socket, name, bytes)."""
    data = os.urandom(4 * MiB) + bytes(4 * MiB) + os.urandom(4 * MiB)
    (tmp_path / "disk.raw").write_bytes(data)
    store = PosixStore(tmp_path / "store")
    up = await ImageRepository(store).upload_image(
        ImageFiles(tmp_path / "disk.raw"), recipe="r" * 64, role="root"
    )
    cache = ChunkCache(tmp_path / "cache", store, 64 * MiB)
    stats = BlockStats(cache)
    server = BlockServer(tmp_path / "b.sock", Exports(ImageRepository(store), cache, stats), stats)
    await server.start()
    try:
        yield tmp_path / "b.sock", up.manifest.digest, data
    finally:
        await server.stop()
        cache.close()


async def replies(
    reader: asyncio.StreamReader, reads: dict[int, int]
) -> dict[int, tuple[int, bytes]]:
    """Every reply until the server closes: handle -> (error, data); `reads` gives each
    read's length (a successful read's data follows its header)."""
    out: dict[int, tuple[int, bytes]] = {}
    while header := await reader.read(REPLY.size):
        header += await reader.readexactly(REPLY.size - len(header))
        magic, error, handle = REPLY.unpack(header)
        assert magic == nbd.SIMPLE_REPLY_MAGIC and handle not in out
        n = reads.get(handle, 0) if error == 0 else 0
        out[handle] = (error, await reader.readexactly(n) if n else b"")
    return out


@pytest.mark.parametrize("piece", [0, 1, 7])
async def test_pipelined_requests_split_anywhere_are_each_answered_once(
    served: tuple[Path, str, bytes], piece: int
) -> None:
    sock, name, data = served
    reader, writer = await go(sock, name)
    asks = [
        (nbd.Cmd.READ, 1, 100, 4096),  # cold: a fetch, in a task
        (nbd.Cmd.READ, 2, 4 * MiB + 5, 300),  # the zero chunk: no I/O
        (nbd.Cmd.WRITE, 3, 0, 512),  # refused; its payload follows and is skipped
        (nbd.Cmd.FLUSH, 4, 0, 0),
        (nbd.Cmd.READ, 5, 12 * MiB - 10, 20),  # past the end
        (nbd.Cmd.READ, 6, 8 * MiB - 50, 100),  # zeros and a cold chunk, across them
        (nbd.Cmd.READ, 7, 0, 4096),
    ]
    wire = b""
    for cmd, handle, offset, length in asks:
        wire += request(cmd, handle, offset, length)
        if cmd == nbd.Cmd.WRITE:
            wire += bytes(length)
    wire += request(nbd.Cmd.DISC, 99, 0, 0)
    if piece:  # the same bytes in small writes: headers and payloads split across reads
        for i in range(0, len(wire), piece):
            writer.write(wire[i : i + piece])
            await writer.drain()
    else:
        writer.write(wire)
    reads = {h: n for c, h, _, n in asks if c == nbd.Cmd.READ}
    got = await asyncio.wait_for(replies(reader, reads), 20)
    writer.close()
    assert got == {
        1: (0, data[100:4196]),
        2: (0, bytes(300)),
        3: (nbd.EPERM, b""),
        4: (0, b""),
        5: (nbd.EINVAL, b""),
        6: (0, data[8 * MiB - 50 : 8 * MiB + 50]),
        7: (0, data[:4096]),
    }


async def test_a_burst_of_warm_reads_is_answered_in_full(
    served: tuple[Path, str, bytes],
) -> None:
    sock, name, data = served
    reader, writer = await go(sock, name)
    writer.write(request(nbd.Cmd.READ, 1, 0, 10) + request(nbd.Cmd.READ, 2, 8 * MiB, 10))
    await writer.drain()
    for _ in range(2):  # cold: fetched
        _, error, _ = REPLY.unpack(await reader.readexactly(REPLY.size))
        assert error == 0
        await reader.readexactly(10)
    offsets = [(i * 4096 * 37) % (4 * MiB - 4096) for i in range(200)]
    writer.write(b"".join(request(nbd.Cmd.READ, i, o, 4096) for i, o in enumerate(offsets)))
    writer.write(request(nbd.Cmd.DISC, 999, 0, 0))
    got = await asyncio.wait_for(replies(reader, dict.fromkeys(range(200), 4096)), 20)
    assert got == {i: (0, data[o : o + 4096]) for i, o in enumerate(offsets)}
    writer.close()


async def test_a_zero_length_read_at_the_disk_s_end_is_answered(
    served: tuple[Path, str, bytes],
) -> None:
    sock, name, data = served
    reader, writer = await go(sock, name)
    writer.write(request(nbd.Cmd.READ, 1, len(data), 0) + request(nbd.Cmd.READ, 2, 0, 8))
    writer.write(request(nbd.Cmd.DISC, 3, 0, 0))
    got = await asyncio.wait_for(replies(reader, {1: 0, 2: 8}), 20)
    assert got == {1: (0, b""), 2: (0, data[:8])}
    writer.close()

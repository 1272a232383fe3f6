"""The streaming multipart parser, fed the SDK's captured bodies at every split."""

from __future__ import annotations

import base64
import os
import random
from collections.abc import Sequence

import pytest

from envd.multipart import (
    MultipartError,
    MultipartParser,
    PartData,
    PartEnd,
    PartStart,
    boundary_of,
    disposition_params,
)

# multi-file body sent by e2b 2.63.0's write_files (from the wire capture)
CAPTURED = base64.b64decode(
    "LS1mNjYzMzQ4ZjRkMDJmNjg2MDI0NjNkNGI5YWU5ZWU4Yw0KQ29udGVudC1EaXNwb3NpdGlvbjogZm9ybS1kYXRh"
    "OyBuYW1lPSJmaWxlIjsgZmlsZW5hbWU9ImQvYS50eHQiDQpDb250ZW50LVR5cGU6IHRleHQvcGxhaW4NCg0KQQ0K"
    "LS1mNjYzMzQ4ZjRkMDJmNjg2MDI0NjNkNGI5YWU5ZWU4Yw0KQ29udGVudC1EaXNwb3NpdGlvbjogZm9ybS1kYXRh"
    "OyBuYW1lPSJmaWxlIjsgZmlsZW5hbWU9ImQvYi5iaW4iDQpDb250ZW50LVR5cGU6IGFwcGxpY2F0aW9uL29jdGV0"
    "LXN0cmVhbQ0KDQoAAQ0KLS1mNjYzMzQ4ZjRkMDJmNjg2MDI0NjNkNGI5YWU5ZWU4Yy0tDQo="
)
BOUNDARY = b"f663348f4d02f68602463d4b9ae9ee8c"


def _files(events: Sequence[object]) -> list[tuple[str | None, bytes]]:
    out: list[tuple[str | None, bytes]] = []
    name: str | None = None
    data = b""
    for ev in events:
        if isinstance(ev, PartStart):
            name, data = ev.filename, b""
        elif isinstance(ev, PartData):
            data += ev.data
        elif isinstance(ev, PartEnd):
            out.append((name, data))
    return out


def test_captured_body_at_every_split() -> None:
    for split in range(len(CAPTURED) + 1):
        p = MultipartParser(BOUNDARY)
        events = p.feed(CAPTURED[:split]) + p.feed(CAPTURED[split:])
        assert _files(events) == [("d/a.txt", b"A"), ("d/b.bin", b"\x00\x01")], split
        assert p.done


def test_byte_by_byte() -> None:
    p = MultipartParser(BOUNDARY)
    events = [ev for b in CAPTURED for ev in p.feed(bytes([b]))]
    assert _files(events) == [("d/a.txt", b"A"), ("d/b.bin", b"\x00\x01")]


def test_data_that_looks_like_a_boundary() -> None:
    b = b"XyZ"
    payload = b"\r\n--XyQ almost\r\n--Xy\r\n-" + os.urandom(5000).replace(b"XyZ", b"xyz")
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n\r\n'
        + payload
        + b"\r\n--XyZ--\r\n"
    )
    for split in (1, 7, 30, len(body) // 2, len(body) - 3):
        p = MultipartParser(b)
        assert _files(p.feed(body[:split]) + p.feed(body[split:])) == [("f", payload)]


def test_large_part_is_streamed_not_buffered() -> None:
    p = MultipartParser(b"bb")
    p.feed(b'--bb\r\nContent-Disposition: form-data; name="file"; filename="big"\r\n\r\n')
    chunk = b"x" * 65536
    emitted = 0
    for _ in range(100):
        for ev in p.feed(chunk):
            assert isinstance(ev, PartData)
            emitted += len(ev.data)
    assert emitted >= 100 * 65536 - 16  # only a boundary's worth is held back


def test_boundary_and_disposition_parsing() -> None:
    assert boundary_of("multipart/form-data; boundary=abc") == b"abc"
    assert boundary_of('multipart/form-data; charset=x; boundary="a b"') == b"a b"
    assert boundary_of("application/octet-stream") is None
    params = disposition_params('form-data; name="file"; filename="d/x \\"q\\".txt"')
    assert params == {"name": "file", "filename": 'd/x "q".txt'}
    assert disposition_params('form-data; filename="a%22b"')["filename"] == 'a"b'
    star = disposition_params("form-data; filename=\"x\"; filename*=utf-8''%C3%A9.txt")
    assert star["filename"] == "é.txt"


def test_garbage_after_boundary() -> None:
    p = MultipartParser(b"b")
    with pytest.raises(MultipartError):
        p.feed(b"--b" + b"x" * 300)


def _body(boundary: bytes, parts: list[tuple[str, bytes]]) -> bytes:
    out = b""
    for name, data in parts:
        out += (
            b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; '
            b'filename="' + name.encode() + b'"\r\n\r\n' + data + b"\r\n"
        )
    return out + b"--" + boundary + b"--\r\n"


def test_random_bodies_fed_as_spans_of_a_reused_buffer() -> None:
    """What /files does: each piece lands in one buffer the connection reuses, the parser
    gets (buffer, start, end), and part data must be consumed before the next piece
    overwrites it. Payloads are full of boundary prefixes, split at random points."""
    rng = random.Random(7)
    boundary = b"0f1e2d3c4b5a"
    delim = b"\r\n--" + boundary
    for _ in range(200):
        parts = []
        for i in range(rng.randint(1, 4)):
            pieces = [os.urandom(rng.randint(0, 300)) for _ in range(rng.randint(0, 5))]
            noise = [delim[: rng.randint(1, len(delim) - 1)] for _ in pieces]
            data = b"".join(p + n for p, n in zip(pieces, noise, strict=True))
            parts.append((f"d/{i}.bin", data.replace(delim, b"x" * len(delim))))
        body = _body(boundary, parts)
        p = MultipartParser(boundary)
        buf = bytearray(4096)
        events: list[object] = []
        pos = 0
        while pos < len(body):
            n = rng.choice((1, 2, 3, 17, len(delim) - 1, len(delim), len(delim) + 1, 200, 4096))
            piece = body[pos : pos + n]
            start = rng.randint(0, len(buf) - len(piece))
            buf[start : start + len(piece)] = piece
            for ev in p.feed(buf, start, start + len(piece)):
                # copy now: the next piece overwrites the buffer the views point into
                events.append(PartData(bytes(ev.data)) if isinstance(ev, PartData) else ev)
            buf[:] = b"\xee" * len(buf)
            pos += len(piece)
        assert p.done
        assert _files(events) == parts


def test_part_data_is_a_view_of_the_fed_buffer() -> None:
    """The bytes of a big part are not copied: the parser hands out views of its input."""
    p = MultipartParser(b"bb")
    p.feed(b'--bb\r\nContent-Disposition: form-data; name="file"; filename="big"\r\n\r\n')
    buf = bytearray(b"y" * 65536)
    events = p.feed(buf, 100, 60000)
    assert len(events) == 1 and isinstance(events[0], PartData)
    data = events[0].data
    assert isinstance(data, memoryview) and data.obj is buf
    assert len(data) == 60000 - 100 - len(b"\r\n--bb") + 1

"""Connect envelope framing and error shapes (pure)."""

from __future__ import annotations

import json
import struct

import pytest

from envd.connect import (
    CODE_STATUS,
    FLAG_END_STREAM,
    EnvelopeParser,
    RpcError,
    decode_message,
    end_of_stream,
    envelope,
)


def test_envelope_layout() -> None:
    assert envelope(b'{"a":1}') == b"\x00\x00\x00\x00\x07" + b'{"a":1}'
    assert end_of_stream(None) == b"\x02\x00\x00\x00\x02{}"
    eos = end_of_stream(RpcError("not_found", "gone"))
    flags, length = struct.unpack(">BI", eos[:5])
    assert flags == FLAG_END_STREAM and length == len(eos) - 5
    assert json.loads(eos[5:]) == {"error": {"code": "not_found", "message": "gone"}}


def test_parser_handles_any_chunking() -> None:
    stream = envelope(b'{"x":1}') + envelope(b"{}") + envelope(b'{"y":"z"}', FLAG_END_STREAM)
    for split in range(1, len(stream)):
        p = EnvelopeParser()
        got = p.feed(stream[:split]) + p.feed(stream[split:])
        assert got == [(0, b'{"x":1}'), (0, b"{}"), (FLAG_END_STREAM, b'{"y":"z"}')]
        assert p.pending == 0
    p = EnvelopeParser()
    got = [m for b in stream for m in p.feed(bytes([b]))]
    assert len(got) == 3


def test_parser_rejects_oversized_messages() -> None:
    p = EnvelopeParser(max_message=10)
    with pytest.raises(RpcError) as info:
        p.feed(struct.pack(">BI", 0, 11))
    assert info.value.code == "resource_exhausted"


def test_sdk_captured_envelopes_parse() -> None:
    """The exact bytes connectrpc writes for StreamInput (from the wire capture)."""
    msgs = [b'{"start":{"process":{"pid":23712}}}', b'{"data":{"input":{"stdin":"YQo="}}}']
    p = EnvelopeParser()
    got = p.feed(b"".join(envelope(m) for m in msgs))
    assert [decode_message(m) for _, m in got] == [
        {"start": {"process": {"pid": 23712}}},
        {"data": {"input": {"stdin": "YQo="}}},
    ]


def test_decode_message_errors() -> None:
    assert decode_message(b"") == {}
    with pytest.raises(RpcError) as info:
        decode_message(b"[1]")
    assert info.value.code == "invalid_argument"
    with pytest.raises(RpcError):
        decode_message(b"{nope")


def test_code_statuses_follow_the_connect_spec() -> None:
    assert CODE_STATUS["not_found"] == 404
    assert CODE_STATUS["already_exists"] == 409
    assert CODE_STATUS["invalid_argument"] == 400
    assert CODE_STATUS["unauthenticated"] == 401
    assert CODE_STATUS["deadline_exceeded"] == 504
    assert CODE_STATUS["unimplemented"] == 501
    assert CODE_STATUS["canceled"] == 499


def test_errors_decode_with_connectrpc() -> None:
    """Our end-of-stream error is what connectrpc turns into a ConnectError."""
    from connectrpc._protocol import ConnectWireError
    from connectrpc.code import Code

    body = json.loads(end_of_stream(RpcError("already_exists", "dir"))[5:])
    err = ConnectWireError.from_dict(body["error"], 500, Code.UNKNOWN).to_exception()
    assert err.code == Code.ALREADY_EXISTS and err.message == "dir"

"""The NBD codec of the block service (`workers/snapshot/blocks/protocol.py`): every
option's replies and every request's answer, as bytes, against the protocol document."""

from __future__ import annotations

import struct

import pytest

from workers.snapshot.blocks import protocol as nbd
from workers.snapshot.blocks.export import Segment, segments
from workers.snapshot.manifest import MemoryRef

SIZES = {"img": 10 << 20}


def go_payload(name: str, infos: tuple[int, ...] = ()) -> bytes:
    raw = name.encode()
    return (
        struct.pack(">I", len(raw))
        + raw
        + struct.pack(">H", len(infos))
        + b"".join(struct.pack(">H", i) for i in infos)
    )


def replies(data: bytes) -> list[tuple[int, int, bytes]]:
    """(option, reply type, payload) of each option reply in `data`."""
    out = []
    while data:
        magic, opt, rtype, n = struct.unpack_from(">QIII", data)
        assert magic == nbd.REPLY_MAGIC
        out.append((opt, rtype, data[20 : 20 + n]))
        data = data[20 + n :]
    return out


def test_greeting_is_fixed_newstyle_without_zeroes() -> None:
    g = nbd.greeting()
    assert g[:8] == b"NBDMAGIC" and g[8:16] == b"IHAVEOPT"
    assert struct.unpack(">H", g[16:]) == (nbd.FLAG_FIXED_NEWSTYLE | nbd.FLAG_NO_ZEROES,)


@pytest.mark.parametrize("flags", [0, nbd.FLAG_NO_ZEROES, 1 | 4])
def test_old_style_or_unknown_client_flags_are_dropped(flags: int) -> None:
    with pytest.raises(nbd.ProtocolError):
        nbd.client_flags(struct.pack(">I", flags))
    assert nbd.client_flags(struct.pack(">I", 3)) == 3


def test_option_header_checks_magic_and_bounds_the_payload() -> None:
    assert nbd.option_header(struct.pack(">QII", nbd.IHAVEOPT, 7, 12)) == (7, 12)
    with pytest.raises(nbd.ProtocolError):
        nbd.option_header(struct.pack(">QII", nbd.NBDMAGIC, 7, 12))
    with pytest.raises(nbd.ProtocolError):
        nbd.option_header(struct.pack(">QII", nbd.IHAVEOPT, 7, 1 << 20))


def test_go_on_a_known_export_gives_its_size_read_only_flags_and_block_sizes() -> None:
    a = nbd.answer_option(nbd.OPT_GO, go_payload("img", (3,)), SIZES.get, no_zeroes=True)
    assert (a.outcome, a.export, a.size) == (nbd.Outcome.SERVE, "img", 10 << 20)
    (o1, t1, p1), (_, t2, p2), (_, t3, p3) = replies(a.replies)
    assert (o1, t1, t3, p3) == (nbd.OPT_GO, nbd.REP_INFO, nbd.REP_ACK, b"")
    info, size, flags = struct.unpack(">HQH", p1)
    assert (info, size) == (nbd.INFO_EXPORT, 10 << 20)
    assert flags & nbd.TFLAG_READ_ONLY and flags & nbd.TFLAG_HAS_FLAGS
    assert t2 == nbd.REP_INFO
    assert struct.unpack(">HIII", p2) == (nbd.INFO_BLOCK_SIZE, 1, 4096, nbd.MAX_REQUEST)


def test_info_answers_like_go_but_stays_in_negotiation() -> None:
    a = nbd.answer_option(nbd.OPT_INFO, go_payload("img"), SIZES.get, no_zeroes=True)
    assert a.outcome is nbd.Outcome.NEXT
    assert [t for _, t, _ in replies(a.replies)] == [nbd.REP_INFO, nbd.REP_INFO, nbd.REP_ACK]


@pytest.mark.parametrize("opt", [nbd.OPT_GO, nbd.OPT_INFO])
def test_an_unknown_export_is_err_unknown_and_negotiation_goes_on(opt: int) -> None:
    a = nbd.answer_option(opt, go_payload("other"), SIZES.get, no_zeroes=True)
    assert a.outcome is nbd.Outcome.NEXT
    [(o, t, msg)] = replies(a.replies)
    assert (o, t) == (opt, nbd.REP_ERR_UNKNOWN) and b"other" in msg


@pytest.mark.parametrize(
    "payload",
    [b"", struct.pack(">I", 99) + b"img", go_payload("img") + b"x", go_payload("img", (3,))[:-2]],
)
def test_a_malformed_go_is_err_invalid(payload: bytes) -> None:
    a = nbd.answer_option(nbd.OPT_GO, payload, SIZES.get, no_zeroes=True)
    assert [t for _, t, _ in replies(a.replies)] == [nbd.REP_ERR_INVALID]
    assert a.outcome is nbd.Outcome.NEXT


@pytest.mark.parametrize("no_zeroes", [True, False])
def test_export_name_answers_size_and_flags_with_or_without_zeroes(no_zeroes: bool) -> None:
    a = nbd.answer_option(nbd.OPT_EXPORT_NAME, b"img", SIZES.get, no_zeroes=no_zeroes)
    assert a.outcome is nbd.Outcome.SERVE and a.export == "img"
    assert len(a.replies) == 10 + (0 if no_zeroes else 124)
    size, flags = struct.unpack_from(">QH", a.replies)
    assert size == 10 << 20 and flags == nbd.EXPORT_FLAGS


def test_export_name_of_an_unknown_export_hangs_up() -> None:
    a = nbd.answer_option(nbd.OPT_EXPORT_NAME, b"nope", SIZES.get, no_zeroes=True)
    assert a == nbd.OptionAnswer(b"", nbd.Outcome.CLOSE)


def test_list_names_the_open_exports_then_acks() -> None:
    a = nbd.answer_option(nbd.OPT_LIST, b"", SIZES.get, no_zeroes=True, listed=("a", "bc"))
    got = replies(a.replies)
    assert [t for _, t, _ in got] == [nbd.REP_SERVER, nbd.REP_SERVER, nbd.REP_ACK]
    assert got[1][2] == struct.pack(">I", 2) + b"bc"
    bad = nbd.answer_option(nbd.OPT_LIST, b"x", SIZES.get, no_zeroes=True)
    assert [t for _, t, _ in replies(bad.replies)] == [nbd.REP_ERR_INVALID]


def test_abort_is_acked_and_closes() -> None:
    a = nbd.answer_option(nbd.OPT_ABORT, b"", SIZES.get, no_zeroes=True)
    assert a.outcome is nbd.Outcome.CLOSE
    assert replies(a.replies) == [(nbd.OPT_ABORT, nbd.REP_ACK, b"")]


@pytest.mark.parametrize("opt", [nbd.OPT_STRUCTURED_REPLY, 5, 9, 10, 1234])
def test_structured_replies_and_other_options_are_unsupported(opt: int) -> None:
    a = nbd.answer_option(opt, b"", SIZES.get, no_zeroes=True)
    assert a.outcome is nbd.Outcome.NEXT
    assert replies(a.replies) == [(opt, nbd.REP_ERR_UNSUP, b"")]


def test_export_name_of_reads_the_name_an_option_asks_for() -> None:
    assert nbd.export_name_of(nbd.OPT_GO, go_payload("img", (1, 3))) == "img"
    assert nbd.export_name_of(nbd.OPT_EXPORT_NAME, b"x") == "x"
    assert nbd.export_name_of(nbd.OPT_LIST, b"") is None
    assert nbd.export_name_of(nbd.OPT_GO, b"\0\0") is None


def req(cmd: int, offset: int = 0, length: int = 512) -> nbd.Request:
    return nbd.parse_request(struct.pack(">IHHQQI", nbd.REQUEST_MAGIC, 0, cmd, 77, offset, length))


def test_requests_parse_and_a_bad_magic_is_a_protocol_error() -> None:
    assert req(nbd.Cmd.READ, 4096, 8) == nbd.Request(0, 0, 77, 4096, 8)
    with pytest.raises(nbd.ProtocolError):
        nbd.parse_request(struct.pack(">IHHQQI", nbd.SIMPLE_REPLY_MAGIC, 0, 0, 1, 0, 1))


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (req(nbd.Cmd.READ), 0),
        (req(nbd.Cmd.READ, (10 << 20) - 512), 0),
        (req(nbd.Cmd.READ, (10 << 20) - 511), nbd.EINVAL),  # past the end
        (req(nbd.Cmd.READ, 0, nbd.MAX_REQUEST + 1), nbd.EINVAL),
        (req(nbd.Cmd.FLUSH), 0),
        (req(nbd.Cmd.WRITE), nbd.EPERM),
        (req(nbd.Cmd.TRIM), nbd.EPERM),
        (req(nbd.Cmd.WRITE_ZEROES), nbd.EPERM),
        (req(nbd.Cmd.CACHE), nbd.EINVAL),
        (req(99), nbd.EINVAL),
    ],
)
def test_each_request_gets_its_errno_before_any_io(request_: nbd.Request, error: int) -> None:
    assert nbd.request_error(request_, 10 << 20) == error


def test_simple_reply_header() -> None:
    assert nbd.simple_reply(77, nbd.EIO) == struct.pack(">IIQ", nbd.SIMPLE_REPLY_MAGIC, 5, 77)


def test_a_read_is_cut_at_chunk_boundaries_zero_chunks_named_none() -> None:
    disk = MemoryRef(size=10, chunk_size=4, chunks=("a" * 64, None, "c" * 64))
    assert segments(disk, 2, 7) == [
        Segment("a" * 64, 2, 2, 0),
        Segment(None, 0, 4, 2),
        Segment("c" * 64, 0, 1, 6),
    ]
    assert segments(disk, 8, 2) == [Segment("c" * 64, 0, 2, 0)]
    assert segments(disk, 4, 4) == [Segment(None, 0, 4, 0)]

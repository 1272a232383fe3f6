"""The NBD wire (fixed newstyle, read-only, simple replies): bytes in, bytes and decisions out.

Pure: no sockets, no awaits, so every framing rule is a unit test. The server
(`blocks/server.py`) reads the fixed-size headers this module names, resolves an export's
size (that needs the repository), and writes what these functions return.

What we speak, and why no more: QEMU's client (7.2) asks for NBD_OPT_STRUCTURED_REPLY and
falls back to simple replies when refused, so we refuse it (structured replies only pay off
for sparse reads and block status, which a read-only base disk under a qcow2 top does not
need). Options: GO / INFO (with NBD_INFO_EXPORT and NBD_INFO_BLOCK_SIZE), EXPORT_NAME (old
clients), LIST, ABORT; the rest are NBD_REP_ERR_UNSUP. Commands: READ, FLUSH (a no-op on a
read-only export), DISC; WRITE / TRIM / WRITE_ZEROES are EPERM, anything else EINVAL.
Reference: the NBD protocol document (github.com/NetworkBlockDevice/nbd, doc/proto.md).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "MAX_REQUEST",
    "OPTION_HEADER",
    "READ",
    "REQUEST_HEADER",
    "Cmd",
    "OptionAnswer",
    "Outcome",
    "ProtocolError",
    "Request",
    "answer_option",
    "client_flags",
    "export_name_of",
    "greeting",
    "option_header",
    "option_reply",
    "parse_request",
    "request_error",
    "request_error_of",
    "simple_reply",
    "unpack_request",
]

NBDMAGIC = 0x4E42444D41474943  # "NBDMAGIC"
IHAVEOPT = 0x49484156454F5054  # "IHAVEOPT"
REPLY_MAGIC = 0x3E889045565A9  # option replies
REQUEST_MAGIC = 0x25609513
SIMPLE_REPLY_MAGIC = 0x67446698

# handshake flags (server) and client flags
FLAG_FIXED_NEWSTYLE = 1 << 0
FLAG_NO_ZEROES = 1 << 1
CLIENT_FLAGS_KNOWN = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES

# options
OPT_EXPORT_NAME = 1
OPT_ABORT = 2
OPT_LIST = 3
OPT_INFO = 6
OPT_GO = 7
OPT_STRUCTURED_REPLY = 8

# option reply types
REP_ACK = 1
REP_SERVER = 2
REP_INFO = 3
REP_ERR_UNSUP = (1 << 31) | 1
REP_ERR_INVALID = (1 << 31) | 3
REP_ERR_UNKNOWN = (1 << 31) | 6

# NBD_REP_INFO types
INFO_EXPORT = 0
INFO_BLOCK_SIZE = 3

# transmission flags: read-only; flush accepted (a no-op); several connections may read
# the same export at once (nothing to keep coherent: nobody writes)
TFLAG_HAS_FLAGS = 1 << 0
TFLAG_READ_ONLY = 1 << 1
TFLAG_SEND_FLUSH = 1 << 2
TFLAG_CAN_MULTI_CONN = 1 << 8
EXPORT_FLAGS = TFLAG_HAS_FLAGS | TFLAG_READ_ONLY | TFLAG_SEND_FLUSH | TFLAG_CAN_MULTI_CONN

# errno values on the wire (the protocol fixes them, whatever the host's errno.h says)
EPERM = 1
EIO = 5
EINVAL = 22
ENOSPC = 28
ESHUTDOWN = 108

#: The largest request payload we serve: QEMU never asks for more than 32 MiB, and a bound
#: keeps one request from holding an unbounded buffer. Advertised as the maximum block size.
MAX_REQUEST = 32 << 20
#: Preferred I/O size: a page (QEMU aligns to it anyway).
PREFERRED_BLOCK = 4096

_OPTION = struct.Struct(">QII")
_REPLY = struct.Struct(">QIII")
_REQUEST = struct.Struct(">IHHQQI")
_SIMPLE = struct.Struct(">IIQ")

#: Bytes of a client's option header (IHAVEOPT, option, length).
OPTION_HEADER = _OPTION.size
#: Bytes of a transmission request header.
REQUEST_HEADER = _REQUEST.size
#: Longest option payload accepted (a name is at most 4096 bytes; room for info requests).
MAX_OPTION_DATA = 8192


class ProtocolError(Exception):
    """The peer broke the framing: the connection cannot go on and is closed."""


class Cmd(int, Enum):
    READ = 0
    WRITE = 1
    DISC = 2
    FLUSH = 3
    TRIM = 4
    CACHE = 5
    WRITE_ZEROES = 6


#: `Cmd.READ` as a plain int, for the per-request comparisons of the hot path.
READ = int(Cmd.READ)


class Outcome(Enum):
    """What the connection does after an option's replies are sent."""

    NEXT = "next"  # read the next option
    SERVE = "serve"  # transmission phase on `OptionAnswer.export`
    CLOSE = "close"  # the client aborted, or an EXPORT_NAME for an unknown export


@dataclass(frozen=True)
class OptionAnswer:
    replies: bytes
    outcome: Outcome = Outcome.NEXT
    export: str | None = None
    size: int = 0


@dataclass(frozen=True)
class Request:
    flags: int
    cmd: int
    handle: int
    offset: int
    length: int


def greeting() -> bytes:
    """The server's first bytes: magic, IHAVEOPT, handshake flags."""
    return struct.pack(">QQH", NBDMAGIC, IHAVEOPT, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES)


def client_flags(data: bytes) -> int:
    """The client's 4-byte flags. A client that is not fixed-newstyle, or sets flags we do
    not know, must be dropped (the protocol says so: it cannot be answered safely)."""
    (flags,) = struct.unpack(">I", data)
    if not flags & FLAG_FIXED_NEWSTYLE or flags & ~CLIENT_FLAGS_KNOWN:
        raise ProtocolError(f"client flags {flags:#x}: fixed newstyle only")
    return int(flags)


def option_header(data: bytes) -> tuple[int, int]:
    """(option, payload length) from a client's 16-byte option header."""
    magic, opt, length = _OPTION.unpack(data)
    if magic != IHAVEOPT:
        raise ProtocolError(f"option magic {magic:#x}")
    if length > MAX_OPTION_DATA:
        raise ProtocolError(f"option {opt} with {length} bytes of data")
    return int(opt), int(length)


def option_reply(opt: int, rtype: int, data: bytes = b"") -> bytes:
    return _REPLY.pack(REPLY_MAGIC, opt, rtype, len(data)) + data


def export_name_of(opt: int, data: bytes) -> str | None:
    """The export an option asks about (EXPORT_NAME, INFO, GO), for the server to look up
    before `answer_option`; None for other options or a malformed payload."""
    if opt == OPT_EXPORT_NAME:
        return data.decode("utf-8", "replace")
    if opt in (OPT_INFO, OPT_GO) and len(data) >= 6:
        (n,) = struct.unpack_from(">I", data)
        if 4 + n + 2 <= len(data):
            return data[4 : 4 + n].decode("utf-8", "replace")
    return None


def answer_option(
    opt: int,
    data: bytes,
    size_of: Callable[[str], int | None],
    *,
    no_zeroes: bool,
    listed: tuple[str, ...] = (),
) -> OptionAnswer:
    """The replies to one option. `size_of(name)`: the export's size, None if unknown
    (the server resolved it beforehand). `listed`: names NBD_OPT_LIST returns."""
    if opt == OPT_EXPORT_NAME:
        name = data.decode("utf-8", "replace")
        size = size_of(name)
        if size is None:  # this option has no error reply: the server just hangs up
            return OptionAnswer(b"", Outcome.CLOSE)
        tail = b"" if no_zeroes else bytes(124)
        return OptionAnswer(
            struct.pack(">QH", size, EXPORT_FLAGS) + tail, Outcome.SERVE, name, size
        )
    if opt == OPT_ABORT:
        return OptionAnswer(option_reply(opt, REP_ACK), Outcome.CLOSE)
    if opt == OPT_LIST:
        if data:
            return OptionAnswer(option_reply(opt, REP_ERR_INVALID))
        out = b"".join(
            option_reply(opt, REP_SERVER, struct.pack(">I", len(n.encode())) + n.encode())
            for n in listed
        )
        return OptionAnswer(out + option_reply(opt, REP_ACK))
    if opt in (OPT_INFO, OPT_GO):
        return _info_or_go(opt, data, size_of)
    return OptionAnswer(option_reply(opt, REP_ERR_UNSUP))  # STRUCTURED_REPLY, STARTTLS, ...


def _info_or_go(opt: int, data: bytes, size_of: Callable[[str], int | None]) -> OptionAnswer:
    # payload: u32 name length, name, u16 count of info requests, count x u16
    if len(data) < 6:
        return OptionAnswer(option_reply(opt, REP_ERR_INVALID))
    (n,) = struct.unpack_from(">I", data)
    if 4 + n + 2 > len(data):
        return OptionAnswer(option_reply(opt, REP_ERR_INVALID))
    (count,) = struct.unpack_from(">H", data, 4 + n)
    if len(data) != 4 + n + 2 + 2 * count:
        return OptionAnswer(option_reply(opt, REP_ERR_INVALID))
    raw = data[4 : 4 + n]
    name = raw.decode("utf-8", "replace")
    size = size_of(name)
    if size is None:
        return OptionAnswer(option_reply(opt, REP_ERR_UNKNOWN, b"no such image: " + raw))
    # NBD_INFO_EXPORT always; the block sizes unasked too (allowed, and QEMU uses them)
    out = option_reply(opt, REP_INFO, struct.pack(">HQH", INFO_EXPORT, size, EXPORT_FLAGS))
    out += option_reply(
        opt, REP_INFO, struct.pack(">HIII", INFO_BLOCK_SIZE, 1, PREFERRED_BLOCK, MAX_REQUEST)
    )
    out += option_reply(opt, REP_ACK)
    if opt == OPT_GO:
        return OptionAnswer(out, Outcome.SERVE, name, size)
    return OptionAnswer(out)


def parse_request(data: bytes) -> Request:
    return Request(*unpack_request(data, 0))


def unpack_request(buf: bytes | bytearray, at: int) -> tuple[int, int, int, int, int]:
    """(flags, cmd, handle, offset, length) of the request header at `at` in `buf`: the
    server's hot path, so plain ints and no object per request."""
    magic, flags, cmd, handle, offset, length = _REQUEST.unpack_from(buf, at)
    if magic != REQUEST_MAGIC:
        raise ProtocolError(f"request magic {magic:#x}")
    return flags, cmd, handle, offset, length


def request_error(req: Request, size: int) -> int:
    """The errno a request is answered with before any I/O (0: serve it)."""
    return request_error_of(req.cmd, req.offset, req.length, size)


def request_error_of(cmd: int, offset: int, length: int, size: int) -> int:
    """`request_error` of a header's fields."""
    if cmd == READ:
        return EINVAL if length > MAX_REQUEST or offset + length > size else 0
    if cmd in (Cmd.WRITE, Cmd.TRIM, Cmd.WRITE_ZEROES):
        return EPERM  # read-only export
    if cmd == Cmd.FLUSH:
        return 0
    return EINVAL


def simple_reply(handle: int, error: int = 0) -> bytes:
    """A simple reply's header; a successful READ's data follows it."""
    return _SIMPLE.pack(SIMPLE_REPLY_MAGIC, error, handle)

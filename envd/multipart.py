"""An incremental multipart/form-data parser: bytes in as they arrive, part data out.

Nothing is buffered beyond one boundary's length (or one part's headers), and part bodies
are handed out as views of the caller's buffer, so uploads of any size stream straight to
disk without a user-space copy. Only what /files needs: part headers (for the filename) and
part bodies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Union

MAX_PART_HEAD = 16 * 1024
# Bytes outside part bodies (boundaries, headers) are moved into the parser's own buffer at
# most this many at a time: enough for a typical part head in one step, small to copy.
SLOW_STEP = 4096


class MultipartError(ValueError):
    """The body is not well-formed multipart."""


@dataclass
class PartStart:
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def filename(self) -> str | None:
        return disposition_params(self.headers.get("content-disposition", "")).get("filename")

    @property
    def name(self) -> str | None:
        return disposition_params(self.headers.get("content-disposition", "")).get("name")


@dataclass
class PartData:
    data: bytes | memoryview  # a view of the fed buffer when it can be: see MultipartParser


@dataclass
class PartEnd:
    pass


# Union, not `|`: this alias is evaluated at run time, and envd runs on Python 3.9 too.
Event = Union[PartStart, PartData, PartEnd]  # noqa: UP007


def boundary_of(content_type: str) -> bytes | None:
    """The boundary parameter of a multipart Content-Type, or None."""
    mtype, _, params = content_type.partition(";")
    if mtype.strip().lower() != "multipart/form-data":
        return None
    for param in params.split(";"):
        k, _, v = param.strip().partition("=")
        if k.strip().lower() == "boundary":
            v = v.strip()
            if len(v) >= 2 and v[0] == v[-1] == '"':
                v = v[1:-1]
            return v.encode("latin-1") if v else None
    return None


def disposition_params(value: str) -> dict[str, str]:
    """Parameters of a Content-Disposition header, honouring quotes and backslash escapes.

    httpx writes `filename="d/a.txt"` and percent-encodes a double quote as %22; RFC 5987
    `filename*=utf-8''...` wins over `filename` when both are present.
    """
    out: dict[str, str] = {}
    i, n = 0, len(value)
    # skip the disposition type
    while i < n and value[i] != ";":
        i += 1
    while i < n:
        i += 1  # past ';'
        while i < n and value[i] in " \t":
            i += 1
        start = i
        while i < n and value[i] not in "=;":
            i += 1
        key = value[start:i].strip().lower()
        if i >= n or value[i] == ";":
            continue
        i += 1  # past '='
        if i < n and value[i] == '"':
            i += 1
            chars: list[str] = []
            while i < n and value[i] != '"':
                if value[i] == "\\" and i + 1 < n:
                    i += 1
                chars.append(value[i])
                i += 1
            i += 1  # closing quote
            val = "".join(chars)
            while i < n and value[i] != ";":
                i += 1
        else:
            start = i
            while i < n and value[i] != ";":
                i += 1
            val = value[start:i].strip()
        if key.endswith("*"):
            from urllib.parse import unquote

            _, _, encoded = val.partition("''")
            out[key[:-1]] = unquote(encoded)
            out[key] = val
        elif key not in out:
            out[key] = val.replace("%22", '"')
    return out


class MultipartParser:
    """Feed body bytes; get PartStart / PartData / PartEnd events in order.

    Part bodies are found where they lie: `feed(buf, start, end)` searches the caller's
    buffer for the next boundary (`bytearray.find`, which runs at memory speed) and hands
    out memoryview slices of it, so a byte of a file is never copied in user space. Only
    what straddles two feeds (at most one boundary's length) and the small part headers
    are copied into the parser's own buffer. A PartData view is valid until the caller
    reuses its buffer (for /files: the next read from the connection).
    """

    def __init__(self, boundary: bytes) -> None:
        self._delim = b"\r\n--" + boundary
        # Pretend a CRLF precedes the body so the first boundary looks like all the others.
        # Holds what is not parsed yet: in a body, never more than len(delim) - 1 bytes.
        self._buf = bytearray(b"\r\n")
        self._state = "preamble"
        self.done = False

    def _take(self, n: int) -> bytes:
        """The first n buffered bytes, removed: one copy (slicing a bytearray makes two)."""
        with memoryview(self._buf) as view:
            out = bytes(view[:n])
        del self._buf[:n]
        return out

    def feed(
        self, data: bytes | bytearray | memoryview, start: int = 0, end: int | None = None
    ) -> list[Event]:
        """Parse data[start:end] (all of data by default)."""
        if isinstance(data, memoryview):  # no find() on a memoryview: callers pass buffers
            data = data.tobytes()
        if end is None:
            end = len(data)
        events: list[Event] = []
        keep = len(self._delim) - 1
        while start < end and not self.done:
            if self._state == "body" and end - start > keep:
                start = self._body(data, start, end, events)
            else:
                # Headers, boundaries and short pieces go through the own buffer, a bounded
                # step at a time so that the start of a big body is not copied first.
                step = min(end - start, SLOW_STEP)
                self._buf += memoryview(data)[start : start + step]
                start += step
                self._parse_buffered(events)
        return events

    def _body(self, data: bytes | bytearray, start: int, end: int, events: list[Event]) -> int:
        """Part data in data[start:end] (longer than a boundary), without copying it; returns
        where parsing continues."""
        delim = self._delim
        keep = len(delim) - 1
        if self._buf:
            # A boundary may begin in the bytes held back from the last feed. It would end
            # within the next `keep` bytes, so this small join is all that must be searched.
            held = len(self._buf)
            joined = bytes(self._buf) + data[start : start + keep]
            self._buf.clear()
            idx = joined.find(delim)
            if idx >= 0:  # it begins in the held bytes (idx < held: see above)
                if idx:
                    events.append(PartData(joined[:idx]))
                events.append(PartEnd())
                self._state = "after_boundary"
                return start + idx + len(delim) - held
            events.append(PartData(joined[:held]))
        idx = data.find(delim, start, end)
        if idx >= 0:
            if idx > start:
                events.append(PartData(memoryview(data)[start:idx]))
            events.append(PartEnd())
            self._state = "after_boundary"
            return idx + len(delim)
        cut = end - keep  # a boundary may begin in the last `keep` bytes: hold them back
        events.append(PartData(memoryview(data)[start:cut]))
        self._buf += memoryview(data)[cut:end]
        return end

    def _parse_buffered(self, events: list[Event]) -> None:
        """Advance over what is in the own buffer as far as it goes: each state's step
        consumes what it can of the buffer and says whether parsing can go on."""
        while _STEPS[self._state](self, events):
            pass

    def _preamble(self, events: list[Event]) -> bool:
        idx = self._buf.find(self._delim)
        if idx < 0:
            keep = len(self._delim) - 1
            if len(self._buf) > keep:
                del self._buf[: len(self._buf) - keep]
            return False
        del self._buf[: idx + len(self._delim)]
        self._state = "after_boundary"
        return True

    def _after_boundary(self, events: list[Event]) -> bool:
        if len(self._buf) < 2:
            return False
        if self._buf[:2] == b"--":
            self._state = "epilogue"
            self.done = True
            self._buf.clear()
            return False
        # optional transport padding, then CRLF
        idx = self._buf.find(b"\r\n")
        if idx < 0:
            if len(self._buf) > 256:
                raise MultipartError("garbage after boundary")
            return False
        del self._buf[: idx + 2]
        self._state = "headers"
        return True

    def _headers(self, events: list[Event]) -> bool:
        idx = self._buf.find(b"\r\n\r\n")
        if idx < 0:
            if self._buf[:2] == b"\r\n":  # a part with no headers at all
                del self._buf[:2]
                events.append(PartStart({}))
                self._state = "body"
                return True
            if len(self._buf) > MAX_PART_HEAD:
                raise MultipartError("part headers too large")
            return False
        head = bytes(self._buf[:idx]).decode("utf-8", "replace")
        del self._buf[: idx + 4]
        headers: dict[str, str] = {}
        for line in head.split("\r\n"):
            k, sep, v = line.partition(":")
            if sep:
                headers[k.strip().lower()] = v.strip()
        events.append(PartStart(headers))
        self._state = "body"
        return True

    def _buffered_body(self, events: list[Event]) -> bool:
        """Part data that went through the own buffer (a short piece, or held-back bytes)."""
        idx = self._buf.find(self._delim)
        if idx < 0:
            keep = len(self._delim) - 1
            if len(self._buf) > keep:
                events.append(PartData(self._take(len(self._buf) - keep)))
            return False
        if idx:
            events.append(PartData(self._take(idx)))
        events.append(PartEnd())
        del self._buf[: len(self._delim)]
        self._state = "after_boundary"
        return True

    def _epilogue(self, events: list[Event]) -> bool:
        self._buf.clear()
        return False


#: The parser's step in each state of `MultipartParser._state`.
_STEPS: dict[str, Callable[[MultipartParser, list[Event]], bool]] = {
    "preamble": MultipartParser._preamble,
    "after_boundary": MultipartParser._after_boundary,
    "headers": MultipartParser._headers,
    "body": MultipartParser._buffered_body,
    "epilogue": MultipartParser._epilogue,
}

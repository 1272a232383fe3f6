"""Just enough ELF64 reading to check the two binaries the guest boots with.

QEMU boots the kernel through its PVH entry, which exists only if the ELF carries the
XEN_ELFNOTE_PHYS32_ENTRY note; the initramfs runs busybox before any libc is mounted, so it
must be static. Both are cheap header checks, done here without readelf.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

ELF_MAGIC = b"\x7fELF"
EM_X86_64 = 62
PT_LOAD = 1
PT_DYNAMIC = 2
DT_NULL, DT_NEEDED, DT_STRTAB = 0, 1, 5
PT_INTERP = 3
PT_NOTE = 4
XEN_ELFNOTE_PHYS32_ENTRY = 0x12


@dataclass(frozen=True)
class Segment:
    """One program header: its type, where its bytes live in the file and in memory."""

    type: int
    offset: int
    filesz: int
    vaddr: int = 0


@dataclass(frozen=True)
class Note:
    """One ELF note (name without the trailing NUL)."""

    name: bytes
    type: int
    desc: bytes


class ElfFormatError(ValueError):
    """The bytes are not a little-endian x86-64 ELF64 file we can read."""


def segments(data: bytes) -> list[Segment]:
    """Program headers of a little-endian x86-64 ELF64 image."""
    if len(data) < 64 or data[:4] != ELF_MAGIC:
        raise ElfFormatError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ElfFormatError("not a little-endian ELF64 file")
    (machine,) = struct.unpack_from("<H", data, 0x12)
    if machine != EM_X86_64:
        raise ElfFormatError(f"ELF machine {machine} is not x86-64")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    if phentsize < 56 or phoff + phentsize * phnum > len(data):
        raise ElfFormatError("truncated program headers")
    out = []
    for i in range(phnum):
        base = phoff + i * phentsize
        (ptype,) = struct.unpack_from("<I", data, base)
        offset, vaddr, _paddr, filesz = struct.unpack_from("<QQQQ", data, base + 8)
        out.append(Segment(ptype, offset, filesz, vaddr))
    return out


def notes(data: bytes) -> Iterator[Note]:
    """Every note in every PT_NOTE segment (the place QEMU's PVH loader looks)."""
    for seg in segments(data):
        if seg.type != PT_NOTE:
            continue
        pos, end = seg.offset, min(seg.offset + seg.filesz, len(data))
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            pos += 12
            name = data[pos : pos + namesz].rstrip(b"\0")
            pos += (namesz + 3) & ~3
            desc = data[pos : pos + descsz]
            pos += (descsz + 3) & ~3
            yield Note(name, ntype, desc)


def section(data: bytes, name: str) -> bytes | None:
    """Contents of the named section (e.g. `.modinfo` of a kernel module), if present."""
    if len(data) < 64 or data[:4] != ELF_MAGIC or data[4] != 2 or data[5] != 1:
        raise ElfFormatError("not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shnum == 0 or shentsize < 64 or shoff + shentsize * shnum > len(data):
        raise ElfFormatError("truncated section headers")

    def header(i: int) -> tuple[int, int, int]:
        base = shoff + i * shentsize
        (name_off,) = struct.unpack_from("<I", data, base)
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name_off, offset, size

    _, str_off, str_size = header(shstrndx)
    strtab = data[str_off : str_off + str_size]
    wanted = name.encode()
    for i in range(shnum):
        name_off, offset, size = header(i)
        end = strtab.find(b"\0", name_off)
        if strtab[name_off:end] == wanted:
            return data[offset : offset + size]
    return None


def modinfo(data: bytes) -> dict[str, str]:
    """The `key=value` strings of a kernel module's `.modinfo` section (last one wins)."""
    raw = section(data, ".modinfo") or b""
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def has_pvh_entry(data: bytes) -> bool:
    """True if the kernel ELF can be booted through PVH (QEMU `-kernel vmlinux`)."""
    return any(n.name == b"Xen" and n.type == XEN_ELFNOTE_PHYS32_ENTRY for n in notes(data))


def is_static(data: bytes) -> bool:
    """True if the executable needs no program interpreter (no dynamic loader, no libc)."""
    return all(seg.type != PT_INTERP for seg in segments(data))


def needed(data: bytes) -> list[str]:
    """The shared libraries a dynamically linked ELF names (DT_NEEDED), in order: what the
    envd runtime must carry beside the interpreter (read, never run: no ldd on the host)."""
    segs = segments(data)
    dynamic = next((s for s in segs if s.type == PT_DYNAMIC), None)
    if dynamic is None:
        return []
    entries: list[tuple[int, int]] = []
    for pos in range(dynamic.offset, dynamic.offset + dynamic.filesz, 16):
        tag, value = struct.unpack_from("<qQ", data, pos)
        if tag == DT_NULL:
            break
        entries.append((tag, value))
    strtab = next((v for t, v in entries if t == DT_STRTAB), None)
    if strtab is None:
        raise ElfFormatError("dynamic section without a string table")
    load = next(
        (s for s in segs if s.type == PT_LOAD and s.vaddr <= strtab < s.vaddr + s.filesz), None
    )
    if load is None:
        raise ElfFormatError("string table outside every loaded segment")
    base = strtab - load.vaddr + load.offset
    names = []
    for tag, value in entries:
        if tag == DT_NEEDED:
            end = data.index(b"\0", base + value)
            names.append(data[base + value : end].decode())
    return names

"""The shared libraries an ELF binary names (its ``DT_NEEDED`` entries), read from the file: no process.

The importer asks this before it imports a built module into a process that has not imported torch:
a module linked against torch's libraries (``libc10.so``, ``libtorch*.so``) finds them only once torch's
import has loaded them (the binary carries no path to them, so that it stays the same file wherever
torch lies), so torch is imported first; a module that needs none of them is imported as it is. Reading
the dynamic section is a few small reads (tens of µs), whatever the binary's size.
"""

from __future__ import annotations

import struct

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_STRSZ = 0, 1, 5, 10
#: Per ELF class (1: 32-bit, 2: 64-bit): the header's (e_phoff, e_phentsize, e_phnum) layout and offset,
#: a program header's (p_type, p_offset, p_vaddr, p_filesz) fields and one dynamic entry's shape.
_LAYOUTS = {
    1: ("I", 0x1C, "H", 0x2A, "IIII", (0, 1, 2, 4), "iI"),
    2: ("Q", 0x20, "H", 0x36, "IIQQQQ", (0, 2, 3, 5), "qQ"),
}


class _NotElf(Exception):
    pass


def needed(path: str) -> tuple[str, ...] | None:
    """The libraries ``path`` names as ``DT_NEEDED``, in order; None when it is no ELF file this can read.

    >>> import sys
    >>> "libc.so.6" in (needed(sys.executable) or ("libc.so.6",))
    True
    >>> needed(__file__) is None
    True
    """
    try:
        with open(path, "rb") as f:
            return _read(f)
    except (OSError, struct.error, _NotElf, ValueError, IndexError):
        return None


def _read(f) -> tuple[str, ...]:
    ident = f.read(16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[4] not in _LAYOUTS or ident[5] not in (1, 2):
        raise _NotElf
    end = "<" if ident[5] == 1 else ">"
    off_t, off_at, half, phent_at, ph_fmt, ph_fields, dyn_fmt = _LAYOUTS[ident[4]]
    f.seek(off_at)
    (phoff,) = struct.unpack(end + off_t, f.read(struct.calcsize(off_t)))
    f.seek(phent_at)
    phentsize, phnum = struct.unpack(end + half + half, f.read(4))
    f.seek(phoff)
    table = f.read(phentsize * phnum)
    loads, dynamic = [], None
    for i in range(phnum):
        raw = struct.unpack_from(end + ph_fmt, table, i * phentsize)
        p_type, p_offset, p_vaddr, p_filesz = (raw[j] for j in ph_fields)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return ()  # a static binary
    f.seek(dynamic[0])
    body = f.read(dynamic[1])
    size = struct.calcsize(dyn_fmt)
    wanted, strtab, strsz = [], None, None
    for i in range(len(body) // size):
        tag, value = struct.unpack_from(end + dyn_fmt, body, i * size)
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            wanted.append(value)
        elif tag == _DT_STRTAB:
            strtab = value
        elif tag == _DT_STRSZ:
            strsz = value
    if not wanted:
        return ()
    if strtab is None or strsz is None:
        raise _NotElf
    at = next((off + strtab - vaddr for vaddr, off, filesz in loads if vaddr <= strtab < vaddr + filesz), None)
    if at is None:
        raise _NotElf
    f.seek(at)
    strings = f.read(strsz)
    return tuple(strings[i:strings.index(b"\0", i)].decode("utf-8", "replace") for i in wanted)


TORCH_LIBRARIES = ("libc10", "libtorch")
"""The prefixes of the libraries torch's import loads (``libc10.so``, ``libc10_cuda.so``, ``libtorch_cpu.so``, ...)."""


def needs_torch(path: str) -> bool:
    """Does the binary at ``path`` name one of torch's libraries? True also when it can't be read as
    ELF (another platform's format): then torch is imported first, as torch's own ``load()`` has it."""
    names = needed(path)
    return names is None or any(n.startswith(TORCH_LIBRARIES) for n in names)


__all__ = ["TORCH_LIBRARIES", "needed", "needs_torch"]

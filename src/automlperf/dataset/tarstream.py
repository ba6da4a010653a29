"""One sequential pass over a tar file: every byte read once, in large chunks, its MD5 taken
on the way, and the members found where their headers lie, tars inside the tar included (the
training archive holds one tar per class), each with the offset of its data in the outer file.

The MD5 runs in a thread beside the parser: hashlib releases the interpreter lock on large
buffers, so reading and parsing headers overlap with hashing, which is the pass's cost (one
stream, one core: ``bench/RESULTS.md``, "ImageNet read from its archives"). The parser
reads ustar, GNU (long names) and pax headers; it never seeks, so the file is read once from
start to end, as a hashed stream must be. No torch here.
"""

from __future__ import annotations

import hashlib
import os
import queue
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from automlperf.dataset.index import DatasetIdentityError

BLOCK = 512
CHUNK = 8 << 20  # bytes read at once: large enough that a read costs nothing beside its bytes
ZERO = bytes(BLOCK)
_SUMMED = struct.Struct("148B8x356B")  # the header's bytes but its checksum field


class ArchiveError(DatasetIdentityError):
    """A file that is not the tar it should be; the message names the file and the byte."""


@dataclass(frozen=True)
class Member:
    """A regular file of a tar: its name and where its data lies in the outer file."""

    name: str
    offset: int
    size: int


class HashedStream:
    """``path`` read once, start to end, in chunks whose MD5 a thread takes; the parser asks
    for bytes at offsets that never go back (:meth:`get`), and what it skips is read (and
    hashed) all the same. :meth:`finish` reads the rest and gives the MD5."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd, self.name = fd, name
        self.size = os.fstat(fd).st_size
        self.buf, self.start = b"", 0  # the bytes held, and the offset of their first
        self.read_bytes = 0
        self.md5 = hashlib.md5()
        self._chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self._hasher = threading.Thread(target=self._hash, name="automlperf-md5", daemon=True)
        self._hasher.start()
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (OSError, AttributeError):
            pass  # advice only

    def _hash(self) -> None:
        while (chunk := self._chunks.get()) is not None:
            self.md5.update(chunk)

    def _read(self) -> bytes:
        chunk = os.read(self.fd, CHUNK)
        if chunk:
            self.read_bytes += len(chunk)
            self._chunks.put(chunk)
        return chunk

    def get(self, offset: int, n: int) -> bytes:
        """The ``n`` bytes at ``offset`` (fewer at the end of the file)."""
        if offset < self.start:
            raise AssertionError(f"{self.name}: the pass went back to byte {offset:,}")
        while offset >= self.start + len(self.buf):  # skipped: read through, hashed
            self.start += len(self.buf)
            self.buf = self._read()
            if not self.buf:
                return b""
        lo = offset - self.start
        while lo + n > len(self.buf):
            chunk = self._read()
            if not chunk:
                break
            self.buf = self.buf[lo:] + chunk
            self.start += lo
            lo = 0
        return self.buf[lo:lo + n]

    def finish(self) -> str:
        """Read what is left (the end-of-archive blocks and the padding count too) and
        return the file's MD5."""
        while self._read():
            pass
        self._chunks.put(None)
        self._hasher.join()
        return self.md5.hexdigest()

    def abandon(self) -> None:
        """Stop the hashing thread without reading on (the pass failed)."""
        self._chunks.put(None)
        self._hasher.join()


def _number(field: bytes, where: str) -> int:
    """A header's number: octal digits, or base-256 (GNU) for large ones."""
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * (len(field) - 1))) if field[:1] == b"\xff" else value
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ArchiveError(f"{where}: not a tar header (a number field holds {field!r})") from None


def _pax(data: bytes) -> dict[str, str]:
    """The records of a pax extended header (``<length> <key>=<value>\\n``)."""
    out, at = {}, 0
    while at < len(data):
        space = data.find(b" ", at)
        if space < 0:
            break
        length = int(data[at:space])
        key, _, value = data[space + 1:at + length - 1].partition(b"=")
        out[key.decode()] = value.decode("utf-8", "replace")
        at += length
    return out


def members(stream: HashedStream, start: int = 0, end: int | None = None) -> Iterator[Member]:
    """The regular files of the tar that begins at ``start`` of the stream (and ends by
    ``end``, for a tar inside a tar), in the order they lie."""
    pos = start
    long_name: str | None = None
    pax: dict[str, str] = {}
    while end is None or pos + BLOCK <= end:
        header = stream.get(pos, BLOCK)
        if len(header) < BLOCK:
            if end is None and not header:
                return  # a tar without its end-of-archive blocks
            raise ArchiveError(f"{stream.name}: ends inside a tar header at byte {pos:,}: the "
                               "file is truncated")
        if header == ZERO:
            return
        where = f"{stream.name} at byte {pos:,}"
        if sum(_SUMMED.unpack(header)) + 8 * 32 != _number(header[148:156], where):
            raise ArchiveError(f"{where}: not a tar header (its checksum does not match): the "
                               "file is not a tar archive, or it is damaged")
        size = _number(header[124:136], where)
        kind = header[156:157]
        data = pos + BLOCK
        if kind == b"L":
            long_name = stream.get(data, size).split(b"\0", 1)[0].decode("utf-8", "replace")
        elif kind in (b"x", b"g"):
            if kind == b"x":
                pax = _pax(stream.get(data, size))
        else:
            name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
            if header[257:262] == b"ustar":
                prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
                if prefix:
                    name = f"{prefix}/{name}"
            name = pax.get("path") or long_name or name
            size = int(pax["size"]) if "size" in pax else size
            if kind in (b"0", b"\0", b"7"):
                if data + size > (stream.size if end is None else end):
                    raise ArchiveError(f"{where}: {name} runs past the end of the "
                                       f"{'file' if end is None else 'tar that holds it'}: the "
                                       "file is truncated or damaged")
                yield Member(name, data, size)
            long_name, pax = None, {}
        pos = data + -(-size // BLOCK) * BLOCK

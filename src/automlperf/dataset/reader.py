"""Reading an image's bytes by its row of the index: what every loader reads through (the
CPU workers, the GPU path's host stage, DALI's external source, and so the validation cache).

* A folder's image is its own file: opened, read and closed per image.
* An archive's image lies at a fixed offset in its archive: one ``pread`` from a descriptor
  the process opened once, when the reader was made (a rank, before it forks its decoding
  workers, which share the descriptor: ``pread`` moves no shared file position). Opening
  holds the archive to the identity the run proved (dataset/proof.py): a replaced archive is
  refused before a byte of it is read.

No torch here.
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO, Protocol

from automlperf.dataset.index import ARCHIVES, FileIndex
from automlperf.dataset.proof import check_identity


class Opened(Protocol):
    """One image, ready to be read: its size, and its bytes read into a buffer or returned."""

    size: int

    def readinto(self, into: memoryview) -> int: ...

    def read(self) -> bytes: ...

    def close(self) -> None: ...


class Reader(Protocol):
    index: FileIndex

    def name(self, row: int) -> str:
        """Where the image is, in words (for a message naming it)."""

    def image(self, row: int) -> str | BinaryIO:
        """What Pillow opens: a path, or the bytes. Raises OSError."""

    def read(self, row: int) -> bytes:
        """The image's bytes. Raises OSError."""

    def open(self, row: int) -> Opened:
        """The image ready to be read, its reading asked of the storage ahead (a chunk's
        images are opened first and read after). Raises OSError."""

    def head(self, row: int, n: int) -> tuple[bytes, int]:
        """The image's first ``n`` bytes (its header, for a count of the file mix) and its
        size. Raises OSError."""


class _File:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except (OSError, AttributeError):
            pass  # advice only
        self.size = os.fstat(self.fd).st_size

    def readinto(self, into: memoryview) -> int:
        got = 0
        while got < len(into):
            n = os.readv(self.fd, [into[got:]])
            if n == 0:
                break  # it shrank
            got += n
        return got

    def read(self) -> bytes:
        return os.read(self.fd, self.size) if self.size else b""

    def close(self) -> None:
        os.close(self.fd)


class FolderReader:
    """Images that are files of a folder."""

    def __init__(self, index: FileIndex) -> None:
        self.index = index

    def name(self, row: int) -> str:
        return self.index.path(row)

    def image(self, row: int) -> str | BinaryIO:
        return self.index.path(row)

    def read(self, row: int) -> bytes:
        with open(self.index.path(row), "rb") as f:
            return f.read()

    def open(self, row: int) -> Opened:
        return _File(self.index.path(row))

    def head(self, row: int, n: int) -> tuple[bytes, int]:
        fd = os.open(self.index.path(row), os.O_RDONLY)
        try:
            return os.pread(fd, n, 0), os.fstat(fd).st_size
        finally:
            os.close(fd)


class _Member:
    def __init__(self, fd: int, at: int, size: int) -> None:
        self.fd, self.at, self.size = fd, at, size
        try:
            os.posix_fadvise(fd, at, size, os.POSIX_FADV_WILLNEED)
        except (OSError, AttributeError):
            pass

    def readinto(self, into: memoryview) -> int:
        return os.preadv(self.fd, [into[:self.size]], self.at)

    def read(self) -> bytes:
        return os.pread(self.fd, self.size, self.at)

    def close(self) -> None:
        return None


class ArchiveReader:
    """Images that lie inside archives: each archive opened once, here, and held to the
    identity the index records of it."""

    def __init__(self, index: FileIndex) -> None:
        assert index.at is not None and index.sizes is not None
        self.index = index
        self.at, self.sizes = index.at, index.sizes
        self.fds: dict[str, int] = {}
        try:
            for split in ("train", "val"):
                if split not in index.archives or not len(index.rows(split)):
                    continue
                path = index.archive_path(split)
                fd = os.open(path, os.O_RDONLY)
                self.fds[split] = fd
                expected = index.identities.get(split)
                if expected:
                    check_identity(path, expected, os.fstat(fd))
        except BaseException:
            self.close()
            raise
        self._train_fd = self.fds.get("train", -1)
        self._val_fd = self.fds.get("val", -1)

    def _fd(self, row: int) -> int:
        return self._train_fd if row < self.index.train_size else self._val_fd

    def name(self, row: int) -> str:
        return self.index.where(row)

    def image(self, row: int) -> str | BinaryIO:
        return io.BytesIO(self.read(row))

    def read(self, row: int) -> bytes:
        size = int(self.sizes[row])
        data = os.pread(self._fd(row), size, int(self.at[row]))
        if len(data) != size:
            raise OSError(f"{len(data):,} of its {size:,} bytes could be read: the archive "
                          "is shorter than when it was indexed")
        return data

    def open(self, row: int) -> Opened:
        return _Member(self._fd(row), int(self.at[row]), int(self.sizes[row]))

    def head(self, row: int, n: int) -> tuple[bytes, int]:
        size = int(self.sizes[row])
        return os.pread(self._fd(row), min(n, size), int(self.at[row])), size

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def reader_for(index: FileIndex) -> FolderReader | ArchiveReader:
    """The reader of an index's source, in this process."""
    return ArchiveReader(index) if index.source == ARCHIVES else FolderReader(index)

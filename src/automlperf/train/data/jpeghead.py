"""What a JPEG file's header says, read from its bytes without decoding it: whether it is a
JPEG at all, its size, its components and sample precision, its coding (baseline,
progressive, lossless, arithmetic) and its EXIF orientation. The GPU decoding path routes by
it: files a GPU decoder would refuse, or decode as another function (rotated by their EXIF
orientation, which the reference does not apply), go to the CPU path before any GPU call.

Nothing here imports torch or Pillow.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SOI = b"\xff\xd8"
# Start-of-frame markers by coding: baseline and extended sequential Huffman, progressive,
# lossless; C8, CC are not frames (JPG extension, arithmetic conditioning).
_SOF = {0xC0: "baseline", 0xC1: "sequential", 0xC2: "progressive", 0xC3: "lossless",
        0xC5: "differential", 0xC6: "differential", 0xC7: "differential",
        0xC9: "arithmetic", 0xCA: "arithmetic", 0xCB: "arithmetic",
        0xCD: "arithmetic", 0xCE: "arithmetic", 0xCF: "arithmetic"}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM, RSTn: no length field


@dataclass(frozen=True)
class JpegHeader:
    width: int
    height: int
    components: int  # 1 greyscale, 3 YCbCr (or RGB), 4 CMYK/YCCK
    precision: int  # bits per sample
    coding: str  # baseline, sequential, progressive, lossless, differential, arithmetic
    orientation: int  # EXIF orientation, 1 (as stored) where absent

    def gpu_refusal(self, max_pixels: int) -> str:
        """Why a GPU decoder should not take this file (empty: it may)."""
        if self.components not in (1, 3):
            return f"{self.components} colour components (CMYK or YCCK)"
        if self.precision != 8:
            return f"{self.precision}-bit samples"
        if self.coding not in ("baseline", "sequential", "progressive"):
            return f"{self.coding} coding"
        if self.orientation != 1:
            return f"EXIF orientation {self.orientation} (the reference does not rotate)"
        if self.width * self.height > max_pixels:
            return f"{self.width}x{self.height} pixels"
        return ""


def parse(data: bytes | memoryview) -> JpegHeader | None:
    """The header of a JPEG file's bytes (a memoryview of them is read without a copy); None
    for anything else (another format, a file cut before its frame header)."""
    if bytes(data[:2]) != SOI:
        return None
    pos, n = 2, len(data)
    orientation = 1
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2:pos + 4])
        if length < 2:
            return None
        segment = data[pos + 4:pos + 2 + length]
        if marker == 0xE1 and bytes(segment[:6]) == b"Exif\x00\x00":
            orientation = _exif_orientation(segment[6:]) or orientation
        elif marker in _SOF:
            if len(segment) < 6:
                return None
            precision, height, width, components = struct.unpack(">BHHB", segment[:6])
            if not width or not height:
                return None
            return JpegHeader(width, height, components, precision, _SOF[marker], orientation)
        elif marker == 0xDA:  # scan data before any frame header
            return None
        pos += 2 + length
    return None


def _exif_orientation(tiff: bytes | memoryview) -> int | None:
    """The Orientation tag (0x0112) of IFD0 in an EXIF block's TIFF structure."""
    if len(tiff) < 8 or bytes(tiff[:2]) not in (b"II", b"MM"):
        return None
    order = "<" if bytes(tiff[:2]) == b"II" else ">"
    (ifd,) = struct.unpack(order + "I", tiff[4:8])
    if ifd + 2 > len(tiff):
        return None
    (count,) = struct.unpack(order + "H", tiff[ifd:ifd + 2])
    for i in range(count):
        entry = ifd + 2 + 12 * i
        if entry + 12 > len(tiff):
            return None
        tag, kind = struct.unpack(order + "HH", tiff[entry:entry + 4])
        if tag == 0x0112 and kind == 3:
            (value,) = struct.unpack(order + "H", tiff[entry + 8:entry + 10])
            return value if 1 <= value <= 8 else None
    return None


class FileMix:
    """Tallies of a dataset's files by what decides how each decode path treats them, one
    file at a time (:meth:`add_bytes`: its first bytes, at least up to its frame header; or
    :meth:`add` with a header already parsed), so any pass that reads the files (a folder's,
    an archive's) can count as it goes; :meth:`merge` adds another pass's tallies.

    Kinds overlap (a progressive greyscale file is both): ``progressive``, ``greyscale``,
    ``cmyk`` (4 components), ``rotated`` (an EXIF orientation), ``large_file`` (more bytes than
    ``place_bytes``, a GPU ring place's own room), ``large_image`` (over ``max_pixels``),
    ``other_coding`` (12-bit, lossless, arithmetic) and ``not_jpeg``. Each file also takes one
    route on the GPU path (train/data/gpuring.py's, before its box is drawn): ``batched`` in
    the decoder's one call a step, ``one_by_one`` (progressive: nvJPEG's per-image path on the
    rank's decode thread), or ``cpu_reference`` (decoded by Pillow in the workers: refused by
    their header, or larger than ``chunk_room``, the most a chunk's first place can hold).
    The CPU path decodes every file with Pillow."""

    KINDS = ("progressive", "greyscale", "cmyk", "rotated", "large_file", "large_image",
             "other_coding", "not_jpeg")
    ROUTES = ("batched", "one_by_one", "cpu_reference")

    def __init__(self, max_pixels: int, place_bytes: int, chunk_room: int) -> None:
        self.max_pixels, self.place_bytes, self.chunk_room = max_pixels, place_bytes, chunk_room
        self.files = 0
        self.bytes = 0
        self.kinds = dict.fromkeys(self.KINDS, 0)
        self.routes = dict.fromkeys(self.ROUTES, 0)

    def add_bytes(self, data: bytes | memoryview, size: int | None = None) -> JpegHeader | None:
        """Count a file from its bytes (``size``: the whole file's, where ``data`` is only
        its start); its header, or None where it is no JPEG."""
        head = parse(data)
        self.add(head, len(data) if size is None else size)
        return head

    def add(self, head: JpegHeader | None, size: int) -> None:
        """Count a file of ``size`` bytes whose header is ``head`` (None: no JPEG)."""
        self.files += 1
        self.bytes += size
        kinds = self.kinds
        if size > self.place_bytes:
            kinds["large_file"] += 1
        if head is None:
            kinds["not_jpeg"] += 1
            self.routes["cpu_reference"] += 1
            return
        kinds["progressive"] += head.coding == "progressive"
        kinds["greyscale"] += head.components == 1
        kinds["cmyk"] += head.components == 4
        kinds["rotated"] += head.orientation != 1
        kinds["large_image"] += head.width * head.height > self.max_pixels
        kinds["other_coding"] += (head.precision != 8
                                  or head.coding not in ("baseline", "sequential", "progressive"))
        if head.gpu_refusal(self.max_pixels) or size > self.chunk_room:
            self.routes["cpu_reference"] += 1
        elif head.coding == "progressive":
            self.routes["one_by_one"] += 1
        else:
            self.routes["batched"] += 1

    def merge(self, other: FileMix) -> None:
        self.files += other.files
        self.bytes += other.bytes
        for k in self.KINDS:
            self.kinds[k] += other.kinds[k]
        for k in self.ROUTES:
            self.routes[k] += other.routes[k]

    def to_dict(self) -> dict[str, object]:
        """The tallies, and each as a share of the files counted."""
        n = max(1, self.files)
        return {"files": self.files, "mean_bytes": self.bytes / n, "kinds": dict(self.kinds),
                "shares": {k: v / n for k, v in self.kinds.items()},
                "gpu_path": {k: v / n for k, v in self.routes.items()},
                "gpu_routes": dict(self.routes),
                "limits": {"max_pixels": self.max_pixels, "place_bytes": self.place_bytes,
                           "chunk_room": self.chunk_room}}

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

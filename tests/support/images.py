"""Images made in the test with Pillow, as requests carry them: encoded bytes, base64, data: URLs."""

from __future__ import annotations

import base64
import io
import struct
import zlib

from PIL import Image


def picture(size: tuple[int, int] = (32, 24), seed: int = 0) -> Image.Image:
    """A small RGB picture whose pixels depend on `seed`."""
    width, height = size
    image = Image.new("RGB", size)
    image.putdata(
        [((x * 7 + seed) % 256, (y * 11 + seed) % 256, (x + y + seed) % 256) for y in range(height) for x in range(width)]
    )
    return image


def encoded(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"


def png_bomb(width: int = 50_000, height: int = 50_000) -> bytes:
    """A PNG whose header declares width × height 8-bit grey pixels (2.5 gigapixels by default)
    over a few bytes of data: decoded, it would take that much memory; only its header may be read."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\0" * (width + 1) * 4, 9)  # a few rows: a real bomb's rest compresses as well
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")

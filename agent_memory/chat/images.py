"""Images in a request, whatever its wire format: where each one is (`ImageSource`, read from
the body), then decoded and checked (`ChatImage`), each refusal a 400 naming the part.

What is accepted: PNG, JPEG, WebP and GIF (one frame), as a `data:` URL or base64 (always),
or an http(s) URL fetched by the server only where the operator allows it (`--image-urls`: a
server that fetches URLs is a way into the operator's network), within a size and a time
limit. A local path (`file:`, `/…`) is never read, and a `file_id` is refused: there is no
files API. The limits (`ImageLimits`) are settings: images per request, bytes per image,
pixels per image; a decompression bomb is refused from its header, before its pixels are
decoded. The image is kept in memory only, never written anywhere.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import warnings
from dataclasses import dataclass

import httpx
from PIL import Image, ImageOps

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")  # as OpenAI's and Anthropic's APIs take them
MEDIA_TYPES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/jpg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}
NO_FILES = "there is no files API on this server: send the image itself (base64 or a data: URL)"
MAX_REDIRECTS = 3


class ImageError(ValueError):
    """An image this server cannot take: a 400 naming `where` (the part's path in the body)."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclass(frozen=True)
class ImageLimits:
    """The operator's limits (config.py's settings of the same names)."""

    max_images: int = 16  # per request, the whole conversation's
    max_image_bytes: int = 10 << 20  # one image as sent (decoded from base64, or fetched)
    max_image_pixels: int = 1 << 25  # width × height, read from the header before decoding
    fetch_urls: bool = False  # http(s) image URLs fetched by the server
    fetch_seconds: float = 10.0  # the whole fetch of one URL

    def described(self) -> dict:
        """As /v1/models shows them."""
        return {
            "max_images": self.max_images,
            "max_image_bytes": self.max_image_bytes,
            "max_image_pixels": self.max_image_pixels,
            "urls": self.fetch_urls,
        }


@dataclass(frozen=True)
class ImageSource:
    """An image part as read from the body, not yet decoded: its bytes, or an http(s) URL."""

    where: str  # its path in the body: messages.2.content.1, input.0.content.1, ...
    data: bytes | None = None
    url: str | None = None


@dataclass(frozen=True, eq=False)
class ChatImage:
    """A decoded image: RGB pixels, upright (EXIF orientation applied, as transformers'
    `load_image` does), transparency over white (as transformers' `convert_to_rgb`).

    `digest` is the SHA-256 of the mode, the size and the pixels, not of the bytes as sent: it
    names what the model sees, so the same picture sent as PNG, or re-saved with other
    metadata or compression, or as lossless WebP, is the same image and shares KV, while a
    JPEG of it (other pixels) is another. It is the image's part of a block's identity
    (memory/hashing.py `SpanKey`); nothing else of the image is kept past the request."""

    digest: str
    image: Image.Image
    where: str

    @classmethod
    def of(cls, image: Image.Image, where: str) -> ChatImage:
        h = hashlib.sha256(f"{image.mode} {image.width}x{image.height}\n".encode())
        h.update(image.tobytes())
        return cls(h.hexdigest(), image, where)


def source_of_url(url: object, where: str) -> ImageSource:
    """A URL part: a data: URL decoded here; an http(s) URL kept for `fetch`; anything else
    (a local path, file:, ftp:) refused."""
    if not isinstance(url, str) or not url:
        raise ImageError("an image needs a URL: a data: URL, or http(s) where the server allows it", where)
    if url.startswith("data:"):
        header, comma, payload = url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise ImageError("a data: URL of an image is data:<media type>;base64,<data>", where)
        return source_of_base64(header[5:].removesuffix(";base64"), payload, where)
    if url.startswith(("http://", "https://")):
        return ImageSource(where, url=url)
    raise ImageError("an image URL is a data: URL or http(s); local paths and other schemes are never read", where)


def source_of_base64(media_type: object, data: object, where: str) -> ImageSource:
    """Base64 image data with its declared media type (Anthropic's `source`, a data: URL)."""
    if not isinstance(media_type, str) or media_type.lower() not in MEDIA_TYPES:
        raise ImageError(f"media type {media_type!r} is not one this server takes: {', '.join(MEDIA_TYPES)}", where)
    if not isinstance(data, str) or not data:
        raise ImageError("the image's base64 data is empty", where)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image's data is not valid base64", where) from None
    return ImageSource(where, data=raw)


async def load(sources: list[ImageSource | ChatImage], limits: ImageLimits) -> list[ChatImage]:
    """Every image of a request, fetched where allowed and decoded off the event loop, in order;
    one already loaded (in the stored chain a Responses request continues) as it is."""
    if len(sources) > limits.max_images:
        where = sources[limits.max_images].where
        raise ImageError(f"a request takes at most {limits.max_images} images, this one has {len(sources)}", where)
    out = []
    for source in sources:
        if isinstance(source, ChatImage):
            out.append(source)
            continue
        data = source.data if source.url is None else await fetch(source, limits)
        out.append(await asyncio.to_thread(decode, data, source.where, limits))
    return out


async def fetch(source: ImageSource, limits: ImageLimits) -> bytes:
    """An http(s) image, where the operator allows it: at most max_image_bytes, within fetch_seconds."""
    where = source.where
    if not limits.fetch_urls:
        raise ImageError("this server does not fetch image URLs (the operator's --image-urls); send a data: URL", where)
    try:
        async with asyncio.timeout(limits.fetch_seconds):
            async with httpx.AsyncClient(follow_redirects=True, max_redirects=MAX_REDIRECTS) as client:
                async with client.stream("GET", source.url) as r:
                    if r.status_code != 200:
                        raise ImageError(f"fetching the image URL answered {r.status_code}", where)
                    data = bytearray()
                    async for chunk in r.aiter_bytes():
                        data += chunk
                        if len(data) > limits.max_image_bytes:
                            raise ImageError(_too_large(limits), where)
                    return bytes(data)
    except TimeoutError:
        raise ImageError(f"fetching the image URL took longer than {limits.fetch_seconds:g} s", where) from None
    except httpx.HTTPError as e:
        raise ImageError(f"the image URL could not be fetched ({type(e).__name__})", where) from None


def _too_large(limits: ImageLimits) -> str:
    return f"an image is at most {limits.max_image_bytes} bytes (the operator's --max-image-mb)"


def decode(data: bytes, where: str, limits: ImageLimits) -> ChatImage:
    """The image's pixels, once its header says it is of a taken format and within the limits
    (a decompression bomb is refused here, its pixels never decoded)."""
    if len(data) > limits.max_image_bytes:
        raise ImageError(_too_large(limits), where)
    over = f"over {limits.max_image_pixels} pixels (the operator's --max-image-pixels)"
    try:
        with warnings.catch_warnings():  # Pillow's own warning: the limit here is the operator's
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:  # over twice Pillow's limit (config.py keeps the operator's below it)
        raise ImageError(f"the image is {over}", where) from None
    except Image.UnidentifiedImageError:
        taken = ", ".join(FORMATS)
        raise ImageError(f"the data is not an image of a format this server takes ({taken})", where) from None
    pixels = image.width * image.height
    if pixels > limits.max_image_pixels:
        raise ImageError(f"the image is {image.width}×{image.height}, {over}", where)
    if getattr(image, "n_frames", 1) > 1:
        raise ImageError(f"an animated image ({image.n_frames} frames) is not taken: send one frame", where)
    try:
        image.load()
        return ChatImage.of(_rgb(ImageOps.exif_transpose(image)), where)
    except (OSError, ValueError, SyntaxError):  # truncated or corrupt data past the header
        why = f"the {image.format} image cannot be decoded: its data is damaged or cut short"
        raise ImageError(why, where) from None


def _rgb(image: Image.Image) -> Image.Image:
    """RGB, transparency composited over white."""
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")

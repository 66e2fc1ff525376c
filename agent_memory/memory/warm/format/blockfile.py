"""The block format: one safetensors file per block (or a Redis value of the same bytes), read with distrust.

Standard safetensors (8-byte header length, JSON header, raw tensor bytes), with metadata that
names what the file holds: format version, model fingerprint, block hash and parent, token ids,
KV precision and a CRC32 of the tensor bytes. A reader checks the header's size before reading
it and every shape, dtype and offset before reading any data, then the checksum after, so a
truncated, bit-flipped, swapped or foreign file is refused before it can cost memory.
No MLX here: the `cache` command line reads these files too.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from agent_memory import files

FORMAT = "agent-memory-kv-block"
VERSION = "1"
MAX_HEADER_BYTES = 1 << 20

# safetensors dtype -> how the bytes are held in numpy (bfloat16 travels as raw uint16).
NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32}

Tensors = dict[str, tuple[str, np.ndarray]]  # name -> (safetensors dtype, array)
Layout = dict[str, tuple[str, tuple[int, ...]]]  # name -> (safetensors dtype, shape)


def layout_bytes(layout: Layout) -> int:
    """The tensor bytes of a file of this layout."""
    return sum(math.prod(dims) * np.dtype(NUMPY_DTYPES[dtype]).itemsize for dtype, dims in layout.values())


class BlockFileError(ValueError):
    """The file is not a block this server may load; the message says why."""


def encode(meta: dict[str, str], tensors: Tensors) -> list[bytes | memoryview]:
    """The file's bytes: header and tensor data, with the data's checksum in the metadata."""
    header: dict = {}
    data, offset, crc = [], 0, 0
    for name in sorted(tensors):
        dtype, array = tensors[name]
        raw = memoryview(np.ascontiguousarray(array)).cast("B")  # no copy: written as it is
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        data.append(raw)
        crc = zlib.crc32(raw, crc)
        offset += len(raw)
    header["__metadata__"] = {**meta, "format": FORMAT, "version": VERSION, "crc32": f"{crc:08x}"}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return [struct.pack("<Q", len(head)), head, *data]


def read_header(f, size: int) -> tuple[dict[str, str], dict]:
    if size < 8:
        raise BlockFileError(f"file of {size} bytes is too short")
    (n,) = struct.unpack("<Q", f.read(8))
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise BlockFileError(f"header length {n} does not fit a file of {size} bytes")
    try:
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__")
    except (ValueError, KeyError, AttributeError, TypeError, RecursionError) as e:
        # RecursionError: deeply nested JSON; TypeError: a header that is a list, not an object.
        raise BlockFileError(f"unreadable header: {e}") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BlockFileError("not an agent-memory block file")
    if meta.get("version") != VERSION:
        raise BlockFileError(f"format version {meta.get('version')} (this server reads {VERSION})")
    return meta, header


def _is_int(x: object) -> bool:
    """A JSON integer: bools are ints in Python but never a size or an offset here."""
    return type(x) is int


def check_entries(header: dict, data_size: int, layout: Layout | None) -> list[tuple[str, str, tuple, int, int]]:
    """(name, dtype, shape, start, stop) of each tensor, after checking that the offsets tile
    the data exactly and, given a layout, that names, dtypes and shapes match it."""
    if layout is not None and set(header) != set(layout):
        raise BlockFileError(f"tensors {sorted(header)} where {sorted(layout)} are expected")
    entries = []
    for name, entry in header.items():
        try:
            dtype, shape, (start, stop) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            itemsize = np.dtype(NUMPY_DTYPES[dtype]).itemsize
        except (TypeError, KeyError, ValueError) as e:
            raise BlockFileError(f"tensor {name}: malformed entry") from e
        # Checked before any arithmetic: a float, string or negative dim would otherwise raise
        # TypeError or overflow later, or pass the size check with two negative dims.
        if not (_is_int(start) and _is_int(stop) and all(_is_int(d) and d >= 0 for d in shape)):
            raise BlockFileError(f"tensor {name}: offsets and dims must be non-negative integers")
        count = math.prod(shape)  # exact: no int64 overflow on hostile dims
        if layout is not None and (dtype, shape) != layout[name]:
            expected_dtype, expected_shape = layout[name]
            raise BlockFileError(f"tensor {name} is {dtype}{list(shape)}, expected {expected_dtype}{list(expected_shape)}")
        if stop - start != count * itemsize:
            raise BlockFileError(f"tensor {name}: offsets {start}..{stop} do not match its shape")
        entries.append((name, dtype, shape, start, stop))
    end = 0
    for name, _, _, start, stop in sorted(entries, key=lambda e: e[3]):
        if start != end:
            raise BlockFileError(f"tensor {name} starts at {start}, not {end}")
        end = stop
    if end != data_size:
        raise BlockFileError(f"tensor data is {data_size} bytes, the header describes {end}")
    return entries


def read(path: Path, expect: dict[str, str], layout: Layout | None) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """Read and check a block file: its metadata must carry every `expect` value exactly."""
    try:
        f = files.open_regular(path)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise BlockFileError("a symbolic link, not a block file") from e
        raise
    except files.NotRegularFile as e:
        raise BlockFileError(str(e)) from e
    with f:
        return _read_from(f, os.fstat(f.fileno()).st_size, expect, layout)


def read_bytes(data: bytes, expect: dict[str, str], layout: Layout | None) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """The same checks as `read`, on a block's bytes held elsewhere (the Redis warm tier)."""
    return _read_from(io.BytesIO(data), len(data), expect, layout)


def _read_from(f, size: int, expect: dict[str, str], layout: Layout | None) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """Header first (its size, then every identity field), then offsets, then the data and its CRC."""
    meta, header = read_header(f, size)
    for key, value in expect.items():
        if meta.get(key) != value:
            raise BlockFileError(f"{key} is {str(meta.get(key))[:80]!r}, expected {value[:80]!r}")
    data_size = size - f.tell()
    entries = check_entries(header, data_size, layout)
    data = f.read(data_size)
    if len(data) != data_size or f"{zlib.crc32(data):08x}" != meta.get("crc32"):
        raise BlockFileError("checksum mismatch: the tensor data is damaged")
    view = memoryview(data)
    arrays = {
        name: np.frombuffer(view[start:stop], NUMPY_DTYPES[dtype]).reshape(shape)
        for name, dtype, shape, start, stop in entries
    }
    return meta, arrays

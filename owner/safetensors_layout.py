"""Where each tensor lives inside a safetensors file, byte for byte.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and ``data_offsets`` (relative to the end of the header), then the
tensor bytes. The owner needs the absolute byte ranges to map a changed manifest chunk
onto the tensors (and rows) it touches, and to rebuild any byte range of the file from
the live weights when it verifies an in-place update. When two revisions' layouts differ,
:func:`first_difference` says how, in the words of a refusal.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

MAX_HEADER_BYTES = 64 * 1024 * 1024
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


class LayoutError(ValueError):
    """A safetensors header is malformed or describes an impossible layout."""


@dataclass(frozen=True)
class TensorSlot:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int

    @property
    def row_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype] * (self.shape[-1] if self.shape else 1)

    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) > 1 else 1


@dataclass(frozen=True)
class Layout:
    """The header bytes and the tensors of one safetensors file, in file order."""

    header: bytes  # the first ``data_start`` bytes of the file, verbatim
    tensors: tuple[TensorSlot, ...]
    size: int

    @property
    def data_start(self) -> int:
        return len(self.header)

    def by_name(self) -> dict[str, TensorSlot]:
        return {t.name: t for t in self.tensors}

    def overlapping(self, start: int, end: int) -> list[TensorSlot]:
        return [t for t in self.tensors if t.start < end and start < t.end]


def header_length(prefix: bytes) -> int:
    if len(prefix) < 8:
        raise LayoutError("file is shorter than the 8-byte safetensors header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES:
        raise LayoutError(f"safetensors header of {n} bytes is over the limit")
    return 8 + n


def parse_layout(data: bytes | memoryview, size: int) -> Layout:
    """Parse the header at the start of ``data`` for a file of ``size`` bytes."""
    data_start = header_length(bytes(data[:8]))
    if data_start > size or len(data) < data_start:
        raise LayoutError("safetensors header runs past the end of the file")
    header = bytes(data[:data_start])
    try:
        doc = json.loads(header[8:])
    except ValueError as e:
        raise LayoutError(f"safetensors header is not JSON: {e}") from None
    doc.pop("__metadata__", None)
    slots = []
    for name, info in doc.items():
        dtype, shape, (a, b) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        if dtype not in DTYPE_BYTES:
            raise LayoutError(f"tensor {name!r}: dtype {dtype} is not supported")
        if b - a != DTYPE_BYTES[dtype] * math.prod(shape) or a < 0:
            raise LayoutError(f"tensor {name!r}: offsets {a}..{b} do not match shape {shape}")
        slots.append(TensorSlot(name, dtype, shape, data_start + a, data_start + b))
    slots.sort(key=lambda t: t.start)
    pos = data_start
    for t in slots:
        if t.start != pos:
            raise LayoutError(f"tensor {t.name!r} starts at {t.start}, expected {pos} (gap or overlap)")
        pos = t.end
    if pos != size:
        raise LayoutError(f"tensors end at {pos} but the file has {size} bytes")
    return Layout(header, tuple(slots), size)


def first_difference(live: Layout, target: Layout) -> str:
    """How ``target`` differs from ``live``, first tensor first (in the live file's order)."""
    old, new = live.by_name(), target.by_name()
    for name, a in old.items():
        b = new.get(name)
        if b is None:
            return f"tensor {name} is not in the target"
        if a.dtype != b.dtype:
            return f"tensor {name} changes dtype from {a.dtype} to {b.dtype}"
        if a.shape != b.shape:
            return f"tensor {name} changes shape from {list(a.shape)} to {list(b.shape)}"
    added = [name for name in new if name not in old]
    if added:
        return f"tensor {added[0]} is new in the target"
    moved = [a.name for a in live.tensors if (a.start, a.end) != (new[a.name].start, new[a.name].end)]
    if moved:
        return f"tensor {moved[0]} moves within the file"
    return "the header's metadata changes" if live.header != target.header else "the layouts are the same"

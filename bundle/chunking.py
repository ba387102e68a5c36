"""How a file is cut into chunks, and the digests of a file read once from start to end.

Two ways, named by the word a user gives (``resident bundle build --chunking``, the
``chunking`` parameter of an ``hf://`` URI):

- ``fixed`` (the default): slices of the chunk size from byte 0. A file of at most one
  chunk has no chunk digests.
- ``tensors``: a safetensors file larger than one chunk is cut where its header ends and
  where each tensor starts and ends, so that a changed tensor is its own chunks and a
  delivery moves its bytes and not its neighbours'. Each cut also cuts at the 4 KiB
  boundaries around it, and the pieces in between are at most the chunk size, counted
  from a 4 KiB boundary: every chunk but the few bytes on either side of a cut starts and
  ends on 4 KiB, which reflink clones need (:mod:`bundle.reflink`). The entry lists where
  each chunk starts (``offsets``). Every other file, a file whose header does not parse
  as safetensors, and one with more than :data:`MAX_CUTS` tensor boundaries (which would
  make a manifest of millions of chunks) are cut as ``fixed``.

The same bytes with the same chunking always give the same chunks, so a digest pins a
chunking too: ``tensors`` makes other bundle digests than ``fixed`` for the same files.
"""

from __future__ import annotations

import hashlib
import json
import struct

from .manifest import FileEntry, ManifestError
from .reflink import BLOCK as ALIGN

CHUNKINGS = ("fixed", "tensors")
MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_CUTS = 65_536   # a file with more tensor boundaries is cut in fixed slices: a bounded manifest


def check_chunking(chunking: str) -> str:
    if chunking not in CHUNKINGS:
        raise ManifestError(f"chunking {chunking!r} must be one of {', '.join(CHUNKINGS)}")
    return chunking


def cut_at_tensors(path: str, size: int, chunk_size: int) -> bool:
    """Whether ``tensors`` chunking looks for tensors in this file: a safetensors file of
    more than one chunk (it may still fall back to fixed slices: :func:`tensor_cuts`)."""
    return path.endswith(".safetensors") and size > chunk_size


def tensor_cuts(prefix: bytes, size: int) -> list[int] | None:
    """Where the safetensors header that ``prefix`` starts ends, and where each tensor
    starts and ends (absolute offsets); ``[]`` when these bytes are no safetensors header
    of a file of ``size`` bytes; None when more of the file is needed to say."""
    if len(prefix) < 8:
        return None
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES or 8 + n > size:
        return []
    if len(prefix) < 8 + n:
        return None
    try:
        doc = json.loads(bytes(prefix[8:8 + n]))
        doc.pop("__metadata__", None)
        spans = [tuple(info["data_offsets"]) for info in doc.values()]
        cuts = {8 + n} | {8 + n + int(x) for span in spans for x in span}
    except (ValueError, TypeError, KeyError, AttributeError):
        return []
    inside = sorted(c for c in cuts if 0 < c < size)
    return inside if len(inside) <= MAX_CUTS else []


def tensor_offsets(cuts: list[int], size: int, chunk_size: int) -> tuple[int, ...]:
    """Chunk starts for a file of ``size`` bytes cut at ``cuts`` (see the module)."""
    points = {0}
    for c in cuts:
        points |= {c, c // ALIGN * ALIGN, -(-c // ALIGN) * ALIGN}
    starts = sorted(p for p in points if 0 <= p < size)
    offsets: list[int] = []
    for a, b in zip(starts, [*starts[1:], size]):
        offsets.extend(range(a, b, chunk_size))
    return tuple(offsets)


class FileHasher:
    """The sha256 of a file and of each of its chunks, fed its bytes in order (``update``).

    With ``tensors`` chunking a safetensors file's chunks are known once its header has
    been read: until then the bytes wait here (at most the header)."""

    def __init__(self, path: str, size: int, chunk_size: int, chunking: str = "fixed") -> None:
        self.size, self.chunk_size = size, chunk_size
        self.whole = hashlib.sha256()
        self.chunks: list[str] = []
        self.offsets: tuple[int, ...] | None = ()
        if check_chunking(chunking) == "tensors" and cut_at_tensors(path, size, chunk_size):
            self.offsets = None   # decided by the header
        self._waiting = bytearray()
        self._chunk, self._pos, self._end = hashlib.sha256(), 0, self._chunk_end(0)

    def update(self, block: bytes | memoryview) -> None:
        self.whole.update(block)
        if self.offsets is None:
            self._waiting += block
            cuts = tensor_cuts(self._waiting, self.size)
            if cuts is None and len(self._waiting) < self.size:
                return
            self._decide(cuts)
            return
        self._feed(block)

    def _decide(self, cuts: list[int] | None) -> None:
        """Cut at ``cuts`` (none: fixed slices) and hash the bytes that waited for it."""
        self.offsets = tensor_offsets(cuts, self.size, self.chunk_size) if cuts else ()
        self._end = self._chunk_end(0)
        waiting, self._waiting = bytes(self._waiting), bytearray()
        self._feed(waiting)

    def _feed(self, block: bytes | memoryview) -> None:
        if self.size <= self.chunk_size:
            return
        view = memoryview(block)
        while view:
            take = min(len(view), self._end - self._pos)
            if take <= 0:   # bytes past the size: the caller finds the size wrong
                return
            self._chunk.update(view[:take])
            self._pos += take
            view = view[take:]
            if self._pos == self._end:
                self.chunks.append(self._chunk.hexdigest())
                self._chunk, self._end = hashlib.sha256(), self._chunk_end(len(self.chunks))

    def _chunk_end(self, index: int) -> int:
        if self.offsets:
            return self.offsets[index + 1] if index + 1 < len(self.offsets) else self.size
        return min(self.size, (index + 1) * self.chunk_size)

    def result(self) -> tuple[str, tuple[str, ...], tuple[int, ...]]:
        """(sha256, chunk digests, chunk offsets) once every byte has been fed (a file
        that ended early has fewer chunks than its size says: the caller checks the size)."""
        if self.offsets is None:
            self._decide(None)
        return self.whole.hexdigest(), tuple(self.chunks), self.offsets or ()


def cut_as(entry: FileEntry, chunk_size: int, chunking: str) -> bool:
    """Whether ``entry``, from a manifest of ``chunk_size``, is cut as ``chunking`` would cut
    its bytes, so that its digests can be taken for the same bytes without reading them:
    an entry with offsets was cut at tensors; one without, in fixed slices, which is also
    what ``tensors`` gives a file it does not cut (not safetensors, or one chunk at most).
    A safetensors file in fixed slices may have been a ``tensors`` fallback: not taken."""
    if chunking == "fixed":
        return not entry.offsets
    return bool(entry.offsets) or not cut_at_tensors(entry.path, entry.size, chunk_size)

"""In-place transitions (B2): journal, apply, verify, restore, release.

Admission and staging (:mod:`owner.admission`) produce a :class:`StagedUpdate` of row
patches. Applying happens under the owner's inference lock: the rows about to be
replaced are journaled, the new rows written, then read back from the live weights and
verified against each staged row block's sha256 (optionally also every changed chunk,
rebuilt from live memory, against the target manifest's chunk digest). A failed
verification restores the journal (:class:`VerifyFailed`); a restore that fails or does
not verify is :class:`RestoreFailed` (the owner must unload); a failure to release staged
memory is :class:`ReleaseFailed` (the owner is quarantined).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .revisions import Revision
from .safetensors_layout import Layout


class NeedsReload(Exception):
    """The change cannot be applied in place; only a reload can reach the target."""


class InPlaceFailed(Exception):
    """An admitted in-place update failed (the old identity is kept)."""


class VerifyFailed(InPlaceFailed):
    """Read-back verification failed; the journal restored the old rows."""


class RestoreFailed(InPlaceFailed):
    """Verification failed and the journal could not restore the old rows."""


class ReleaseFailed(InPlaceFailed):
    """Staged or journal memory could not be released. ``applied`` says whether the new
    rows were verified and are live (True) or the old rows were restored (False)."""

    def __init__(self, message: str, applied: bool):
        super().__init__(message)
        self.applied = applied


class RowStore(Protocol):
    """What a backend offers the in-place machinery: bytes and rows of live tensors.

    Values are exchanged as their bit patterns: unsigned integers of the width of the
    tensor's dtype in its file (uint16 for BF16 and F16, uint32 for F32), so what is
    compared, written and read back is exactly the bytes the file holds."""

    def layouts(self) -> dict[str, Layout]: ...
    def tensor_bytes(self, name: str, start: int, end: int) -> bytes: ...
    def live_bits(self, name: str) -> np.ndarray: ...  # bit patterns, tensor-shaped; read only
    def read_rows(self, name: str, rows: np.ndarray) -> np.ndarray: ...
    def write_rows(self, name: str, rows: np.ndarray, values: np.ndarray) -> None: ...
    def release_staged(self, update: "StagedUpdate") -> None: ...


@dataclass(frozen=True)
class ChangedRange:
    path: str
    index: int  # chunk index, or 0 for a file without chunks


@dataclass(frozen=True)
class RangeCheck:
    path: str
    offset: int
    length: int
    sha256: str


@dataclass
class TensorPatch:
    name: str
    rows: np.ndarray  # sorted row indices
    new: np.ndarray  # bit patterns of the tensor's dtype (see RowStore), [len(rows), width]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.new.tobytes()).hexdigest()


@dataclass
class StagedUpdate:
    target: Revision
    patches: list[TensorPatch]
    checks: list[RangeCheck]  # changed chunks as the target manifest has them
    bytes_read: int
    baseline: list[RangeCheck] = field(default_factory=list)  # the same chunks before the update

    @property
    def rows_changed(self) -> int:
        return sum(len(p.rows) for p in self.patches)


@dataclass
class ApplyReport:
    apply_seconds: float
    verify_seconds: float
    rows: int


@dataclass
class _Journal:
    entries: list[tuple[str, np.ndarray, np.ndarray, str]] = field(default_factory=list)


def rebuild_range(store: RowStore, layout: Layout, offset: int, length: int) -> bytes:
    """Bytes ``offset..offset+length`` of the weights file as the live weights hold them."""
    end = offset + length
    parts = []
    if offset < layout.data_start:
        parts.append(layout.header[offset:min(end, layout.data_start)])
    for slot in layout.overlapping(offset, end):
        a, b = max(offset, slot.start), min(end, slot.end)
        parts.append(store.tensor_bytes(slot.name, a - slot.start, b - slot.start))
    return b"".join(parts)


def _chunks_match(store: RowStore, checks: list[RangeCheck]) -> str | None:
    layouts = store.layouts()
    for c in checks:
        live = rebuild_range(store, layouts[c.path], c.offset, c.length)
        if hashlib.sha256(live).hexdigest() != c.sha256:
            return f"{c.path}: bytes {c.offset}..{c.offset + c.length} rebuilt from live weights do not match"
    return None


def _verify(store: RowStore, update: StagedUpdate, chunks: bool) -> str | None:
    for p in update.patches:
        if hashlib.sha256(store.read_rows(p.name, p.rows).tobytes()).hexdigest() != p.sha256:
            return f"tensor {p.name}: rows read back do not match the staged rows"
    return _chunks_match(store, update.checks) if chunks else None


def _restore(store: RowStore, journal: _Journal, update: StagedUpdate, chunks: bool) -> None:
    for name, rows, old, sha in reversed(journal.entries):
        store.write_rows(name, rows, old)
    for name, rows, old, sha in journal.entries:
        if hashlib.sha256(store.read_rows(name, rows).tobytes()).hexdigest() != sha:
            raise RestoreFailed(f"tensor {name}: restored rows do not match the journal")
    problem = _chunks_match(store, update.baseline) if chunks else None
    if problem:  # e.g. a stray write outside the journaled rows
        raise RestoreFailed(f"after restoring the journal: {problem}")


def apply(store: RowStore, update: StagedUpdate, verify_chunks: bool = False) -> ApplyReport:
    """Journal, write and verify; call with inference excluded. See the module docstring.

    Verification always compares each tensor's rows read back from live memory with the
    sha256 of the staged rows. ``verify_chunks`` also rebuilds every changed chunk from
    live memory and checks it against the target manifest, which catches stray writes
    outside the patched rows (within those chunks) at the cost of hashing whole chunks.
    """
    t0 = time.perf_counter()
    rows = update.rows_changed
    journal = _Journal()
    for p in update.patches:
        old = store.read_rows(p.name, p.rows)
        journal.entries.append((p.name, p.rows, old, hashlib.sha256(old.tobytes()).hexdigest()))
    try:
        for p in update.patches:
            store.write_rows(p.name, p.rows, p.new)
    except Exception as e:  # noqa: BLE001 - a failed write is restored like a failed verify
        problem = f"writing rows failed: {type(e).__name__}: {e}"
        t1 = time.perf_counter()
    else:
        t1 = time.perf_counter()
        problem = _verify(store, update, verify_chunks)
    t2 = time.perf_counter()
    if problem is not None:
        try:
            _restore(store, journal, update, verify_chunks)
        except RestoreFailed:
            raise
        except Exception as e:  # noqa: BLE001 - any failure to restore means unload
            raise RestoreFailed(f"restoring the journal failed: {e}") from e
        _release(store, update, applied=False)
        raise VerifyFailed(f"verification failed, old rows restored: {problem}")
    _release(store, update, applied=True)
    return ApplyReport(t1 - t0, t2 - t1, rows)


def _release(store: RowStore, update: StagedUpdate, applied: bool) -> None:
    try:
        store.release_staged(update)
    except Exception as e:  # noqa: BLE001 - any failure to release means quarantine
        raise ReleaseFailed(f"releasing staged memory failed: {e}", applied) from e
    update.patches = []

"""In-place transitions (B2): admit, stage, journal, apply, verify, restore, release.

Admission reads the manifest diff first: graph, config and tokenizer files must be
identical and every weights file must keep its path and size; otherwise the answer is
"needs reload". The changed chunks of the weights files are then read from the target
revision and hash-checked, and every differing byte is mapped through the safetensors
header onto tensors and rows. Only rows of admissible tensors (projections, LM head)
with unchanged header (so unchanged shape, dtype and offsets) may differ; anything else
is "needs reload" too, decided before a single live byte changes.

Applying happens under the owner's inference lock: the rows about to be replaced are
journaled, the new rows written, then read back from the live weights and verified
against each staged row block's sha256 (optionally also every changed chunk, rebuilt
from live memory, against the target manifest's chunk digest). A failed verification restores the journal
(:class:`VerifyFailed`); a restore that fails or does not verify is
:class:`RestoreFailed` (the owner must unload); a failure to release staged memory is
:class:`ReleaseFailed` (the owner is quarantined).
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from bundle.demo import is_admissible
from bundle.manifest import Manifest, Role

from .revisions import Revision, read_range_verified
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
    """What a backend offers the in-place machinery: BF16 bytes and rows of live tensors."""

    def layouts(self) -> dict[str, Layout]: ...
    def tensor_bytes(self, name: str, start: int, end: int) -> bytes: ...
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
    new: np.ndarray  # uint16 BF16 bit patterns, [len(rows), width]

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


def plan_ranges(current: Manifest, target: Manifest, layouts: dict[str, Layout]) -> list[ChangedRange]:
    """Chunks of weights files that differ; raise NeedsReload for anything else that does."""
    def others(m: Manifest) -> set:
        return {(f.path, f.sha256, f.role) for f in m.files if f.role != Role.weights}

    if others(current) != others(target):
        raise NeedsReload("graph, config or tokenizer files differ; only a reload can apply them")
    cur, tgt = current.by_path(), target.by_path()
    cur_w = {p for p, f in cur.items() if f.role == Role.weights}
    tgt_w = {p for p, f in tgt.items() if f.role == Role.weights}
    if cur_w != tgt_w:
        raise NeedsReload("the set of weights files differs")
    ranges = []
    for path in sorted(tgt_w):
        a, b = cur[path], tgt[path]
        if a.sha256 == b.sha256:
            continue
        if a.size != b.size:
            raise NeedsReload(f"{path}: size changes from {a.size} to {b.size}")
        if path not in layouts:
            raise NeedsReload(f"{path}: the backend holds no layout for this weights file")
        if not b.chunks:
            ranges.append(ChangedRange(path, 0))
        elif current.chunk_size == target.chunk_size and a.chunks:
            ranges += [ChangedRange(path, i) for i, (x, y) in enumerate(zip(a.chunks, b.chunks)) if x != y]
        else:
            ranges += [ChangedRange(path, i) for i in range(len(b.chunks))]
    return ranges


def _stage_tensor(store: RowStore, slot, a: int, b: int, new: bytes,
                  pending: dict[str, dict[int, np.ndarray]]) -> None:
    """Record the rows of ``slot`` whose bytes in file range a..b differ from the live ones."""
    rb = slot.row_bytes
    r0, r1 = (a - slot.start) // rb, -(-(b - slot.start) // rb)
    rows = np.arange(r0, r1)
    live = store.read_rows(slot.name, rows) if len(slot.shape) == 2 else None
    if live is None:
        old = store.tensor_bytes(slot.name, a - slot.start, b - slot.start)
        if old != new:
            raise NeedsReload(f"tensor {slot.name} changed and is not admissible in place")
        return
    start = (a - slot.start) - r0 * rb
    old = live.view(np.uint8).reshape(-1)[start:start + (b - a)]
    incoming = np.frombuffer(new, dtype=np.uint8)
    differ = np.nonzero(old != incoming)[0]
    if differ.size == 0:
        return
    if not is_admissible(slot.name) or slot.dtype != "BF16":
        raise NeedsReload(f"tensor {slot.name} changed and is not admissible in place "
                          "(only BF16 rows of projection and LM-head tensors are)")
    mine = pending.setdefault(slot.name, {})
    for j in np.unique((differ + start) // rb):
        row = int(rows[j])
        value = mine.get(row, live[j]).copy()
        lo, hi = max(start, j * rb), min(start + (b - a), (j + 1) * rb)  # this row's bytes in range
        value.view(np.uint8)[lo - j * rb:hi - j * rb] = incoming[lo - start:hi - start]
        mine[row] = value
    # a row split across two chunks: the part in an unchanged range keeps its live bytes


def _read_ranges(target: Revision, ranges: list[ChangedRange], ahead: int = 4):
    """Yield the changed chunks, hash-checked, reading and hashing up to ``ahead`` at once on
    two threads (hashlib releases the GIL) so admission can stop early without reading all."""
    entries = target.manifest.by_path()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = []
        for i in range(len(ranges)):
            while len(futures) < ahead and i + len(futures) < len(ranges):
                r = ranges[i + len(futures)]
                futures.append(pool.submit(read_range_verified, target, entries[r.path], r.index))
            try:
                yield futures.pop(0).result()
            except BaseException:
                for f in futures:
                    f.cancel()
                raise


def stage(store: RowStore, current: Manifest, target: Revision) -> StagedUpdate:
    """Read and hash-check the changed chunks of ``target``; return the row patches."""
    layouts = store.layouts()
    ranges = plan_ranges(current, target.manifest, layouts)
    pending: dict[str, dict[int, np.ndarray]] = {}
    checks, baseline, total = [], [], 0
    entries = target.manifest.by_path()
    for rng, data in zip(ranges, _read_ranges(target, ranges)):
        entry, layout = entries[rng.path], layouts[rng.path]
        off = rng.index * target.manifest.chunk_size if entry.chunks else 0
        end = off + len(data)
        total += len(data)
        digest = entry.chunks[rng.index] if entry.chunks else entry.sha256  # just verified equal
        checks.append(RangeCheck(rng.path, off, len(data), digest))
        before = current.by_path()[rng.path]
        if current.chunk_size == target.manifest.chunk_size and bool(before.chunks) == bool(entry.chunks):
            old_digest = before.chunks[rng.index] if before.chunks else before.sha256
            baseline.append(RangeCheck(rng.path, off, len(data), old_digest))
        if off < layout.data_start:
            n = min(end, layout.data_start) - off
            if data[:n] != layout.header[off:off + n]:
                raise NeedsReload(f"{rng.path}: the safetensors header (tensor layout) changed")
        for slot in layout.overlapping(off, end):
            a, b = max(off, slot.start), min(end, slot.end)
            _stage_tensor(store, slot, a, b, data[a - off:b - off], pending)
    patches = []
    for name, rows in sorted(pending.items()):
        order = sorted(rows)
        patches.append(TensorPatch(name, np.asarray(order, dtype=np.int64), np.stack([rows[r] for r in order])))
    return StagedUpdate(target, patches, checks, total, baseline)


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

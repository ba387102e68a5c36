"""In-place admission and staging: which bytes change, and may they change in place?

Admission reads the manifest diff first: graph, config and tokenizer files must be
identical and every weights file must keep its path and size; otherwise the answer is
"needs reload". The changed chunks of the weights files are then read from the target
revision and hash-checked against the target manifest, and every differing byte is
mapped through the safetensors header onto tensors and rows. Only rows of admissible
tensors (projections, LM head) with an unchanged header (so unchanged shapes, dtypes and
offsets) may differ, in whatever dtype the file holds them (BF16, F16, F32): rows are
compared and staged as the bit patterns of their values, integers of the dtype's width.
A changed header or file size is refused with the first tensor whose dtype or shape
changes, read from the target's own header. The result is a
:class:`~owner.inplace.StagedUpdate` of row patches, decided before a single live byte
changes. Old bytes come from the live weights, not from the old revision's files.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from bundle.model_revisions import is_admissible
from bundle.manifest import FileEntry, Manifest, Role, chunk_range, cut_alike

from .inplace import ChangedRange, NeedsReload, RangeCheck, RowStore, StagedUpdate, TensorPatch
from .revisions import Revision, RevisionError, read_range_verified
from .safetensors_layout import DTYPE_BYTES, Layout, LayoutError, first_difference, header_length, parse_layout


def plan_ranges(current: Manifest, target: Manifest, layouts: dict[str, Layout],
                explain: Callable[[str], str] | None = None) -> list[ChangedRange]:
    """Chunks of weights files that differ; raise NeedsReload for anything else that does.
    ``explain(path)`` may say why a weights file changes size (see :func:`stage`)."""
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
            why = f"{path}: size changes from {a.size} to {b.size}"
            raise NeedsReload(f"{why}: {explain(path)}" if explain and path in layouts else why)
        if path not in layouts:
            raise NeedsReload(f"{path}: the backend holds no layout for this weights file")
        if not b.chunks:
            ranges.append(ChangedRange(path, 0))
        elif cut_alike(a, current.chunk_size, b, target.chunk_size):
            ranges += [ChangedRange(path, i) for i, (x, y) in enumerate(zip(a.chunks, b.chunks)) if x != y]
        else:
            ranges += [ChangedRange(path, i) for i in range(len(b.chunks))]
    return ranges


def _stage_tensor(store: RowStore, slot, a: int, b: int, new: bytes,
                  pending: dict[str, dict[int, np.ndarray]]) -> None:
    """Record the rows of ``slot`` whose bytes in file range a..b differ from the live ones.

    Compares values as bit patterns (unsigned integers of the dtype's width) in place
    against the live tensor (no copy of it) and reduces the comparison per row; only the
    rows that differ are copied and patched. ``a`` and ``b`` fall on value boundaries when
    the tensor starts on one of its dtype's width: chunks start at multiples of 4096 or
    where a tensor starts or ends (bundle.chunking), and safetensors writes the widest
    dtypes first after a header padded to 8 bytes. A tensor
    that starts elsewhere may still keep its bytes; it cannot change in place."""
    width = DTYPE_BYTES[slot.dtype]
    if len(slot.shape) != 2 or (a - slot.start) % width or (b - slot.start) % width:
        if store.tensor_bytes(slot.name, a - slot.start, b - slot.start) != new:
            why = ("only rows of 2-D tensors change in place" if len(slot.shape) != 2 else
                   f"its {slot.dtype} values do not start on {width}-byte boundaries in the file")
            raise NeedsReload(f"tensor {slot.name} changed and is not admissible in place ({why})")
        return
    live, columns = store.live_bits(slot.name), slot.shape[1]
    if live.dtype.itemsize != width:
        raise NeedsReload(f"tensor {slot.name} is held in {live.dtype.itemsize}-byte values, "
                          f"its file's {slot.dtype} has {width}; only a reload can change it")
    e0, e1 = (a - slot.start) // width, (b - slot.start) // width
    incoming = np.frombuffer(new, dtype=live.dtype)
    differs = live.reshape(-1)[e0:e1] != incoming
    r0 = e0 // columns
    row_starts = np.r_[0, np.arange((r0 + 1) * columns - e0, e1 - e0, columns)]
    changed = r0 + np.flatnonzero(np.logical_or.reduceat(differs, row_starts))
    if changed.size == 0:
        return
    if not is_admissible(slot.name):
        raise NeedsReload(f"tensor {slot.name} changed and is not admissible in place "
                          "(only rows of projection and LM-head tensors are)")
    mine = pending.setdefault(slot.name, {})
    for row in changed.tolist():
        # a row split across two chunks keeps the part another chunk staged, or the live one
        value = mine[row] if row in mine else live[row].copy()
        lo, hi = max(e0, row * columns), min(e1, (row + 1) * columns)
        value[lo - row * columns:hi - row * columns] = incoming[lo - e0:hi - e0]
        mine[row] = value


def _layout_change(layout: Layout, target: Revision, entry: FileEntry) -> str:
    """What differs between the live layout of a weights file and the target's, read from
    the target file's header (its first chunks, hash-checked); for a refusal's reason."""
    data, index = b"", 0
    try:
        while True:
            data += read_range_verified(target, entry, index)
            index += 1
            if len(data) >= header_length(data) or not entry.chunks or index == len(entry.chunks):
                break
        return first_difference(layout, parse_layout(data, entry.size))
    except (LayoutError, RevisionError, OSError) as e:
        return f"the target's safetensors header cannot be read ({e})"


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
    entries = target.manifest.by_path()

    def explain(path: str) -> str:
        return _layout_change(layouts[path], target, entries[path])

    ranges = plan_ranges(current, target.manifest, layouts, explain)
    pending: dict[str, dict[int, np.ndarray]] = {}
    checks, baseline, total = [], [], 0
    for rng, data in zip(ranges, _read_ranges(target, ranges)):
        entry, layout = entries[rng.path], layouts[rng.path]
        off = chunk_range(entry, rng.index, target.manifest.chunk_size)[0] if entry.chunks else 0
        end = off + len(data)
        total += len(data)
        digest = entry.chunks[rng.index] if entry.chunks else entry.sha256  # just verified equal
        checks.append(RangeCheck(rng.path, off, len(data), digest))
        before = current.by_path()[rng.path]
        if cut_alike(before, current.chunk_size, entry, target.manifest.chunk_size):
            old_digest = before.chunks[rng.index] if before.chunks else before.sha256
            baseline.append(RangeCheck(rng.path, off, len(data), old_digest))
        if off < layout.data_start:
            n = min(end, layout.data_start) - off
            if data[:n] != layout.header[off:off + n]:
                raise NeedsReload(f"{rng.path}: the safetensors header (tensor layout) changed: "
                                  f"{explain(rng.path)}")
        for slot in layout.overlapping(off, end):
            a, b = max(off, slot.start), min(end, slot.end)
            _stage_tensor(store, slot, a, b, data[a - off:b - off], pending)
    patches = []
    for name, rows in sorted(pending.items()):
        order = sorted(rows)
        patches.append(TensorPatch(name, np.asarray(order, dtype=np.int64), np.stack([rows[r] for r in order])))
    return StagedUpdate(target, patches, checks, total, baseline)

"""Build one revision's blobs from a delivery plan: clone, copy or fetch, verifying as it goes.

For each target file that the store does not already hold, a blob is written to a
temporary file in the work directory, in chunk order:

- chunks the plan says the donor already has are shared from the donor's file
  (``FICLONERANGE`` where the store supports reflink, an in-kernel copy otherwise);
- the other chunks are read from the source and written as they arrive, each hashed and
  compared with its manifest digest at the chunk boundary, before anything else is done
  with the file. A wrong, short or long stream raises :class:`IntegrityMismatch`.

Fetch runs and donor copies are timed into the :class:`Tally`, so that the store can
learn the source's and the disk's throughput (:mod:`bundle.throughput`).

Only a complete, verified blob is synced, made read-only and renamed into the store.
Nothing here touches revision trees or the catalog; :mod:`bundle.store` does that.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol

from .errors import IntegrityMismatch, SourceUnavailable, StoreFull
from .manifest import FileEntry, chunk_range
from .plan import FilePlan
from .reflink import share_or_copy

Progress = Callable[[int], None]
BLOB_MODE = 0o444


class BundleSource(Protocol):
    """What the store needs from a source (``bundle.sources.open_source(uri)``)."""

    def read(self, entry: FileEntry, offset: int, length: int) -> Iterator[bytes]: ...


@dataclass
class Tally:
    """Bytes moved by one materialization, and the time spent fetching and copying."""

    fetched: int = 0
    reused: int = 0
    written: int = 0
    cloned: int = 0
    copied: int = 0               # reused donor bytes that were copied (not cloned)
    fetch_seconds: float = 0.0    # in fetch runs: source reads, hashing, writes
    copy_seconds: float = 0.0     # in donor copies that were not clones


def _segments(entry: FileEntry, fp: FilePlan, chunk_size: int) -> list[tuple]:
    """Coalesced runs in file order: ("clone", donor_path, donor_off, dst_off, length) or
    ("fetch", first_chunk, last_chunk)."""
    if not entry.chunks:
        return [("fetch", 0, 0)]
    clones = {c.index: c for c in fp.clones} if fp.action == "rebase" else {}
    runs: list[list] = []
    for i in range(len(entry.chunks)):
        off, length = chunk_range(entry, i, chunk_size)
        c = clones.get(i)
        last = runs[-1] if runs else None
        if c is not None:
            if (last and last[0] == "clone" and last[1] == c.donor_path
                    and last[2] + last[4] == c.donor_offset and last[3] + last[4] == off):
                last[4] += length
            else:
                runs.append(["clone", c.donor_path, c.donor_offset, off, length])
        elif last and last[0] == "fetch":
            last[2] = i
        else:
            runs.append(["fetch", i, i])
    return [tuple(r) for r in runs]


def fetch_run(source: BundleSource, entry: FileEntry, first: int, last: int, chunk_size: int,
              fd: int, tally: Tally, progress: Progress | None) -> None:
    """Stream chunks ``first..last`` from the source into ``fd``, verifying each chunk: one
    read of the source for the whole run, as a delivery fetches every run of missing chunks
    (experiments/04 times sources through it, into /dev/null)."""
    if entry.chunks:
        bounds = [chunk_range(entry, i, chunk_size) for i in range(first, last + 1)]
        expected = [entry.chunks[i] for i in range(first, last + 1)]
    else:
        bounds, expected = [(0, entry.size)], [entry.sha256]
    start = bounds[0][0]
    wanted = bounds[-1][0] + bounds[-1][1] - start
    k, hasher, filled, pos = 0, hashlib.sha256(), 0, start

    def close_chunk() -> None:
        nonlocal k, hasher, filled
        actual = hasher.hexdigest()
        if actual != expected[k]:
            raise IntegrityMismatch(entry.path, expected[k], actual,
                                    chunk=first + k if entry.chunks else None)
        k, hasher, filled = k + 1, hashlib.sha256(), 0

    try:
        stream = source.read(entry, start, wanted)
        for block in stream:
            view = memoryview(block)
            while view:
                if k == len(bounds):
                    raise IntegrityMismatch(entry.path, expected[-1], None,
                                            chunk=first + k - 1 if entry.chunks else None,
                                            received=pos - start + len(view), wanted=wanted,
                                            detail="the source sent more bytes than the manifest says")
                take = min(len(view), bounds[k][1] - filled)
                piece = view[:take]
                hasher.update(piece)
                _write_all(fd, piece, pos)
                pos += take
                filled += take
                tally.fetched += take
                tally.written += take
                if progress:
                    progress(take)
                view = view[take:]
                if filled == bounds[k][1]:
                    close_chunk()
    except (IntegrityMismatch, StoreFull, SourceUnavailable):
        raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreFull(f"store filesystem is full while writing {entry.path}: {e}") from None
        raise
    if k < len(bounds):
        if filled == bounds[k][1] == 0:  # an empty file: its one (empty) chunk
            close_chunk()
        if k < len(bounds):
            raise IntegrityMismatch(entry.path, expected[k], None,
                                    chunk=first + k if entry.chunks else None,
                                    received=pos - start, wanted=wanted,
                                    detail="the source ended early")


def _write_all(fd: int, data: memoryview, pos: int) -> None:
    while data:
        n = os.pwrite(fd, data, pos)
        data, pos = data[n:], pos + n


def build_blob(tmp: Path, entry: FileEntry, fp: FilePlan, chunk_size: int, source: BundleSource,
               donor_dir: Path | None, reflink: bool, tally: Tally,
               progress: Progress | None = None) -> None:
    """Write the verified content of ``entry`` to ``tmp`` (synced, read-only)."""
    donor_fds: dict[str, int] = {}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for seg in _segments(entry, fp, chunk_size):
            if seg[0] == "fetch":
                t0 = time.monotonic()
                try:
                    fetch_run(source, entry, seg[1], seg[2], chunk_size, fd, tally, progress)
                finally:
                    tally.fetch_seconds += time.monotonic() - t0
                continue
            _, donor_path, donor_off, dst_off, length = seg
            if donor_dir is None:
                raise RuntimeError("plan clones chunks but no donor tree was given")
            if donor_path not in donor_fds:
                donor_fds[donor_path] = os.open(donor_dir / donor_path, os.O_RDONLY)
            t0 = time.monotonic()
            cloned = share_or_copy(donor_fds[donor_path], donor_off, length, fd, dst_off, reflink)
            tally.reused += length
            if cloned:
                tally.cloned += length
            else:
                tally.copy_seconds += time.monotonic() - t0
                tally.copied += length
                tally.written += length
            if progress:
                progress(length)
        os.fsync(fd)
        os.fchmod(fd, BLOB_MODE)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreFull(f"store filesystem is full while writing {entry.path}: {e}") from None
        raise
    finally:
        os.close(fd)
        for dfd in donor_fds.values():
            os.close(dfd)
    if os.stat(tmp).st_size != entry.size:
        raise IntegrityMismatch(entry.path, entry.sha256, None, received=os.stat(tmp).st_size,
                                wanted=entry.size, detail="built file has the wrong size")

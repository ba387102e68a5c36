"""Finding and trusting revisions inside the owner's bundle directory.

The bridge publishes ``<bundle-dir>/current -> revisions/sha256-<hex>`` and stages new
revisions next to it. The owner loads ``current`` at start and a transition target at
``revisions/<revision_dirname(target)>``. Every path is resolved (symlinks included) and
must stay inside the bundle directory; the manifest found there must hash to the digest
that names it; and file bytes are checked against the manifest's sha256s as they are
read, so nothing unverified reaches a backend.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bundle.manifest import (DIGEST_RE, MANIFEST_NAME, FileEntry, Manifest, ManifestError, check_digest,
                             chunk_range, revision_dirname)
from bundle.scan import read_manifest


class RevisionError(ValueError):
    """A revision is missing, escapes the bundle dir, or does not match its digest."""


class RevisionNotFound(RevisionError):
    """No revision directory exists for the requested digest."""


class IntegrityError(RevisionError):
    """Bytes read from a revision do not match the manifest's sha256."""


@dataclass(frozen=True)
class Revision:
    dir: Path
    manifest: Manifest

    @property
    def digest(self) -> str:
        return self.manifest.digest

    def file(self, entry: FileEntry) -> Path:
        return inside(self.dir, self.dir / entry.path)


def inside(root: Path, path: Path) -> Path:
    """``path`` with symlinks resolved, if it stays under ``root``; raise otherwise."""
    real_root = root.resolve()
    real = path.resolve()
    if real != real_root and real_root not in real.parents:
        raise RevisionError(f"{path} resolves to {real}, outside {real_root}")
    return real


def open_revision(bundle_dir: Path, digest: str | None = None) -> Revision:
    """The revision ``digest`` (or ``current``), with its manifest checked against the digest."""
    bundle_dir = Path(bundle_dir)
    if digest is None:
        link = bundle_dir / "current"
        if not link.exists():
            raise RevisionNotFound(f"{link} does not exist: no current revision was delivered")
        rdir = inside(bundle_dir, link)
        expected = "sha256:" + rdir.name.removeprefix("sha256-")
        if not rdir.name.startswith("sha256-") or not DIGEST_RE.match(expected):
            raise RevisionError(f"{link} points at {rdir.name!r}, not at a revisions/sha256-<hex> directory")
    else:
        try:
            name = revision_dirname(digest)
        except ManifestError as e:
            raise RevisionError(str(e)) from None
        candidate = bundle_dir / "revisions" / name
        if not os.path.lexists(candidate):
            raise RevisionNotFound(f"revision {digest} is not staged in {bundle_dir}/revisions")
        rdir = inside(bundle_dir, candidate)
        expected = digest
    try:
        manifest = read_manifest(rdir)
    except ManifestError as e:
        raise RevisionError(f"{rdir}: {e}") from None
    if manifest.digest != check_digest(expected):
        raise IntegrityError(f"{rdir}: manifest digest {manifest.digest} does not match {expected}")
    return Revision(rdir, manifest)


def read_verified(rev: Revision, entry: FileEntry) -> bytearray:
    """All bytes of one file, checked against its sha256 (one hash pass, no second one per chunk)."""
    path = rev.file(entry)
    chunk = rev.manifest.chunk_size
    buf = bytearray(entry.size)
    view = memoryview(buf)
    whole = hashlib.sha256()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size != entry.size:
            raise IntegrityError(f"{entry.path}: size differs from the manifest's {entry.size}")
        for off in range(0, entry.size, chunk):
            part = view[off:off + chunk]
            if f.readinto(part) != len(part):
                raise IntegrityError(f"{entry.path}: truncated at byte {off}")
            whole.update(part)
    if whole.hexdigest() != entry.sha256:
        raise IntegrityError(f"{entry.path}: sha256 does not match the manifest")
    return buf


def map_verified(rev: Revision, entry: FileEntry) -> mmap.mmap:
    """A read-only map of one file, checked against the manifest before it is returned.

    A chunked file is checked chunk by chunk against its chunk digests (which the manifest
    digest pins as firmly as the whole-file sha256) on every core at once, since hashlib
    releases the GIL; a file of one chunk against its sha256. Revision files are immutable
    once published (read-only, content-addressed), so the bytes hashed are the bytes the
    caller then reads. The caller closes the map.
    """
    path = rev.file(entry)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size != entry.size or entry.size == 0:
            raise IntegrityError(f"{entry.path}: size differs from the manifest's {entry.size} (or is empty)")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        bad = _first_bad_chunk(mm, entry, rev.manifest.chunk_size)
    except BaseException:
        mm.close()
        raise
    if bad is not None:
        mm.close()
        where = (f"chunk {bad} (bytes {chunk_range(entry, bad, rev.manifest.chunk_size)[0]}..)"
                 if entry.chunks else "sha256")
        raise IntegrityError(f"{entry.path}: {where} does not match the manifest")
    return mm


def _first_bad_chunk(mm: mmap.mmap, entry: FileEntry, chunk: int) -> int | None:
    """Index of the first chunk whose sha256 differs (0 for an unchunked file), or None."""
    if not entry.chunks:
        return None if hashlib.sha256(mm).hexdigest() == entry.sha256 else 0
    view = memoryview(mm)
    try:
        def digest(i: int) -> str:
            off, length = chunk_range(entry, i, chunk)
            return hashlib.sha256(view[off:off + length]).hexdigest()

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            got = pool.map(digest, range(len(entry.chunks)))
            return next((i for i, (a, b) in enumerate(zip(got, entry.chunks)) if a != b), None)
    finally:
        view.release()


def verify_tree(rev: Revision) -> None:
    """Every file of the revision directory is one its manifest names, with the manifest's bytes.

    For backends that hand the whole directory to a vendor SDK, which reads whatever it
    finds there: a file the manifest does not name, or one whose bytes differ, is refused
    before the SDK sees the directory.
    """
    named = {e.path for e in rev.manifest.files} | {MANIFEST_NAME}
    present = {p.relative_to(rev.dir).as_posix() for p in rev.dir.rglob("*")
               if p.is_symlink() or not p.is_dir()}
    unnamed = sorted(present - named)
    if unnamed:
        raise IntegrityError(f"{rev.dir}: files the manifest does not name: {', '.join(unnamed[:5])}")
    for entry in rev.manifest.files:
        if entry.size == 0:
            read_verified(rev, entry)
        else:
            map_verified(rev, entry).close()


def read_range_verified(rev: Revision, entry: FileEntry, index: int) -> bytes:
    """Chunk ``index`` of a file (the whole file if it has no chunks), hash-checked."""
    if entry.chunks:
        (off, length), expected = chunk_range(entry, index, rev.manifest.chunk_size), entry.chunks[index]
    else:
        off, length, expected = 0, entry.size, entry.sha256
    with open(rev.file(entry), "rb") as f:
        f.seek(off)
        data = f.read(length)
    if len(data) != length or hashlib.sha256(data).hexdigest() != expected:
        raise IntegrityError(f"{entry.path}: bytes {off}..{off + length} do not match their digest")
    return data

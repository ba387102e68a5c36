"""The local side of ``push``: a built bundle directory, read back and checked as it is sent.

``push`` publishes what ``resident bundle build`` wrote: a directory with
``resident-manifest.json`` beside the files it lists. Before anything is sent, every file
must still exist as a regular file of the size the manifest records, so a bundle that
changed after it was built is refused up front (``ManifestError``: rebuild it). While
files are sent their bytes are hashed, and a file whose content no longer matches its
sha256 raises :class:`IntegrityMismatch` before the manifest is published: a target never
names content it does not hold. The manifest is sent last, in its canonical form, so its
sha256 is the bundle digest whatever whitespace the file on disk has.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import BundleError, IntegrityMismatch, SourceUnavailable
from ..manifest import FileEntry, Manifest, ManifestError
from ..scan import read_manifest
from .metrics import PUSHED_BYTES
from .ranged import RetryPolicy

Progress = Callable[[int], None]  # called with the number of bytes just sent


class TargetConflict(BundleError):
    """The push target already holds something else; nothing was overwritten."""


@dataclass(frozen=True)
class LocalBundle:
    """A built bundle directory and its manifest, checked against the files on disk."""

    root: Path
    manifest: Manifest

    @property
    def digest(self) -> str:
        return self.manifest.digest

    @property
    def manifest_bytes(self) -> bytes:
        return self.manifest.canonical_json()

    def path_of(self, entry: FileEntry) -> Path:
        return self.root / entry.path

    def unique_files(self) -> list[FileEntry]:
        """One entry per distinct content: blob stores hold each sha256 once."""
        seen: dict[str, FileEntry] = {}
        for f in self.manifest.files:
            seen.setdefault(f.sha256, f)
        return list(seen.values())


def open_bundle(root: Path | str) -> LocalBundle:
    """Read the manifest of a built bundle and check that every file is still there."""
    root = Path(root)
    if not root.is_dir():
        raise ManifestError(f"{root}: not a directory")
    manifest = read_manifest(root)
    for f in manifest.files:
        full = root / f.path
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            raise ManifestError(f"{full}: listed in the manifest but missing; rebuild the bundle") from None
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{full}: not a regular file")
        if st.st_size != f.size:
            raise ManifestError(f"{full}: {st.st_size} bytes on disk, manifest says {f.size}; "
                                "rebuild the bundle")
    return LocalBundle(root, manifest)


class FileBody:
    """A read-only file-like view of ``[offset, offset+length)`` that hashes what it hands out.

    ``requests`` streams it as a request body with a Content-Length (from ``__len__``).
    Several views of one file can share one ``hasher`` to hash the whole file across a
    chunked upload.
    """

    def __init__(self, path: Path, offset: int, length: int, hasher=None,
                 progress: Progress | None = None) -> None:
        self._path, self._offset = path, offset
        self._f = None  # opened on first read, so many parts of one file hold no descriptors
        self._left = length
        self._length = length
        self.hasher = hasher if hasher is not None else hashlib.sha256()
        self._progress = progress

    @property
    def done(self) -> bool:
        """Whether every byte of the view was handed out (and hashed)."""
        return self._left <= 0

    def __len__(self) -> int:
        return self._length

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        if self._f is None:
            self._f = open(self._path, "rb")
            self._f.seek(self._offset)
        want = self._left if n is None or n < 0 else min(n, self._left)
        data = self._f.read(want)
        if not data:
            raise IntegrityMismatch(str(self._path), "", None, received=self._length - self._left,
                                    wanted=self._length, detail="the file shrank while it was sent")
        self._left -= len(data)
        self.hasher.update(data)
        if self._progress and data:
            self._progress(len(data))
        return data

    def close(self) -> None:
        if self._f is not None:
            self._f.close()

    def __enter__(self) -> "FileBody":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_sent(entry: FileEntry, hasher, target: str) -> None:
    """After a file was sent, refuse to go on if its bytes were not what the manifest says."""
    actual = hasher.hexdigest()
    if actual != entry.sha256:
        raise IntegrityMismatch(entry.path, entry.sha256, actual,
                                detail=f"the bundle changed after it was built; nothing "
                                       f"was published to {target}")


def send_contents(bundle: LocalBundle, target: str, scheme: str, progress: Progress | None,
                  policy: RetryPolicy, present: Callable[[FileEntry], bool],
                  upload: Callable[[FileEntry, list[FileBody]], None],
                  part_size: int | None = None) -> None:
    """Send every distinct file content the target lacks, insisting on its sha256.

    ``present(entry)`` asks the target; ``upload(entry, parts)`` sends the file as
    consecutive :class:`FileBody` parts of ``part_size`` bytes (one part if None), which
    share one hasher. A transient failure repeats the whole file with fresh parts (per
    ``policy``); ``progress`` still adds up to the file's size once. If the target refuses
    a fully read file, a local change is reported as :class:`IntegrityMismatch` rather than
    as the target's refusal.
    """
    for entry in bundle.unique_files():
        if present(entry):
            if progress:
                progress(entry.size)
            continue
        reported = _Reported(progress)

        def attempt(entry: FileEntry = entry) -> None:
            hasher = hashlib.sha256()
            step = part_size or max(entry.size, 1)
            bounds = [(off, min(step, entry.size - off)) for off in range(0, entry.size, step)] or [(0, 0)]
            parts = [FileBody(bundle.path_of(entry), off, n, hasher, reported.count) for off, n in bounds]
            reported.restart()
            try:
                upload(entry, parts)
            except SourceUnavailable:
                if all(p.done for p in parts):
                    check_sent(entry, hasher, target)
                raise
            finally:
                for p in parts:
                    p.close()
            check_sent(entry, hasher, target)

        policy.call(attempt, scheme)
        PUSHED_BYTES.labels(scheme).inc(entry.size)


class _Reported:
    """Passes on only bytes beyond what earlier attempts at the same file already reported."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress, self.high, self.now = progress, 0, 0

    def restart(self) -> None:
        self.now = 0

    def count(self, n: int) -> None:
        self.now += n
        if self.progress and self.now > self.high:
            self.progress(self.now - self.high)
            self.high = self.now

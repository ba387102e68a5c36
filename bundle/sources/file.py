"""file:// sources and targets: a bundle directory as ``resident bundle build`` leaves it.

``file:///abs/dir`` names a directory holding ``resident-manifest.json`` and the files it
lists, at their relative paths. One directory holds one bundle.

Reads never leave the directory: the manifest's paths are already checked (no ``..``, no
absolute paths), and each file is opened only if its resolved path is still inside the
directory and it is a regular file, so a symlink planted in the source cannot redirect a
read elsewhere.

A push to ``file://`` builds the whole tree under a temporary sibling name, checks every
file's sha256 while copying, and renames it into place: the target is either absent or
complete. A target that already holds the same bundle is left as it is; one that holds
anything else is refused (:class:`TargetConflict`) and nothing in it is touched.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote, urlsplit

from ..errors import IntegrityMismatch, SourceUnavailable
from ..manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, FileEntry, ManifestError
from .metrics import FETCHED_BYTES, PUSHED_BYTES
from .publish import FileBody, Progress, TargetConflict, check_sent, open_bundle
from .source import BLOCK_SIZE, Source, check_range


def dir_from_uri(uri: str) -> Path:
    """The absolute directory a ``file://`` URI names."""
    parts = urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise ManifestError(f"{uri!r}: expected file:///absolute/path")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise ManifestError(f"{uri!r}: the path must be absolute (file:///dir)")
    return Path(path)


class FileSource(Source):
    scheme = "file"

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.root = dir_from_uri(uri)

    def manifest_bytes(self, digest: str) -> bytes:
        path = self.root / MANIFEST_NAME
        try:
            with open(path, "rb") as f:
                return f.read(MAX_MANIFEST_BYTES + 1)
        except OSError as e:
            raise SourceUnavailable(f"{self.uri}: cannot read {MANIFEST_NAME}: {e.strerror}") from None

    def _open(self, entry: FileEntry):
        full = self.root / entry.path
        try:
            real = full.resolve(strict=True)
            root = self.root.resolve(strict=True)
        except OSError as e:
            raise SourceUnavailable(f"{self.uri}: {entry.path}: {e.strerror or e}") from None
        if not real.is_relative_to(root):
            raise SourceUnavailable(f"{self.uri}: {entry.path} resolves outside the bundle directory")
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            raise SourceUnavailable(f"{self.uri}: {entry.path}: {e.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise SourceUnavailable(f"{self.uri}: {entry.path} is not a regular file")
        return os.fdopen(fd, "rb")

    def read(self, entry: FileEntry, offset: int, length: int) -> Iterator[bytes]:
        check_range(entry, offset, length)
        return self._blocks(entry, offset, length)

    def _blocks(self, entry: FileEntry, offset: int, length: int) -> Iterator[bytes]:
        if length == 0:
            return
        with self._open(entry) as f:
            f.seek(offset)
            left = length
            while left:
                block = f.read(min(BLOCK_SIZE, left))
                if not block:
                    raise IntegrityMismatch(entry.path, entry.sha256, None, received=length - left,
                                            wanted=length, detail=f"{self.uri} ends early")
                left -= len(block)
                FETCHED_BYTES.labels(self.scheme).inc(len(block))
                yield block


def push_dir(bundle_dir: Path | str, uri: str, progress: Progress | None = None) -> str:
    """Copy a built bundle to the directory ``uri`` names; return the bundle digest."""
    bundle = open_bundle(bundle_dir)
    target = dir_from_uri(uri)
    if _holds_bundle(target, bundle.digest):
        return bundle.digest
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise TargetConflict(f"{target}: exists and is not empty (nor holds bundle {bundle.digest}); "
                             "refusing to overwrite it")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.push-", dir=target.parent))
    try:
        for entry in bundle.manifest.files:
            dest = staging / entry.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            with FileBody(bundle.path_of(entry), 0, entry.size, hashlib.sha256(), progress) as body, \
                    open(dest, "wb") as out:
                while block := body.read(BLOCK_SIZE):
                    out.write(block)
                    PUSHED_BYTES.labels("file").inc(len(block))
            check_sent(entry, body.hasher, uri)
        (staging / MANIFEST_NAME).write_bytes(bundle.manifest_bytes)
        os.chmod(staging, 0o755)
        os.rename(staging, target)  # replaces an empty directory atomically
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return bundle.digest


def _holds_bundle(target: Path, digest: str) -> bool:
    try:
        data = (target / MANIFEST_NAME).read_bytes()
    except OSError:
        return False
    return "sha256:" + hashlib.sha256(data).hexdigest() == digest

"""The volume directory: what a Pod sees at its CSI mount.

```
<volume>/current                 -> revisions/sha256-<hex>   (relative symlink)
<volume>/revisions/sha256-<hex>/ resident-manifest.json + the bundle's files
```
Revision trees are hardlink copies of the store's revision (``Store.link_tree``), so
every Pod of one bundle shares one copy on disk. A revision is linked into
``<volume>/.incoming/`` first and renamed into ``revisions/`` only when whole, and
``current`` is replaced by renaming a new symlink over it, so a reader (or a bridge that
crashed half way) never sees a partial tree. ``.incoming`` is scratch: reconciling a
volume empties it.

The bind mount shows the whole volume directory, so a revision staged here later (a
BundleDelivery) appears in the Pod's read-only mount without remounting.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from bundle.manifest import DIGEST_RE, MANIFEST_NAME, revision_dirname
from . import mountinfo

INCOMING = ".incoming"
REVISIONS = "revisions"
CURRENT = "current"


class VolumeError(OSError):
    """A volume directory cannot be built or removed safely."""


def revision_dir(volume: Path, digest: str) -> Path:
    return Path(volume) / REVISIONS / revision_dirname(digest)


def has_revision(volume: Path, digest: str) -> bool:
    return (revision_dir(volume, digest) / MANIFEST_NAME).is_file()


def holds_store_tree(store, volume: Path, digest: str) -> bool:
    """Every file of revision ``digest`` in the volume is the store's (verified) inode with
    the manifest's size, and its manifest is the store's."""
    staged, src = revision_dir(volume, digest), store.revision_path(digest)
    manifest = store.manifest(digest)
    for entry in manifest.files:
        try:
            a, b = os.stat(staged / entry.path), os.stat(src / entry.path)
        except OSError:
            return False
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) or a.st_size != entry.size:
            return False
    return (staged / MANIFEST_NAME).read_bytes() == manifest.canonical_json()


def link_revision(store, volume: Path, digest: str) -> Path:
    """Hardlink the store's revision ``digest`` into the volume (whole, or not at all).

    A tree of ``digest`` already there is kept when it is the store's. One that is not was
    left by an earlier staging whose store copy the store collected since (a revision the
    volume holds but ``current`` does not name is not leased): the store has made it again,
    and the volume gets the store's tree in its place (the chaos soak's hour found a switch
    back to such a revision failing its verification for good)."""
    volume = Path(volume)
    final = revision_dir(volume, digest)
    if final.is_dir():
        if current_digest(volume) == digest or holds_store_tree(store, volume, digest):
            return final
        unlink_revision(volume, digest)
    incoming = volume / INCOMING
    clear_incoming(volume)
    incoming.mkdir(parents=True, exist_ok=True)
    (volume / REVISIONS).mkdir(parents=True, exist_ok=True)
    staged = incoming / final.name
    store.link_tree(digest, staged)
    if not (staged / MANIFEST_NAME).is_file():
        # The store's tree lacks the manifest: write it from the store's record.
        (staged / MANIFEST_NAME).write_bytes(store.manifest(digest).canonical_json())
    os.rename(staged, final)
    os.rmdir(incoming)
    _fsync_dir(volume / REVISIONS)
    return final


def set_current(volume: Path, digest: str) -> None:
    """Point ``current`` at ``revisions/<digest>`` atomically (rename over the old link)."""
    volume = Path(volume)
    if not revision_dir(volume, digest).is_dir():
        raise VolumeError(errno.ENOENT, f"{volume}: revision {digest} is not staged")
    tmp = volume / ".current.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(f"{REVISIONS}/{revision_dirname(digest)}", tmp)
    os.replace(tmp, volume / CURRENT)
    _fsync_dir(volume)


def current_digest(volume: Path) -> str | None:
    """The digest ``current`` points at, or None if the link is absent or malformed."""
    try:
        target = os.readlink(Path(volume) / CURRENT)
    except OSError:
        return None
    name = target.rsplit("/", 1)[-1]
    digest = name.replace("-", ":", 1)
    return digest if DIGEST_RE.match(digest) and has_revision(volume, digest) else None


def build(store, volume: Path, digest: str, keep_current: bool = False) -> None:
    """Make ``volume`` hold ``digest``, as its current revision (idempotent). With
    ``keep_current`` (a volume published before, built again: a remount after a node
    reboot), a ``current`` that points at a whole revision stays: the volume may have
    switched since it was published, and the owner must come back on that revision."""
    Path(volume).mkdir(parents=True, exist_ok=True)
    link_revision(store, volume, digest)
    current = current_digest(volume)
    if current != digest and not (keep_current and current is not None):
        set_current(volume, digest)


def unlink_revision(volume: Path, digest: str) -> bool:
    """Remove revision ``digest`` from the volume unless ``current`` points at it; False if
    it stays. It is moved out of ``revisions/`` first (one rename, to a name of its own, so a
    stage running into ``.incoming/`` meanwhile is not touched), so a reader sees it whole
    or not at all; files an owner still has open or mapped stay readable to it."""
    volume = Path(volume)
    final = revision_dir(volume, digest)
    if not final.is_dir() or current_digest(volume) == digest:
        return False
    doomed = volume / f".released-{final.name}"
    if doomed.exists():
        shutil.rmtree(doomed)
    os.rename(final, doomed)
    _fsync_dir(volume / REVISIONS)
    shutil.rmtree(doomed)
    return True


def clear_incoming(volume: Path) -> None:
    incoming = Path(volume) / INCOMING
    if incoming.exists():
        refuse_if_mounted(incoming)
        shutil.rmtree(incoming)


def refuse_if_mounted(path: Path) -> None:
    busy = mountinfo.mounts_under(path)
    if busy:
        raise VolumeError(errno.EBUSY, f"{path}: still has a mount at {busy[0].mount_point}; "
                          "refusing to delete it")


def remove(volume: Path) -> bool:
    """Delete a volume directory that nothing is mounted on or under; False if absent."""
    volume = Path(volume)
    if not volume.exists():
        return False
    refuse_if_mounted(volume)
    shutil.rmtree(volume)
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

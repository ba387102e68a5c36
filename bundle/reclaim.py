"""Giving space back: reclaiming abandoned work on open, and garbage collection.

*Reclaim* runs when a store is opened. A materialization holds an flock on
``work/<token>.lock`` for as long as it runs, so a token whose lock can be taken belongs
to a process that died (killed, crashed, power cut). Its work directory is deleted, a
revision tree it may have renamed into place but not committed is removed, and its
catalog rows (staging revision, blob refs, donor pin) are forgotten. Stray directories
and blob files the catalog does not know are removed too. Nothing that a live process
is working on is touched.

*GC* (:func:`collect`) runs only above a high watermark and stops at the low one. It
first drops blobs no revision refers to (leftovers of failed work), then removes ready,
unleased revisions, least recently used first, with the blobs only they used. Choosing
and unlinking from the catalog happen in one IMMEDIATE transaction, and the directories
are moved to ``trash/`` inside it, so a lease racing GC either pins the revision before
GC looks or finds it already gone. The trash is deleted after the commit.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from .manifest import check_digest, revision_dirname

if TYPE_CHECKING:
    from .store import Store

#: work entries without a catalog row are left alone this long (seconds) after creation
STRAY_GRACE_SECONDS = 60.0


def remove_tree(path: Path) -> None:
    """Delete a (possibly read-only) tree or file; absent is fine. Never follows symlinks."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
        return
    try:
        os.chmod(path, stat.S_IRWXU)
        for dirpath, dirnames, _ in os.walk(path):
            for d in dirnames:
                p = os.path.join(dirpath, d)
                if not os.path.islink(p):
                    os.chmod(p, stat.S_IRWXU)
        shutil.rmtree(path)
    except FileNotFoundError:  # someone else removed (part of) it first
        shutil.rmtree(path, ignore_errors=True)


def _is_alive(lock_path: Path) -> bool:
    """True if some process holds the work lock; False if the lock is free or missing."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)


def _age_seconds(path: Path) -> float:
    try:
        return time.time() - path.lstat().st_mtime
    except FileNotFoundError:
        return float("inf")


def reclaim(store: "Store") -> dict[str, int]:
    """Remove what interrupted materializations left; return counts of what was removed."""
    work_dir, counts = store.root / "work", {"work": 0, "trees": 0, "blobs": 0}
    live = set()
    for token, digest in store.catalog.abandoned_work():
        if _is_alive(work_dir / f"{token}.lock"):
            live.add(token)
            continue
        if store.catalog.revision_state(digest) == "staging":
            remove_tree(store.revision_path(digest))
        store.catalog.forget_work(token)
        remove_tree(work_dir / token)
        (work_dir / f"{token}.lock").unlink(missing_ok=True)
        counts["work"] += 1
    known_work = {t for t, _ in store.catalog.abandoned_work()}
    for entry in work_dir.iterdir():
        token = entry.name.removesuffix(".lock")
        if token in live or _is_alive(work_dir / f"{token}.lock"):
            continue
        if token not in known_work and _age_seconds(entry) < STRAY_GRACE_SECONDS:
            continue  # perhaps a materialization between creating its lock and taking it
        counts["work"] += entry.is_dir()
        remove_tree(entry)
    for digest in store.catalog.staging_without_work():
        remove_tree(store.revision_path(digest))
        store.catalog.drop_revision(digest)
    ready = {revision_dirname(d) for d in store.catalog.ready_revisions()}
    staging_live = {revision_dirname(d) for t, d in store.catalog.abandoned_work() if t in live}
    for tree in (store.root / "revisions").iterdir():
        if tree.name not in ready and tree.name not in staging_live:
            remove_tree(tree)
            counts["trees"] += 1
    if not live:
        known = store.catalog.blob_keys()
        for blob in (store.root / "blobs").glob("*/*"):
            if blob.name not in known:
                blob.unlink(missing_ok=True)
                counts["blobs"] += 1
        for key in known:
            if not store.blob_path(key).is_file():
                store.catalog.drop_blob(key)
    for leftover in (store.root / "trash").iterdir():
        if _age_seconds(leftover) >= STRAY_GRACE_SECONDS:  # else perhaps a running GC's
            remove_tree(leftover)
    return counts


def collect(store: "Store", high: int, low: int) -> list[str]:
    """GC: if usage > ``high``, remove unleased content LRU-first until usage <= ``low``."""
    if store.usage_bytes() <= high:
        return []
    trash = store.root / "trash" / uuid.uuid4().hex
    trash.mkdir()
    removed: list[str] = []
    moved: list[tuple[Path, Path]] = []

    def move(src: Path, dst: Path) -> None:
        os.rename(src, dst)
        moved.append((src, dst))

    committed = False
    try:
        with store.catalog.write() as db:
            usage = int(db.execute("SELECT COALESCE(SUM(size),0) FROM blobs").fetchone()[0])

            def drop_unreferenced(keys: list[str] | None) -> None:
                nonlocal usage
                q = ("SELECT key, size FROM blobs WHERE key NOT IN "
                     "(SELECT key FROM revision_blobs)")
                rows = db.execute(q).fetchall()
                if keys is not None:
                    rows = [r for r in rows if r[0] in set(keys)]
                for key, size in sorted(rows):
                    if usage <= low:
                        return
                    path = store.blob_path(key)
                    if path.exists():
                        move(path, trash / key)
                    db.execute("DELETE FROM blobs WHERE key=?", (key,))
                    usage -= size

            drop_unreferenced(None)
            victims = [r[0] for r in db.execute(
                "SELECT digest FROM revisions WHERE state='ready' AND digest NOT IN "
                "(SELECT digest FROM leases) ORDER BY last_used_ns, digest")]
            for digest in victims:
                if usage <= low:
                    break
                check_digest(digest)
                keys = [r[0] for r in db.execute(
                    "SELECT key FROM revision_blobs WHERE digest=?", (digest,))]
                tree = store.revision_path(digest)
                if tree.exists():
                    move(tree, trash / tree.name)
                db.execute("DELETE FROM revision_blobs WHERE digest=?", (digest,))
                db.execute("DELETE FROM revisions WHERE digest=?", (digest,))
                removed.append(digest)
                drop_unreferenced(keys)
        committed = True
    finally:
        if not committed:  # the catalog rolled back: put every file back where it was
            for src, dst in reversed(moved):
                os.rename(dst, src)
        remove_tree(trash)
    return removed

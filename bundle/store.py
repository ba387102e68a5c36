"""The node content store: verified content by digest, and revision trees built from it.

A store is one directory the bridge owns (it must be one filesystem, for hardlinks)::

    store.db                    catalog (SQLite, WAL): blobs, revisions, leases, work
    blobs/<k[:2]>/<k>           read-only file contents by content key (sha256-derived)
    revisions/sha256-<hex>/     read-only revision trees: resident-manifest.json + files,
                                every file a hardlink to its blob
    work/<token>/               temporary files of one materialization (+ <token>.lock)
    locks/<hex>.lock            one flock per digest: one materialization at a time
    trash/                      what GC and reclaim are deleting

:meth:`Store.materialize` plans the delivery (:mod:`bundle.plan`), builds missing blobs
(:mod:`bundle.materialize`), stages the tree under ``work/`` and renames it into
``revisions/``: a tree is complete or absent, never partial. A failure removes the work
directory; work abandoned by a crash is reclaimed when the store is next opened
(:mod:`bundle.reclaim`). Leases pin revisions against :meth:`Store.gc`. Each
materialization records how fast it fetched and copied (:mod:`bundle.throughput`); a
store without reflink plans with those speeds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

from .catalog import Catalog
from .errors import PlanError, StoreError, StoreFull
from .manifest import MANIFEST_NAME, Manifest, check_digest, check_relative_path, revision_dirname
from .materialize import BLOB_MODE, BundleSource, Progress, Tally, build_blob
from .plan import DeliveryPlan, content_key, plan_delivery
from .reflink import supports_reflink
from . import leases as leasing, reclaim, store_metrics as metrics, throughput
from .leases import Lease

__all__ = ["Store", "MaterializeResult", "FilesystemBytes", "Lease"]
log = logging.getLogger("resident.bundle.store")
TREE_DIR_MODE = 0o555


class FilesystemBytes(NamedTuple):
    size: int
    used: int
    available: int   # for unprivileged writers; ``df``'s Use% is used / (used + available)


@dataclass(frozen=True)
class MaterializeResult:
    digest: str
    path: Path
    method: str                      # present | graph-only | rebase | reconstruct
    fallback_reason: str | None
    bytes_fetched: int
    bytes_reused: int
    bytes_written: int
    seconds: float
    verified: bool
    bytes_cloned: int = 0
    plan: DeliveryPlan | None = None
    cost_reason: str | None = None   # without reflink: how rebase and reconstruct compared

    def to_status(self) -> dict:
        """camelCase fields for a BundleDelivery status."""
        return {"digest": self.digest, "method": self.method,
                "fallbackReason": self.fallback_reason, "costReason": self.cost_reason,
                "verified": self.verified,
                "bytes": {"fetched": self.bytes_fetched, "reused": self.bytes_reused,
                          "written": self.bytes_written},
                "seconds": round(self.seconds, 6)}


class Store:
    """A node content store rooted at ``root`` (created if missing)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        for sub in ("blobs", "revisions", "work", "locks", "trash"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.catalog = Catalog(self.root / "store.db")
        self.reflink = supports_reflink(self.root / "work")
        self.reclaimed = self._reclaim_if_idle()
        metrics.STORE_BYTES.set(self.usage_bytes())

    # -- activity: reclaim only when no other process works in the store -----------
    @contextlib.contextmanager
    def _active(self, mode: int) -> Iterator[bool]:
        """flock ``activity.lock``: shared while materializing or collecting, exclusive for
        reclaim. Yields False when a non-blocking request could not be granted."""
        fd = os.open(self.root / "activity.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, mode)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def _reclaim_if_idle(self) -> dict[str, int]:
        """Reclaim what interrupted work left, unless another process (or another Store of
        this one) is materializing right now: its work in progress would look abandoned."""
        with self._active(fcntl.LOCK_EX | fcntl.LOCK_NB) as idle:
            if idle:
                return reclaim.reclaim(self)
        log.info("store busy in another process; reclaim deferred to the next open")
        return {"work": 0, "trees": 0, "blobs": 0}

    # -- paths and lookups ---------------------------------------------------------
    def blob_path(self, key: str) -> Path:
        return self.root / "blobs" / key[:2] / key

    def revision_path(self, digest: str) -> Path:
        return self.root / "revisions" / revision_dirname(digest)

    def has_revision(self, digest: str) -> bool:
        return (self.catalog.revision_state(check_digest(digest)) == "ready"
                and self.revision_path(digest).is_dir())

    def manifest(self, digest: str) -> Manifest:
        if not self.has_revision(digest):
            raise StoreError(f"revision {digest} is not in the store")
        m = Manifest.parse((self.revision_path(digest) / MANIFEST_NAME).read_bytes())
        if m.digest != digest:
            raise StoreError(f"store revision {digest} holds a manifest of digest {m.digest}")
        return m

    def usage_bytes(self) -> int:
        return self.catalog.usage_bytes()

    def reclaimable_bytes(self) -> int:
        """What GC could remove if it ran now with a low watermark of 0 (unleased content)."""
        return self.catalog.reclaimable_bytes()

    def filesystem_bytes(self) -> FilesystemBytes:
        """Size, used and available bytes of the filesystem the store is on, as ``df`` says."""
        st = os.statvfs(self.root)
        return FilesystemBytes(st.f_blocks * st.f_frsize, (st.f_blocks - st.f_bfree) * st.f_frsize,
                               st.f_bavail * st.f_frsize)

    def revisions(self) -> list[str]:
        return sorted(self.catalog.ready_revisions())

    # -- materialization -----------------------------------------------------------
    @contextlib.contextmanager
    def _digest_lock(self, digest: str) -> Iterator[None]:
        fd = os.open(self.root / "locks" / (revision_dirname(digest) + ".lock"),
                     os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def materialize(self, manifest: Manifest, source: BundleSource, *, donor: str | None = None,
                    mode: str = "Auto", rebase: str = "Auto", min_reuse: float = 0.5,
                    progress: Progress | None = None) -> MaterializeResult:
        """Make revision ``manifest.digest`` present in the store, verified.

        Idempotent; concurrent calls for one digest (threads or processes) serialize on
        its lock and the later ones return ``method="present"``. Raises IntegrityMismatch,
        SourceUnavailable, StoreFull or PlanError, leaving no revision behind.
        """
        digest, t0 = manifest.digest, time.monotonic()
        source_uri = getattr(source, "uri", None)  # real sources have one; keys throughput
        if donor is not None:
            check_digest(donor)
        for entry in manifest.files:  # defence in depth: a Manifest built without validation
            check_relative_path(entry.path)
        with self._active(fcntl.LOCK_SH), self._digest_lock(digest):
            if self.has_revision(digest):
                self.catalog.touch(digest)
                return MaterializeResult(digest, self.revision_path(digest), "present", None,
                                         0, 0, 0, time.monotonic() - t0, True)
            if self.catalog.revision_state(digest) == "ready":  # its tree was deleted
                log.warning("revision tree missing; rebuilding", extra={"digest": digest})
                self.catalog.drop_revision(digest)
            token = uuid.uuid4().hex
            work = self.root / "work" / token
            lock_fd = os.open(self.root / "work" / f"{token}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            published = False
            try:
                work.mkdir()
                plan, donor_dir = self._plan_and_register(manifest, token, donor, mode, rebase,
                                                          min_reuse, source_uri)
                tally = self._build(manifest, plan, source, work, donor_dir, progress)
                self._publish(manifest, work / "tree", token)
                published = True
            except StoreFull as e:
                raise self._no_space(manifest, e) from None
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise self._no_space(manifest, e) from None
                raise
            except sqlite3.OperationalError as e:
                if "full" in str(e):
                    raise self._no_space(manifest, e) from None
                raise
            finally:
                reclaim.remove_tree(work)  # first: frees space the catalog may need
                if not published:
                    self.catalog.finish_work(token, digest, publish=False)
                (self.root / "work" / f"{token}.lock").unlink(missing_ok=True)
                os.close(lock_fd)
        seconds = time.monotonic() - t0
        res = MaterializeResult(digest, self.revision_path(digest), plan.method,
                                plan.fallback_reason, tally.fetched, tally.reused, tally.written,
                                seconds, True, tally.cloned, plan, plan.cost_reason)
        self._record(res)
        try:  # a published revision never fails over its statistics
            throughput.record_tally(self.catalog, source_uri, tally)
        except sqlite3.Error as e:
            log.warning("throughput not recorded: %s", e)
        return res

    def _no_space(self, manifest: Manifest, cause: BaseException) -> StoreFull:
        """StoreFull naming the revision's size, the filesystem's and what GC could free."""
        size = self.filesystem_bytes().size
        try:
            held = (f"the store holds {self.usage_bytes()} bytes, "
                    f"{self.reclaimable_bytes()} of them unleased (collectable)")
        except sqlite3.Error:
            held = "the store catalog is unreadable"
        return StoreFull(f"no space in the node store for {manifest.digest} "
                         f"({manifest.total_bytes} bytes) on a {size}-byte filesystem; {held}: "
                         f"{cause}")

    def throughputs(self, source_uri: str | None) -> tuple[float | None, float | None]:
        """Measured bytes/s: (fetching from this source, copying locally); None if unknown."""
        return throughput.estimates(self.catalog, source_uri)

    def _plan_and_register(self, manifest: Manifest, token: str, donor: str | None, mode: str,
                           rebase: str, min_reuse: float,
                           source_uri: str | None) -> tuple[DeliveryPlan, Path | None]:
        """Plan against the donor and pin it; if GC removed it meanwhile, plan without it.
        Without reflink, the plan weighs a rebase with the speeds measured before."""
        reason = None
        source_bps, copy_bps = (None, None) if self.reflink else self.throughputs(source_uri)
        for _ in range(2):
            donor_manifest = None
            if donor and donor != manifest.digest:
                if self.has_revision(donor):
                    donor_manifest = self.manifest(donor)
                elif mode == "GraphOnly":
                    raise PlanError(f"graph-only needs donor {donor} on the node; "
                                    "the store does not hold it")
                else:
                    reason = f"donor {donor} is not in the store"
            plan = plan_delivery(manifest, donor_manifest, mode=mode, rebase=rebase,
                                 min_reuse=min_reuse, reflink=self.reflink,
                                 source_bps=source_bps, copy_bps=copy_bps)
            if reason and plan.fallback_reason is None:
                plan = _with_reason(plan, reason)
            keys = {content_key(f, manifest.chunk_size) for f in manifest.files}
            if self.catalog.begin_work(token, manifest.digest, os.getpid(), manifest.total_bytes,
                                       keys, donor if donor_manifest else None):
                return plan, self.revision_path(donor) if donor_manifest else None
            reason = f"donor {donor} was removed from the store while planning"
            donor = None
        raise StoreError("could not register the materialization")  # unreachable

    def _build(self, manifest: Manifest, plan: DeliveryPlan, source: BundleSource, work: Path,
               donor_dir: Path | None, progress: Progress | None) -> Tally:
        tally, done = Tally(), set()
        entries = manifest.by_path()
        for n, fp in enumerate(plan.files):
            entry = entries[fp.path]
            key = content_key(entry, manifest.chunk_size)
            blob = self.blob_path(key)
            if key in done or (self.catalog.has_blob(key) and blob.is_file()):
                tally.reused += entry.size  # content-addressed: already verified and stored
                if progress:
                    progress(entry.size)
            else:
                tmp = work / f"blob-{n}"
                build_blob(tmp, entry, fp, manifest.chunk_size, source, donor_dir, self.reflink,
                           tally, progress)
                blob.parent.mkdir(exist_ok=True)
                os.replace(tmp, blob)
                self.catalog.add_blob(key, entry.size)
            done.add(key)
        tree = work / "tree"
        tree.mkdir()
        for entry in manifest.files:
            dest = tree / entry.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(self.blob_path(content_key(entry, manifest.chunk_size)), dest)
        mf = tree / MANIFEST_NAME
        mf.write_bytes(manifest.canonical_json())
        mf.chmod(BLOB_MODE)
        for d in sorted((p for p in tree.rglob("*") if p.is_dir()), reverse=True):
            d.chmod(TREE_DIR_MODE)
        tree.chmod(TREE_DIR_MODE)
        return tally

    def _publish(self, manifest: Manifest, tree: Path, token: str) -> None:
        final = self.revision_path(manifest.digest)
        if final.exists():  # a leftover nobody references (the catalog says not ready)
            reclaim.remove_tree(final)
        os.rename(tree, final)
        try:
            dfd = os.open(final.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            self.catalog.finish_work(token, manifest.digest, publish=True)
        except BaseException:
            reclaim.remove_tree(final)
            raise

    def _record(self, res: MaterializeResult) -> None:
        metrics.DELIVERY_BYTES.labels("fetched").inc(res.bytes_fetched)
        metrics.DELIVERY_BYTES.labels("reused").inc(res.bytes_reused)
        metrics.DELIVERY_BYTES.labels("written").inc(res.bytes_written)
        metrics.MATERIALIZE_SECONDS.labels(res.method).observe(res.seconds)
        metrics.STORE_BYTES.set(self.usage_bytes())
        log.info("materialized", extra={
            "digest": res.digest, "method": res.method, "fallback_reason": res.fallback_reason,
            "cost_reason": res.cost_reason,
            "bytes_fetched": res.bytes_fetched, "bytes_reused": res.bytes_reused,
            "bytes_written": res.bytes_written, "bytes_cloned": res.bytes_cloned,
            "seconds": round(res.seconds, 4), "reflink": self.reflink})

    # -- trees outside the store ---------------------------------------------------
    def link_tree(self, digest: str, dest: Path | str) -> Path:
        """Hardlink revision ``digest`` at ``dest`` (same filesystem), staged then renamed.

        Idempotent when ``dest`` already holds this revision; refuses any other ``dest``
        that exists. Hold a lease on ``digest`` while doing this.
        """
        dest = Path(dest)
        manifest = self.manifest(digest)
        if dest.exists() or dest.is_symlink():
            mf = dest / MANIFEST_NAME
            if mf.is_file() and mf.read_bytes() == manifest.canonical_json():
                return dest
            raise StoreError(f"{dest} exists and is not a tree of revision {digest}")
        src = self.revision_path(digest)
        stage = dest.parent / f".{dest.name}.staging-{uuid.uuid4().hex[:12]}"
        try:
            stage.mkdir(parents=True)
            for entry in manifest.files:
                target = stage / entry.path
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(src / entry.path, target)
            os.link(src / MANIFEST_NAME, stage / MANIFEST_NAME)
            os.rename(stage, dest)
        except OSError as e:
            reclaim.remove_tree(stage)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFull(f"no space to link {digest} at {dest}: {e}") from None
            if e.errno == errno.ENOENT and not self.has_revision(digest):
                raise StoreError(f"revision {digest} was removed while linking it") from None
            raise
        self.catalog.touch(digest)
        return dest

    # -- leases and GC -------------------------------------------------------------
    def acquire_lease(self, holder: str, digest: str) -> bool:
        """Pin ``digest`` for ``holder``; True if the revision is present now (see leases)."""
        return leasing.acquire(self.catalog, holder, digest)

    def release_lease(self, holder: str) -> bool:
        return leasing.release(self.catalog, holder)

    def leases(self) -> list[Lease]:
        return leasing.held(self.catalog)

    def gc(self, high_water_bytes: int, low_water_bytes: int) -> list[str]:
        """Above ``high_water_bytes``, remove unleased content LRU-first down to ``low``."""
        if low_water_bytes > high_water_bytes or low_water_bytes < 0:
            raise ValueError("need 0 <= low_water_bytes <= high_water_bytes")
        with self._active(fcntl.LOCK_SH):
            removed = reclaim.collect(self, high_water_bytes, low_water_bytes)
        metrics.STORE_BYTES.set(self.usage_bytes())
        return removed


def _with_reason(plan: DeliveryPlan, reason: str) -> DeliveryPlan:
    from dataclasses import replace
    return replace(plan, fallback_reason=reason)

"""Publish and unpublish: from a validated request to a verified read-only mount and back.

Publish, in order (each step is safe to repeat, so a retry or a restarted bridge picks
up where the last attempt stopped):

1. Compare with the publication already recorded at the target: the same volume and
   bundle answers OK once its mount checks out; anything else is ALREADY_EXISTS.
2. Authorize the Pod's namespace (no filesystem work before this), and prove that the
   namespace's source serves the bundle (:mod:`csi_bridge.possession`): knowing a digest
   the store holds is not enough to mount it. A digest the store lacks is proven by its
   fetch from that source, and checked again once it is in the store (3).
3. Materialize the revision in the store, in the background if it takes long: ABORTED
   with progress while bytes arrive; UNAVAILABLE when the fetch is stalled; the last
   failure's own code and message while a retry after a failure runs (a failure is
   logged and kept in ``bridge.db`` until a fetch of that revision succeeds).
4. Record the publication as ``publishing`` and take its lease (holder ``volume:<dir>``).
5. Build the volume directory (hardlinks from the store, ``current`` link).
6. Create the target, bind-mount the volume read-only, verify ``ro`` in mountinfo.
7. Record it ``published``.

Unpublish marks the record ``unpublishing``, unmounts, removes the target and the volume
directory, releases exactly that publication's lease and deletes the record. An unknown
volume or an absent target answers OK. Leases are released only here, never on an error
path.

Every read of the source for a publish (the fetch, the proof) uses the credentials that
publish brought (its ``secrets``); a publish that succeeds or is confirmed leaves them
with the volume for later deliveries into it (:mod:`csi_bridge.volume_credentials`), and
unpublish drops them.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import threading
from pathlib import Path

import grpc

from bundle.errors import BundleError
from bundle.manifest import MANIFEST_NAME
from . import checkpoints, mountinfo, mounts, volumes
from .arguments import PublishArgs, UnpublishArgs
from .authorization import Authorizer, Denied, Unchecked
from .fetches import Fetch, Fetches
from .locks import VolumeLocks
from .metrics import BridgeMetrics
from .peering import peer_bytes
from .possession import NotProven, Possession
from .state import BridgeState, Publication
from .status import CsiError, from_bundle_error
from .volume_credentials import VolumeCredentials

log = logging.getLogger("resident.bridge.publish")
STALL_SECONDS = 30.0  # a fetch with no byte for this long (or the call's wait) is stalled


def volume_dirname(volume_id: str, target_path: str) -> str:
    return hashlib.sha256(f"{volume_id}\0{target_path}".encode()).hexdigest()[:32]


def lease_holder(volume_dir: str | Path) -> str:
    return f"volume:{Path(volume_dir).name}"


class Publisher:
    def __init__(self, store, state: BridgeState, volumes_root: Path, authorizer: Authorizer,
                 metrics: BridgeMetrics, locks: VolumeLocks, open_source, protected_dirs=()):
        self.store, self.state, self.authorizer = store, state, authorizer
        self.volumes_root = Path(volumes_root)
        self.metrics, self.locks = metrics, locks
        self.open_source = open_source    # open_source(uri, credentials=...): a bundle.sources.Source
        self.peering = None               # a csi_bridge.peering.Peering: peers in front of the origin
        self.credentials = VolumeCredentials()
        self.possession = Possession(state, open_source, protected_dirs)
        self.fetches = Fetches(self._materialize)
        self.gc_guard = threading.Lock()  # replaced by the Collector's guard when GC runs
        self.collect = lambda: None       # Collector.collect: after a new publication or an unpublish

    # -- publish -----------------------------------------------------------------------
    def publish(self, args: PublishArgs, wait_seconds: float) -> str:
        """Publish or confirm; returns 'published', 'confirmed' or 'repaired'. Raises CsiError."""
        result = self._publish(args, wait_seconds)
        self.credentials.remember(args.target_path, args.credentials)
        if result == "published":
            self.collect()  # the new revision is leased; older unleased ones may have to go
        return result

    def _publish(self, args: PublishArgs, wait_seconds: float) -> str:
        try:
            held = self.locks.hold(f"volume {args.volume_id}", f"target {args.target_path}")
            held.__enter__()
        except CsiError:
            # kubelet publishes mounted volumes again about once a minute (requiresRepublish);
            # one that arrives while a delivery stages into the volume is confirmed, not
            # ABORTED, which kubelet would report as a FailedMount of a running Pod
            if self._published_as_asked(args):
                return "confirmed"
            raise
        try:
            return self._publish_held(args, wait_seconds)
        finally:
            held.__exit__(None, None, None)

    def _published_as_asked(self, args: PublishArgs) -> bool:
        rec = self.state.publication(args.target_path)
        return (rec is not None and rec.state == "published"
                and (rec.volume_id, rec.digest) == (args.volume_id, args.bundle.digest)
                and self._mount_intact(rec))

    def _publish_held(self, args: PublishArgs, wait_seconds: float) -> str:
        rec = self.state.publication(args.target_path)
        if rec is not None and rec.state == "unpublishing":
            self.finish_unpublish(rec)  # an interrupted unpublish is finished first
            rec = None
        if rec is not None:
            if (rec.volume_id, rec.digest) != (args.volume_id, args.bundle.digest):
                raise CsiError(grpc.StatusCode.ALREADY_EXISTS,
                               f"target {args.target_path} already holds volume {rec.volume_id} "
                               f"with bundle {rec.digest}; refusing volume {args.volume_id} "
                               f"with bundle {args.bundle.digest}")
            if rec.state == "published" and self._mount_intact(rec):
                return "confirmed"
        else:
            if mountinfo.mount_at(args.target_path) is not None:
                raise CsiError(grpc.StatusCode.ALREADY_EXISTS,
                               f"target {args.target_path} is already a mount point the bridge "
                               "did not make")
            try:
                self.authorizer.authorize(args.pod, args.bundle)
            except Unchecked as e:   # the API server away: kubelet retries
                raise CsiError(grpc.StatusCode.UNAVAILABLE, str(e)) from None
            except Denied as e:
                self.metrics.unauthorized_mounts.labels(reason="namespace").inc()
                raise CsiError(grpc.StatusCode.PERMISSION_DENIED, str(e)) from None
            self._prove(args, before_fetch=True)
        self._materialized(args, wait_seconds)
        if rec is None:   # a new publication: its own source served what the store holds
            self._prove(args)
        with self.gc_guard:  # no GC between "the revision is there" and "it is leased"
            if not self.store.has_revision(args.bundle.digest):
                raise CsiError(grpc.StatusCode.ABORTED,
                               f"{args.bundle.digest} was collected before it could be "
                               "leased; retry to fetch it again")
            if rec is None:
                vdir = self.volumes_root / volume_dirname(args.volume_id, args.target_path)
                rec = self.state.put_publication(Publication(
                    target_path=args.target_path, volume_id=args.volume_id,
                    volume_dir=str(vdir), digest=args.bundle.digest,
                    source=args.bundle.source, model=args.bundle.model,
                    pod_uid=args.pod.uid, pod_namespace=args.pod.namespace,
                    pod_name=args.pod.name, state="publishing"))
            self.store.acquire_lease(lease_holder(rec.volume_dir), rec.digest)
        self.complete(rec)
        return "published" if rec.state == "publishing" else "repaired"

    def complete(self, rec: Publication) -> None:
        """Steps 4-7 for a recorded publication; idempotent, used by publish and reconcile."""
        vdir, target = Path(rec.volume_dir), Path(rec.target_path)
        try:
            self.store.acquire_lease(lease_holder(vdir), rec.digest)
            checkpoints.reached("publish:after-lease")
            # a publication made before (remount, repair) keeps the revision it switched to
            volumes.build(self.store, vdir, rec.digest, keep_current=rec.state != "publishing")
        except BundleError as e:
            raise from_bundle_error(e, f"building the volume of {rec.digest}") from None
        except OSError as e:
            raise CsiError(grpc.StatusCode.INTERNAL, f"building volume for {rec.digest}: {e}") from None
        checkpoints.reached("publish:after-volume")
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CsiError(grpc.StatusCode.INTERNAL, f"creating target {target}: {e.strerror}") from None
        try:
            top = mountinfo.mount_at(target)
            if top is not None and mounts.shows(vdir, target) and not top.read_only:
                mounts.unmount(target)  # a half-made (read-write) bind from an earlier attempt
                top = None
            if top is None:
                mounts.bind_read_only(vdir, target,
                                      between=lambda: checkpoints.reached("publish:after-bind"))
            else:
                mounts.verify_read_only_bind(vdir, target)
        except mounts.MountError as e:
            raise CsiError(grpc.StatusCode.INTERNAL, f"mounting {target}: {e}") from None
        checkpoints.reached("publish:after-mount")
        self.state.set_publication_state(rec.target_path, "published")

    def _mount_intact(self, rec: Publication) -> bool:
        try:
            mounts.verify_read_only_bind(Path(rec.volume_dir), Path(rec.target_path))
        except mounts.MountError:
            return False
        return volumes.current_digest(Path(rec.volume_dir)) is not None

    def _prove(self, args: PublishArgs, before_fetch: bool = False) -> None:
        """The namespace's own source must serve the bundle before the store may serve it.

        Before the fetch, a digest the store lacks needs no proof yet: it is fetched from this
        very source (whose failure is then the fetch's, recorded and answered as such), and
        proven once it is in the store, as any store hit is."""
        digest, ns = args.bundle.digest, args.pod.namespace
        try:
            if before_fetch and not self.store.has_revision(digest):
                self.possession.refuse_protected(args.bundle.source, digest)
                return
            self.possession.prove(ns, args.bundle.source, digest, args.credentials)
        except NotProven as e:
            self.metrics.unauthorized_mounts.labels(reason="possession").inc()
            raise CsiError(grpc.StatusCode.PERMISSION_DENIED,
                           f"namespace {ns!r} may not mount {digest}: {e}; a digest alone "
                           "grants no access to a bundle") from None

    def _materialized(self, args: PublishArgs, wait_seconds: float) -> None:
        digest = args.bundle.digest
        if self.store.has_revision(digest):
            return
        job = self.fetches.start(digest, args.bundle.source, args.credentials)
        if self.fetches.wait(job, wait_seconds):
            if job.error is not None:
                raise failure_of(job)
            return
        last = self.state.fetch_failure(digest)
        if last is not None:  # kubelet keeps seeing the cause, not "in progress"
            raise CsiError(grpc.StatusCode[last.code],
                           f"{last.message} (failed {last.failures} times); retrying: {job.describe()}")
        if job.idle_seconds() >= max(1.0, min(STALL_SECONDS, wait_seconds)):
            raise CsiError(grpc.StatusCode.UNAVAILABLE,
                           f"{job.describe()}: stalled, no byte arrived for "
                           f"{job.idle_seconds():.0f}s; the fetch goes on in the background")
        raise CsiError(grpc.StatusCode.ABORTED,
                       f"{job.describe()}; the fetch continues in the background, retry to "
                       "finish the publish")

    def _materialize(self, job: Fetch):
        try:
            source = self.open_source(job.source, credentials=job.credentials)
            if self.peering is not None:
                source = self.peering.around(source, job.digest)
            try:
                manifest = source.fetch_manifest(job.digest)
                job.bytes_total = manifest.total_bytes
                res = self.store.materialize(manifest, source, progress=job.progress)
            finally:
                source.close()
        except BaseException as e:
            err = failure_of(job, e)
            self.state.record_fetch_failure(job.digest, job.source, err.code.name, err.message)
            self.metrics.fetch_failures.labels(err.code.name).inc()
            log.warning("fetch failed", extra={
                "digest": job.digest, "source": job.source, "code": err.code.name,
                "error": err.message, "bytes": job.bytes_done, "bytes_total": job.bytes_total,
                "duration_seconds": round(job.seconds(), 3)})
            raise
        self.state.clear_fetch_failure(job.digest)
        log.info("revision fetched", extra={
            "digest": job.digest, "source": job.source, "method": res.method, "bytes": res.bytes_fetched,
            **peer_bytes(source), "duration_seconds": round(job.seconds(), 3)})
        return res

    # -- unpublish ---------------------------------------------------------------------
    def unpublish(self, args: UnpublishArgs) -> str:
        """Returns 'unpublished' or 'unknown'; raises CsiError only if a step fails."""
        with self.locks.hold(f"volume {args.volume_id}", f"target {args.target_path}"):
            rec = self.state.publication(args.target_path)
            if rec is None or rec.volume_id != args.volume_id:
                return "unknown"
            self.state.set_publication_state(rec.target_path, "unpublishing")
            self.finish_unpublish(rec)
        self.collect()  # content may have become collectable
        return "unpublished"

    def finish_unpublish(self, rec: Publication) -> None:
        vdir, target = Path(rec.volume_dir), Path(rec.target_path)
        try:
            if mounts.shows(vdir, target) or mountinfo.mount_at(target) is not None:
                mounts.unmount_all(target)
            checkpoints.reached("unpublish:after-unmount")
            try:
                os.rmdir(target)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno == errno.ENOTEMPTY:
                    raise CsiError(grpc.StatusCode.INTERNAL,
                                   f"target {target} is not empty after unmount; left in place") from None
                raise
            volumes.remove(vdir)
        except (OSError, mounts.MountError) as e:
            raise CsiError(grpc.StatusCode.INTERNAL, f"unpublishing {target}: {e}") from None
        self.store.release_lease(lease_holder(vdir))
        self.state.delete_publication(rec.target_path)
        self.credentials.forget(rec.target_path)

    # -- stats -------------------------------------------------------------------------
    def usage(self, volume_id: str, volume_path: str) -> tuple[os.statvfs_result, int, str]:
        recs = [r for r in self.state.publications("volume_id=?", (volume_id,))]
        if not recs:
            raise CsiError(grpc.StatusCode.NOT_FOUND, f"volume {volume_id} is not published here")
        if not any(r.target_path == volume_path.rstrip("/") for r in recs):
            raise CsiError(grpc.StatusCode.NOT_FOUND,
                           f"volume {volume_id} is not published at {volume_path}")
        if not os.path.isdir(volume_path):
            raise CsiError(grpc.StatusCode.NOT_FOUND, f"volume path {volume_path} does not exist")
        rec = next(r for r in recs if r.target_path == volume_path.rstrip("/"))
        used = sum(f.stat().st_size for f in Path(rec.volume_dir).rglob("*")
                   if f.is_file() and not f.is_symlink())
        problem = "" if self._mount_intact(rec) else (
            f"{volume_path} is not a read-only mount of its volume with a valid current revision")
        return os.statvfs(volume_path), used, problem


def failure_of(job: Fetch, error: BaseException | None = None) -> CsiError:
    """The CsiError a failed fetch answers with: the source's own error, named."""
    return from_bundle_error(error or job.error, f"delivering {job.digest} from {job.source}")


__all__ = ["Publisher", "volume_dirname", "lease_holder", "MANIFEST_NAME"]

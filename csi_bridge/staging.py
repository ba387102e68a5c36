"""Live staging: put a new revision into a Pod's published volume, for a transition or ahead of one.

A BundleDelivery asks for revision X in the live volume of Pod P by path GraphOnly or
WholeBundle, optionally rebased on a donor (the volume's current revision by default).
With ``activate: false`` (a pre-staged revision: the model's ``spec.stage``, or the revision
kept for a rollback) X is staged beside the live revision and ``current`` stays where it
is; setting ``activate`` later (a switch to X) stages it again, which only moves ``current``.
Staging, in order, each step repeatable:

1. find the Pod's published volume (by Pod UID, and model when given), and authorize the
   delivery like a publish: its namespace must be the Pod's, and a ResidentModel there
   must declare the revision (the bridge's authorizer); a refusal takes no lease. A
   demotion (``activate: false`` on the revision the delivery already holds) is not
   authorized again: it makes nothing new readable;
2. record the delivery ``staging`` and take its lease (holder ``delivery:<uid>``);
3. materialize X in the store by the requested path, with the donor if the store has it
   (the store reports the method used and any fallback, e.g. rebase refused under
   ``minReuse`` and done as a reconstruct), reading the source with the credentials the
   volume's last publish brought (a source that reads credentials waits, Pending, until
   kubelet has published the volume since the bridge started);
4. hardlink X into ``<volume>/revisions/`` (whole or not at all) and, if the delivery
   activates it, move ``current``;
5. verify: every file of X in the volume is the store's verified inode, with its size;
6. record ``staged`` with the status to report.

This module knows nothing of the Kubernetes API; :mod:`csi_bridge.deliveries` feeds it
BundleDelivery objects and writes back the status it returns.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from bundle.errors import (AccessDenied, IntegrityMismatch, PlanError, SourceUnavailable, StoreError,
                           StoreFull)
from bundle.manifest import ManifestError, revision_dirname
from bundle.sources import reads_credentials
from . import checkpoints, volumes
from .arguments import BundleRef, PodRef
from .authorization import Denied, Unchecked
from .peering import peer_bytes
from .state import Delivery, Publication
from .status import CsiError


class BundleSpec(BaseModel):
    source: str
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")


class DeliverySpec(BaseModel):
    """``spec`` of a BundleDelivery (crds/bundledeliveries.resident.dev.yaml)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    node_name: str = Field(alias="nodeName", min_length=1)
    pod_name: str = Field(alias="podName", min_length=1)
    pod_uid: str = Field(alias="podUID", min_length=1)
    model: str = ""
    bundle: BundleSpec
    path: str = Field(pattern="^(GraphOnly|WholeBundle)$")
    donor: str = ""
    rebase: str = Field(default="Auto", pattern="^(Auto|Never)$")
    min_reuse: float = Field(default=0.5, alias="minReuse", ge=0, le=1)
    activate: bool = True


class NotYet(Exception):
    """Staging cannot start yet (the Pod's volume is not published, or it is busy)."""


class StageFailed(Exception):
    """Staging failed for good; ``reason`` is a CamelCase word for status.reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


REASONS = ((IntegrityMismatch, "IntegrityMismatch"), (AccessDenied, "AccessDenied"),
           (SourceUnavailable, "SourceUnavailable"),
           (StoreFull, "StoreFull"), (PlanError, "PlanRefused"), (ManifestError, "InvalidManifest"),
           (StoreError, "StoreError"))


def delivery_holder(uid: str) -> str:
    return f"delivery:{uid}"


def find_volume(state, spec: DeliverySpec) -> Publication:
    pubs = state.publications_of_pod(spec.pod_uid)
    if spec.model:
        pubs = [p for p in pubs if p.model in ("", spec.model)]
    if not pubs:
        raise NotYet(f"no published volume for Pod {spec.pod_name} (uid {spec.pod_uid}) on this node")
    return sorted(pubs, key=lambda p: p.target_path)[0]


def authorize(bridge, namespace: str, spec: DeliverySpec, pub: Publication) -> None:
    """Staging is authorized like publishing; raise StageFailed when it is not."""
    if namespace != pub.pod_namespace:
        raise StageFailed("NamespaceMismatch",
                          f"a BundleDelivery of namespace {namespace!r} may not stage into the "
                          f"volume of Pod {spec.pod_name} (uid {spec.pod_uid}), which belongs to "
                          f"namespace {pub.pod_namespace or '(unknown)'!r}")
    try:
        bridge.authorizer.authorize(
            PodRef(namespace=namespace, name=spec.pod_name, uid=spec.pod_uid),
            BundleRef(digest=spec.bundle.digest, source=spec.bundle.source, model=spec.model))
    except Unchecked as e:   # the API server away: retried, like a source that is down
        raise StageFailed("AuthorizationUnavailable", str(e)) from None
    except Denied as e:
        raise StageFailed("NotAuthorized", str(e)) from None


def stage(bridge, uid: str, namespace: str, name: str, generation: int,
          spec: DeliverySpec, attempt: int = 1) -> dict:
    """Stage ``spec`` for delivery ``uid``; return the status to report (phase Staged)."""
    store, state = bridge.store, bridge.state
    pub = find_volume(state, spec)
    held = {l.holder: l.digest for l in store.leases()}.get(delivery_holder(uid))
    if spec.activate or held != spec.bundle.digest:
        # A demotion (``activate: false`` on the revision this delivery already holds, the
        # revision a switch just left) gives the Pod nothing new, so it is not authorized
        # again: the model may not list it yet (the operator writes ``previousBundle``
        # after it demotes), and a refusal would fail the rollback's delivery.
        authorize(bridge, namespace, spec, pub)
    credentials = bridge.publisher.credentials
    if reads_credentials(spec.bundle.source) and not credentials.known(pub.target_path):
        raise NotYet(f"the credentials of Pod {spec.pod_name}'s volume are not known since the "
                     "bridge started; waiting for kubelet to publish it again (requiresRepublish)")
    digest = spec.bundle.digest
    try:
        lock = bridge.locks.hold(f"target {pub.target_path}")
        lock.__enter__()
    except CsiError as e:
        raise NotYet(e.message) from None
    t0 = time.monotonic()
    try:
        state.put_delivery(Delivery(uid=uid, namespace=namespace, name=name,
                                    target_path=pub.target_path, digest=digest,
                                    generation=generation, state="staging"))
        if held is not None and held != digest:
            # The delivery's spec changed (a new generation): its lease moves to the new revision.
            store.release_lease(delivery_holder(uid))
        store.acquire_lease(delivery_holder(uid), digest)
        checkpoints.reached("stage:after-lease")
        vdir = Path(pub.volume_dir)
        donor = spec.donor or volumes.current_digest(vdir)
        if donor and (donor == digest or not store.has_revision(donor)):
            donor = None
        try:
            source = bridge.publisher.open_source(spec.bundle.source,
                                                  credentials=credentials.of(pub.target_path))
            if bridge.peering is not None and not store.has_revision(digest):
                source = bridge.peering.around(source, digest, rollout=True)
            try:
                manifest = source.fetch_manifest(digest)
                res = store.materialize(manifest, source, donor=donor, mode=spec.path,
                                        rebase=spec.rebase, min_reuse=spec.min_reuse)
            finally:
                source.close()
        except Exception as e:
            for cls, reason in REASONS:
                if isinstance(e, cls):
                    raise StageFailed(reason, str(e)) from None
            raise
        volumes.link_revision(store, vdir, digest)
        checkpoints.reached("stage:after-link")
        if spec.activate:
            volumes.set_current(vdir, digest)
        verified = volumes.holds_store_tree(store, vdir, digest) and res.verified
        status = {
            "phase": "Staged" if verified else "Failed",
            "observedGeneration": generation,
            "attempts": attempt,
            "nextAttemptTime": None,
            "method": res.method,
            "bytes": {"fetched": res.bytes_fetched, "reused": res.bytes_reused,
                      "written": res.bytes_written},
            "durationSeconds": round(time.monotonic() - t0, 6),
            "finishedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "verified": verified,
            "revisionPath": f"{volumes.REVISIONS}/{revision_dirname(digest)}",
            "reason": "Staged" if verified else "VerificationFailed",
            "message": f"{digest} staged into the volume of Pod {spec.pod_name} by {res.method}"
                       + (f" ({res.fallback_reason or res.cost_reason})"
                          if res.fallback_reason or res.cost_reason else "")
                       + ("" if spec.activate else "; pre-staged: the volume's current revision is unchanged"),
        }
        if res.fallback_reason:  # the client sends "" as null, which the schema refuses
            status["fallbackReason"] = res.fallback_reason
        peers = peer_bytes(source)
        if peers:
            status["bytes"]["peers"] = peers["bytes_from_peers"]
            status["message"] += (f"; {peers['bytes_from_peers']} of {res.bytes_fetched} fetched bytes from peers "
                                  f"({', '.join(peers['peers']) or 'none'})"
                                  + "".join(f"; peer {n} dropped: {why[:200]}"
                                            for n, why in peers["peers_dropped"].items()))
        state.put_delivery(Delivery(uid=uid, namespace=namespace, name=name,
                                    target_path=pub.target_path, digest=digest,
                                    generation=generation,
                                    state="staged" if verified else "failed",
                                    status_json=json.dumps(status)))
        return status
    finally:
        lock.__exit__(None, None, None)


def release(bridge, uid: str) -> bool:
    """The BundleDelivery is being deleted: release its lease and forget it. Its revision
    also leaves the volume unless the volume's ``current`` points at it or another delivery
    of the volume holds it, so its bytes are freed once the store collects them: a revision
    a switch left, or a pre-staged one no longer wanted; otherwise each switch of a
    long-lived owner would leave a whole revision on the node's disk until the Pod goes. An
    owner that still has its files open or mapped reads on."""
    rec = bridge.state.delivery(uid)
    if rec is not None and rec.target_path:
        pub = bridge.state.publication(rec.target_path)
        others = {d.digest for d in bridge.state.deliveries()
                  if d.uid != uid and d.target_path == rec.target_path}
        if pub is not None and rec.digest not in others:
            volumes.unlink_revision(Path(pub.volume_dir), rec.digest)
    released = bridge.store.release_lease(delivery_holder(uid))
    bridge.state.delete_delivery(uid)
    return released

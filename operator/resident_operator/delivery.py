"""BundleDelivery manifests: "stage revision X into the live volume of owner Pod P".

The operator writes one BundleDelivery per owner and target revision; the bridge on the
Pod's node stages the revision into the Pod's volume and reports ``status.phase``
(Pending, Staging, Staged, Failed, Releasing). The bridge's finalizer turns the object
into the cluster-visible lease of that revision: deleting it releases the lease. A
Failed delivery with ``nextAttemptTime`` is *retrying*: the bridge stages it again with
capped backoff (the source may come back, GC may free space); one without is final. This
module builds the object and reads its status; it does not talk to the API server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import naming
from .spec import ModelSpec

STAGED = "Staged"
FAILED = "Failed"


def build_bundle_delivery(model: str, model_uid: str, spec: ModelSpec, *, slot: int,
                          incarnation: int, pod_name: str, pod_uid: str, node_name: str,
                          target_digest: str, target_source: str, path: str,
                          donor_digest: str = "", activate: bool = True) -> dict[str, Any]:
    """The delivery of ``target_digest`` into the volume of ``pod_name`` (by UID); with
    ``activate`` False a pre-staged one, which leaves the volume's live revision alone."""
    labels = naming.model_labels(model, model_uid, naming.COMPONENT_DELIVERY)
    labels.update({naming.LABEL_SLOT: str(slot), naming.LABEL_INCARNATION: str(incarnation),
                   naming.LABEL_REVISION: naming.revision_label(target_digest)})
    body_spec: dict[str, Any] = {
        "nodeName": node_name, "podName": pod_name, "podUID": pod_uid, "model": model,
        "bundle": {"source": target_source, "digest": target_digest},
        "path": path, "rebase": spec.delivery.rebase, "minReuse": spec.delivery.min_reuse,
        "activate": activate,
    }
    if donor_digest:
        body_spec["donor"] = donor_digest
    return {
        "apiVersion": naming.API_VERSION, "kind": "BundleDelivery",
        "metadata": {"name": naming.delivery_name(model, slot, incarnation, target_digest),
                     "labels": labels},
        "spec": body_spec,
    }


def prestaged(body: dict[str, Any]) -> bool:
    """A pre-staged delivery (``activate: false``): its revision waits beside the live one."""
    return (body.get("spec") or {}).get("activate", True) is False


def deliveries_of_gone_owners(deliveries: list[dict[str, Any]], live_pod_uids: set[str]
                              ) -> list[dict[str, Any]]:
    """Deliveries, not yet being deleted, into the volume of a Pod that is no live owner
    any more: the owner was replaced (lost with its node, evicted, deleted) and its
    deliveries' leases must go, or the revision stays pinned on that node when it returns."""
    return [bd for bd in deliveries if not bd["metadata"].get("deletionTimestamp")
            and (bd.get("spec") or {}).get("podUID") not in live_pod_uids]


@dataclass(frozen=True)
class DeliveryObservation:
    """What the operator reads back from a BundleDelivery's status."""

    phase: str
    reason: str = ""
    message: str = ""
    method: str = ""
    fetched: int = 0
    reused: int = 0
    written: int = 0
    peers: int = 0          # of the fetched bytes, those other nodes' bridges sent
    duration_seconds: float = 0.0
    verified: bool = False
    attempts: int = 0
    next_attempt_time: str = ""
    finished_at: str = ""
    current: bool = True   # the status answers the delivery's current generation

    @property
    def settled(self) -> bool:
        """Staged as its spec now asks (an activated pre-staged revision: ``current`` moved)."""
        return self.staged and self.current

    @property
    def staged(self) -> bool:
        return self.phase == STAGED and self.verified

    @property
    def failed(self) -> bool:
        """Failed for good: the bridge will not try again."""
        return self.phase == FAILED and not self.next_attempt_time

    @property
    def retrying(self) -> bool:
        """Failed, and the bridge tries again at ``next_attempt_time``."""
        return self.phase == FAILED and bool(self.next_attempt_time)


def observe_delivery(body: dict[str, Any] | None) -> DeliveryObservation | None:
    """Read a BundleDelivery's status; ``None`` if the object does not exist."""
    if body is None:
        return None
    st = body.get("status") or {}
    b = st.get("bytes") or {}
    return DeliveryObservation(
        phase=st.get("phase") or "Pending", reason=st.get("reason") or "",
        message=st.get("message") or "", method=st.get("method") or "",
        fetched=int(b.get("fetched") or 0), reused=int(b.get("reused") or 0),
        written=int(b.get("written") or 0), peers=int(b.get("peers") or 0),
        duration_seconds=float(st.get("durationSeconds") or 0.0),
        verified=bool(st.get("verified")), attempts=int(st.get("attempts") or 0),
        next_attempt_time=st.get("nextAttemptTime") or "", finished_at=st.get("finishedAt") or "",
        current=st.get("observedGeneration") in (None, (body.get("metadata") or {}).get("generation")))

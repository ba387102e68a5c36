"""The BundleDelivery watch: serve the deliveries addressed to this node.

The API server (1.20) has no field selectors on custom resources, so the bridge lists and
watches every BundleDelivery and keeps those whose ``spec.nodeName`` is its node id. For
each one it:

- adds the finalizer ``bundles.resident.dev/lease`` before doing anything, so the object
  is the cluster-visible lease of the revision it stages;
- stages it (``staging.stage``) in a worker thread, reporting ``Staging`` and then
  ``Staged`` or ``Failed`` with method, fallback reason, bytes, duration, ``verified``
  and the revision path; a delivery whose Pod volume is not published yet stays
  ``Pending`` and is retried at the next resync; a Failed one is retried with capped
  exponential backoff (:mod:`csi_bridge.retries`), its ``attempts`` and
  ``nextAttemptTime`` in the status;
- on deletion, releases the lease and removes the finalizer.

A delivery already answered for its generation is left alone; one the bridge answered
before a restart gets the same status again from the bridge database. A re-list every
``resync_seconds`` retries what is pending and catches events missed while down.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pydantic import ValidationError

from . import retries, staging
from .events import EventPoster
from .state import Delivery

log = logging.getLogger("resident.bridge.deliveries")
GROUP, VERSION, PLURAL = "resident.dev", "v1alpha1", "bundledeliveries"
FINALIZER = "bundles.resident.dev/lease"


class DeliveryWatcher:
    def __init__(self, bridge, api_client, resync_seconds: float = 5.0, workers: int = 2,
                 backoff: retries.Backoff = retries.Backoff()):
        from kubernetes import client
        self.bridge, self.node_id = bridge, bridge.config.node_id
        self.api = client.CustomObjectsApi(api_client)
        self.resync_seconds, self.backoff = resync_seconds, backoff
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stage")
        self._inflight: set[str] = set()
        self._retry_at: dict[str, float] = {}  # Pending deliveries wait before trying again
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="deliveries", daemon=True)
        self.events = EventPoster(api_client, self.node_id)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.resync_seconds + 5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- watch loop --------------------------------------------------------------------
    def _loop(self) -> None:
        from kubernetes import watch
        while not self._stop.is_set():
            try:
                listing = self.api.list_cluster_custom_object(GROUP, VERSION, PLURAL,
                                                              _request_timeout=30)
                for obj in listing.get("items", []):
                    self.handle(obj)
                rv = listing["metadata"].get("resourceVersion")
                w = watch.Watch()
                for event in w.stream(self.api.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                                      resource_version=rv, timeout_seconds=max(1, int(self.resync_seconds)),
                                      _request_timeout=self.resync_seconds + 10):
                    if self._stop.is_set():
                        w.stop()
                        break
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.handle(event["object"])
            except Exception as e:  # API hiccups: log, wait, re-list
                if not self._stop.is_set():
                    log.warning("delivery watch error", extra={"error": f"{type(e).__name__}: {e}"})
                    self._stop.wait(1.0)

    # -- one object --------------------------------------------------------------------
    def handle(self, obj: dict) -> None:
        spec, meta = obj.get("spec") or {}, obj.get("metadata") or {}
        if spec.get("nodeName") != self.node_id:
            return
        uid, finalizers = meta["uid"], list(meta.get("finalizers") or [])
        if meta.get("deletionTimestamp"):
            with self._lock:
                busy = uid in self._inflight
            if FINALIZER in finalizers and not busy:  # a running stage finishes first
                self._release(obj)
            return
        if FINALIZER not in finalizers:
            obj = self._patch_meta(obj, {"finalizers": finalizers + [FINALIZER],
                                         "resourceVersion": meta["resourceVersion"]})
            if obj is None:
                return
        gen = obj["metadata"].get("generation", 1)
        status, now = obj.get("status") or {}, time.time()
        if status.get("observedGeneration") == gen and status.get("phase") in ("Staged", "Failed"):
            if not retries.due(status, now):
                return  # answered; a retry not due yet comes with a later re-list
        else:
            rec = self.bridge.state.delivery(uid)
            if rec and rec.generation == gen and rec.state in ("staged", "failed") \
                    and rec.status_json != "{}" and not retries.due(json.loads(rec.status_json), now):
                self._patch_status(obj, json.loads(rec.status_json))  # answered before a restart
                return
        with self._lock:
            if uid in self._inflight or time.monotonic() < self._retry_at.get(uid, 0.0):
                return
            self._inflight.add(uid)
        self._pool.submit(self._stage, obj)

    def _stage(self, obj: dict) -> None:
        meta, uid = obj["metadata"], obj["metadata"]["uid"]
        gen = meta.get("generation", 1)
        attempt = retries.previous_attempts(obj.get("status") or {}, gen) + 1
        t0, result = time.monotonic(), "error"
        try:
            try:
                spec = staging.DeliverySpec.model_validate(obj.get("spec") or {})
            except ValidationError as e:
                self._fail(obj, gen, "InvalidSpec", str(e).replace("\n", "; "), attempt=attempt)
                result = "invalid"
                return
            staging.find_volume(self.bridge.state, spec)  # NotYet before saying "Staging"
            phase = (obj.get("status") or {}).get("phase")
            if phase != "Staging":
                self._patch_status(obj, {"phase": "Staging", "observedGeneration": gen,
                                         "reason": "Staging", "message": f"staging, attempt {attempt}",
                                         "attempts": attempt, "nextAttemptTime": None})
            try:
                status = staging.stage(self.bridge, uid, meta["namespace"], meta["name"], gen, spec,
                                       attempt)
                result = "staged" if status["phase"] == "Staged" else "failed"
                self._patch_status(obj, status)
                self.events.post(obj, "DeliveryStaged" if result == "staged" else "DeliveryFailed",
                                 status["message"], warning=result != "staged")
                log.info("delivery staged", extra={"delivery": f"{meta['namespace']}/{meta['name']}",
                                                   "digest": spec.bundle.digest, "bytes": status["bytes"],
                                                   "duration_seconds": status["durationSeconds"]})
            except staging.StageFailed as e:
                result = "failed"
                self._fail(obj, gen, e.reason, e.message, spec, attempt)
        except staging.NotYet as e:
            result = "pending"
            with self._lock:
                self._retry_at[uid] = time.monotonic() + self.resync_seconds * 0.8
            self._patch_status(obj, {"phase": "Pending", "observedGeneration": gen,
                                     "reason": "VolumeNotReady", "message": str(e)})
        except Exception as e:
            log.exception("staging failed", extra={"delivery": uid})
            self._fail(obj, gen, "InternalError", f"{type(e).__name__}: {e}", attempt=attempt)
        finally:
            self.bridge.metrics.stage_seconds.labels(result).observe(time.monotonic() - t0)
            if result in ("staged", "failed"):  # a new revision, or a store that ran full
                self.bridge.collector.collect()
            with self._lock:
                self._inflight.discard(uid)

    def _fail(self, obj: dict, gen: int, reason: str, message: str, spec=None,
              attempt: int = 1) -> None:
        meta = obj["metadata"]
        retry_at = retries.next_attempt(reason, attempt, self.backoff, time.time())
        message = message[:2000] + (f" (attempt {attempt}; retrying at {retry_at})" if retry_at
                                    else f" (attempt {attempt}; not retried until the spec changes)")
        status = {"phase": "Failed", "observedGeneration": gen, "reason": reason,
                  "message": message, "verified": False, "attempts": attempt,
                  "nextAttemptTime": retry_at}
        if spec is not None:
            rec = self.bridge.state.delivery(meta["uid"])
            target = rec.target_path if rec else ""
            self.bridge.state.put_delivery(Delivery(
                uid=meta["uid"], namespace=meta["namespace"], name=meta["name"],
                target_path=target, digest=spec.bundle.digest, generation=gen, state="failed",
                status_json=json.dumps(status)))
        self._patch_status(obj, status)
        self.events.post(obj, "DeliveryFailed", f"{reason}: {message}", warning=True)

    def _release(self, obj: dict) -> None:
        meta = obj["metadata"]
        self._patch_status(obj, {"phase": "Releasing", "reason": "Deleting",
                                 "message": "releasing the lease"})
        released = staging.release(self.bridge, meta["uid"])
        self._retry_at.pop(meta["uid"], None)
        self.events.post(obj, "LeaseReleased", f"released the lease on {obj['spec']['bundle']['digest']}"
                         if released else "no lease was held")
        log.info("delivery released", extra={"delivery": f"{meta['namespace']}/{meta['name']}",
                                             "phase": "released" if released else "no-lease"})
        rest = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        self._patch_meta(obj, {"finalizers": rest, "resourceVersion": meta["resourceVersion"]})

    # -- API writes --------------------------------------------------------------------
    def _patch_meta(self, obj: dict, metadata: dict) -> dict | None:
        from kubernetes.client.exceptions import ApiException
        meta = obj["metadata"]
        try:
            return self.api.patch_namespaced_custom_object(
                GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], {"metadata": metadata},
                _request_timeout=30)
        except ApiException as e:
            if e.status in (404, 409):
                return None  # gone, or changed since: the next event brings the new version
            raise

    def _patch_status(self, obj: dict, status: dict) -> None:
        from kubernetes.client.exceptions import ApiException
        meta = obj["metadata"]
        try:
            self.api.patch_namespaced_custom_object_status(
                GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], {"status": status},
                _request_timeout=30)
        except ApiException as e:
            if e.status != 404:
                raise

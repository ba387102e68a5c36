"""The operator's side effects on the API server, as plain dicts in and out.

A thin layer over the official client for the kinds the operator creates (Pod, Secret,
Service, BundleDelivery, PodDisruptionBudget, NetworkPolicy), for the Events of its owner
Pods and for the ResidentModel's status. Creation tolerates 409 by returning the existing
object (the caller decides whether it may adopt it); deletion tolerates 404 and always
carries a UID precondition, and reports a 409 (the name now belongs to another object) as
"not ours" instead of deleting it.

With a :class:`~.child_cache.ChildCache` (the operator has one), every write's answer (and
every read of a model) goes into it, and :meth:`Kube.model` and :meth:`Kube.children` read
a model, its owner Pods and BundleDeliveries from it when it can say, else from the API
server.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone
from typing import Any, Iterable

import kubernetes
from kubernetes.client.rest import ApiException

from . import metrics, naming
from .child_cache import ChildCache
from .pod_verdicts import FAILED_MOUNT

MOUNT_EVENTS = f"reason={FAILED_MOUNT},involvedObject.kind=Pod"   # the operator's watch of Events
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"

log = logging.getLogger("resident.operator.kube")
CORE_KINDS = {"Pod": "pod", "Secret": "secret", "Service": "service"}   # plural: + "s"
# other kinds: (group, version, plural); each is GA in every Kubernetes the operator supports
KINDS = {"BundleDelivery": (naming.GROUP, naming.VERSION, naming.DELIVERY_PLURAL),
         "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
         "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies")}


def load_config() -> kubernetes.client.ApiClient:
    """An API client from KUBECONFIG / ~/.kube/config, or the in-cluster service account."""
    cfg = kubernetes.client.Configuration()
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if os.path.exists(path.split(os.pathsep)[0]):
        kubernetes.config.load_kube_config(config_file=path, client_configuration=cfg)
    else:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    return kubernetes.client.ApiClient(cfg)


class Kube:
    """Create, read, list, patch, delete (by UID) and status-patch, returning dicts."""

    def __init__(self, api: kubernetes.client.ApiClient, cache: ChildCache | None = None) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)
        self.cache = cache

    @staticmethod
    def api_version(kind: str) -> str:
        """``group/version`` of ``kind``."""
        if kind in CORE_KINDS:
            return "v1"
        group, version, _ = KINDS[kind]
        return f"{group}/{version}"

    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        return json.loads(resp.data)

    def _call(self, verb: str, kind: str, namespace: str, *args: Any, **kw: Any) -> Any:
        """``verb`` (create, read, list, patch, delete) on ``kind`` in ``namespace``: core
        kinds through CoreV1Api's ``<verb>_namespaced_<kind>``, ours as custom objects."""
        if kind in CORE_KINDS:
            method = getattr(self.core, f"{verb}_namespaced_{CORE_KINDS[kind]}")
            if verb in ("read", "patch", "delete"):   # (name, namespace, ...)
                return method(args[0], namespace, *args[1:], **kw)
            return method(namespace, *args, **kw)
        verb = {"read": "get"}.get(verb, verb)
        method = getattr(self.custom, f"{verb}_namespaced_custom_object")
        group, version = self.api_version(kind).split("/")
        return method(group, version, namespace, KINDS[kind][2], *args, **kw)

    def create(self, namespace: str, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create ``obj``; on 409 return the existing object. Returns (object, created)."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            created = self._json(self._call("create", kind, namespace, obj, _preload_content=False))
            self._wrote(kind, created)
            return created, True
        except ApiException as e:
            if e.status != 409:
                raise
        existing = self.get(namespace, kind, name)
        if existing is None:  # deleted between our create and get: let the caller retry
            raise ConflictGone(f"{kind} {namespace}/{name} conflicted and then disappeared")
        self._wrote(kind, existing, own=False)
        return existing, False

    def _wrote(self, kind: str, obj: dict[str, Any], own: bool = True) -> None:
        if self.cache is not None:
            self.cache.wrote(kind, obj, own)

    def get(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        try:
            obj = self._json(self._call("read", kind, namespace, name, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        obj.setdefault("kind", kind)
        return obj

    def list(self, namespace: str, kind: str, selector: str) -> list[dict[str, Any]]:
        return self.list_at(namespace, kind, selector)[0]

    def list_at(self, namespace: str, kind: str, selector: str, metadata_only: bool = False
                ) -> tuple[list[dict[str, Any]], str | None]:
        """The objects and the resourceVersion the LIST was made at. ``metadata_only``: only
        each object's metadata (a PartialObjectMetadataList, as client-go's metadata
        informers read; a server that cannot answer so answers whole objects)."""
        if metadata_only:
            listed = self._json(self.core.api_client.call_api(
                self._collection(namespace, kind), "GET", query_params=[("labelSelector", selector)],
                header_params={"Accept": METADATA_ONLY}, auth_settings=["BearerToken"],
                _return_http_data_only=True, _preload_content=False))
        else:
            listed = self._json(self._call("list", kind, namespace, label_selector=selector,
                                           _preload_content=False))
        items = listed.get("items") or []
        for item in items:
            item["kind"], item["apiVersion"] = kind, self.api_version(kind)
        return items, (listed.get("metadata") or {}).get("resourceVersion")

    def _collection(self, namespace: str, kind: str) -> str:
        """The URL path of ``kind``'s collection in ``namespace``."""
        if kind in CORE_KINDS:
            return f"/api/v1/namespaces/{namespace}/{CORE_KINDS[kind]}s"
        group, version, plural = KINDS[kind]
        return f"/apis/{group}/{version}/namespaces/{namespace}/{plural}"

    def children(self, namespace: str, kind: str, model: str, recorded: Iterable[str]
                 ) -> list[dict[str, Any]]:
        """The ``kind`` objects labelled for ``model`` (the model label's value), given the
        UIDs of those the model's status records: from the cache when it can say, else a
        LIST (the cache is not ready there, or a recorded one is missing from it)."""
        cached = self.cache.children(namespace, kind, model, recorded) if self.cache is not None else None
        metrics.CHILD_READS.labels(kind=kind, source="api" if cached is None else "cache").inc()
        if cached is not None:
            for item in cached:
                item.setdefault("apiVersion", self.api_version(kind))
            return cached
        return self.list(namespace, kind, f"{naming.LABEL_MODEL}={model}")

    def failed_mounts(self, namespace: str, pod_uid: str) -> tuple[list[dict[str, Any]], bool]:
        """kubelet's FailedMount Events about one Pod, and whether a watch brings the next
        ones (the cache knows this namespace's: one LIST of them made it so), or the
        caller must ask again."""
        if self.cache is not None:
            known = self.cache.mount_events(namespace, pod_uid)
            if known is None:
                self.cache.refresh_events(namespace, self._events(namespace, MOUNT_EVENTS))
                known = self.cache.mount_events(namespace, pod_uid)
            if known is not None:
                return known, True
        return self._events(namespace, f"involvedObject.uid={pod_uid},reason={FAILED_MOUNT}"), False

    def _events(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._json(self.core.list_namespaced_event(
            namespace, field_selector=selector, _preload_content=False)).get("items") or []

    def patch(self, namespace: str, kind: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch (RFC 7386) of ``name``: a list in ``patch`` replaces the whole list."""
        patched = self._json(self._call("patch", kind, namespace, name, patch, _preload_content=False,
                                        _content_type="application/merge-patch+json"))
        self._wrote(kind, patched)
        return patched

    def delete(self, namespace: str, kind: str, name: str, uid: str) -> str:
        """Delete ``name`` only if its UID is ``uid``: returns deleted, gone or not-ours."""
        body = kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(uid=uid))
        try:
            self._call("delete", kind, namespace, name, body=body, _preload_content=False)
            if self.cache is not None:
                self.cache.deleting(uid, datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
            return "deleted"
        except ApiException as e:
            if e.status == 404:
                return "gone"
            if e.status == 409:
                log.warning("not deleting %s %s/%s: its UID is no longer %s", kind, namespace, name, uid)
                return "not-ours"
            raise

    def remove_finalizer(self, namespace: str, obj: dict[str, Any], finalizer: str) -> bool:
        """Take ``finalizer`` off a BundleDelivery as it was read (a resourceVersion
        precondition: after a concurrent change this does nothing and returns False)."""
        meta = obj["metadata"]
        kept = [f for f in meta.get("finalizers") or [] if f != finalizer]
        patch = {"metadata": {"finalizers": kept, "resourceVersion": meta["resourceVersion"]}}
        try:
            self.custom.patch_namespaced_custom_object(
                naming.GROUP, naming.VERSION, namespace, naming.DELIVERY_PLURAL, meta["name"], patch)
            return True
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise

    def model(self, namespace: str, name: str, uid: str, fresh: bool = False) -> dict[str, Any] | None:
        """The model ``uid`` named ``name``, for a pass: the cache's copy when it has one
        (never older than this operator's last write of it, ``child_cache.py``) unless
        ``fresh``, else a GET (which may find the name taken by another model: the caller
        compares UIDs)."""
        held = self.cache.model(uid) if self.cache is not None and not fresh else None
        metrics.MODEL_READS.labels(source="api" if held is None else "cache").inc()
        return held if held is not None else self.get_model(namespace, name)

    def get_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The model named ``name`` as the API server has it now (None: there is none)."""
        try:
            body = self._json(self.custom.get_namespaced_custom_object(
                naming.GROUP, naming.VERSION, namespace, naming.MODEL_PLURAL, name,
                _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return self._read_model(body)

    def _read_model(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.cache is not None:
            self.cache.observe_model(None, body)
        return body

    def patch_model_status(self, namespace: str, name: str, status: dict[str, Any],
                           resource_version: str | None = None) -> dict[str, Any]:
        """Merge-patch ``status`` (a None value removes the field); returns the model as
        written. With ``resource_version`` the write is conditional: the API server applies
        it only if the model is still at that version, else raises :class:`StatusConflict`
        (409) and nothing is written."""
        body: dict[str, Any] = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            return self._read_model(self._json(self.custom.patch_namespaced_custom_object_status(
                naming.GROUP, naming.VERSION, namespace, naming.MODEL_PLURAL, name, body,
                _preload_content=False, _content_type="application/merge-patch+json")))
        except ApiException as e:
            if e.status == 409 and resource_version is not None:
                raise StatusConflict(f"ResidentModel {namespace}/{name} changed since "
                                     f"resourceVersion {resource_version}") from e
            raise


class StatusConflict(RuntimeError):
    """A conditional status write found the model at another resourceVersion (409)."""


class ConflictGone(RuntimeError):
    """A create hit 409 but the existing object vanished before it could be read."""

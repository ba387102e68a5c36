"""The operator's side effects on the API server, as plain dicts in and out.

A thin layer over the official client for the three kinds the operator creates (Pod,
Secret, BundleDelivery) and for the ResidentModel's status. Creation tolerates 409 by
returning the existing object (the caller decides whether it may adopt it); deletion
tolerates 404 and always carries a UID precondition, and reports a 409 (the name now
belongs to another object) as "not ours" instead of deleting it.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from . import naming

log = logging.getLogger(__name__)
KINDS = {"Pod": "pods", "Secret": "secrets", "BundleDelivery": naming.DELIVERY_PLURAL}


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
    """Create, read, list, delete (by UID) and status-patch, returning dicts."""

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)

    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        return json.loads(resp.data)

    def create(self, namespace: str, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create ``obj``; on 409 return the existing object. Returns (object, created)."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            if kind == "Pod":
                resp = self.core.create_namespaced_pod(namespace, obj, _preload_content=False)
            elif kind == "Secret":
                resp = self.core.create_namespaced_secret(namespace, obj, _preload_content=False)
            else:
                resp = self.custom.create_namespaced_custom_object(
                    naming.GROUP, naming.VERSION, namespace, KINDS[kind], obj,
                    _preload_content=False)
            return self._json(resp), True
        except ApiException as e:
            if e.status != 409:
                raise
        existing = self.get(namespace, kind, name)
        if existing is None:  # deleted between our create and get: let the caller retry
            raise ConflictGone(f"{kind} {namespace}/{name} conflicted and then disappeared")
        return existing, False

    def get(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        try:
            if kind == "Pod":
                resp = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
            elif kind == "Secret":
                resp = self.core.read_namespaced_secret(name, namespace, _preload_content=False)
            else:
                resp = self.custom.get_namespaced_custom_object(
                    naming.GROUP, naming.VERSION, namespace, KINDS[kind], name,
                    _preload_content=False)
            obj = self._json(resp)
            obj.setdefault("kind", kind)
            return obj
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list(self, namespace: str, kind: str, selector: str) -> list[dict[str, Any]]:
        if kind == "Pod":
            resp = self.core.list_namespaced_pod(namespace, label_selector=selector,
                                                 _preload_content=False)
        elif kind == "Secret":
            resp = self.core.list_namespaced_secret(namespace, label_selector=selector,
                                                    _preload_content=False)
        else:
            resp = self.custom.list_namespaced_custom_object(
                naming.GROUP, naming.VERSION, namespace, KINDS[kind],
                label_selector=selector, _preload_content=False)
        items = self._json(resp).get("items") or []
        for item in items:
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", "v1" if kind in ("Pod", "Secret") else naming.API_VERSION)
        return items

    def delete(self, namespace: str, kind: str, name: str, uid: str) -> str:
        """Delete ``name`` only if its UID is ``uid``: returns deleted, gone or not-ours."""
        body = kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(uid=uid))
        try:
            if kind == "Pod":
                self.core.delete_namespaced_pod(name, namespace, body=body)
            elif kind == "Secret":
                self.core.delete_namespaced_secret(name, namespace, body=body)
            else:
                self.custom.delete_namespaced_custom_object(
                    naming.GROUP, naming.VERSION, namespace, KINDS[kind], name, body=body)
            return "deleted"
        except ApiException as e:
            if e.status == 404:
                return "gone"
            if e.status == 409:
                log.warning("not deleting %s %s/%s: its UID is no longer %s", kind, namespace, name, uid)
                return "not-ours"
            raise

    def get_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._json(self.custom.get_namespaced_custom_object(
                naming.GROUP, naming.VERSION, namespace, naming.MODEL_PLURAL, name,
                _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch_model_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch ``status`` (a None value removes the field)."""
        self.custom.patch_namespaced_custom_object_status(
            naming.GROUP, naming.VERSION, namespace, naming.MODEL_PLURAL, name,
            {"status": status})


class ConflictGone(RuntimeError):
    """A create hit 409 but the existing object vanished before it could be read."""

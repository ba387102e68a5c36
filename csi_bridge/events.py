"""Kubernetes Events about BundleDeliveries, for humans (``kubectl describe bd``).

Status is the durable record; an Event says what just happened, with a CamelCase reason:
``DeliveryStaged``, ``DeliveryFailed``, ``LeaseReleased``. Posting is best effort: a
refused or failed Event is logged and never changes what the bridge does.
"""

from __future__ import annotations

import datetime
import logging

log = logging.getLogger("resident.bridge.events")
COMPONENT = "resident-bridge"


def build_event(obj: dict, reason: str, message: str, node: str, warning: bool = False) -> dict:
    """A v1 Event about ``obj`` (pure; tested without a cluster)."""
    meta = obj["metadata"]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": obj.get("apiVersion", "resident.dev/v1alpha1"),
                           "kind": obj.get("kind", "BundleDelivery"), "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta["uid"]},
        "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT, "host": node},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


class EventPoster:
    def __init__(self, api_client, node: str):
        from kubernetes import client
        self.core, self.node = client.CoreV1Api(api_client), node

    def post(self, obj: dict, reason: str, message: str, warning: bool = False) -> None:
        body = build_event(obj, reason, message, self.node, warning)
        try:
            self.core.create_namespaced_event(body["metadata"]["namespace"], body,
                                              _request_timeout=10)
        except Exception as e:
            log.warning("event not posted", extra={"error": f"{type(e).__name__}: {e}",
                                                   "delivery": obj["metadata"].get("name")})

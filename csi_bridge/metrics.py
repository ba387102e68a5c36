"""Prometheus metrics of the bridge.

Units are in the names: durations in seconds, sizes in bytes. Lease and volume counts,
the store's capacity (its filesystem's size and free bytes), what GC could reclaim and
the GC watermarks are read when scraped, so they are never stale. Store usage
(``resident_store_bytes``, the bytes of content held) and delivered bytes (``resident_delivery_bytes_total{kind}``)
are recorded by the bundle store itself in the default registry; the bridge registers its
own metrics there too in production, so one ``/metrics`` shows both. Tests that run
several bridges in one process give each a private registry.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class BridgeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.publish_seconds = Histogram(
            "resident_publish_duration_seconds", "NodePublishVolume duration by result",
            ["result"], buckets=BUCKETS, registry=r)
        self.unpublish_seconds = Histogram(
            "resident_unpublish_duration_seconds", "NodeUnpublishVolume duration by result",
            ["result"], buckets=BUCKETS, registry=r)
        self.requests = Counter(
            "resident_csi_requests_total", "CSI RPCs by method and gRPC code",
            ["method", "code"], registry=r)
        self.stage_seconds = Histogram(
            "resident_stage_duration_seconds", "BundleDelivery staging duration by result",
            ["result"], buckets=BUCKETS, registry=r)
        self.fetch_failures = Counter(
            "resident_fetch_failures_total", "Failed fetches of a revision for a publish, by the "
            "gRPC code the publish answers", ["code"], registry=r)
        self.unauthorized_mounts = Counter(
            "resident_unauthorized_mounts_total", "Publishes refused because the Pod's namespace "
            "may not mount the bundle: reason namespace (the authorizer denied it) or possession "
            "(the namespace's own source did not serve it)", ["reason"], registry=r)
        for reason in ("namespace", "possession"):   # at 0, so the first refusal is an increase
            self.unauthorized_mounts.labels(reason=reason)
        self.peer_requests = Counter(
            "resident_peer_requests_total", "Requests of other nodes' bridges for this node's "
            "store content, by outcome (served, or why not)", ["outcome"], registry=r)
        self.peer_served_bytes = Counter(
            "resident_peer_served_bytes_total", "Bytes of store content served to other nodes' bridges",
            registry=r)
        self.gc_failures = Counter("resident_store_gc_failures_total",
                                   "Store GC passes that raised instead of collecting", registry=r)
        self.leases = Gauge("resident_store_leases", "Leases held in the node store (volumes and deliveries)",
                            registry=r)
        self.publications = Gauge("resident_published_volumes", "Volumes published on this node",
                                  registry=r)

        self.capacity = Gauge("resident_store_capacity_bytes",
                              "Size of the filesystem the node store is on", registry=r)
        self.available = Gauge("resident_store_available_bytes",
                               "Free bytes on the node store's filesystem", registry=r)
        self.reclaimable = Gauge("resident_store_reclaimable_bytes",
                                 "Store bytes no lease pins (GC may remove them)", registry=r)
        self.gc_high = Gauge("resident_store_gc_high_water_bytes",
                             "Store GC runs above this many bytes of content, now (0: no GC)", registry=r)
        self.gc_low = Gauge("resident_store_gc_low_water_bytes",
                            "Store GC removes content down to this many bytes", registry=r)

    def watch(self, leases: Callable[[], float], publications: Callable[[], float]) -> None:
        self.leases.set_function(leases)
        self.publications.set_function(publications)

    def watch_store(self, store, collector) -> None:
        self.capacity.set_function(lambda: store.filesystem_bytes().size)
        self.available.set_function(lambda: store.filesystem_bytes().available)
        self.reclaimable.set_function(store.reclaimable_bytes)
        self.gc_high.set_function(lambda: (collector.watermarks() or (0, 0))[0])
        self.gc_low.set_function(lambda: (collector.watermarks() or (0, 0))[1])

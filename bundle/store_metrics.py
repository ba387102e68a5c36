"""Prometheus metrics of the node content store (units in the names)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

STORE_BYTES = Gauge("resident_store_bytes", "Bytes of content held by the node store")
DELIVERY_BYTES = Counter("resident_delivery_bytes_total",
                         "Bytes moved by materializations", ["kind"])  # fetched|reused|written
MATERIALIZE_SECONDS = Histogram("resident_materialize_duration_seconds",
                                "Wall time of store materializations", ["method"],
                                buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900))
GC_REVISIONS = Counter("resident_store_gc_revisions_removed_total",
                       "Revisions removed by store garbage collection")
GC_BYTES = Counter("resident_store_gc_bytes_removed_total",
                   "Blob bytes removed by store garbage collection")

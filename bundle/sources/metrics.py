"""Prometheus metrics of bundle sources: bytes moved and connection retries, by scheme.

They live in the process-wide default registry, so whichever process reads from or pushes
to a source (the bridge, the CLI) exposes them with its other metrics.
"""

from prometheus_client import Counter

FETCHED_BYTES = Counter("resident_source_fetched_bytes_total",
                        "Bytes read from bundle sources (before the store verifies them)", ["scheme"])
PUSHED_BYTES = Counter("resident_source_pushed_bytes_total",
                       "Bytes of bundle files sent to push targets", ["scheme"])
RETRIES = Counter("resident_source_retries_total",
                  "Requests to a source retried after a dropped connection or server error",
                  ["scheme"])

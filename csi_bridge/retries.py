"""Retrying failed BundleDeliveries: capped exponential backoff, recorded in the status.

A delivery that failed for a reason that can pass (the source down, the store full,
wrong bytes from the source, credentials the source refused, which a rotated Secret
brings anew with kubelet's next publish, an internal error) is staged again after a delay that
doubles with each attempt, up to a cap: ``first * 2**(attempts-1)``, at most ``max``.
The status says so: ``attempts`` (for this generation, the current one included) and
``nextAttemptTime``. A delivery whose spec cannot be staged (invalid spec or manifest, a
refused plan) is not retried: ``nextAttemptTime`` is absent and a new generation starts
again at attempt 1. The watch retries at its first re-list after ``nextAttemptTime``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

RETRIED_REASONS = frozenset({"SourceUnavailable", "AccessDenied", "StoreFull", "IntegrityMismatch",
                             "StoreError", "InternalError", "AuthorizationUnavailable"})


@dataclass(frozen=True)
class Backoff:
    first_seconds: float = 5.0
    max_seconds: float = 300.0

    def delay(self, attempts: int) -> float:
        return min(self.max_seconds, self.first_seconds * 2 ** max(0, attempts - 1))


def timestamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def previous_attempts(status: dict, generation: int) -> int:
    """Attempts already made for ``generation`` (0 for a new generation)."""
    if status.get("observedGeneration") != generation:
        return 0
    return int(status.get("attempts") or 0)


def next_attempt(reason: str, attempts: int, backoff: Backoff, now: float) -> str | None:
    """When to try again after ``attempts`` failed, or None when the reason is final."""
    return timestamp(now + backoff.delay(attempts)) if reason in RETRIED_REASONS else None


def due(status: dict, now: float) -> bool:
    """True for a Failed status whose ``nextAttemptTime`` has come."""
    when = status.get("nextAttemptTime")
    if status.get("phase") != "Failed" or not when:
        return False
    return datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp() <= now

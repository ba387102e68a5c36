"""Leases: who keeps a revision in the node store, and until when.

A lease is a row ``holder -> digest`` in the store catalog. While it exists, garbage
collection never removes the revision (nor the blobs it is made of). The bridge takes one
per published volume and one per BundleDelivery, and releases them only when the volume
is unpublished or the BundleDelivery deleted, never on an error path.

- A lease may be taken before its revision exists; it then pins the revision from the
  moment it is published. ``acquire`` says whether the revision is present now.
- A holder holds at most one lease. Acquiring the same digest again is a no-op; another
  digest is refused (release first), so a lease never moves silently.
- Holders ``work:<token>`` are reserved for materializations pinning their donor.

Acquisition runs in an IMMEDIATE transaction, as GC does, so the two are ordered: either
the lease is committed before GC looks (the revision stays) or GC committed first (the
revision is gone and ``acquire`` returns False).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .catalog import Catalog, now_ns
from .errors import StoreError
from .manifest import check_digest

log = logging.getLogger("resident.bundle.leases")
RESERVED_PREFIX = "work:"


@dataclass(frozen=True)
class Lease:
    holder: str
    digest: str
    created_ns: int


def acquire(catalog: Catalog, holder: str, digest: str) -> bool:
    check_digest(digest)
    if not isinstance(holder, str) or not holder or holder.startswith(RESERVED_PREFIX):
        raise StoreError(f"lease holder {holder!r} must be non-empty and not start with "
                         f"{RESERVED_PREFIX!r}")
    with catalog.write() as db:
        row = db.execute("SELECT digest FROM leases WHERE holder=?", (holder,)).fetchone()
        if row and row[0] != digest:
            raise StoreError(f"holder {holder!r} already leases {row[0]}; release it first")
        if not row:
            db.execute("INSERT INTO leases VALUES (?,?,?)", (holder, digest, now_ns()))
        state = db.execute("SELECT state FROM revisions WHERE digest=?", (digest,)).fetchone()
        db.execute("UPDATE revisions SET last_used_ns=? WHERE digest=?", (now_ns(), digest))
    present = bool(state and state[0] == "ready")
    log.info("lease acquired", extra={"holder": holder, "digest": digest, "present": present})
    return present


def release(catalog: Catalog, holder: str) -> bool:
    """Drop ``holder``'s lease; False if it held none."""
    with catalog.write() as db:
        n = db.execute("DELETE FROM leases WHERE holder=? AND holder NOT LIKE 'work:%'",
                       (holder,)).rowcount
    if n:
        log.info("lease released", extra={"holder": holder})
    return bool(n)


def held(catalog: Catalog) -> list[Lease]:
    """Every lease except the materializations' own donor pins."""
    return [Lease(*row) for row in catalog.leases()]

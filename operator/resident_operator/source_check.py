"""Is the revision really there? Reading a bundle's manifest from its source, with the verdict.

The operator depends on a revision only after it read that revision's manifest from its
source and the manifest hashed to the digest the spec names: at first placement (before
any owner Pod exists, so that a wrong example fails with a reason instead of a Pod stuck
in ContainerCreating) and when a transition is planned. :func:`fetch_manifest` turns
every way this can fail into one of two reasons the user sees in ``Degraded``:

- ``DigestMismatch``: the source answered with a manifest whose sha256 is not the digest
  asked for (a ``file://`` directory holding another revision);
- ``SourceUnavailable``: the source cannot be reached, or does not hold that digest (an
  http or oci layout answers 404), or its manifest cannot be parsed.

The message carries the source's own error. A network source is given a short retry
budget (two attempts, 3 s connect and read timeouts), so the verdict arrives within 7 s.
Passes read through :func:`read_manifest`: when the source's server is down (no answer,
a timeout, 5xx), the model waits on the one probe of that source that every model
shares (``source_probes.py``), and does not read it again until the probe answers; a
source the probe cannot help (a 404, a digest mismatch, a ``file://`` directory) is read
again by the model itself after :func:`retry_after`. Never in a loop inside a pass.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from bundle.errors import BundleError, IntegrityMismatch
from bundle.manifest import Manifest, ManifestError
from bundle.sources import RetryPolicy, is_outage, open_source

from . import conditions as c
from .context import ModelContext
from .model_state import ModelState
from .observe import Blocker
from .source_probes import source_key
from .spec import ModelSpec

SOURCE_REASONS = ("SourceUnavailable", "DigestMismatch")
QUICK = RetryPolicy(attempts=2, backoff_seconds=0.5, connect_timeout_seconds=3.0,
                    read_timeout_seconds=3.0)
FIRST_RETRY_SECONDS = 2.0
MAX_RETRY_SECONDS = 60.0


class SourceProblem(Exception):
    """The manifest of a revision could not be read from its source (``reason``, message)."""

    def __init__(self, reason: str, message: str, outage: bool = False) -> None:
        super().__init__(message)
        self.blocker = Blocker(reason, message)
        self.outage = outage   # the source's server did not answer (bundle.sources.is_outage)


def read_manifest(ctx: ModelContext, source: str, digest: str) -> Manifest:
    """:func:`fetch_manifest` for a pass, which waits on the source's probe when it is down.

    A manifest read before is returned whatever the source's state. Else, if the source
    has an open probe, it is not read: :class:`SourceProblem` at once, and the model joins
    the probe's waiters (``ctx.follow_up.source_waits``). If the read finds the server
    down, the model opens or joins that probe the same way."""
    if (kept := _kept_manifest(source, digest)) is not None:
        return kept
    probes = ctx.sources
    error = probes.down(source) if probes is not None else None
    if error is not None:
        ctx.follow_up.source_waits.append((source, error))
        raise SourceProblem("SourceUnavailable", f"cannot read the manifest of {digest} from "
                                                 f"{source}: the source is down, waiting on its "
                                                 f"probe; last error: {error}", outage=True)
    try:
        return fetch_manifest(source, digest)
    except SourceProblem as e:
        if e.outage and probes is not None and source_key(source) is not None:
            ctx.follow_up.source_waits.append((source, str(e)))
        raise


def retry_later(ctx: ModelContext) -> None:
    """After a :class:`SourceProblem`: look again after :func:`retry_after`, unless the
    model waits on a source's probe, which wakes it when the source answers."""
    if not ctx.follow_up.source_waits:
        status = ctx.body.get("status") or {}
        ctx.follow_up.recheck_in(retry_after(status.get("conditions"), ctx.clock()))


def fetch_manifest(source: str, digest: str) -> Manifest:
    """The manifest of ``digest`` from ``source``, verified; raise :class:`SourceProblem`.

    A verified manifest is content-addressed, so the last :data:`KEPT_MANIFESTS` read are
    kept by (source, digest): planning a transition reads its target, while its donor (the
    live revision) was read when it was placed or planned itself."""
    if (kept := _kept_manifest(source, digest)) is not None:
        return kept
    manifest = _read_manifest(source, digest)
    with _kept_lock:
        _kept[(source, digest)] = manifest
        while len(_kept) > KEPT_MANIFESTS:
            _kept.popitem(last=False)
    return manifest


KEPT_MANIFESTS = 64
_kept: OrderedDict[tuple[str, str], Manifest] = OrderedDict()
_kept_lock = threading.Lock()


def _kept_manifest(source: str, digest: str) -> Manifest | None:
    with _kept_lock:
        if (source, digest) in _kept:
            _kept.move_to_end((source, digest))
            return _kept[(source, digest)]
    return None


def _read_manifest(source: str, digest: str) -> Manifest:
    try:
        with open_source(source, QUICK) as src:
            return src.fetch_manifest(digest)
    except IntegrityMismatch as e:
        raise SourceProblem("DigestMismatch", f"{source} does not hold {digest}: {e}") from None
    except (BundleError, ManifestError, OSError) as e:
        raise SourceProblem("SourceUnavailable", f"cannot read the manifest of {digest} from "
                                                 f"{source}: {type(e).__name__}: {e}",
                            outage=is_outage(e)) from None


def retry_after(conditions: list[dict[str, Any]] | None, now: float) -> float:
    """Seconds until a source that failed is tried again: capped exponential backoff.

    The wait is the time the model has been Degraded for a source reason (at least 2 s,
    at most 60 s), so retries fall at about 2, 4, 8, 16, 32, 64, then every 60 s after
    the failure began. It needs no counter: the condition's ``lastTransitionTime`` is
    the durable record, so a restarted operator keeps the pace."""
    degraded = c.find(conditions, c.DEGRADED) or {}
    if degraded.get("status") != "True" or degraded.get("reason") not in SOURCE_REASONS:
        return FIRST_RETRY_SECONDS
    try:
        age = c.seconds_since(degraded["lastTransitionTime"], now)
    except (KeyError, TypeError, ValueError):
        return FIRST_RETRY_SECONDS
    return min(MAX_RETRY_SECONDS, max(FIRST_RETRY_SECONDS, age))


def check_first_placement(ctx: ModelContext, state: ModelState, spec: ModelSpec) -> Blocker | None:
    """Before a model's first owner Pod: its source must hold ``spec.bundle``.

    A model with a committed revision (``status.bundle``) passes. Otherwise the manifest
    is read; when it verifies, the revision is committed and placement goes on; when it
    does not, the blocker is returned and the model looks again later (:func:`retry_later`)."""
    if state.bundle:
        return None
    try:
        read_manifest(ctx, spec.bundle.source, spec.bundle.digest)
    except SourceProblem as e:
        retry_later(ctx)
        return e.blocker
    state.commit_bundle(spec.bundle.digest, spec.bundle.source)
    return None

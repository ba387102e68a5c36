"""Is the revision really there? Reading a bundle's manifest from its source, with the verdict.

The operator depends on a revision only after it read that revision's manifest from its
source and the manifest hashed to the digest the spec names: at first placement (before
any owner Pod exists, so that a wrong example fails with a reason instead of a Pod stuck
in ContainerCreating) and when a transition is planned. :func:`fetch_manifest` turns
every way this can fail into one of two reasons the user sees in ``Degraded``:

- ``DigestMismatch``: the source answered with a manifest whose sha256 is not the digest
  asked for (a ``file://`` directory holding another revision);
- ``SourceUnavailable``: the source cannot be reached, or does not hold that digest (an
  http or oci layout answers 404, an s3 bucket has no such key), or its manifest cannot be
  parsed;
- ``AccessDenied``: the source refused the model's credentials, or refused anonymous
  access when the model names none (the message names the bucket);
- ``CredentialsUnavailable``: the Secret the model names (``spec.bundle.credentialsSecret``)
  does not exist in its namespace or cannot be read.

A source that reads credentials (``s3://``) is read with the model's own: the data of that
Secret, which the operator reads from the model's namespace (the bridge gets the same data
from kubelet). They key the kept manifests too, so a manifest one model could read is not
taken as readable by another with other credentials. The message carries the source's own
error. A network source is given a short retry
budget (two attempts, 3 s connect and read timeouts), so the verdict arrives within 7 s.
Passes read through :func:`read_manifest`: when the source's server is down (no answer,
a timeout, 5xx), the model waits on the one probe of that source that every model
shares (``source_probes.py``), and does not read it again until the probe answers; a
source the probe cannot help (a 404, a digest mismatch, a ``file://`` directory) is read
again by the model itself after :func:`retry_after`. Never in a loop inside a pass.
"""

from __future__ import annotations

import base64
import binascii
import threading
from collections import OrderedDict
from typing import Any

from kubernetes.client.rest import ApiException

from bundle.errors import AccessDenied, BundleError, IntegrityMismatch
from bundle.manifest import Manifest, ManifestError
from bundle.sources import RetryPolicy, SourceCredentials, is_outage, open_source, reads_credentials

from . import conditions as c
from . import retry_policy
from .context import ModelContext
from .model_state import ModelState
from .observe import Blocker
from .source_probes import source_key
from .spec import ModelSpec

SOURCE_REASONS = ("SourceUnavailable", "DigestMismatch", "AccessDenied", "CredentialsUnavailable")
QUICK = RetryPolicy(attempts=2, backoff_seconds=0.5, connect_timeout_seconds=3.0,
                    read_timeout_seconds=3.0)


class SourceProblem(Exception):
    """The manifest of a revision could not be read from its source (``reason``, message)."""

    def __init__(self, reason: str, message: str, outage: bool = False) -> None:
        super().__init__(message)
        self.blocker = Blocker(reason, message)
        self.outage = outage   # the source's server did not answer (bundle.sources.is_outage)


def read_manifest(ctx: ModelContext, source: str, digest: str, secret: str | None = None) -> Manifest:
    """:func:`fetch_manifest` for a pass, which waits on the source's probe when it is down.

    ``secret`` is the model's ``spec.bundle.credentialsSecret``: a source that reads
    credentials is read with its data (:func:`model_credentials`). A manifest read before
    with the same credentials is returned whatever the source's state. Else, if the source
    has an open probe, it is not read: :class:`SourceProblem` at once, and the model joins
    the probe's waiters (``ctx.follow_up.source_waits``). If the read finds the server
    down, the model opens or joins that probe the same way."""
    credentials = model_credentials(ctx, source, secret)
    if (kept := _kept_manifest(source, digest, credentials)) is not None:
        return kept
    probes = ctx.sources
    error = probes.down(source) if probes is not None else None
    if error is not None:
        ctx.follow_up.source_waits.append((source, error))
        raise SourceProblem("SourceUnavailable", f"cannot read the manifest of {digest} from "
                                                 f"{source}: the source is down, waiting on its "
                                                 f"probe; last error: {error}", outage=True)
    try:
        return fetch_manifest(source, digest, credentials)
    except SourceProblem as e:
        if e.outage and probes is not None and source_key(source) is not None:
            ctx.follow_up.source_waits.append((source, str(e)))
        raise


def model_credentials(ctx: ModelContext, source: str, secret: str | None) -> SourceCredentials | None:
    """The data of the model's Secret, for a source that reads credentials; None when the
    model names no Secret (anonymous) or the source reads none. Raises
    :class:`SourceProblem` ``CredentialsUnavailable`` when the Secret is missing or unreadable."""
    if not secret or not reads_credentials(source):
        return None
    where = f"Secret {secret!r} (spec.bundle.credentialsSecret) in namespace {ctx.namespace!r}"
    try:
        obj = ctx.kube.get(ctx.namespace, "Secret", secret)
    except ApiException as e:
        raise SourceProblem("CredentialsUnavailable", f"cannot read {where}: HTTP {e.status} "
                                                      f"{e.reason}") from None
    if obj is None:
        raise SourceProblem("CredentialsUnavailable", f"{where} does not exist; {source} is read "
                                                      "with its credentials")
    try:
        data = {k: base64.b64decode(v, validate=True).decode() for k, v in (obj.get("data") or {}).items()}
    except (binascii.Error, UnicodeDecodeError, TypeError) as e:
        raise SourceProblem("CredentialsUnavailable", f"{where}: a value is not base64 of UTF-8 "
                                                      f"text ({type(e).__name__})") from None
    return SourceCredentials(data)


def retry_later(ctx: ModelContext) -> None:
    """After a :class:`SourceProblem`: look again after :func:`retry_after`, unless the
    model waits on a source's probe, which wakes it when the source answers."""
    if not ctx.follow_up.source_waits:
        status = ctx.body.get("status") or {}
        ctx.follow_up.recheck_in(retry_after(status.get("conditions"), ctx.clock()))


def fetch_manifest(source: str, digest: str, credentials: SourceCredentials | None = None) -> Manifest:
    """The manifest of ``digest`` from ``source``, verified; raise :class:`SourceProblem`.

    A verified manifest is content-addressed, so the last :data:`KEPT_MANIFESTS` read are
    kept by (source, digest, credentials): planning a transition reads its target, while
    its donor (the live revision) was read when it was placed or planned itself."""
    if (kept := _kept_manifest(source, digest, credentials)) is not None:
        return kept
    manifest = _read_manifest(source, digest, credentials)
    with _kept_lock:
        _kept[_key(source, digest, credentials)] = manifest
        while len(_kept) > KEPT_MANIFESTS:
            _kept.popitem(last=False)
    return manifest


KEPT_MANIFESTS = 64
_kept: OrderedDict[tuple[str, str, str], Manifest] = OrderedDict()
_kept_lock = threading.Lock()


def _key(source: str, digest: str, credentials: SourceCredentials | None) -> tuple[str, str, str]:
    return (source, digest, credentials.fingerprint() if credentials is not None else "")


def _kept_manifest(source: str, digest: str,
                   credentials: SourceCredentials | None = None) -> Manifest | None:
    key = _key(source, digest, credentials)
    with _kept_lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    return None


def _read_manifest(source: str, digest: str, credentials: SourceCredentials | None = None) -> Manifest:
    try:
        with open_source(source, QUICK, credentials) as src:
            return src.fetch_manifest(digest)
    except IntegrityMismatch as e:
        raise SourceProblem("DigestMismatch", f"{source} does not hold {digest}: {e}") from None
    except AccessDenied as e:
        raise SourceProblem("AccessDenied", f"cannot read the manifest of {digest} from "
                                            f"{source}: {e}") from None
    except (BundleError, ManifestError, OSError) as e:
        raise SourceProblem("SourceUnavailable", f"cannot read the manifest of {digest} from "
                                                 f"{source}: {type(e).__name__}: {e}",
                            outage=is_outage(e)) from None


def retry_after(conditions: list[dict[str, Any]] | None, now: float) -> float:
    """Seconds until a source that failed is tried again (``retry_policy.source_retry_after``),
    from how long the model has been Degraded for a source reason. It needs no counter: the
    condition's ``lastTransitionTime`` is the durable record, so a restarted operator keeps
    the pace."""
    degraded = c.find(conditions, c.DEGRADED) or {}
    if degraded.get("status") != "True" or degraded.get("reason") not in SOURCE_REASONS:
        return retry_policy.source_retry_after(None)
    try:
        return retry_policy.source_retry_after(c.seconds_since(degraded["lastTransitionTime"], now))
    except (KeyError, TypeError, ValueError):
        return retry_policy.source_retry_after(None)


def check_first_placement(ctx: ModelContext, state: ModelState, spec: ModelSpec) -> Blocker | None:
    """Before a model's first owner Pod: its source must hold ``spec.bundle``.

    A model with a committed revision (``status.bundle``) passes. Otherwise the manifest
    is read; when it verifies, the revision is committed and placement goes on; when it
    does not, the blocker is returned and the model looks again later (:func:`retry_later`)."""
    if state.bundle:
        return None
    try:
        read_manifest(ctx, spec.bundle.source, spec.bundle.digest, spec.bundle.credentials_secret)
    except SourceProblem as e:
        retry_later(ctx)
        return e.blocker
    state.commit_bundle(spec.bundle.digest, spec.bundle.source)
    return None

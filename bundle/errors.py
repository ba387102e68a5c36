"""The ways delivering a bundle can fail, as exception classes every component shares.

A bundle travels from a source (file, http, oci) into a node's content store and from
there into a volume. Each failure along that way has one class here, so that callers
(the bridge, the operator, the CLI) can tell "the bytes are wrong" from "the source is
gone" from "the disk is full" without parsing messages:

- :class:`IntegrityMismatch`: bytes did not hash to what the manifest promised (a corrupt
  or truncated source). Nothing built from them is ever published.
- :class:`SourceUnavailable`: the source could not be reached or does not hold the
  requested manifest or file. Retrying later may help.
- :class:`AccessDenied` (a SourceUnavailable): the source refused the credentials it was
  given, or none were given where it needs some. Fixing the credentials helps.
- :class:`StoreFull`: the store's filesystem ran out of space (ENOSPC) while writing.
  The partial work is removed; GC or a larger volume may help.
- :class:`ManifestError` (re-exported): a manifest or bundle directory is not acceptable.
- :class:`PlanError`: a requested delivery path is impossible for these two manifests.
"""

from __future__ import annotations

from .manifest import ManifestError

__all__ = [
    "BundleError", "IntegrityMismatch", "SourceUnavailable", "AccessDenied", "StoreFull", "ManifestError",
    "PlanError", "StoreError",
]


class BundleError(Exception):
    """Base class of delivery failures (not of :class:`ManifestError`, a ValueError)."""


class IntegrityMismatch(BundleError):
    """Bytes read from a source do not match the sha256 the manifest names for them.

    ``path`` is the bundle-relative file, ``chunk`` the chunk index (``None`` for a whole
    file), ``expected`` and ``actual`` the hex digests (``actual`` is ``None`` when the
    source returned too few bytes), ``received``/``wanted`` the byte counts.
    """

    def __init__(self, path: str, expected: str, actual: str | None = None, *,
                 chunk: int | None = None, received: int | None = None,
                 wanted: int | None = None, detail: str = "") -> None:
        self.path, self.expected, self.actual = path, expected, actual
        self.chunk, self.received, self.wanted = chunk, received, wanted
        where = path if chunk is None else f"{path} chunk {chunk}"
        if received is not None and wanted is not None and received != wanted:
            what = f"truncated: got {received} of {wanted} bytes"
        else:
            what = f"sha256 {actual} != expected {expected}"
        super().__init__(f"integrity mismatch in {where}: {what}" + (f" ({detail})" if detail else ""))


class SourceUnavailable(BundleError):
    """A source cannot be reached or does not hold what was asked for."""


class AccessDenied(SourceUnavailable):
    """The source refused access with the credentials it was opened with (wrong or
    incomplete ones, or none); the message names the place (an S3 bucket and endpoint)."""


class StoreFull(BundleError):
    """The store's filesystem ran out of space (ENOSPC); the partial work was removed."""


class StoreError(BundleError):
    """The node store is in a state that refuses the request (e.g. unknown revision)."""


class PlanError(BundleError):
    """The requested delivery path is impossible for these manifests (the reason says why)."""

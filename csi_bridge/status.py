"""gRPC status codes the bridge answers with, and how delivery failures map onto them.

Every refusal travels as a :class:`CsiError` and leaves the servicer only through
``context.abort(code, message)``: a readable message, no status details. Bundle errors
map to codes by what the caller can do about them:

| failure                 | code               | why                                          |
|-------------------------|--------------------|----------------------------------------------|
| AccessDenied            | PERMISSION_DENIED  | the source refused the volume's credentials   |
| SourceUnavailable       | UNAVAILABLE        | transient: kubelet retries                    |
| StoreFull               | RESOURCE_EXHAUSTED | transient once GC or an unpublish frees space |
| IntegrityMismatch       | DATA_LOSS          | the source's bytes are wrong; nothing is published |
| ManifestError/PlanError | FAILED_PRECONDITION| the bundle as named cannot be delivered       |
| namespace denied        | PERMISSION_DENIED  |                                               |
| namespace not checkable | UNAVAILABLE        | the API server did not answer: kubelet retries |
| fetch still running     | ABORTED            | kubelet retries and the retry finishes        |
"""

from __future__ import annotations

import grpc

from bundle.errors import (AccessDenied, IntegrityMismatch, ManifestError, PlanError,
                           SourceUnavailable, StoreFull)


class CsiError(Exception):
    """A refusal with the gRPC status code to answer it with."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def from_bundle_error(e: BaseException, what: str) -> CsiError:
    """The CsiError for a failure while delivering ``what`` (a digest, for the message)."""
    for cls, code in ((AccessDenied, grpc.StatusCode.PERMISSION_DENIED),
                      (SourceUnavailable, grpc.StatusCode.UNAVAILABLE),
                      (StoreFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
                      (IntegrityMismatch, grpc.StatusCode.DATA_LOSS),
                      (ManifestError, grpc.StatusCode.FAILED_PRECONDITION),
                      (PlanError, grpc.StatusCode.FAILED_PRECONDITION)):
        if isinstance(e, cls):
            return CsiError(code, f"{what}: {e}")
    return CsiError(grpc.StatusCode.INTERNAL, f"{what}: {type(e).__name__}: {e}")

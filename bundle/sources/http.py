"""http(s):// sources and targets: manifests and file contents addressed by sha256.

``http://host:port/BASE`` names a bundle repository laid out as::

    BASE/manifests/sha256-<hex>.json   the bundle manifest whose sha256 is <hex>
    BASE/blobs/sha256-<hex>            the content of every file whose sha256 is <hex>

Files are fetched by their content digest, so two bundles (or two paths) with the same
file share one blob, and chunks are byte ranges of blobs (``Range: bytes=a-b``); see
:mod:`bundle.sources.ranged` for resumption after a dropped connection. Any static web
server can serve this layout read-only; ``python -m bundle.sources.httpserve`` serves it
and accepts pushes.

A push PUTs every distinct blob the target does not already hold (HEAD first, then PUT
with a Content-Length), and the manifest last: a reader that finds the manifest finds
every blob it names.
"""

from __future__ import annotations

from typing import Iterator
from urllib.parse import urlsplit

import requests

from ..errors import SourceUnavailable
from ..manifest import MAX_MANIFEST_BYTES, FileEntry, ManifestError
from .publish import Progress, open_bundle, send_contents
from .ranged import RETRYABLE, RangedReader, RetryPolicy, TransientUnavailable, is_transient
from .source import Source, check_range


def base_from_uri(uri: str) -> str:
    """The base URL without a trailing slash; refuse anything but plain http(s) URLs."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ManifestError(f"{uri!r}: expected http(s)://host[:port]/base")
    return uri.rstrip("/")


def manifest_url(base: str, digest: str) -> str:
    return f"{base}/manifests/{digest.replace(':', '-', 1)}.json"


def blob_url(base: str, sha256: str) -> str:
    return f"{base}/blobs/sha256-{sha256}"


class HttpSource(Source):
    scheme = "http"

    def __init__(self, uri: str, policy: RetryPolicy | None = None) -> None:
        super().__init__(uri)
        self.base = base_from_uri(uri)
        self.session = requests.Session()
        self.reader = RangedReader(self.session, policy or RetryPolicy(), self.scheme)

    def manifest_bytes(self, digest: str) -> bytes:
        return self.reader.get_small(manifest_url(self.base, digest), MAX_MANIFEST_BYTES)

    def read(self, entry: FileEntry, offset: int, length: int) -> Iterator[bytes]:
        check_range(entry, offset, length)
        return self.reader.read(blob_url(self.base, entry.sha256), offset, length,
                                entry.path, entry.sha256)

    def close(self) -> None:
        self.session.close()


def push_http(bundle_dir, uri: str, progress: Progress | None = None,
              policy: RetryPolicy | None = None) -> str:
    """Publish a built bundle to an http layout that accepts PUT; return the bundle digest."""
    bundle = open_bundle(bundle_dir)
    base = base_from_uri(uri)
    policy = policy or RetryPolicy()
    with requests.Session() as session:
        send_contents(bundle, uri, "http", progress, policy,
                      lambda e: _holds(session, blob_url(base, e.sha256), e.size, policy),
                      lambda e, parts: _put(session, blob_url(base, e.sha256), parts[0], policy))
        policy.call(lambda: _put(session, manifest_url(base, bundle.digest), bundle.manifest_bytes,
                                 policy), "http")
    return bundle.digest


def _holds(session: requests.Session, url: str, size: int, policy: RetryPolicy) -> bool:
    try:
        resp = session.head(url, timeout=policy.timeout)
    except RETRYABLE as e:
        raise TransientUnavailable(f"HEAD {url}: {e}") from e
    return resp.status_code == 200 and resp.headers.get("Content-Length") == str(size)


def _put(session: requests.Session, url: str, body, policy: RetryPolicy) -> None:
    try:
        resp = session.put(url, data=body, timeout=policy.timeout, headers={
            "Content-Type": "application/octet-stream", "Content-Length": str(len(body))})
    except RETRYABLE as e:
        raise TransientUnavailable(f"PUT {url}: {e}") from e
    if resp.status_code not in (200, 201, 204):
        error = TransientUnavailable if is_transient(resp.status_code) else SourceUnavailable
        raise error(f"PUT {url}: HTTP {resp.status_code} {resp.text.strip()[:200]}")

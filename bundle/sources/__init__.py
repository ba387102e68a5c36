"""Bundle sources behind one interface, and ``push`` to the same places.

A *source* is where a node fetches a bundle from; a *push target* is the same place seen
from the publisher. Five kinds exist, chosen by URI scheme:

- ``file:///dir``: a bundle directory as ``resident bundle build`` writes it;
- ``http(s)://host/base``: a content-addressed layout (``manifests/``, ``blobs/``);
- ``oci://host/repo[:tag]``: an OCI artifact in a distribution registry;
- ``s3://bucket/prefix[?endpoint=…&region=…&addressing=…]``: the http layout in a bucket;
- ``hf://org/name@commit[?endpoint=…&chunk=…]``: a Hugging Face Hub repository at a commit,
  made into a bundle (read only: nothing is pushed there).

A source that reads credentials (:data:`CREDENTIAL_SCHEMES`) is opened with the data of
the model's Secret (:class:`SourceCredentials`); the others take none.

Every source verifies a manifest against the digest asked for before parsing it;
file bytes are handed to the caller raw and verified by the store, or by
:func:`fetch_verified`. See docs/bundle-sources.md for the layouts and decisions.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..manifest import ManifestError
from .file import FileSource, push_dir
from .hf import HfSource
from .http import HttpSource, push_http
from .oci import OciSource, push_oci
from .credentials import SourceCredentials
from .publish import Progress, TargetConflict, open_bundle
from .ranged import RetryPolicy, is_outage
from .s3 import S3Source, push_s3
from .source import Source, fetch_verified, verify_manifest

__all__ = ["Source", "open_source", "push", "push_size", "fetch_verified", "verify_manifest", "RetryPolicy",
           "TargetConflict", "is_outage", "FileSource", "HttpSource", "OciSource", "S3Source", "HfSource",
           "SourceCredentials", "SCHEMES", "CREDENTIAL_SCHEMES", "reads_credentials"]

SCHEMES = ("file", "http", "https", "oci", "oci+http", "oci+https", "s3", "hf")
CREDENTIAL_SCHEMES = ("s3", "hf")   # the schemes that read the model's Secret


def _scheme(uri: str) -> str:
    scheme = urlsplit(uri).scheme if isinstance(uri, str) else ""
    if scheme not in SCHEMES:
        raise ManifestError(f"{uri!r}: unsupported source; use file:///dir, http(s)://host/base, "
                            "oci://host/repo[:tag], s3://bucket/prefix or hf://org/name@commit")
    return scheme


def reads_credentials(uri: str) -> bool:
    """Whether a source of this URI's scheme is opened with the model's credentials."""
    return isinstance(uri, str) and urlsplit(uri).scheme in CREDENTIAL_SCHEMES


def open_source(uri: str, policy: RetryPolicy | None = None,
                credentials: SourceCredentials | None = None, proxy: str | None = None) -> Source:
    """The source a URI names (no I/O happens until it is read). ``credentials`` are used
    by the schemes that read them (:data:`CREDENTIAL_SCHEMES`) and ignored by the others.
    ``proxy`` (``http://host:port``) is the HTTP proxy the http(s) and OCI sources go
    through, e.g. a pull-through cache in front of the origin; the others ignore it."""
    scheme = _scheme(uri)
    if scheme == "file":
        return FileSource(uri)
    if scheme in ("http", "https"):
        return through(HttpSource(uri, policy), proxy)
    if scheme == "s3":
        return S3Source(uri, policy, credentials)
    if scheme == "hf":
        return HfSource(uri, policy, credentials)
    return through(OciSource(uri, policy), proxy)


def through(source: Source, proxy: str | None) -> Source:
    """``source`` with every request sent through ``proxy``: a proxy named for the session
    wins over the environment's (``HTTP_PROXY``, ``NO_PROXY``)."""
    if proxy:
        source.session.proxies.update({"http": proxy, "https": proxy})
    return source


def push(bundle_dir, target: str, progress: Progress | None = None,
         policy: RetryPolicy | None = None, credentials: SourceCredentials | None = None) -> str:
    """Publish a built bundle directory to ``target``; return the bundle digest.

    ``progress`` is called with byte counts as file content is sent (or found already
    present at the target): the bundle's size for file://, its distinct content for
    http, oci and s3, where each sha256 is stored once. ``credentials`` sign s3 requests.
    """
    scheme = _scheme(target)
    if scheme == "hf":
        raise ManifestError(f"{target!r}: hf:// is read only; publish to the Hub with its own tools "
                            "(git, huggingface_hub) and name the commit")
    if scheme == "file":
        return push_dir(bundle_dir, target, progress)
    if scheme in ("http", "https"):
        return push_http(bundle_dir, target, progress, policy)
    if scheme == "s3":
        return push_s3(bundle_dir, target, progress, policy, credentials)
    return push_oci(bundle_dir, target, progress, policy)


def push_size(bundle_dir, target: str) -> int:
    """The bytes ``push(bundle_dir, target)`` reports through ``progress``: a bar's total."""
    bundle = open_bundle(bundle_dir)
    if _scheme(target) == "file":
        return bundle.manifest.total_bytes
    return sum(f.size for f in bundle.unique_files())

"""What a bundle source is: a place that holds manifests and file bytes, addressed by digest.

A source answers two questions and nothing else: "give me the manifest whose sha256 is
D" and "give me bytes [offset, offset+length) of this file". It never decides what is
trusted. The manifest is trusted only because its bytes hash to the digest the caller
asked for (checked here, before parsing, so a wrong or tampered manifest is rejected with
:class:`IntegrityMismatch` and never interpreted). File bytes are trusted only once the
caller, the node store, has hashed them against the manifest; :func:`fetch_verified` is
the same check for callers without a store.

A source that has fewer bytes than the manifest promises raises
:class:`IntegrityMismatch` (the content is wrong); a source that cannot be reached, or
does not hold the object at all, raises :class:`SourceUnavailable` (trying later may help).
"""

from __future__ import annotations

import abc
import hashlib
from typing import Iterator
from urllib.parse import urlsplit

from ..errors import IntegrityMismatch
from ..manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, FileEntry, Manifest, ManifestError, check_digest

BLOCK_SIZE = 1024 * 1024  # bytes yielded per block by every source


class Source(abc.ABC):
    """One place bundles are read from. Implementations: file, http(s), oci."""

    #: the URI scheme, used in metrics labels and messages
    scheme: str = ""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    @abc.abstractmethod
    def manifest_bytes(self, digest: str) -> bytes:
        """The raw bytes the source holds for manifest ``digest`` (not yet verified)."""

    @abc.abstractmethod
    def read(self, entry: FileEntry, offset: int, length: int) -> Iterator[bytes]:
        """Yield the raw bytes of ``[offset, offset+length)`` of ``entry``, in order."""

    def fetch_manifest(self, digest: str) -> Manifest:
        """Fetch, verify (sha256 of the bytes == ``digest``) and parse a manifest."""
        return verify_manifest(self.manifest_bytes(check_digest(digest)), digest, self.uri)

    def close(self) -> None:
        """Release connections; a source may be used again after closing."""

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def verify_manifest(data: bytes, digest: str, where: str = "") -> Manifest:
    """Parse manifest bytes only if they hash to ``digest``; raise IntegrityMismatch otherwise."""
    expected = check_digest(digest).removeprefix("sha256:")
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected or len(data) > MAX_MANIFEST_BYTES:
        raise IntegrityMismatch(MANIFEST_NAME, expected, actual,
                                detail=f"manifest served by {where}" if where else "")
    return Manifest.parse(data)


def check_range(entry: FileEntry, offset: int, length: int) -> None:
    """Refuse a read outside the file the manifest describes (a caller bug, not a source fault)."""
    if offset < 0 or length < 0 or offset + length > entry.size:
        raise ValueError(f"{entry.path}: range [{offset}, {offset + length}) is outside "
                         f"the file's {entry.size} bytes")


def fetch_verified(src: Source, entry: FileEntry, offset: int, length: int,
                   expected_sha256: str, chunk: int | None = None) -> bytes:
    """Read a range and return it only if its sha256 is ``expected_sha256`` (hex)."""
    got = bytearray()
    for block in src.read(entry, offset, length):
        got += block
        if len(got) > length:
            break
    data = bytes(got)
    actual = hashlib.sha256(data).hexdigest()
    if len(data) != length or actual != expected_sha256:
        raise IntegrityMismatch(entry.path, expected_sha256, actual, chunk=chunk,
                                received=len(data), wanted=length, detail=f"from {src.uri}")
    return data


def endpoint_option(uri: str, value: str, credentials: str) -> str:
    """The ``endpoint=`` option of a source URI, normalized to ``http(s)://host[:port]``.
    User info is refused: ``credentials`` says where they belong instead."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as e:
        raise ManifestError(f"{uri!r}: endpoint {value!r} is not a URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ManifestError(f"{uri!r}: endpoint {value!r} must be http(s)://host[:port]")
    if parts.username is not None or parts.password is not None:
        raise ManifestError(f"{uri!r}: endpoint {value!r} carries user info; {credentials}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ManifestError(f"{uri!r}: endpoint {value!r} must be http(s)://host[:port], "
                            "without a path or query")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def query_options(uri: str, query: dict[str, list[str]], allowed: tuple[str, ...], usage: str) -> dict[str, str]:
    """A source URI's parsed query (``parse_qs``) as one value per option; an unknown or
    repeated option is refused."""
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        raise ManifestError(f"{uri!r}: unknown parameter {', '.join(unknown)}; {usage}")
    repeated = sorted(k for k, v in query.items() if len(v) > 1)
    if repeated:
        raise ManifestError(f"{uri!r}: parameter {', '.join(repeated)} given more than once")
    return {k: v[0] for k, v in query.items()}

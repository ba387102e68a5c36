"""The OCI distribution API (v2) as far as bundles need it: blobs and manifests of one repository.

A reference ``oci://host[:port]/name/space[:tag]`` names a repository on a registry.
Plain HTTP is used for loopback registries (127.0.0.0/8, localhost, ::1) and for
``oci+http://``; any other host is spoken to over HTTPS. Authentication, where the
registry asks for it, is :mod:`bundle.sources.oci_auth`'s, on the session given here.

Blob uploads follow the spec's two forms: monolithic (``POST`` to open a session, then one
``PUT ?digest=`` with the body) and chunked (``PATCH`` each chunk with its
``Content-Range``, then ``PUT ?digest=`` to close). The registry verifies the digest when
the upload closes; a mismatch comes back as an error and nothing is stored.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlencode, urljoin, urlsplit

import requests

from ..errors import SourceUnavailable
from ..manifest import ManifestError
from .ranged import RETRYABLE, RetryPolicy, TransientUnavailable, is_transient

NAME_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class Reference:
    """Where a repository lives: ``registry`` is ``http(s)://host:port``, ``tag`` may be None."""

    registry: str
    name: str
    tag: str | None

    @classmethod
    def parse(cls, uri: str) -> "Reference":
        parts = urlsplit(uri)
        if parts.scheme not in ("oci", "oci+http", "oci+https") or not parts.hostname \
                or parts.query or parts.fragment:
            raise ManifestError(f"{uri!r}: expected oci://host[:port]/repository[:tag]")
        path = parts.path.lstrip("/")
        tag = None
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, tag = path.rsplit(":", 1)
            if not TAG_RE.match(tag):
                raise ManifestError(f"{uri!r}: tag {tag!r} is not a valid OCI tag")
        if not NAME_RE.match(path):
            raise ManifestError(f"{uri!r}: repository {path!r} is not a valid OCI name "
                                "(lowercase letters, digits, separators, '/')")
        if parts.scheme == "oci":
            http = "http" if _is_loopback(parts.hostname) else "https"
        else:
            http = parts.scheme.removeprefix("oci+")
        return cls(f"{http}://{parts.netloc}", path, tag)

    def blob_url(self, digest: str) -> str:
        return f"{self.registry}/v2/{self.name}/blobs/{digest}"

    def manifest_url(self, reference: str) -> str:
        return f"{self.registry}/v2/{self.name}/manifests/{reference}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Registry:
    """Calls against one repository; every failure becomes :class:`SourceUnavailable`."""

    def __init__(self, ref: Reference, session: requests.Session, policy: RetryPolicy) -> None:
        self.ref, self.session, self.policy = ref, session, policy

    def _call(self, method: str, url: str, ok: tuple[int, ...], **kw) -> requests.Response:
        try:
            resp = self.session.request(method, url, timeout=self.policy.timeout, **kw)
        except RETRYABLE as e:
            raise TransientUnavailable(f"{method} {url}: {e}") from e
        if resp.status_code not in ok:
            error = TransientUnavailable if is_transient(resp.status_code) else SourceUnavailable
            raise error(f"{method} {url}: HTTP {resp.status_code} {_errors(resp)}")
        return resp

    def has_blob(self, digest: str, size: int) -> bool:
        resp = self._call("HEAD", self.ref.blob_url(digest), (200, 404))
        return resp.status_code == 200 and resp.headers.get("Content-Length") == str(size)

    def upload_blob(self, digest: str, bodies: list) -> None:
        """Upload one blob; ``bodies`` are its consecutive parts (one part: monolithic)."""
        location = self._start_upload()
        if len(bodies) == 1:
            return self._close_upload(location, digest, bodies[0])
        offset = 0
        for body in bodies:
            n = len(body)
            resp = self._call("PATCH", location, (202,), data=body, headers={
                "Content-Type": "application/octet-stream", "Content-Length": str(n),
                "Content-Range": f"{offset}-{offset + n - 1}"})
            location = self._location(resp)
            offset += n
        self._close_upload(location, digest, b"")

    def _start_upload(self) -> str:
        resp = self._call("POST", f"{self.ref.registry}/v2/{self.ref.name}/blobs/uploads/", (202,))
        return self._location(resp)

    def _close_upload(self, location: str, digest: str, body) -> None:
        sep = "&" if urlsplit(location).query else "?"
        self._call("PUT", location + sep + urlencode({"digest": digest}), (201,), data=body,
                   headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(body))})

    def _location(self, resp: requests.Response) -> str:
        loc = resp.headers.get("Location")
        if not loc:
            raise SourceUnavailable(f"{resp.request.method} {resp.url}: no Location in the answer")
        return urljoin(self.ref.registry + "/", loc)

    def put_manifest(self, reference: str, body: bytes) -> str:
        resp = self._call("PUT", self.ref.manifest_url(reference), (201,), data=body,
                          headers={"Content-Type": OCI_MANIFEST})
        return resp.headers.get("Docker-Content-Digest", "")


def _errors(resp: requests.Response) -> str:
    """The registry's error codes and messages, if it sent the spec's error document."""
    try:
        errs = resp.json().get("errors", [])
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errs) or resp.reason
    except (ValueError, AttributeError):
        return resp.reason or ""

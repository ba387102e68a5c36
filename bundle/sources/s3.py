"""s3:// sources and targets: the http layout, in a bucket of an S3-compatible store.

``s3://BUCKET/PREFIX`` holds the same content-addressed layout as an http source::

    PREFIX/manifests/sha256-<hex>.json   the canonical manifest whose sha256 is <hex>
    PREFIX/blobs/sha256-<hex>            the bytes of every file whose sha256 is <hex>

so a bundle pushed there once is read by any node, and two revisions share every file
they have in common. Where the store is and how to address it are query parameters of
the URI, so that the URI alone names the place wherever it travels (a Pod's volume
attributes, a BundleDelivery, ``status.bundle``, the bridge's records of what it proved):

- ``endpoint=http(s)://host[:port]``: an S3-compatible server; without it, AWS
  (``s3.<region>.amazonaws.com``);
- ``region=NAME``: the region requests are signed for (default ``us-east-1``);
- ``addressing=path|virtual``: the bucket in the path (``host/bucket/key``) or in the host
  name (``bucket.host/key``). Default: ``virtual`` on AWS, ``path`` with an endpoint (an
  S3-compatible server answers it without wildcard DNS).

Anything else in the URI (another parameter, a repeated one, user info in the endpoint,
a bucket name S3 would refuse, ``..`` in the prefix) is a :class:`ManifestError` before
any request.

Requests go through botocore (SigV4 signing, addressing, endpoints). With credentials
(:mod:`.credentials`: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optionally
``AWS_SESSION_TOKEN``) they are signed with them; without, they are anonymous (unsigned).
botocore's own credential chain (environment, ``~/.aws``, instance metadata) is never
consulted: on a node that would be the node's or the bridge's identity, shared by every
tenant. botocore retries nothing itself: file bytes are ranged GETs resumed after a drop
by :func:`~.ranged.read_resumably`, like every network source, and whole requests are
repeated by :meth:`RetryPolicy.call`.

Errors: the store's refusal (403: ``AccessDenied``, ``InvalidAccessKeyId``,
``SignatureDoesNotMatch``, ...) is :class:`AccessDenied` naming the bucket and endpoint;
a missing key or bucket is :class:`SourceUnavailable`; an object shorter than the manifest
says is :class:`IntegrityMismatch` (truncated); no connection, a timeout, 5xx or a
``SlowDown`` is retried, then :class:`SourceUnavailable` (an outage:
:func:`~.ranged.is_outage`).

A push sends every distinct file the bucket lacks (HEAD first), in one PUT up to
:data:`PART_SIZE` bytes (with ``x-amz-checksum-sha256``, the file's own digest, for a store
that checks it) or as a multipart upload of such parts, aborted if it fails, and the
manifest last: a reader that finds the manifest finds every blob it names.
"""

from __future__ import annotations

import base64
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import parse_qs, urlsplit

from ..errors import AccessDenied, IntegrityMismatch, SourceUnavailable
from ..manifest import MAX_MANIFEST_BYTES, FileEntry, ManifestError
from .credentials import S3_ACCESS_KEY, S3_SECRET_KEY, S3_SESSION_TOKEN, SourceCredentials
from .publish import FileBody, Progress, open_bundle, send_contents
from .ranged import CONTENT_RANGE, RetryPolicy, TransientUnavailable, read_resumably
from .source import BLOCK_SIZE, Source, check_range, endpoint_option, query_options

T = TypeVar("T")
DEFAULT_REGION = "us-east-1"
PART_SIZE = 64 * 1024 * 1024    # larger files go up as multipart uploads of this part size
MIN_PART_SIZE = 5 * 1024 * 1024  # S3's smallest part but the last
OPTIONS = ("endpoint", "region", "addressing")
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
REGION_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem",
                "InvalidSecurity", "RequestTimeTooSkewed", "MissingSecurityHeader"}
MISSING_CODES = {"NoSuchKey", "NotFound", "404"}
TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError",
                   "Throttling", "ThrottlingException", "RequestLimitExceeded", "503", "500"}


class ObjectMissing(SourceUnavailable):
    """The store has no such key (or no such bucket: ``bucket_missing``)."""

    def __init__(self, message: str, bucket_missing: bool = False) -> None:
        super().__init__(message)
        self.bucket_missing = bucket_missing


class RangeNotSatisfiable(SourceUnavailable):
    """A 416: the object ends before the first byte asked for (the caller says how short)."""


@dataclass(frozen=True)
class S3Location:
    """Where an s3:// URI points: bucket, key prefix, and how to reach the store."""

    bucket: str
    prefix: str            # "" or "a/b": no slash at either end
    endpoint: str | None   # "http(s)://host[:port]", or None for AWS
    region: str
    addressing: str        # "path" or "virtual"

    @classmethod
    def parse(cls, uri: str) -> "S3Location":
        try:
            parts = urlsplit(uri)
            query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError as e:
            raise ManifestError(f"{uri!r}: not a valid s3:// URI ({e})") from None
        usage = "expected s3://bucket[/prefix][?endpoint=http(s)://host:port&region=R&addressing=path|virtual]"
        if parts.scheme != "s3" or parts.fragment or "@" in parts.netloc:
            raise ManifestError(f"{uri!r}: {usage}")
        bucket = parts.netloc
        if not BUCKET_RE.match(bucket) or ".." in bucket:
            raise ManifestError(f"{uri!r}: bucket {bucket!r} is not a valid S3 bucket name "
                                "(3-63 lowercase letters, digits, dots and hyphens)")
        prefix = parts.path.strip("/")
        if prefix and any(seg in ("", ".", "..") for seg in prefix.split("/")):
            raise ManifestError(f"{uri!r}: prefix {prefix!r} has an empty, '.' or '..' segment")
        opts = query_options(uri, query, OPTIONS, usage)
        endpoint = None
        if "endpoint" in opts:
            endpoint = endpoint_option(uri, opts["endpoint"], "credentials belong in the model's Secret "
                                       "(spec.bundle.credentialsSecret)")
        region = opts.get("region", DEFAULT_REGION)
        if not REGION_RE.match(region):
            raise ManifestError(f"{uri!r}: region {region!r} is not a region name")
        addressing = opts.get("addressing", "path" if endpoint else "virtual")
        if addressing not in ("path", "virtual"):
            raise ManifestError(f"{uri!r}: addressing must be path or virtual, not {addressing!r}")
        if addressing == "virtual" and "." in bucket and (endpoint or "").startswith("https:"):
            raise ManifestError(f"{uri!r}: bucket {bucket!r} has dots, which break TLS "
                                "certificates in virtual-host addressing; use addressing=path")
        return cls(bucket, prefix, endpoint, region, addressing)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def manifest_key(self, digest: str) -> str:
        return self.key(f"manifests/{digest.replace(':', '-', 1)}.json")

    def blob_key(self, sha256: str) -> str:
        return self.key(f"blobs/sha256-{sha256}")

    @property
    def where(self) -> str:
        """The store, for messages: the endpoint, or AWS with the region."""
        return self.endpoint or f"AWS region {self.region}"

    def url(self, key: str) -> str:
        """``s3://bucket/key``, naming one object in messages."""
        return f"s3://{self.bucket}/{key}"



# -- the client --------------------------------------------------------------------------

_session_lock = threading.Lock()
_session: Any = None


def make_client(loc: S3Location, credentials: SourceCredentials | None, policy: RetryPolicy,
                pool: int = 16) -> Any:
    """A botocore S3 client for ``loc``, signing with ``credentials`` or anonymous.

    Nothing is taken from botocore's environment but proxies and CA bundles: the
    credentials, region, endpoint and addressing are all explicit here."""
    import botocore.session
    from botocore import UNSIGNED
    from botocore.config import Config

    global _session
    config = Config(
        region_name=loc.region,
        signature_version=UNSIGNED if credentials is None else "s3v4",
        s3={"addressing_style": loc.addressing,
            # the body is streamed once (and hashed by FileBody as it goes); the store
            # checks x-amz-checksum-sha256 where it can, and readers check every byte
            "payload_signing_enabled": False},
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=policy.connect_timeout_seconds,
        read_timeout=policy.read_timeout_seconds,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        ignore_configured_endpoint_urls=True,
        max_pool_connections=pool,
    )
    keys: dict[str, str | None] = {}
    if credentials is not None:
        missing = [k for k in (S3_ACCESS_KEY, S3_SECRET_KEY) if not credentials.get(k)]
        if missing:
            raise AccessDenied(f"AccessDenied: s3 bucket {loc.bucket!r} at {loc.where}: the "
                               f"credentials lack {' and '.join(missing)} "
                               f"(present: {', '.join(sorted(credentials)) or 'none'})")
        keys = {"aws_access_key_id": credentials[S3_ACCESS_KEY],
                "aws_secret_access_key": credentials[S3_SECRET_KEY],
                "aws_session_token": credentials.get(S3_SESSION_TOKEN) or None}
    with _session_lock:   # a botocore session is not thread-safe; its clients are
        if _session is None:
            _session = botocore.session.get_session()
        return _session.create_client("s3", endpoint_url=loc.endpoint, config=config, **keys)


def _transient_errors() -> tuple[type[BaseException], ...]:
    """What botocore raises when the connection fails (refused, reset, timed out, TLS,
    a body cut short): worth another attempt."""
    from botocore import exceptions as b
    from urllib3.exceptions import HTTPError
    return (b.ConnectionError, b.HTTPClientError, b.IncompleteReadError, HTTPError,
            ConnectionError, TimeoutError)


class S3Bucket:
    """The requests a source and a push make to one location, with errors in our terms."""

    def __init__(self, loc: S3Location, credentials: SourceCredentials | None,
                 policy: RetryPolicy) -> None:
        self.loc, self.policy = loc, policy
        self.client = make_client(loc, credentials, policy)
        self.transient = _transient_errors()

    def call(self, operation: str, key: str, **kw: Any) -> dict[str, Any]:
        """One request (``get_object``, ``head_object``, ...) for ``key``, errors translated."""
        from botocore.exceptions import ClientError
        try:
            return getattr(self.client, operation)(Bucket=self.loc.bucket, Key=key, **kw)
        except ClientError as e:
            raise self.refusal(e, operation, key) from None
        except self.transient as e:
            raise TransientUnavailable(f"s3 endpoint {self.loc.where}: {_describe(e)}") from e

    def refusal(self, e: Any, operation: str, key: str) -> Exception:
        """The error for the store's answer ``e`` (a botocore ClientError)."""
        error = e.response.get("Error") or {}
        meta = e.response.get("ResponseMetadata") or {}
        code, status = str(error.get("Code") or ""), int(meta.get("HTTPStatusCode") or 0)
        message = str(error.get("Message") or "").strip()
        said = f"{code}: {message}" if message and message != code else (code or f"HTTP {status}")
        obj = self.loc.url(key)
        action = "".join(word.capitalize() for word in operation.split("_"))   # GetObject
        if code in DENIED_CODES or status in (401, 403):
            return AccessDenied(f"AccessDenied: s3 bucket {self.loc.bucket!r} at {self.loc.where} "
                                f"refused {action} of {obj} ({said}); check the credentials "
                                "(spec.bundle.credentialsSecret) and the bucket's policy")
        if code == "NoSuchBucket":
            return ObjectMissing(f"{obj}: bucket {self.loc.bucket!r} does not exist at "
                                 f"{self.loc.where} (NoSuchBucket)", bucket_missing=True)
        if code in MISSING_CODES or status == 404:
            return ObjectMissing(f"{obj}: no such key at {self.loc.where} ({code or 'HTTP 404'})")
        if code == "InvalidRange" or status == 416:
            return RangeNotSatisfiable(f"{obj} at {self.loc.where}: {said}")
        if code in TRANSIENT_CODES or status >= 500 or status == 429:
            return TransientUnavailable(f"{obj} at {self.loc.where}: HTTP {status} {said}")
        if code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException") \
                or status == 301:
            return SourceUnavailable(f"{obj}: the bucket is not in region {self.loc.region!r} at "
                                     f"{self.loc.where} ({said}); set region= in the URI")
        return SourceUnavailable(f"{obj} at {self.loc.where}: HTTP {status} {said}")


class S3Source(Source):
    scheme = "s3"

    def __init__(self, uri: str, policy: RetryPolicy | None = None,
                 credentials: SourceCredentials | None = None) -> None:
        super().__init__(uri)
        self.loc = S3Location.parse(uri)
        self.policy = policy or RetryPolicy()
        self.bucket = S3Bucket(self.loc, credentials, self.policy)

    def manifest_bytes(self, digest: str) -> bytes:
        key = self.loc.manifest_key(digest)
        return self.policy.call(lambda: self._whole(key, MAX_MANIFEST_BYTES), self.scheme)

    def _whole(self, key: str, limit: int) -> bytes:
        resp = self.bucket.call("get_object", key)
        body = resp["Body"]
        try:
            if int(resp.get("ContentLength") or 0) > limit:
                raise SourceUnavailable(f"{self.loc.url(key)}: document larger than {limit} bytes")
            try:
                return body.read()
            except self.bucket.transient as e:
                raise TransientUnavailable(f"{self.loc.url(key)}: {_describe(e)}") from e
        finally:
            body.close()

    def read(self, entry: FileEntry, offset: int, length: int) -> Iterator[bytes]:
        check_range(entry, offset, length)
        key = self.loc.blob_key(entry.sha256)

        def attempt(pos: int, end: int) -> Iterator[bytes]:
            try:
                resp = self.bucket.call("get_object", key, Range=f"bytes={pos}-{end - 1}")
            except RangeNotSatisfiable:   # 416: the object ends before pos
                raise self._short(key, entry, offset, end, self._size(key)) from None
            body = resp["Body"]
            try:
                skip = self._start(resp, key, entry, offset, pos, end)
                for block in body.iter_chunks(BLOCK_SIZE):
                    if skip:
                        cut = min(skip, len(block))
                        block, skip = block[cut:], skip - cut
                    yield block
            except self.bucket.transient as e:
                raise TransientUnavailable(f"{self.loc.url(key)}: {_describe(e)}") from e
            finally:
                body.close()

        return read_resumably(attempt, offset, length, self.policy, self.scheme, self.loc.url(key))

    def _start(self, resp: dict[str, Any], key: str, entry: FileEntry, offset: int,
               pos: int, end: int) -> int:
        """Check the answer to a ranged GET; return how many leading bytes to skip."""
        status = int(resp["ResponseMetadata"]["HTTPStatusCode"])
        if status == 200 and not resp.get("ContentRange"):   # the range was ignored: all of it
            total = int(resp.get("ContentLength") or 0)
            if total < end:
                raise self._short(key, entry, offset, end, total)
            return pos
        m = CONTENT_RANGE.match(resp.get("ContentRange") or "")
        if not m or int(m.group(1)) != pos:
            raise SourceUnavailable(f"{self.loc.url(key)}: Content-Range "
                                    f"{resp.get('ContentRange')!r} does not answer bytes={pos}-{end - 1}")
        if m.group(3) != "*" and int(m.group(3)) < end:
            raise self._short(key, entry, offset, end, int(m.group(3)))
        return 0

    def _size(self, key: str) -> int:
        return int(self.bucket.call("head_object", key).get("ContentLength") or 0)

    def _short(self, key: str, entry: FileEntry, offset: int, end: int, total: int) -> IntegrityMismatch:
        return IntegrityMismatch(entry.path, entry.sha256, None, received=max(0, total - offset),
                                 wanted=end - offset,
                                 detail=f"{self.loc.url(key)} at {self.loc.where} holds only {total} bytes")

    def close(self) -> None:
        self.bucket.client.close()


# -- push --------------------------------------------------------------------------------

def push_s3(bundle_dir, uri: str, progress: Progress | None = None,
            policy: RetryPolicy | None = None, credentials: SourceCredentials | None = None,
            part_size: int = PART_SIZE) -> str:
    """Publish a built bundle to an s3:// location; return the bundle digest."""
    if part_size < MIN_PART_SIZE:
        raise ValueError(f"part_size {part_size} is below S3's minimum of {MIN_PART_SIZE} bytes")
    bundle = open_bundle(bundle_dir)
    loc = S3Location.parse(uri)
    policy = policy or RetryPolicy()
    bucket = S3Bucket(loc, credentials, policy)
    try:
        send_contents(bundle, uri, "s3", progress, policy,
                      lambda e: _holds(bucket, loc.blob_key(e.sha256), e.size),
                      lambda e, parts: _upload(bucket, loc.blob_key(e.sha256), parts, e.sha256),
                      part_size)
        raw = bundle.manifest_bytes
        policy.call(lambda: bucket.call("put_object", loc.manifest_key(bundle.digest), Body=raw,
                                        ContentType="application/json"), "s3")
    finally:
        bucket.client.close()
    return bundle.digest


def _holds(bucket: S3Bucket, key: str, size: int) -> bool:
    try:
        head = bucket.call("head_object", key)
    except ObjectMissing as e:
        if e.bucket_missing:
            raise
        return False
    return int(head.get("ContentLength") or -1) == size


def _upload(bucket: S3Bucket, key: str, parts: list[FileBody], sha256: str) -> None:
    if len(parts) == 1:
        body = parts[0]
        bucket.call("put_object", key, Body=body, ContentLength=len(body),
                    ChecksumSHA256=base64.b64encode(bytes.fromhex(sha256)).decode())
        return
    upload = bucket.call("create_multipart_upload", key)["UploadId"]
    try:
        done = []
        for number, body in enumerate(parts, start=1):
            answer = bucket.call("upload_part", key, UploadId=upload, PartNumber=number,
                                 Body=body, ContentLength=len(body))
            done.append({"PartNumber": number, "ETag": answer["ETag"]})
        bucket.call("complete_multipart_upload", key, UploadId=upload,
                    MultipartUpload={"Parts": done})
    except BaseException:
        _quietly(lambda: bucket.call("abort_multipart_upload", key, UploadId=upload))
        raise


def _quietly(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except Exception:   # cleanup after a failure: the failure is what gets reported
        return None


def _describe(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) < 300 else text[:300] + "..."

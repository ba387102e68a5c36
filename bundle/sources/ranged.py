"""Resumable HTTP reads: Range GETs that pick up after a dropped connection.

Every network source (the http layout, OCI registries, S3 buckets) reads file bytes the
same way: a GET of a byte range, streamed. When the connection drops, times out or the
server answers 5xx/429 mid-transfer, the read asks again from the first byte it has not
yet received, so bytes already handed to the caller are never fetched twice. A read gives
up only after ``attempts`` consecutive failures without progress, with
:class:`SourceUnavailable` naming the URL, the last cause and how far it got. That loop is
:func:`read_resumably`; :class:`RangedReader` runs it over plain ``requests`` GETs, and the
s3 source over botocore's.

A server that ignores Range (answers 200) is read from the start with the leading bytes
skipped. A server whose object is shorter than the range asked for (416, or a total size
below the end) raises :class:`IntegrityMismatch` as a truncated file: waiting will not
make it longer. 404/401/403 and other 4xx answers are final at once.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

import requests
import urllib3

from ..errors import IntegrityMismatch, SourceUnavailable
from .metrics import FETCHED_BYTES, RETRIES
from .source import BLOCK_SIZE

log = logging.getLogger("resident.bundle.sources")
CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
T = TypeVar("T")
RETRYABLE = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError,
             urllib3.exceptions.HTTPError, http.client.HTTPException, ConnectionError, TimeoutError)


class _Retry(Exception):
    """A server answer that deserves another try (5xx, 429)."""


class TransientUnavailable(SourceUnavailable):
    """A failure another attempt may cure: a dropped connection, a timeout, a 5xx or 429."""


def is_transient(status_code: int) -> bool:
    return status_code >= 500 or status_code == 429


def is_outage(error: BaseException) -> bool:
    """True when a read failed because the server did not answer usefully (no connection,
    a timeout, 5xx or 429, after the retries), False when it answered no (a 4xx) or the
    failure was not the network's: the cause chain is searched, since a reader that gives
    up raises :class:`SourceUnavailable` from the last cause."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (TransientUnavailable, _Retry, *RETRYABLE)):
            return True
        seen = seen.__cause__
    return False
_OS_ERROR = re.compile(r"\[Errno -?\d+\] [^'\")\]]+")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard a network source tries before it reports the source unavailable."""

    attempts: int = 5          # consecutive failures without progress before giving up
    backoff_seconds: float = 0.2  # first wait; doubled each time, capped at 5 s
    connect_timeout_seconds: float = 5.0
    read_timeout_seconds: float = 30.0

    @property
    def timeout(self) -> tuple[float, float]:
        return (self.connect_timeout_seconds, self.read_timeout_seconds)

    def wait(self, failures: int) -> None:
        time.sleep(min(5.0, self.backoff_seconds * 2 ** (failures - 1)))

    def call(self, attempt: Callable[[], T], scheme: str) -> T:
        """Run ``attempt()`` again after :class:`TransientUnavailable`, at most ``attempts`` times.

        For requests that can be repeated whole (a push's uploads): ``attempt`` must make
        its request body afresh each time.
        """
        failures = 0
        while True:
            try:
                return attempt()
            except TransientUnavailable as e:
                failures += 1
                if failures >= self.attempts:
                    raise TransientUnavailable(f"{e} (gave up after {failures} attempts)") from e
                RETRIES.labels(scheme).inc()
                log.warning("request failed, retrying", extra={"cause": _describe(e), "attempt": failures})
                self.wait(failures)


def final_status(resp: requests.Response, url: str) -> None:
    """Raise for answers that end a request: _Retry for 5xx/429, SourceUnavailable for 4xx."""
    code = resp.status_code
    if is_transient(code):
        raise _Retry(f"HTTP {code}")
    if code == 404 or code == 410:
        raise SourceUnavailable(f"{url}: not found (HTTP {code})")
    if code >= 400 and code != 416:
        raise SourceUnavailable(f"{url}: HTTP {code} {resp.reason}")


def read_resumably(attempt: Callable[[int, int], Iterator[bytes]], offset: int, length: int,
                   policy: RetryPolicy, scheme: str, url: str) -> Iterator[bytes]:
    """Yield exactly the bytes ``[offset, offset+length)``, asking ``attempt`` again after drops.

    ``attempt(pos, end)`` starts one request for ``[pos, end)`` and yields its bytes from
    ``pos`` on as they arrive (a generator: it is closed when the read stops early). It
    raises a retryable error (a connection error of ``requests``, :class:`TransientUnavailable`,
    a 5xx) to have the read resumed, anything else to end it. An attempt that brought bytes
    is repeated at once; ``policy.attempts`` consecutive ones that brought none give up with
    :class:`SourceUnavailable` naming ``url``.
    """
    pos, end, failures = offset, offset + length, 0
    while pos < end:
        attempt_start = pos
        try:
            with contextlib.closing(attempt(pos, end)) as blocks:
                for block in blocks:
                    block = block[:end - pos]
                    if not block:
                        continue
                    pos += len(block)
                    FETCHED_BYTES.labels(scheme).inc(len(block))
                    yield block
                    if pos >= end:
                        break
            if pos < end:
                raise _Retry("response ended early")
        except (_Retry, TransientUnavailable, *RETRYABLE) as e:
            if pos > attempt_start:  # it was delivering: ask again at once
                failures = 0
                RETRIES.labels(scheme).inc()
                log.info("source read resumed", extra={"url": url, "offset": pos,
                                                       "cause": _describe(e)})
                continue
            failures += 1
            give_up_or_wait(policy, scheme, failures, url, e,
                            f"{pos - offset} of {length} bytes received")


def give_up_or_wait(policy: RetryPolicy, scheme: str, failures: int, url: str,
                    cause: Exception, progress: str) -> None:
    """After the ``failures``-th failed attempt: raise SourceUnavailable (from ``cause``)
    once the policy's attempts are spent, else count a retry and wait the backoff."""
    where = f", {progress}" if progress else ""
    if failures >= policy.attempts:
        raise SourceUnavailable(f"{url}: {_describe(cause)} (gave up after {failures} "
                                f"attempts{where})") from cause
    RETRIES.labels(scheme).inc()
    log.warning("source read failed, retrying", extra={
        "url": url, "cause": _describe(cause), "attempt": failures})
    policy.wait(failures)


class RangedReader:
    """Streams byte ranges of URLs over one ``requests.Session`` with bounded resumption."""

    def __init__(self, session: requests.Session, policy: RetryPolicy, scheme: str) -> None:
        self.session, self.policy, self.scheme = session, policy, scheme
        # bytes as stored: a compressed representation would break digests and ranges
        session.headers["Accept-Encoding"] = "identity"

    def read(self, url: str, offset: int, length: int, path: str, sha256: str) -> Iterator[bytes]:
        """Yield exactly the bytes ``[offset, offset+length)`` of ``url``, resuming as needed.

        ``path``/``sha256`` name the bundle file, for errors only.
        """
        def attempt(pos: int, end: int) -> Iterator[bytes]:
            with self.session.get(url, headers={"Range": f"bytes={pos}-{end - 1}"},
                                  stream=True, timeout=self.policy.timeout) as resp:
                skip = self._start(resp, url, pos, end, offset, path, sha256)
                for block in _arriving(resp):
                    if skip:
                        cut = min(skip, len(block))
                        block, skip = block[cut:], skip - cut
                    yield block

        return read_resumably(attempt, offset, length, self.policy, self.scheme, url)

    def get_small(self, url: str, limit: int, headers: dict | None = None) -> bytes:
        """GET a small document (a manifest) whole, with retries; at most ``limit`` bytes."""
        failures = 0
        while True:
            try:
                resp = self.session.get(url, headers=headers or {}, stream=True,
                                        timeout=self.policy.timeout)
                with resp:
                    final_status(resp, url)
                    body = bytearray()
                    for block in _arriving(resp):
                        body += block
                        if len(body) > limit:
                            raise SourceUnavailable(f"{url}: document larger than {limit} bytes")
                return bytes(body)
            except (_Retry, *RETRYABLE) as e:
                failures += 1
                give_up_or_wait(self.policy, self.scheme, failures, url, e, "")

    @staticmethod
    def _start(resp: requests.Response, url: str, pos: int, end: int, offset: int,
               path: str, sha256: str) -> int:
        """Check a response to a Range GET; return how many leading bytes to skip."""
        def short(total: int) -> IntegrityMismatch:
            return IntegrityMismatch(path, sha256, None, received=max(0, total - offset),
                                     wanted=end - offset, detail=f"{url} holds only {total} bytes")

        if resp.status_code == 416:
            m = re.match(r"^bytes \*/(\d+)$", resp.headers.get("Content-Range", ""))
            raise short(int(m.group(1)) if m else pos)
        final_status(resp, url)
        if resp.status_code == 200:  # Range ignored: the whole object, skip to pos
            total = resp.headers.get("Content-Length")
            if total is not None and int(total) < end:
                raise short(int(total))
            return pos
        if resp.status_code != 206:
            raise SourceUnavailable(f"{url}: unexpected HTTP {resp.status_code} to a Range request")
        m = CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
        if not m or int(m.group(1)) != pos:
            raise SourceUnavailable(f"{url}: Content-Range {resp.headers.get('Content-Range')!r} "
                                    f"does not answer bytes={pos}-{end - 1}")
        if m.group(3) != "*" and int(m.group(3)) < end:
            raise short(int(m.group(3)))
        return 0


def _arriving(resp: requests.Response) -> Iterator[bytes]:
    """Body blocks as they arrive (``read1``), so bytes before a drop still reach the caller.

    ``iter_content`` reads fixed-size blocks and loses a partly filled one when the
    connection breaks; resuming must start after the last byte actually received.
    """
    while True:
        block = resp.raw.read1(BLOCK_SIZE)
        if not block:
            return
        yield block


def _describe(e: Exception) -> str:
    """The error in a line; a connection error by its OS error (urllib3 buries it at the end
    of a long message: "[Errno 111] Connection refused")."""
    text = str(e) or type(e).__name__
    os_error = _OS_ERROR.search(text)
    if os_error:
        return f"{os_error.group(0).rstrip()} ({type(e).__name__})"
    return text if len(text) < 300 else text[:300] + "..."

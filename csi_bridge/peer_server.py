"""Serving the node store to other nodes' bridges, and to nothing else (issue 30).

A bridge that needs a revision another node holds reads it from that node's bridge
(:class:`bundle.sources.peers.PeeredSource`). This is the serving side: an HTTP server
on the node's (Pod's) address that answers, read-only, from the store::

    GET /v1/manifests/sha256-<hex>.json   the manifest of a revision the store holds
    GET /v1/blobs/<content key>           a file's content by its store name; one
                                          ``Range: bytes=a-b`` gives 206

Decisions:

- **Who may read.** Every request carries ``Authorization: Bearer <token>``, a projected
  ServiceAccount token with the peer audience. :class:`TokenReviewer` asks the API server
  (TokenReview, with that audience) who it is, and only the bridge's own ServiceAccount
  (``--peer-account``) is served: not another namespace's account, not a token minted for
  another audience (such as the API server's own). A review is remembered for a minute
  per token (by its sha256), so a transfer of many chunks costs one review. No token,
  a token the API server does not accept, and a token of another account are refused
  (401, 401, 403) and counted by reason; when the API server cannot be asked the answer
  is 503, so the puller goes elsewhere.
- **Limits.** At most ``max_transfers`` answers at once (more get 503 with
  ``Retry-After``: the puller takes that chunk from another peer or the origin), and at
  most ``rate`` bytes per second over all of them (0: no limit).
- **A blob collected mid-read.** The file is opened before the answer starts; an open file
  keeps its bytes when GC unlinks it, and content never changes under a content key, so
  the read finishes with the right bytes. A blob already gone is 404.
- Content is never verified here: the puller hashes every chunk against the manifest
  before it stores it, and drops a peer that served a wrong one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bundle.manifest import MANIFEST_NAME, check_digest

log = logging.getLogger("resident.bridge.peers")

AUDIENCE = "peers.resident.dev"      # the audience of the tokens bridges present to each other
REVIEW_SECONDS = 60.0                # how long a TokenReview's answer is used
BLOCK = 1 << 20
_BLOB = re.compile(r"^/v1/blobs/([0-9a-f]{64})$")
_MANIFEST = re.compile(r"^/v1/manifests/sha256-([0-9a-f]{64})\.json$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
OUTCOMES = ("served", "not-found", "busy", "no-token", "unauthenticated", "forbidden", "bad-range",
            "review-unavailable")


class Refused(Exception):
    def __init__(self, code: int, outcome: str, message: str):
        super().__init__(message)
        self.code, self.outcome = code, outcome


class TokenReviewer:
    """Who a token is, by TokenReview with the peer audience; only ``account`` is let in."""

    def __init__(self, api_client, account: str, audience: str = AUDIENCE, clock=time.monotonic):
        from kubernetes import client
        self.api = client.AuthenticationV1Api(api_client)
        self.account, self.audience, self.clock = account, audience, clock
        self._seen: dict[str, tuple[float, Refused | None]] = {}
        self._lock = threading.Lock()

    def check(self, header: str | None) -> None:
        """Return if the ``Authorization`` header carries a token of the bridge's own
        account for the peer audience; raise :class:`Refused` otherwise."""
        if not header or not header.startswith("Bearer ") or not header[7:].strip():
            raise Refused(401, "no-token", "a bearer token of the bridge's ServiceAccount is required")
        token = header[7:].strip()
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
        if seen is None or now - seen[0] > REVIEW_SECONDS:
            seen = (now, self._review(token))
            with self._lock:
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] <= REVIEW_SECONDS}
                self._seen[key] = seen
        if seen[1] is not None:
            raise seen[1]

    def _review(self, token: str) -> Refused | None:
        from kubernetes import client
        try:
            review = self.api.create_token_review(client.V1TokenReview(
                spec=client.V1TokenReviewSpec(token=token, audiences=[self.audience])), _request_timeout=10)
        except Exception as e:   # the API server cannot be asked: not remembered, say so
            raise Refused(503, "review-unavailable", f"cannot review the token: {type(e).__name__}") from None
        st = review.status
        if not st or not st.authenticated:
            return Refused(401, "unauthenticated", f"the token is not valid for audience {self.audience}"
                           + (f": {st.error}" if st and st.error else ""))
        user = st.user.username if st.user else ""
        if user != self.account:
            return Refused(403, "forbidden", f"{user} is not the bridge's ServiceAccount")
        return None


class RateLimit:
    """Bytes per second over every answer (0: unlimited): each block waits its turn."""

    def __init__(self, per_second: float):
        self.per_second = per_second
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        if self.per_second <= 0:
            return
        with self._lock:
            now = time.monotonic()
            start = max(self._next, now)
            self._next = start + n / self.per_second
        if start > now:
            time.sleep(start - now)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A peer that closes its connection between requests (a probe done with it) is no
        error; anything else is logged in the bridge's structured form, not as a bare traceback."""
        err = sys.exc_info()[1]
        if isinstance(err, (ConnectionResetError, BrokenPipeError, TimeoutError)):
            return
        log.warning("a peer request failed", extra={"peer": str(client_address[0]),
                                                    "error": f"{type(err).__name__}: {err}"[:300]})


class PeerServer:
    """Serve ``store`` to peers on ``address:port`` (port 0: any free one)."""

    def __init__(self, store, reviewer: TokenReviewer, address: str, port: int, metrics=None,
                 max_transfers: int = 4, rate: float = 0.0):
        self.store, self.reviewer, self.metrics = store, reviewer, metrics
        self.slots = threading.BoundedSemaphore(max(1, max_transfers))
        self.rate = RateLimit(rate)
        self._open_connections: set = set()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                with server._lock:
                    server._open_connections.add(self.connection)

            def finish(self):
                with server._lock:
                    server._open_connections.discard(self.connection)
                super().finish()

            def do_GET(self):   # noqa: N802 - http.server's name
                server._answer(self)

            def log_message(self, *args):   # structured logs only
                pass

        self.httpd = _Server((address, port), Handler)
        self.httpd.daemon_threads = True
        self.address = f"{address}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="peer-server", daemon=True)

    def start(self) -> "PeerServer":
        self._thread.start()
        log.info("serving the store to peers", extra={"address": self.address})
        return self

    def stop(self) -> None:
        """Stop serving, and end the answers under way (their pullers go elsewhere)."""
        self.httpd.shutdown()
        self.httpd.server_close()
        with self._lock:
            conns = list(self._open_connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- one request ---------------------------------------------------------------------
    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        try:
            self.reviewer.check(h.headers.get("Authorization"))
            if not self.slots.acquire(blocking=False):
                raise Refused(503, "busy", "this node serves as many peers as it may; ask another")
            try:
                sent = self._send(h)
            finally:
                self.slots.release()
            self._count("served", sent)
        except Refused as e:
            self._count(e.outcome)
            body = (str(e) + "\n").encode()
            h.send_response(e.code)
            if e.code == 503:
                h.send_header("Retry-After", "1")
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the peer went away mid-answer: it takes the rest elsewhere

    def _open(self, path: str) -> int:
        m = _MANIFEST.match(path)
        if m:
            digest = check_digest(f"sha256:{m.group(1)}")
            if self.store.has_revision(digest):
                try:
                    return os.open(self.store.revision_path(digest) / MANIFEST_NAME, os.O_RDONLY)
                except FileNotFoundError:
                    pass
            raise Refused(404, "not-found", f"this node does not hold {digest}")
        m = _BLOB.match(path)
        if m:
            try:
                return os.open(self.store.blob_path(m.group(1)), os.O_RDONLY)
            except FileNotFoundError:
                raise Refused(404, "not-found", "this node does not hold that blob") from None
        raise Refused(404, "not-found", "no such path")

    def _send(self, h: BaseHTTPRequestHandler) -> int:
        fd = self._open(h.path.split("?", 1)[0])
        try:
            size = os.fstat(fd).st_size
            start, end, status = 0, size, 200
            wanted = h.headers.get("Range")
            if wanted:
                m = _RANGE.match(wanted.strip())
                if not m or int(m.group(1)) >= max(size, 1):
                    raise Refused(416, "bad-range", f"unsatisfiable range {wanted!r} of {size} bytes")
                start = int(m.group(1))
                end = min(size, int(m.group(2)) + 1) if m.group(2) else size
                if end <= start:
                    raise Refused(416, "bad-range", f"unsatisfiable range {wanted!r} of {size} bytes")
                status = 206
            h.send_response(status)
            h.send_header("Content-Type", "application/octet-stream")
            h.send_header("Content-Length", str(end - start))
            if status == 206:
                h.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            h.end_headers()
            h.wfile.flush()
            pos = start
            with open(fd, "rb", closefd=False) as f:
                while pos < end:   # the kernel copies file to socket: no Python buffer per block
                    self.rate.take(min(BLOCK, end - pos))
                    sent = h.connection.sendfile(f, pos, min(BLOCK, end - pos))
                    if not sent:
                        break    # cannot happen for an immutable blob; the puller sees a short answer
                    pos += sent
            return pos - start
        finally:
            os.close(fd)

    def _count(self, outcome: str, sent: int = 0) -> None:
        if self.metrics is None:
            return
        self.metrics.peer_requests.labels(outcome).inc()
        if sent:
            self.metrics.peer_served_bytes.inc(sent)

"""A small content-addressed bundle server: the http layout, over GET (with Range) and PUT.

It serves the layout documented in docs/bundle-sources.md from a root directory::

    ROOT/[PREFIX/]manifests/sha256-<hex>.json   bundle manifests, by bundle digest
    ROOT/[PREFIX/]blobs/sha256-<hex>            file contents, by the file's sha256

``PREFIX`` is any number of plain path segments, so one server can hold many bundle
repositories (``http://127.0.0.1:8700/models/tiny`` is one). GET and HEAD honour a single
byte range; PUT stores an object only if its body hashes to the digest in its name
(written to a temporary name, then renamed), so the server never holds content under a
wrong name. Nothing else is served. It binds 127.0.0.1 unless told otherwise.

Run it as ``python -m bundle.sources.httpserve --root DIR --port P``; it logs JSON lines
and exposes Prometheus metrics at ``/metrics``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest

from .. import jsonlog

log = logging.getLogger("resident.bundle.httpserve")
OBJECT_PATH = re.compile(
    r"^/((?:[A-Za-z0-9_][A-Za-z0-9._-]*/)*)(manifests/sha256-([0-9a-f]{64})\.json|blobs/sha256-([0-9a-f]{64}))$")
RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
COPY_BLOCK = 1024 * 1024
SERVED_BYTES = Counter("resident_bundle_server_sent_bytes_total", "Body bytes sent by the bundle server")
STORED_BYTES = Counter("resident_bundle_server_stored_bytes_total", "Bytes stored by PUT on the bundle server")
REJECTED = Counter("resident_bundle_server_rejected_puts_total",
                   "PUTs refused because the body did not hash to its name, or was malformed")


class BundleRequestHandler(BaseHTTPRequestHandler):
    """GET/HEAD/PUT of content-addressed objects under ``server.root``."""

    protocol_version = "HTTP/1.1"
    server_version = "resident-bundle-server/1"

    # -- routing ---------------------------------------------------------------------
    def _object(self) -> tuple[Path, str] | None:
        m = OBJECT_PATH.match(self.path.split("?", 1)[0])
        if not m:
            return None
        return self.server.root / (m.group(1) + m.group(2)), (m.group(3) or m.group(4))

    def do_HEAD(self) -> None:
        self._get(head=True)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            return self._reply(200, generate_latest(), CONTENT_TYPE_LATEST)
        self._get(head=False)

    def _get(self, head: bool) -> None:
        found = self._object()
        if found is None or not found[0].is_file():
            return self._reply(404, b"not found\n")
        path = found[0]
        size = path.stat().st_size
        start, length, status = 0, size, 200
        header = self.headers.get("Range")
        if header:
            m = RANGE.match(header.strip())
            if m and (m.group(1) or m.group(2)):
                if m.group(1):
                    start = int(m.group(1))
                    last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
                else:  # suffix range: the last N bytes
                    start, last = max(0, size - int(m.group(2))), size - 1
                if start >= size or last < start:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                length, status = last - start + 1, 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{start + length - 1}/{size}")
        self.end_headers()
        if not head:
            with open(path, "rb") as f:
                f.seek(start)
                self.send_body(f, length)

    def send_body(self, f, length: int) -> None:
        """Copy ``length`` bytes of ``f`` to the client (tests override this to misbehave),
        no faster than the server's ``rate`` (bytes per second) when it has one."""
        rate, start, sent = self.server.rate, time.monotonic(), 0
        step = min(COPY_BLOCK, max(4096, int(rate / 20))) if rate else COPY_BLOCK
        while length > 0:
            block = f.read(min(step, length))
            if not block:
                break
            if rate:   # this block leaves when the ones before it have had their time
                time.sleep(max(0.0, start + sent / rate - time.monotonic()))
            self.wfile.write(block)
            SERVED_BYTES.inc(len(block))
            length -= len(block)
            sent += len(block)

    def do_PUT(self) -> None:
        found = self._object()
        refusal = None
        if found is None:
            refusal = (404, b"PUT only to manifests/sha256-<hex>.json or blobs/sha256-<hex>\n")
        elif self.server.read_only:
            refusal = (405, b"this server is read-only\n")
        elif "chunked" in self.headers.get("Transfer-Encoding", "") or \
                not self.headers.get("Content-Length", "").isdigit():
            refusal = (411, b"a Content-Length is required\n")
        if refusal:
            self.close_connection = True  # the unread body must not be taken for a request
            return self._reply(*refusal)
        path, hexdigest = found
        code, message = self._store(path, hexdigest, int(self.headers["Content-Length"]))
        if code == 400:
            REJECTED.inc()
        self._reply(code, message.encode())

    def _store(self, path: Path, hexdigest: str, length: int) -> tuple[int, str]:
        """Receive the body into a temporary file; rename it to ``path`` only if it verifies.

        The temporary file is gone before the answer is sent, whatever the outcome.
        """
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            hasher, left = hashlib.sha256(), length
            with os.fdopen(fd, "wb") as out:
                while left > 0:
                    block = self.rfile.read(min(COPY_BLOCK, left))
                    if not block:
                        break
                    hasher.update(block)
                    out.write(block)
                    left -= len(block)
            if left:
                self.close_connection = True
                return 400, f"body ended after {length - left} of {length} bytes\n"
            if hasher.hexdigest() != hexdigest:
                return 400, f"body sha256 {hasher.hexdigest()} does not match the name\n"
            existed = path.exists()
            os.replace(tmp, path)
            tmp = None
            STORED_BYTES.inc(length)
            return (200 if existed else 201), ""
        except OSError as e:
            return 507, f"cannot store: {e.strerror}\n"
        finally:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)

    # -- plumbing --------------------------------------------------------------------
    def _reply(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_request(self, code="-", size="-") -> None:
        log.info("request", extra={"method": self.command, "path": self.path, "status": int(code)
                                   if str(code).isdigit() else str(code), "client": self.client_address[0]})

    def log_message(self, format: str, *args) -> None:
        log.warning(format % args)


class BundleServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path | str, host: str = "127.0.0.1", port: int = 0,
                 handler: type[BundleRequestHandler] = BundleRequestHandler, read_only: bool = False,
                 rate: float | None = None):
        self.root = Path(root)
        self.read_only = read_only
        self.rate = rate
        super().__init__((host, port), handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bundle.sources.httpserve",
        description="Serve bundles in Resident's http layout (manifests/ and blobs/ by sha256) "
                    "with Range GETs, and accept verified PUTs from 'resident bundle push'.")
    ap.add_argument("--root", required=True, type=Path, help="directory holding the layout (created if absent)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    ap.add_argument("--port", type=int, default=8700, help="TCP port (default 8700; 0 picks a free one)")
    ap.add_argument("--read-only", action="store_true", help="refuse PUT")
    ap.add_argument("--rate", type=float, default=None, metavar="BYTES_PER_SECOND",
                    help="send content no faster than this (a slow source for tests and demos)")
    args = ap.parse_args(argv)
    jsonlog.configure()
    args.root.mkdir(parents=True, exist_ok=True)
    server = BundleServer(args.root, args.host, args.port, read_only=args.read_only, rate=args.rate)
    log.info("serving", extra={"url": server.url, "root": str(args.root), "read_only": args.read_only})
    print(server.url, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

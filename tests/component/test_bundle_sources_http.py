"""http(s):// sources and push against a real bundle server on 127.0.0.1, well and badly behaved."""

from __future__ import annotations

import hashlib
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from bundle.errors import IntegrityMismatch, SourceUnavailable
from bundle.manifest import MANIFEST_NAME, ManifestError, chunk_range
from bundle.scan import build_manifest, write_manifest
from bundle.sources import RetryPolicy, fetch_verified, open_source, push, push_size
from bundle.sources.httpserve import BundleRequestHandler, BundleServer

CHUNK = 8192
FAST = RetryPolicy(attempts=3, backoff_seconds=0.01, connect_timeout_seconds=2, read_timeout_seconds=5)


def make_bundle(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "model.safetensors").write_bytes(os.urandom(4 * CHUNK + 100))
    (root / "graph.onnx").write_bytes(os.urandom(3000))
    (root / "config.json").write_bytes(b'{"layers": 2}')
    (root / "sub" / "copy.json").write_bytes(b'{"layers": 2}')  # same content: one blob
    (root / "sub" / "empty.txt").write_bytes(b"")
    write_manifest(root, build_manifest(root, chunk_size=CHUNK))
    return root


class FaultyHandler(BundleRequestHandler):
    """The real handler, with faults switched on per test through ``server.fault``."""

    def do_GET(self):
        if self.server.fault == "ignore_range" and "Range" in self.headers:
            del self.headers["Range"]
        super().do_GET()

    def do_PUT(self):
        srv = self.server
        srv.puts.append(self.path)
        if srv.fault == "drop_put" and "/blobs/" in self.path and not srv.dropped:
            srv.dropped += 1  # take half the body, then vanish without an answer
            self.rfile.read(int(self.headers["Content-Length"]) // 2)
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if srv.fault == "busy_put":
            srv.dropped += 1
            self.close_connection = True
            return self._reply(503, b"busy\n")
        super().do_PUT()

    def send_body(self, f, length):
        srv = self.server
        srv.ranges.append(self.headers.get("Range"))
        srv.encodings.add(self.headers.get("Accept-Encoding"))
        fault, cut = srv.fault, srv.cut
        if fault == "corrupt":
            data = bytearray(f.read(length))
            if srv.flip_at < len(data):
                data[srv.flip_at] ^= 0xFF
            self.wfile.write(bytes(data))
        elif fault in ("drop_once", "drop_always", "down_after") and length > cut and \
                not (fault == "drop_once" and srv.dropped):
            srv.dropped += 1
            self.wfile.write(f.read(cut))
            self.wfile.flush()
            if fault == "down_after":
                srv.shutdown()
                srv.socket.close()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
        else:
            super().send_body(f, length)


@pytest.fixture
def server(tmp_path):
    srv = BundleServer(tmp_path / "srv", handler=FaultyHandler)
    srv.fault, srv.cut, srv.flip_at, srv.dropped, srv.ranges, srv.puts = None, 5000, 0, 0, [], []
    srv.encodings = set()
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


@pytest.fixture
def bundle_dir(tmp_path):
    return make_bundle(tmp_path / "bundle")


@pytest.fixture
def published(server, bundle_dir):
    """(source, manifest) of the bundle pushed to the server."""
    uri = server.url + "/models/tiny"
    digest = push(bundle_dir, uri)
    src = open_source(uri, FAST)
    try:
        yield src, src.fetch_manifest(digest)
    finally:
        src.close()


def test_push_then_read_every_file_and_chunk(server, bundle_dir):
    uri = server.url + "/models/tiny"
    seen = []
    digest = push(bundle_dir, uri, progress=seen.append)
    assert digest == "sha256:" + hashlib.sha256((bundle_dir / MANIFEST_NAME).read_bytes()).hexdigest()
    with open_source(uri, FAST) as src:
        m = src.fetch_manifest(digest)
        assert sum(seen) == sum(f.size for f in {f.sha256: f for f in m.files}.values())
        assert sum(seen) == push_size(bundle_dir, uri)
        for f in m.files:
            assert fetch_verified(src, f, 0, f.size, f.sha256) == (bundle_dir / f.path).read_bytes()
        big = m.by_path()["model.safetensors"]
        for i, sha in enumerate(big.chunks):
            off, n = chunk_range(big, i, m.chunk_size)
            fetch_verified(src, big, off, n, sha, chunk=i)
            assert server.ranges[-1] == f"bytes={off}-{off + n - 1}"
    assert server.encodings == {"identity"}  # never a compressed representation: digests and ranges hold
    blobs = list((server.root / "models" / "tiny" / "blobs").iterdir())
    assert len(blobs) == len({f.sha256 for f in m.files})  # one blob per distinct content
    server.puts.clear()
    assert push(bundle_dir, uri) == digest  # a second push only re-sends the manifest
    assert server.puts == [f"/models/tiny/manifests/{digest.replace(':', '-')}.json"]


def test_resumes_with_a_range_from_the_last_received_byte(server, published):
    src, m = published
    big = m.by_path()["model.safetensors"]
    server.fault, server.ranges = "drop_once", []
    data = fetch_verified(src, big, 100, big.size - 100, hashlib.sha256(
        (server.root / "models/tiny/blobs" / f"sha256-{big.sha256}").read_bytes()[100:]).hexdigest())
    assert len(data) == big.size - 100
    assert server.ranges == [f"bytes=100-{big.size - 1}", f"bytes={100 + 5000}-{big.size - 1}"]


def test_a_connection_that_keeps_dropping_still_completes_while_it_progresses(server, published):
    src, m = published
    big = m.by_path()["model.safetensors"]
    server.fault, server.cut, server.ranges = "drop_always", 3000, []
    assert hashlib.sha256(b"".join(src.read(big, 0, big.size))).hexdigest() == big.sha256
    assert len(server.ranges) == -(-big.size // 3000)
    assert server.ranges[3] == f"bytes=9000-{big.size - 1}"


def test_source_down_mid_transfer_is_unavailable_with_url_and_cause(server, published):
    src, m = published
    big = m.by_path()["model.safetensors"]
    server.fault = "down_after"
    got = bytearray()
    with pytest.raises(SourceUnavailable) as e:
        for block in src.read(big, 0, big.size):
            got += block
    msg = str(e.value)
    assert f"{server.url}/models/tiny/blobs/sha256-{big.sha256}" in msg
    assert "gave up after 3 attempts" in msg and "5000 of" in msg
    assert "refused" in msg.lower() or "connection" in msg.lower()
    assert bytes(got) == (server.root / "models/tiny/blobs" / f"sha256-{big.sha256}").read_bytes()[:5000]


def test_a_source_that_is_down_is_unavailable(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SourceUnavailable, match=f"127.0.0.1:{port}.*gave up after 3 attempts"):
        open_source(f"http://127.0.0.1:{port}/x", FAST).fetch_manifest("sha256:" + "0" * 64)


def test_wrong_bytes_fail_verification_of_that_chunk_only(server, published):
    src, m = published
    big = m.by_path()["model.safetensors"]
    server.fault, server.flip_at = "corrupt", 10
    off, n = chunk_range(big, 1, m.chunk_size)
    with pytest.raises(IntegrityMismatch, match="model.safetensors chunk 1"):
        fetch_verified(src, big, off, n, big.chunks[1], chunk=1)
    server.flip_at = 10 ** 9  # beyond every body: the same server now serves good bytes
    assert len(fetch_verified(src, big, off, n, big.chunks[1], chunk=1)) == n


def test_a_server_holding_a_truncated_blob_is_an_integrity_mismatch(server, published):
    src, m = published
    big = m.by_path()["model.safetensors"]
    blob = server.root / "models/tiny/blobs" / f"sha256-{big.sha256}"
    os.truncate(blob, 2 * CHUNK)
    with pytest.raises(IntegrityMismatch, match="truncated: got 16384 of"):
        list(src.read(big, 0, big.size))
    with pytest.raises(IntegrityMismatch, match="truncated"):  # range starts past the end: 416
        list(src.read(big, 3 * CHUNK, CHUNK))


def test_a_server_that_ignores_range_is_read_from_the_start_and_skipped(server, published):
    src, m = published
    big = m.by_path()["model.safetensors"]
    server.fault = "ignore_range"
    off, n = chunk_range(big, 2, m.chunk_size)
    assert hashlib.sha256(fetch_verified(src, big, off, n, big.chunks[2])).hexdigest() == big.chunks[2]


def test_wrong_or_missing_manifest(server, published, bundle_dir):
    src, m = published
    manifests = server.root / "models/tiny/manifests"
    wrong = "sha256:" + "1" * 64
    (manifests / f"sha256-{'1' * 64}.json").write_bytes(m.canonical_json())  # bytes of another digest
    with pytest.raises(IntegrityMismatch, match="resident-manifest.json"):
        src.fetch_manifest(wrong)
    with pytest.raises(SourceUnavailable, match="not found"):
        src.fetch_manifest("sha256:" + "2" * 64)


def test_a_served_manifest_with_path_traversal_is_rejected(server, published):
    src, m = published
    doc = json.loads(m.canonical_json())
    doc["files"][0]["path"] = "../../../etc/evil"
    raw = json.dumps(doc).encode()
    hexd = hashlib.sha256(raw).hexdigest()
    (server.root / "models/tiny/manifests" / f"sha256-{hexd}.json").write_bytes(raw)
    with pytest.raises(ManifestError, match="escapes"):
        src.fetch_manifest("sha256:" + hexd)


def test_the_server_stores_only_bodies_that_match_their_name(server):
    good, bad = b"content", b"tampered"
    hexd = hashlib.sha256(good).hexdigest()
    url = f"{server.url}/r/blobs/sha256-{hexd}"
    r = requests.put(url, data=bad, timeout=5)
    assert r.status_code == 400 and "does not match" in r.text
    assert not (server.root / "r/blobs").exists() or not list((server.root / "r/blobs").iterdir())
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    conn.request("PUT", f"/r/../x/blobs/sha256-{hexd}", body=good)  # sent as written, not normalized
    assert conn.getresponse().status == 404
    conn.close()
    assert requests.put(url, data=good, timeout=5).status_code == 201
    assert requests.get(url, timeout=5).content == good
    assert [p.name for p in (server.root / "r/blobs").iterdir()] == [f"sha256-{hexd}"]


def test_the_server_refuses_puts_without_a_length(server):
    hexd = hashlib.sha256(b"abc").hexdigest()
    url = f"{server.url}/r/blobs/sha256-{hexd}"
    chunked = requests.put(url, data=iter([b"a", b"bc"]), timeout=5)  # Transfer-Encoding: chunked
    assert chunked.status_code == 411
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    conn.putrequest("PUT", f"/r/blobs/sha256-{hexd}")
    conn.putheader("Content-Length", "three")
    conn.endheaders()
    assert conn.getresponse().status == 411
    conn.close()
    assert not (server.root / "r").exists()


def test_push_of_a_changed_bundle_publishes_no_manifest(server, bundle_dir):
    data = bytearray((bundle_dir / "graph.onnx").read_bytes())
    data[5] ^= 1
    (bundle_dir / "graph.onnx").write_bytes(bytes(data))
    with pytest.raises(IntegrityMismatch, match="graph.onnx"):
        push(bundle_dir, server.url + "/m")
    assert not (server.root / "m" / "manifests").exists()


def test_push_to_a_read_only_server_is_refused_without_retrying(server, bundle_dir):
    server.read_only = True
    with pytest.raises(SourceUnavailable, match="405"):
        push(bundle_dir, server.url + "/m", policy=FAST)
    assert not (server.root / "m").exists()
    assert len(server.puts) == 1


def test_push_repeats_a_file_whose_upload_dropped(server, bundle_dir):
    server.fault = "drop_put"
    seen = []
    digest = push(bundle_dir, server.url + "/m", progress=seen.append, policy=FAST)
    assert server.dropped == 1
    first_blob = server.puts[0]
    assert server.puts.count(first_blob) == 2  # sent again, whole
    assert sum(seen) == push_size(bundle_dir, server.url + "/m")  # not counted twice
    with open_source(server.url + "/m", FAST) as src:
        m = src.fetch_manifest(digest)
        for f in m.files:
            assert fetch_verified(src, f, 0, f.size, f.sha256) == (bundle_dir / f.path).read_bytes()


def test_push_to_a_server_that_stays_busy_gives_up(server, bundle_dir):
    server.fault = "busy_put"
    with pytest.raises(SourceUnavailable, match="503.*gave up after 3 attempts"):
        push(bundle_dir, server.url + "/m", policy=FAST)
    assert server.dropped == 3
    assert not (server.root / "m" / "manifests").exists()


def test_httpserve_runs_as_a_program(tmp_path, bundle_dir):
    helptext = subprocess.run([sys.executable, "-m", "bundle.sources.httpserve", "--help"],
                              capture_output=True, text=True, check=True).stdout
    assert "Range" in helptext and "--root" in helptext and "127.0.0.1" in helptext
    proc = subprocess.Popen([sys.executable, "-m", "bundle.sources.httpserve", "--root",
                             str(tmp_path / "root"), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        digest = push(bundle_dir, url + "/demo")
        with open_source(url + "/demo", FAST) as src:
            m = src.fetch_manifest(digest)
            cfg = m.by_path()["config.json"]
            assert fetch_verified(src, cfg, 0, cfg.size, cfg.sha256) == b'{"layers": 2}'
        metrics = requests.get(url + "/metrics", timeout=5).text
        assert "resident_bundle_server_stored_bytes_total" in metrics
    finally:
        proc.terminate()
        proc.wait(10)
    logs = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]
    assert any(r.get("method") == "PUT" and r.get("status") == 201 for r in logs)


def test_the_store_materializes_only_verified_bytes_from_an_http_source(server, published, tmp_path,
                                                                         bundle_dir):
    from bundle.store import Store

    src, m = published
    store = Store(tmp_path / "store")
    server.fault, server.flip_at = "corrupt", 4000  # every response has one wrong byte
    with pytest.raises(IntegrityMismatch):
        store.materialize(m, src)
    assert not store.has_revision(m.digest) and store.revisions() == []
    server.fault, server.cut = "drop_always", 7000  # now good bytes, but every response drops
    res = store.materialize(m, src)
    assert res.verified and store.has_revision(m.digest)
    for f in m.files:
        assert (res.path / f.path).read_bytes() == (bundle_dir / f.path).read_bytes()


def test_a_rate_limited_server_sends_no_faster_than_its_rate(tmp_path):
    """--rate makes a slow source for tests and demos: 1 MiB at 4 MiB/s takes >= 0.25 s
    and arrives whole."""
    data = os.urandom(1 << 20)
    root = tmp_path / "root"
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    srv = BundleServer(root, rate=4 << 20)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        t0 = time.monotonic()
        got = requests.get(f"{srv.url}/blobs/sha256-{digest}", timeout=30).content
        took = time.monotonic() - t0
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)
    assert got == data and took >= 0.25


class ForwardProxy(http.server.ThreadingHTTPServer):
    """A plain HTTP forward proxy (what a pull-through cache such as Dragonfly's dfdaemon
    looks like to a client): it takes absolute-form requests, forwards them with their
    Range, and records each URL."""

    def __init__(self):
        proxy = self
        self.urls: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                proxy.urls.append(self.path)
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("range", "accept-encoding")}
                with requests.get(self.path, headers=headers, stream=True, timeout=10,
                                  proxies={"http": None, "https": None}) as up:
                    body = up.raw.read()
                    self.send_response(up.status_code)
                    for k in ("Content-Range", "Content-Type"):
                        if k in up.headers:
                            self.send_header(k, up.headers[k])
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.daemon_threads = True


def test_a_source_proxy_carries_every_request_of_an_http_source(server, bundle_dir, monkeypatch):
    """``--source-proxy`` (docs/peer-delivery.md): the manifest and every ranged blob read
    go through the proxy, even with the environment saying to bypass it."""
    uri = server.url + "/models/tiny"
    digest = push(bundle_dir, uri)
    proxy = ForwardProxy()
    thread = threading.Thread(target=proxy.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    try:
        src = open_source(uri, FAST, proxy=f"http://127.0.0.1:{proxy.server_address[1]}")
        manifest = src.fetch_manifest(digest)
        weights = next(f for f in manifest.files if f.path == "model.safetensors")
        start, length = chunk_range(weights, 1, manifest.chunk_size)
        data = b"".join(src.read(weights, start, length))
        assert data == (bundle_dir / "model.safetensors").read_bytes()[start:start + length]
        assert proxy.urls[0].endswith(f"/manifests/{digest.replace(':', '-')}.json")
        assert any(u.endswith(f"/blobs/sha256-{weights.sha256}") for u in proxy.urls)
        assert all(u.startswith(server.url) for u in proxy.urls)
        src.close()
        # without one, nothing goes through it
        before = len(proxy.urls)
        with open_source(uri, FAST) as direct:
            direct.fetch_manifest(digest)
        assert len(proxy.urls) == before
    finally:
        proxy.shutdown()
        proxy.server_close()

"""The store fed by a real HTTP bundle server on 127.0.0.1 (bundle.sources.httpserve):
cut connections are resumed and verified; wrong or short content publishes nothing."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from bundle.errors import IntegrityMismatch, SourceUnavailable
from bundle.scan import build_manifest, write_manifest
from bundle.sources import RetryPolicy, open_source, push
from bundle.sources.httpserve import BundleRequestHandler, BundleServer
from bundle.store import Store

CHUNK = 64 * 1024
FAST = RetryPolicy(attempts=3, backoff_seconds=0.01, connect_timeout_seconds=2,
                   read_timeout_seconds=5)


class CuttingHandler(BundleRequestHandler):
    """The real handler; with ``server.cut`` set, every body stops after that many bytes
    and the connection is shut (a download truncated by the network)."""

    def send_body(self, f, length):
        self.server.bodies += 1
        cut = self.server.cut
        if cut is None or length <= cut:
            return super().send_body(f, length)
        self.wfile.write(f.read(cut))
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True


@pytest.fixture
def server(tmp_path):
    srv = BundleServer(tmp_path / "srv", handler=CuttingHandler)
    srv.cut, srv.bodies = None, 0
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def published(server, tmp_path: Path, name: str, seed_bytes: bytes) -> tuple[str, Path]:
    d = tmp_path / name
    d.mkdir()
    (d / "model.safetensors").write_bytes(seed_bytes)
    (d / "config.json").write_bytes(b'{"layers": 2}')
    write_manifest(d, build_manifest(d, chunk_size=CHUNK))
    uri = f"{server.url}/models/{name}"
    push(d, uri)
    return uri, d


def blob_on_server(server, sha256: str) -> Path:
    return next(server.root.rglob(f"sha256-{sha256}"))


def test_cut_connections_are_resumed_and_every_byte_verified(server, tmp_path):
    data = os.urandom(1 << 20)
    uri, d = published(server, tmp_path, "a", data)
    server.cut = 100_000  # every response stops after 100 kB
    src = open_source(uri, FAST)
    m = build_manifest(d, chunk_size=CHUNK)
    res = Store(tmp_path / "store").materialize(src.fetch_manifest(m.digest), src)
    assert res.method == "reconstruct" and res.bytes_fetched == m.total_bytes
    assert (res.path / "model.safetensors").read_bytes() == data
    assert server.bodies > len(data) // 100_000  # it really took several connections


def test_rebase_over_http_fetches_only_changed_chunks(server, tmp_path):
    base = os.urandom(1 << 20)
    changed = bytearray(base)
    changed[5 * CHUNK + 3] ^= 0xFF
    uri_a, a = published(server, tmp_path, "a", base)
    uri_b, b = published(server, tmp_path, "b", bytes(changed))
    store = Store(tmp_path / "store")
    ma, mb = build_manifest(a, chunk_size=CHUNK), build_manifest(b, chunk_size=CHUNK)
    store.materialize(ma, open_source(uri_a, FAST))
    res = store.materialize(mb, open_source(uri_b, FAST), donor=ma.digest)
    assert res.method == "rebase" and res.bytes_fetched == CHUNK
    assert (res.path / "model.safetensors").read_bytes() == bytes(changed)


def test_wrong_bytes_on_the_server_publish_nothing(server, tmp_path):
    uri, d = published(server, tmp_path, "a", os.urandom(1 << 20))
    m = build_manifest(d, chunk_size=CHUNK)
    blob = blob_on_server(server, m.by_path()["model.safetensors"].sha256)
    with open(blob, "r+b") as f:  # one flipped byte in chunk 7
        f.seek(7 * CHUNK + 11)
        byte = f.read(1)
        f.seek(7 * CHUNK + 11)
        f.write(bytes([byte[0] ^ 1]))
    store = Store(tmp_path / "store")
    with pytest.raises(IntegrityMismatch) as e:
        store.materialize(m, open_source(uri, FAST))
    assert e.value.chunk == 7
    assert not store.has_revision(m.digest) and list((store.root / "work").iterdir()) == []
    assert list((store.root / "revisions").iterdir()) == []


def test_a_short_blob_on_the_server_publishes_nothing(server, tmp_path):
    uri, d = published(server, tmp_path, "a", os.urandom(1 << 20))
    m = build_manifest(d, chunk_size=CHUNK)
    os.truncate(blob_on_server(server, m.by_path()["model.safetensors"].sha256), 300_000)
    store = Store(tmp_path / "store")
    with pytest.raises((IntegrityMismatch, SourceUnavailable)):
        store.materialize(m, open_source(uri, FAST))
    assert not store.has_revision(m.digest) and list((store.root / "revisions").iterdir()) == []
    assert list((store.root / "work").iterdir()) == []

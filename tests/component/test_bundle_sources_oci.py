"""oci:// sources and push against Debian's docker-registry, started on 127.0.0.1 here."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from bundle.errors import IntegrityMismatch, SourceUnavailable
from bundle.manifest import MANIFEST_NAME, ManifestError, chunk_range
from bundle.scan import build_manifest, write_manifest
from bundle.sources import RetryPolicy, fetch_verified, open_source, push, push_size
from bundle.sources.oci import CONFIG_TYPE, LAYER_TYPE, TITLE, push_oci
from bundle.sources.oci_registry import OCI_MANIFEST, Reference, Registry
from localcluster.binaries import apt_install
from localcluster.processes import ProcessGroup, free_port

CHUNK = 8192
FAST = RetryPolicy(attempts=3, backoff_seconds=0.01, connect_timeout_seconds=2, read_timeout_seconds=5)
REGISTRY_BIN = "/usr/bin/docker-registry"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A real docker-registry (distribution v2) on a free loopback port; stopped by PID after."""
    if not os.path.exists(REGISTRY_BIN):
        apt_install(("docker-registry",))
    work = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = work / "config.yml"
    config.write_text(f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {work / 'data'}
http:
  addr: 127.0.0.1:{port}
""")
    group = ProcessGroup(work / "logs")
    try:
        group.start("docker-registry", [REGISTRY_BIN, "serve", str(config)])
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            group.check_alive()
            try:
                if requests.get(url + "/v2/", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("docker-registry did not answer /v2/ in 20 s")
            time.sleep(0.05)
        yield f"127.0.0.1:{port}", work / "data"
    finally:
        group.stop()


def make_bundle(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "model.safetensors").write_bytes(os.urandom(4 * CHUNK + 100))
    (root / "graph.onnx").write_bytes(os.urandom(3000))
    (root / "config.json").write_bytes(b'{"layers": 2}')
    (root / "sub" / "copy.json").write_bytes(b'{"layers": 2}')
    (root / "sub" / "empty.txt").write_bytes(b"")
    write_manifest(root, build_manifest(root, chunk_size=CHUNK))
    return root


@pytest.fixture
def bundle_dir(tmp_path):
    return make_bundle(tmp_path / "bundle")


@pytest.fixture
def repo(registry):
    """A fresh repository name per test: oci://127.0.0.1:PORT/resident/t-<random>."""
    return f"oci://{registry[0]}/resident/t-{uuid.uuid4().hex[:8]}"


def blob_data(storage: Path, hexd: str) -> Path:
    return storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"


def test_push_with_chunked_upload_then_read_everything(repo, bundle_dir):
    seen = []
    digest = push_oci(bundle_dir, repo + ":v1", progress=seen.append, part_size=CHUNK)
    assert digest == "sha256:" + hashlib.sha256((bundle_dir / MANIFEST_NAME).read_bytes()).hexdigest()
    with open_source(repo, FAST) as src:
        m = src.fetch_manifest(digest)
        assert sum(seen) == sum(f.size for f in {f.sha256: f for f in m.files}.values())
        assert sum(seen) == push_size(bundle_dir, repo)
        for f in m.files:
            assert fetch_verified(src, f, 0, f.size, f.sha256) == (bundle_dir / f.path).read_bytes()
        big = m.by_path()["model.safetensors"]
        for i, sha in enumerate(big.chunks):
            off, n = chunk_range(big, i, m.chunk_size)
            fetch_verified(src, big, off, n, sha, chunk=i)
        assert src.resolve("v1") == digest


def test_the_artifact_is_an_oci_manifest_with_the_bundle_as_config(repo, bundle_dir):
    digest = push(bundle_dir, repo + ":v2")
    ref = Reference.parse(repo)
    doc = requests.get(ref.manifest_url("v2"), headers={"Accept": OCI_MANIFEST}, timeout=5).json()
    assert doc["config"]["mediaType"] == CONFIG_TYPE and doc["config"]["digest"] == digest
    m = open_source(repo, FAST).fetch_manifest(digest)
    assert [(l["mediaType"], l["digest"], l["annotations"][TITLE]) for l in doc["layers"]] == [
        (LAYER_TYPE, "sha256:" + f.sha256, f.path) for f in m.files]
    # docker-registry answers Range GETs with 206, so chunks are read without the skip fallback
    big = m.by_path()["model.safetensors"]
    r = requests.get(ref.blob_url("sha256:" + big.sha256), headers={"Range": "bytes=8192-16383"}, timeout=5)
    assert r.status_code == 206 and len(r.content) == CHUNK


def test_push_without_a_tag_tags_by_digest_and_repeats_cleanly(repo, bundle_dir):
    digest = push(bundle_dir, repo)
    again = []
    assert push(bundle_dir, repo, progress=again.append) == digest
    src = open_source(repo, FAST)
    assert src.resolve(digest.replace(":", "-")) == digest
    assert sum(again) == sum({f.sha256: f.size for f in src.fetch_manifest(digest).files}.values())


def test_tampered_blobs_in_the_registry_fail_verification(registry, repo, bundle_dir):
    storage = registry[1]
    digest = push(bundle_dir, repo)
    src = open_source(repo, FAST)
    m = src.fetch_manifest(digest)
    big = m.by_path()["model.safetensors"]
    with open(blob_data(storage, big.sha256), "r+b") as f:
        f.seek(CHUNK + 1)
        f.write(b"\x00" if f.read(1) != b"\x00" else b"\x01")
    fetch_verified(src, big, 0, CHUNK, big.chunks[0], chunk=0)
    with pytest.raises(IntegrityMismatch, match="model.safetensors chunk 1"):
        fetch_verified(src, big, CHUNK, CHUNK, big.chunks[1], chunk=1)
    config = blob_data(storage, digest.removeprefix("sha256:"))
    config.write_bytes(config.read_bytes().replace(b'"weights"', b'"graph"'))  # still valid JSON
    with pytest.raises(IntegrityMismatch, match="resident-manifest.json"):
        src.fetch_manifest(digest)


def test_a_truncated_blob_in_the_registry_is_an_integrity_mismatch(registry, repo, bundle_dir):
    digest = push(bundle_dir, repo)
    src = open_source(repo, FAST)
    big = src.fetch_manifest(digest).by_path()["model.safetensors"]
    os.truncate(blob_data(registry[1], big.sha256), 2 * CHUNK)
    with pytest.raises(IntegrityMismatch, match="truncated"):
        list(src.read(big, 0, big.size))


def test_unknown_digest_and_traversal_manifest(repo, bundle_dir):
    src = open_source(repo, FAST)
    with pytest.raises(SourceUnavailable, match="not found"):
        src.fetch_manifest("sha256:" + "3" * 64)
    doc = json.loads(build_manifest(bundle_dir, chunk_size=CHUNK).canonical_json())
    doc["files"][0]["path"] = "../escape"
    raw = json.dumps(doc).encode()
    evil = "sha256:" + hashlib.sha256(raw).hexdigest()
    ref = Reference.parse(repo)
    with requests.Session() as s:
        Registry(ref, s, FAST).upload_blob(evil, [raw])
    with pytest.raises(ManifestError, match="escapes"):
        src.fetch_manifest(evil)


def test_push_of_a_changed_bundle_creates_no_tag(repo, bundle_dir):
    data = bytearray((bundle_dir / "graph.onnx").read_bytes())
    data[9] ^= 1
    (bundle_dir / "graph.onnx").write_bytes(bytes(data))
    with pytest.raises(IntegrityMismatch, match="graph.onnx"):
        push(bundle_dir, repo + ":broken")
    r = requests.get(Reference.parse(repo).manifest_url("broken"), headers={"Accept": OCI_MANIFEST}, timeout=5)
    assert r.status_code == 404


def test_a_registry_that_is_down_is_unavailable(bundle_dir):
    port = free_port()
    with pytest.raises(SourceUnavailable, match=f"127.0.0.1:{port}.*gave up after 3 attempts"):
        open_source(f"oci://127.0.0.1:{port}/x", FAST).fetch_manifest("sha256:" + "0" * 64)
    with pytest.raises(SourceUnavailable, match=f"127.0.0.1:{port}"):
        push(bundle_dir, f"oci://127.0.0.1:{port}/x:v1")


class DroppingProxy:
    """A TCP proxy on 127.0.0.1 that cuts the first response stream after ``cut`` bytes."""

    def __init__(self, upstream: tuple[str, int], cut: int) -> None:
        self.upstream, self.cut, self.dropped = upstream, cut, False
        self.requests: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            for src, dst, down in ((client, server, False), (server, client, True)):
                t = threading.Thread(target=self._pipe, args=(src, dst, down), daemon=True)
                self.threads.append(t)
                t.start()

    def _pipe(self, src: socket.socket, dst: socket.socket, down: bool) -> None:
        sent = 0
        try:
            while data := src.recv(4096):
                if not down:
                    self.requests.append(data)
                elif not self.dropped and sent + len(data) > self.cut:
                    self.dropped = True
                    dst.sendall(data[:self.cut - sent])
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked in accept/recv
            except OSError:
                pass
            s.close()
        for t in self.threads:
            t.join(5)


def test_reads_from_the_registry_resume_after_a_dropped_connection(registry, repo, bundle_dir):
    digest = push(bundle_dir, repo)
    host, port = registry[0].split(":")
    proxy = DroppingProxy((host, int(port)), cut=12000)
    try:
        via = f"oci://127.0.0.1:{proxy.port}/{Reference.parse(repo).name}"
        with open_source(via, FAST) as src:
            big = src.fetch_manifest(digest).by_path()["model.safetensors"]
            data = fetch_verified(src, big, 0, big.size, big.sha256)
        assert data == (bundle_dir / "model.safetensors").read_bytes()
        assert proxy.dropped
        sent = b"".join(proxy.requests).decode(errors="replace")
        resumed = [int(r) for r in re.findall(r"Range: bytes=(\d+)-", sent)]
        assert resumed[0] == 0 and len(resumed) == 2 and 0 < resumed[1] < 12000
    finally:
        proxy.close()


def test_the_store_materializes_a_bundle_from_the_registry(repo, bundle_dir, tmp_path):
    from bundle.store import Store

    digest = push(bundle_dir, repo + ":v1")
    with open_source(repo, FAST) as src:
        m = src.fetch_manifest(src.resolve("v1"))
        res = Store(tmp_path / "store").materialize(m, src)
    assert res.digest == digest and res.verified and 0 < res.bytes_fetched <= m.total_bytes
    for f in m.files:
        assert (res.path / f.path).read_bytes() == (bundle_dir / f.path).read_bytes()

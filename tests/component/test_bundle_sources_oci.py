"""oci:// sources and push against Debian's docker-registry, started on 127.0.0.1 here."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from bundle.errors import IntegrityMismatch, SourceUnavailable
from bundle.manifest import MANIFEST_NAME, ManifestError, chunk_range
from bundle.scan import build_manifest, write_manifest
from bundle.sources import RetryPolicy, fetch_verified, open_source, push, push_size
from bundle.sources.oci import CONFIG_TYPE, LAYER_TYPE, TITLE, push_oci
from bundle.sources.oci_auth import Credentials
from bundle.sources.oci_registry import OCI_MANIFEST, Reference, Registry
from localcluster.processes import free_port
from testkit.relay import CuttingRelay

from servers import running_registry

CHUNK = 8192
FAST = RetryPolicy(attempts=3, backoff_seconds=0.01, connect_timeout_seconds=2, read_timeout_seconds=5)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        assert requests.get(f"http://{reg[0]}/v2/", timeout=5).status_code == 200  # no auth
        yield reg


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


def test_reads_from_the_registry_resume_after_a_dropped_connection(registry, repo, bundle_dir):
    digest = push(bundle_dir, repo)
    host, port = registry[0].split(":")
    proxy = CuttingRelay((host, int(port)), after=12000)
    try:
        via = f"oci://127.0.0.1:{proxy.port}/{Reference.parse(repo).name}"
        with open_source(via, FAST) as src:
            big = src.fetch_manifest(digest).by_path()["model.safetensors"]
            data = fetch_verified(src, big, 0, big.size, big.sha256)
        assert data == (bundle_dir / "model.safetensors").read_bytes()
        assert proxy.cuts == 0   # the one cut happened
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


class TokenService:
    """A real token service for docker-registry's ``auth: token``, on 127.0.0.1.

    Tokens are JWTs signed RS256 by openssl with a throwaway self-signed certificate (sent
    as ``x5c``; the registry trusts it through ``rootcertbundle``). Anonymous callers get
    ``pull`` only; the users in ``users`` get what they ask for.
    """

    ISSUER, SERVICE = "resident-test-tokens", "resident-test-registry"

    def __init__(self, work: Path, users: dict[str, str]) -> None:
        self.key, self.cert = work / "token.key", work / "token.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        str(self.key), "-out", str(self.cert), "-subj", "/CN=resident-test-tokens",
                        "-days", "1"], check=True, capture_output=True)
        der = subprocess.run(["openssl", "x509", "-in", str(self.cert), "-outform", "DER"],
                             check=True, capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()
        self.users, self.lifetime, self.issued = users, 300, []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                service.answer(self)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        query = parse_qs(urlsplit(h.path).query)
        user = None
        if h.headers.get("Authorization", "").startswith("Basic "):
            user, _, password = base64.b64decode(h.headers["Authorization"][6:]).decode().partition(":")
            if self.users.get(user) != password:
                h.send_response(401)
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
        access = []
        for scope in query.get("scope", []):
            kind_name, actions = scope.rsplit(":", 1)
            kind, name = kind_name.split(":", 1)
            granted = actions.split(",") if user else [a for a in actions.split(",") if a == "pull"]
            access.append({"type": kind, "name": name, "actions": granted})
        now = int(time.time())
        claims = {"iss": self.ISSUER, "sub": user or "", "aud": query["service"][0], "exp": now + self.lifetime,
                  "nbf": now - 1, "iat": now, "jti": uuid.uuid4().hex, "access": access}
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
        signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)],
                                   input=signing_input.encode(), check=True, capture_output=True).stdout
        body = json.dumps({"token": f"{signing_input}.{b64url(signature)}",
                           "expires_in": self.lifetime}).encode()
        self.issued.append((user, query.get("scope", [])))
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def auth_yaml(self) -> str:
        return (f"auth:\n  token:\n    realm: {self.realm}\n    service: {self.SERVICE}\n"
                f"    issuer: {self.ISSUER}\n    rootcertbundle: {self.cert}\n")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory):
    """(registry host:port, token service) for a registry that demands bearer tokens."""
    work = tmp_path_factory.mktemp("token-registry")
    tokens = TokenService(work, {"pusher": "s3cret"})
    try:
        with running_registry(work, tokens.auth_yaml()) as reg:
            assert requests.get(f"http://{reg[0]}/v2/", timeout=5).status_code == 401
            yield reg[0], tokens
    finally:
        tokens.close()


def test_token_auth_push_needs_credentials_and_pull_works_anonymously(token_registry, bundle_dir,
                                                                      monkeypatch):
    host, tokens = token_registry
    monkeypatch.delenv("RESIDENT_OCI_USERNAME", raising=False)
    repo = f"oci://{host}/resident/auth-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SourceUnavailable, match="401"):
        push(bundle_dir, repo + ":v1")  # anonymous: the token grants pull only
    with pytest.raises(SourceUnavailable, match="refused a token .* as 'pusher': HTTP 401"):
        push_oci(bundle_dir, repo + ":v1", credentials=Credentials("pusher", "wrong"))
    digest = push_oci(bundle_dir, repo + ":v1", credentials=Credentials("pusher", "s3cret"), part_size=CHUNK)
    name = repo.split("/", 3)[3]
    granted = {(user, scope.rsplit(":", 1)[0], frozenset(scope.rsplit(":", 1)[1].split(",")))
               for user, scopes in tokens.issued for scope in scopes}  # action order varies
    assert ("pusher", f"repository:{name}", frozenset({"pull", "push"})) in granted
    tokens.issued.clear()
    with open_source(repo, FAST) as src:  # anonymous pull
        m = src.fetch_manifest(src.resolve("v1"))
        assert m.digest == digest
        for f in m.files:
            assert fetch_verified(src, f, 0, f.size, f.sha256) == (bundle_dir / f.path).read_bytes()
    assert tokens.issued and all(user is None for user, _ in tokens.issued)


def test_credentials_from_the_environment_and_token_renewal(token_registry, bundle_dir, monkeypatch):
    host, tokens = token_registry
    repo = f"oci://{host}/resident/env-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("RESIDENT_OCI_USERNAME", "pusher")
    monkeypatch.setenv("RESIDENT_OCI_PASSWORD", "s3cret")
    digest = push(bundle_dir, repo)
    monkeypatch.delenv("RESIDENT_OCI_USERNAME")
    tokens.lifetime = 2  # renewed 1 s after issue (the registry itself allows 60 s of skew)
    try:
        with open_source(repo, FAST) as src:
            m = src.fetch_manifest(digest)
            tokens.issued.clear()
            cfg = m.by_path()["config.json"]
            fetch_verified(src, cfg, 0, cfg.size, cfg.sha256)
            assert tokens.issued == []  # the token is reused
            time.sleep(1.2)
            fetch_verified(src, cfg, 0, cfg.size, cfg.sha256)
            assert len(tokens.issued) == 1  # renewed before use, not after a 401
    finally:
        tokens.lifetime = 300


def test_resolving_a_tag_that_is_not_a_bundle_is_refused(repo):
    ref = Reference.parse(repo + ":image")
    config = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": [],
           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest,
                      "size": len(config)}}
    with requests.Session() as s:
        registry = Registry(ref, s, FAST)
        registry.upload_blob(digest, [config])
        registry.put_manifest("image", json.dumps(doc).encode())
    with pytest.raises(SourceUnavailable, match="not a Resident bundle"):
        open_source(repo, FAST).resolve("image")
    with pytest.raises(SourceUnavailable, match="not found"):
        open_source(repo, FAST).resolve("no-such-tag")

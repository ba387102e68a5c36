"""s3:// sources and push against a real S3-compatible server (SeaweedFS) on 127.0.0.1.

One server and one bucket serve the session (``s3_endpoint``, ``s3_bucket``); each test
writes under a key prefix of its own (``s3_prefix``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from bundle.errors import AccessDenied, IntegrityMismatch, SourceUnavailable
from bundle.manifest import MANIFEST_NAME
from bundle.scan import build_manifest, write_manifest
from bundle.sources import (RetryPolicy, SourceCredentials, fetch_verified, is_outage, open_source,
                            push, push_size)
from bundle.sources.metrics import FETCHED_BYTES
from bundle.sources.s3 import MIN_PART_SIZE, S3Location, push_s3
from bundle.store import Store
from localcluster.processes import free_port

from testkit.relay import CuttingRelay
from testkit.s3_server import CREDENTIALS, S3_DOMAIN, admin_client

CHUNK = 64 * 1024
FAST = RetryPolicy(attempts=2, backoff_seconds=0.01, connect_timeout_seconds=2, read_timeout_seconds=5)


def write_bundle(root: Path, weights: bytes, config: bytes = b'{"layers": 2}') -> str:
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.safetensors").write_bytes(weights)
    (root / "config.json").write_bytes(config)
    (root / "copy.json").write_bytes(config)
    (root / "empty.txt").write_bytes(b"")
    manifest = build_manifest(root, chunk_size=CHUNK)
    write_manifest(root, manifest)
    return manifest.digest


def fetched() -> float:
    return FETCHED_BYTES.labels("s3")._value.get()


@pytest.fixture
def uri(s3_endpoint, s3_bucket, s3_prefix):
    return f"s3://{s3_bucket}/{s3_prefix}/tiny?endpoint={s3_endpoint}"


def test_push_then_read_every_file_and_the_layout_is_the_http_one(uri, s3_endpoint, s3_bucket, s3_prefix,
                                                                  tmp_path):
    digest = write_bundle(tmp_path / "b", os.urandom(5 * CHUNK + 123))
    seen: list[int] = []
    assert push(tmp_path / "b", uri, progress=seen.append, credentials=CREDENTIALS) == digest
    assert sum(seen) == push_size(tmp_path / "b", uri)   # each content once: copy.json is config.json
    with open_source(uri, FAST, CREDENTIALS) as src:
        m = src.fetch_manifest(digest)
        for f in m.files:
            assert fetch_verified(src, f, 0, f.size, f.sha256) == (tmp_path / "b" / f.path).read_bytes()
        big = m.by_path()["model.safetensors"]
        middle = b"".join(src.read(big, CHUNK + 7, 3 * CHUNK))   # a ranged read
        assert middle == (tmp_path / "b" / big.path).read_bytes()[CHUNK + 7:4 * CHUNK + 7]
    keys = {o["Key"] for o in admin_client(s3_endpoint).list_objects_v2(
        Bucket=s3_bucket, Prefix=f"{s3_prefix}/tiny/")["Contents"]}
    assert keys == {f"{s3_prefix}/tiny/manifests/sha256-{digest[7:]}.json"} | {
        f"{s3_prefix}/tiny/blobs/sha256-{f.sha256}" for f in m.files}
    raw = admin_client(s3_endpoint).get_object(
        Bucket=s3_bucket, Key=f"{s3_prefix}/tiny/manifests/sha256-{digest[7:]}.json")["Body"].read()
    assert hashlib.sha256(raw).hexdigest() == digest[7:]


def test_a_large_file_goes_up_in_parts_and_a_second_push_sends_nothing(uri, tmp_path):
    weights = os.urandom(MIN_PART_SIZE + 300_000)
    digest = write_bundle(tmp_path / "b", weights)
    push_s3(tmp_path / "b", uri, credentials=CREDENTIALS, part_size=MIN_PART_SIZE)
    with open_source(uri, FAST, CREDENTIALS) as src:
        big = src.fetch_manifest(digest).by_path()["model.safetensors"]
        assert b"".join(src.read(big, 0, big.size)) == weights
    # everything is there: the second push only asks (HEAD), reports the sizes, sends no body
    sent: list[int] = []
    assert push(tmp_path / "b", uri, progress=sent.append, credentials=CREDENTIALS) == digest
    assert sum(sent) == push_size(tmp_path / "b", uri)


def test_materialize_then_a_second_revision_fetches_only_its_changed_chunks(uri, tmp_path):
    weights = bytearray(os.urandom(16 * CHUNK))
    v1 = write_bundle(tmp_path / "v1", bytes(weights))
    weights[5 * CHUNK + 10: 5 * CHUNK + 20] = os.urandom(10)      # one chunk changes
    v2 = write_bundle(tmp_path / "v2", bytes(weights), config=b'{"layers": 3}')
    for d in ("v1", "v2"):
        push(tmp_path / d, uri, credentials=CREDENTIALS)
    store = Store(tmp_path / "store")
    with open_source(uri, FAST, CREDENTIALS) as src:
        before = fetched()
        first = store.materialize(src.fetch_manifest(v1), src)
        assert fetched() - before == first.bytes_fetched >= 16 * CHUNK
        before = fetched()
        second = store.materialize(src.fetch_manifest(v2), src, donor=v1)
    changed = CHUNK + len(b'{"layers": 3}')   # the changed chunk and the new config
    assert second.bytes_fetched == changed
    assert fetched() - before == changed
    assert (store.revision_path(v2) / "model.safetensors").read_bytes() == bytes(weights)


def test_virtual_host_addressing_names_the_bucket_in_the_host(s3_endpoint, s3_bucket, s3_prefix, tmp_path,
                                                              monkeypatch):
    # No DNS names <bucket>.s3.test here: an HTTP proxy setting (which botocore honours, as
    # it would on a node behind one) routes requests for any host to the real server, which
    # takes the bucket from the Host header (-s3.domainName).
    port = s3_endpoint.rsplit(":", 1)[1]
    monkeypatch.setenv("http_proxy", s3_endpoint)
    monkeypatch.setenv("no_proxy", "")
    uri = f"s3://{s3_bucket}/{s3_prefix}?endpoint=http://{S3_DOMAIN}:{port}&addressing=virtual"
    assert S3Location.parse(uri).addressing == "virtual"
    digest = write_bundle(tmp_path / "b", os.urandom(2 * CHUNK))
    requests_seen: list[str] = []
    push(tmp_path / "b", uri, credentials=CREDENTIALS)
    with open_source(uri, FAST, CREDENTIALS) as src:
        src.bucket.client.meta.events.register(
            "before-send.s3", lambda request, **_: requests_seen.append(request.url))
        m = src.fetch_manifest(digest)
        f = m.by_path()["model.safetensors"]
        assert fetch_verified(src, f, 0, f.size, f.sha256) == (tmp_path / "b" / f.path).read_bytes()
    assert requests_seen and all(u.startswith(f"http://{s3_bucket}.{S3_DOMAIN}:{port}/{s3_prefix}/")
                                 for u in requests_seen)
    # and the same objects by path style, straight to the server
    with open_source(f"s3://{s3_bucket}/{s3_prefix}?endpoint={s3_endpoint}", FAST, CREDENTIALS) as src:
        assert src.fetch_manifest(digest).digest == digest


@pytest.mark.parametrize("bad", [
    {"AWS_ACCESS_KEY_ID": "resident-test", "AWS_SECRET_ACCESS_KEY": "not-the-secret"},
    {"AWS_ACCESS_KEY_ID": "nobody", "AWS_SECRET_ACCESS_KEY": "whatever"},
], ids=["wrong-secret", "unknown-key"])
def test_bad_credentials_are_access_denied_naming_the_bucket(uri, s3_bucket, tmp_path, bad):
    digest = write_bundle(tmp_path / "b", os.urandom(CHUNK))
    push(tmp_path / "b", uri, credentials=CREDENTIALS)
    with open_source(uri, FAST, SourceCredentials(bad)) as src:
        with pytest.raises(AccessDenied) as e:
            src.fetch_manifest(digest)
    text = str(e.value)
    assert text.startswith("AccessDenied: ") and f"bucket {s3_bucket!r}" in text
    assert not is_outage(e.value)
    assert bad["AWS_SECRET_ACCESS_KEY"] not in text
    with pytest.raises(AccessDenied, match=s3_bucket):   # and nothing is pushed with them
        push(tmp_path / "b", uri.replace("/tiny", "/other"), credentials=SourceCredentials(bad))


def test_without_credentials_requests_are_anonymous_whatever_the_environment_holds(
        uri, tmp_path, monkeypatch):
    digest = write_bundle(tmp_path / "b", os.urandom(CHUNK))
    push(tmp_path / "b", uri, credentials=CREDENTIALS)
    # valid keys in the environment (as a node or the bridge's own account might have) are
    # never picked up: only the model's Secret signs requests
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    with open_source(uri, FAST) as src, pytest.raises(AccessDenied, match="AccessDenied"):
        src.fetch_manifest(digest)
    with pytest.raises(AccessDenied, match="lack AWS_SECRET_ACCESS_KEY"):
        open_source(uri, FAST, SourceCredentials({"AWS_ACCESS_KEY_ID": "resident-test"}))


def test_a_missing_key_or_bucket_is_source_unavailable_and_not_an_outage(uri, s3_endpoint, tmp_path):
    digest = write_bundle(tmp_path / "b", os.urandom(CHUNK))
    with open_source(uri, FAST, CREDENTIALS) as src, pytest.raises(SourceUnavailable) as e:
        src.fetch_manifest(digest)   # never pushed
    assert "no such key" in str(e.value) and f"manifests/sha256-{digest[7:]}.json" in str(e.value)
    assert not isinstance(e.value, AccessDenied) and not is_outage(e.value)
    with open_source(f"s3://no-such-bucket-here/x?endpoint={s3_endpoint}", FAST, CREDENTIALS) as src:
        with pytest.raises(SourceUnavailable, match="NoSuchBucket"):
            src.fetch_manifest(digest)


def test_an_endpoint_that_is_down_is_an_outage_after_the_retries(tmp_path):
    port = free_port()   # nothing listens there
    uri = f"s3://models/tiny?endpoint=http://127.0.0.1:{port}"
    with open_source(uri, FAST, CREDENTIALS) as src, pytest.raises(SourceUnavailable) as e:
        src.fetch_manifest("sha256:" + "0" * 64)
    assert is_outage(e.value) and f"127.0.0.1:{port}" in str(e.value)
    assert "gave up after 2 attempts" in str(e.value)


def test_a_truncated_or_altered_blob_is_an_integrity_mismatch(uri, s3_endpoint, s3_bucket, s3_prefix, tmp_path):
    weights = os.urandom(4 * CHUNK)
    digest = write_bundle(tmp_path / "b", weights)
    push(tmp_path / "b", uri, credentials=CREDENTIALS)
    admin = admin_client(s3_endpoint)
    with open_source(uri, FAST, CREDENTIALS) as src:
        big = src.fetch_manifest(digest).by_path()["model.safetensors"]
        key = f"{s3_prefix}/tiny/blobs/sha256-{big.sha256}"
        admin.put_object(Bucket=s3_bucket, Key=key, Body=weights[:CHUNK + 100])   # cut short
        with pytest.raises(IntegrityMismatch, match=f"truncated: got 100 of {CHUNK} bytes"):
            fetch_verified(src, big, CHUNK, CHUNK, "0" * 64, chunk=1)
        with pytest.raises(IntegrityMismatch, match="truncated: got 0 of"):   # past its end: 416
            b"".join(src.read(big, 2 * CHUNK, CHUNK))
        with pytest.raises(IntegrityMismatch) as e:
            Store(tmp_path / "store").materialize(src.fetch_manifest(digest), src)
        assert "model.safetensors" in str(e.value)
        altered = bytearray(weights)
        altered[3] ^= 0xFF
        admin.put_object(Bucket=s3_bucket, Key=key, Body=bytes(altered))   # same size, wrong bytes
        with pytest.raises(IntegrityMismatch, match="model.safetensors chunk 0: sha256"):
            Store(tmp_path / "store2").materialize(src.fetch_manifest(digest), src)
    assert not (tmp_path / "store" / "revisions").exists() or not any((tmp_path / "store" / "revisions").iterdir())


def test_a_dropped_download_resumes_from_the_byte_it_reached(uri, s3_endpoint, s3_bucket, s3_prefix, tmp_path):
    weights = os.urandom(8 * CHUNK)
    digest = write_bundle(tmp_path / "b", weights)
    push(tmp_path / "b", uri, credentials=CREDENTIALS)
    relay = CuttingRelay(("127.0.0.1", int(s3_endpoint.rsplit(":", 1)[1])), after=3 * CHUNK, cuts=0)
    try:
        via = f"s3://{s3_bucket}/{s3_prefix}/tiny?endpoint=http://127.0.0.1:{relay.port}"
        with open_source(via, FAST, CREDENTIALS) as src:
            m = src.fetch_manifest(digest)
            relay.cuts = 2   # the manifest went through whole; now cut the blob twice
            before = fetched()
            big = m.by_path()["model.safetensors"]
            assert b"".join(src.read(big, 0, big.size)) == weights
    finally:
        relay.close()
    assert relay.cuts == 0
    # every byte was fetched once: the resumed reads started where the cut ones stopped
    assert fetched() - before == len(weights)


def test_a_bundle_changed_after_it_was_built_publishes_nothing(uri, s3_endpoint, s3_bucket, s3_prefix, tmp_path):
    digest = write_bundle(tmp_path / "b", os.urandom(2 * CHUNK))
    path = tmp_path / "b" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))   # same size, other bytes: the store refuses the body (BadDigest)
    with pytest.raises(IntegrityMismatch, match="changed after it was built"):
        push(tmp_path / "b", uri, credentials=CREDENTIALS)
    listed = admin_client(s3_endpoint).list_objects_v2(Bucket=s3_bucket, Prefix=f"{s3_prefix}/")
    assert f"{s3_prefix}/tiny/manifests/sha256-{digest[7:]}.json" not in {
        o["Key"] for o in listed.get("Contents", [])}


def test_the_cli_pushes_and_materializes_with_the_callers_environment_credentials(
        uri, tmp_path, capsys, monkeypatch):
    from bundle.cli import main
    digest = write_bundle(tmp_path / "b", os.urandom(2 * CHUNK))
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    assert main(["--quiet", "push", str(tmp_path / "b"), uri]) == 1   # anonymous: refused
    assert "AccessDenied" in capsys.readouterr().err
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    assert main(["--quiet", "push", str(tmp_path / "b"), uri]) == 0
    assert capsys.readouterr().out.startswith(digest)
    assert main(["--quiet", "materialize", "--store", str(tmp_path / "store"), uri, digest]) == 0
    assert (Store(tmp_path / "store").revision_path(digest) / "model.safetensors").read_bytes() == \
        (tmp_path / "b" / "model.safetensors").read_bytes()

"""The operator's manifest reads against a real bundle server on 127.0.0.1: a manifest read
and verified once is kept (content-addressed), one never read needs the source."""

from __future__ import annotations

import threading

import pytest

from bundle.cpu_model import make_demo
from bundle.sources import push
from bundle.sources.httpserve import BundleServer
from resident_operator import source_check
from resident_operator.source_check import SourceProblem, fetch_manifest


def test_a_verified_manifest_is_kept_and_an_unread_one_needs_the_source(tmp_path):
    a = make_demo(tmp_path / "a", 64 * 1024, seed=1).digest
    b = make_demo(tmp_path / "b", 64 * 1024, seed=2).digest
    srv = BundleServer(tmp_path / "srv")
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        push(tmp_path / "a", srv.url)
        push(tmp_path / "b", srv.url)
        first = fetch_manifest(srv.url, a)
        assert first.digest == a
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)
    assert fetch_manifest(srv.url, a) is first          # kept: the source is down now
    with pytest.raises(SourceProblem) as e:             # never read: the source is needed
        fetch_manifest(srv.url, b)
    assert e.value.blocker.reason == "SourceUnavailable"
    with pytest.raises(SourceProblem):                  # kept per source, not per digest alone
        fetch_manifest(srv.url + "/other", a)
    assert len(source_check._kept) <= source_check.KEPT_MANIFESTS


def test_an_s3_manifest_is_read_with_the_models_credentials_and_kept_for_them(
        tmp_path, s3_endpoint, s3_bucket, s3_prefix):
    from bundle.sources import SourceCredentials
    from testkit.s3_server import CREDENTIALS
    digest = make_demo(tmp_path / "a", 64 * 1024, seed=3).digest
    source = f"s3://{s3_bucket}/{s3_prefix}?endpoint={s3_endpoint}"
    push(tmp_path / "a", source, credentials=CREDENTIALS)
    assert fetch_manifest(source, digest, CREDENTIALS).digest == digest
    wrong = SourceCredentials({**CREDENTIALS, "AWS_SECRET_ACCESS_KEY": "not-it"})
    for credentials in (wrong, None):   # another model's, or none: read again, and refused
        with pytest.raises(SourceProblem) as e:
            fetch_manifest(source, digest, credentials)
        assert e.value.blocker.reason == "AccessDenied" and not e.value.outage
        assert f"bucket {s3_bucket!r}" in e.value.blocker.message
    with pytest.raises(SourceProblem) as e:   # a digest the prefix does not hold
        fetch_manifest(source, "sha256:" + "0" * 64, CREDENTIALS)
    assert e.value.blocker.reason == "SourceUnavailable" and "no such key" in e.value.blocker.message


def test_the_outage_probe_of_an_s3_source_is_its_endpoint_answering_without_credentials(s3_endpoint):
    import asyncio

    import aiohttp

    from localcluster.processes import free_port
    from resident_operator.driver import _probe_once
    from resident_operator.source_probes import source_key

    async def probe(uri):
        async with aiohttp.ClientSession() as session:
            return await _probe_once(session, source_key(uri) + "/")

    assert source_key(f"s3://any-bucket/x?endpoint={s3_endpoint}") == s3_endpoint
    assert asyncio.run(probe(f"s3://any-bucket/x?endpoint={s3_endpoint}")) is None   # a 403 answers
    assert asyncio.run(probe(f"s3://any-bucket/x?endpoint=http://127.0.0.1:{free_port()}")) is not None

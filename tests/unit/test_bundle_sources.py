"""Pure checks of bundle sources: URI parsing, manifest verification, the OCI artifact shape."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from bundle.errors import IntegrityMismatch
from bundle.manifest import FileEntry, Manifest, ManifestError, Role, build_entries
from bundle.sources import (FileSource, HttpSource, OciSource, S3Source, SourceCredentials, open_source,
                            reads_credentials, verify_manifest)
from bundle.sources.file import dir_from_uri
from bundle.sources.http import base_from_uri, blob_url, manifest_url
from bundle.sources.httpserve import OBJECT_PATH
from bundle.sources.oci import CONFIG_TYPE, LAYER_TYPE, TITLE, artifact_manifest
from bundle.sources.oci_registry import Reference
from bundle.sources.publish import LocalBundle
from bundle.sources.s3 import S3Location
from bundle.sources.source import check_range

HEX = "ab" * 32


def entry(path="a.bin", data=b"hello", role=Role.weights) -> FileEntry:
    return FileEntry(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest(), role=role)


def test_open_source_picks_the_scheme():
    assert isinstance(open_source("file:///srv/b"), FileSource)
    assert isinstance(open_source("http://127.0.0.1:1/x"), HttpSource)
    assert isinstance(open_source("https://example.invalid/x"), HttpSource)
    assert isinstance(open_source("oci://127.0.0.1:5000/m/tiny:v1"), OciSource)
    assert isinstance(open_source("s3://bucket/x?endpoint=http://127.0.0.1:1"), S3Source)
    assert reads_credentials("s3://bucket/x") and not reads_credentials("oci://h/r")


@pytest.mark.parametrize("uri", ["ftp://h/x", "s3://Bad_Bucket/x", "/plain/path", "", "file:relative"])
def test_unsupported_or_malformed_uris_are_refused(uri):
    with pytest.raises(ManifestError):
        open_source(uri)


def test_file_uri_must_be_absolute_and_local():
    assert str(dir_from_uri("file:///srv/my%20bundle")) == "/srv/my bundle"
    for bad in ("file://otherhost/srv", "file:///srv?x=1"):
        with pytest.raises(ManifestError):
            dir_from_uri(bad)


def test_http_layout_urls():
    base = base_from_uri("http://127.0.0.1:8700/models/tiny/")
    assert base == "http://127.0.0.1:8700/models/tiny"
    assert manifest_url(base, "sha256:" + HEX) == f"{base}/manifests/sha256-{HEX}.json"
    assert blob_url(base, HEX) == f"{base}/blobs/sha256-{HEX}"
    with pytest.raises(ManifestError):
        base_from_uri("http:///nohost")


def test_oci_reference_parsing():
    r = Reference.parse("oci://127.0.0.1:5000/models/tiny:v1")
    assert (r.registry, r.name, r.tag) == ("http://127.0.0.1:5000", "models/tiny", "v1")
    assert Reference.parse("oci://localhost:5000/tiny").tag is None
    assert Reference.parse("oci://registry.example/tiny").registry == "https://registry.example"
    assert Reference.parse("oci+http://registry.example/tiny").registry == "http://registry.example"
    assert r.blob_url("sha256:" + HEX) == f"http://127.0.0.1:5000/v2/models/tiny/blobs/sha256:{HEX}"


@pytest.mark.parametrize("uri", ["oci://h/Upper", "oci://h/a/../b", "oci://h/a:bad tag", "oci://h/",
                                 "oci://h/a:" + "t" * 129])
def test_bad_oci_references_are_refused(uri):
    with pytest.raises(ManifestError):
        Reference.parse(uri)


def test_verify_manifest_accepts_only_the_digest_asked_for():
    m = build_entries([entry()])
    raw = m.canonical_json()
    assert verify_manifest(raw, m.digest) == m
    other = build_entries([entry(data=b"other")])
    with pytest.raises(IntegrityMismatch) as e:
        verify_manifest(raw, other.digest, "http://127.0.0.1:1/x")
    assert e.value.actual == m.digest.removeprefix("sha256:")
    assert "http://127.0.0.1:1/x" in str(e.value)
    with pytest.raises(ManifestError):
        verify_manifest(raw, "sha256:XYZ")


def test_a_manifest_with_path_traversal_is_rejected_even_when_its_digest_matches():
    doc = json.loads(build_entries([entry()]).canonical_json())
    doc["files"][0]["path"] = "../../etc/cron.d/evil"
    raw = json.dumps(doc).encode()
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    with pytest.raises(ManifestError, match=r"escapes|normalized"):
        verify_manifest(raw, digest)


def test_check_range_refuses_reads_outside_the_file():
    e = entry(data=b"x" * 10)
    check_range(e, 0, 10)
    check_range(e, 10, 0)
    for off, n in ((0, 11), (-1, 2), (5, -1), (11, 0)):
        with pytest.raises(ValueError):
            check_range(e, off, n)


def test_server_paths_only_name_content_addressed_objects():
    assert OBJECT_PATH.match(f"/models/tiny/blobs/sha256-{HEX}")
    assert OBJECT_PATH.match(f"/manifests/sha256-{HEX}.json")
    for bad in (f"/../blobs/sha256-{HEX}", f"/a/../blobs/sha256-{HEX}", f"/blobs/sha256-{HEX}/x",
                "/blobs/sha256-abc", f"/.hidden/blobs/sha256-{HEX}", "/etc/passwd"):
        assert not OBJECT_PATH.match(bad), bad


def test_artifact_manifest_maps_the_bundle_to_config_and_layers(tmp_path):
    files = [entry("model.safetensors", b"w" * 9), entry("config.json", b"{}", Role.config)]
    m: Manifest = build_entries(files)
    doc = json.loads(artifact_manifest(LocalBundle(tmp_path, m)))
    assert doc["config"] == {"mediaType": CONFIG_TYPE, "digest": m.digest,
                             "size": len(m.canonical_json())}
    assert [(l["digest"], l["size"], l["annotations"][TITLE], l["mediaType"]) for l in doc["layers"]] == [
        ("sha256:" + f.sha256, f.size, f.path, LAYER_TYPE) for f in m.files]
    assert [l["annotations"]["dev.resident.role"] for l in doc["layers"]] == ["config", "weights"]


def test_registry_challenges_are_parsed_and_passwords_never_printed():
    from bundle.sources.oci_auth import Credentials, parse_challenge

    scheme, params = parse_challenge(
        'Bearer realm="http://127.0.0.1:9/token",service="reg",scope="repository:m/tiny:pull,push"')
    assert scheme == "bearer"
    assert params == {"realm": "http://127.0.0.1:9/token", "service": "reg",
                      "scope": "repository:m/tiny:pull,push"}
    assert parse_challenge('Basic realm="registry"') == ("basic", {"realm": "registry"})
    assert "hunter2" not in repr(Credentials("me", "hunter2"))


def test_s3_uris_name_bucket_prefix_and_how_to_reach_the_store():
    loc = S3Location.parse("s3://models/team/tiny/?endpoint=http://127.0.0.1:9000&region=eu-1")
    assert (loc.bucket, loc.prefix, loc.endpoint, loc.region, loc.addressing) == (
        "models", "team/tiny", "http://127.0.0.1:9000", "eu-1", "path")   # path with an endpoint
    assert loc.manifest_key("sha256:" + HEX) == f"team/tiny/manifests/sha256-{HEX}.json"
    assert loc.blob_key(HEX) == f"team/tiny/blobs/sha256-{HEX}"   # the http layout's names
    aws = S3Location.parse("s3://models")
    assert (aws.prefix, aws.endpoint, aws.region, aws.addressing) == ("", None, "us-east-1", "virtual")
    assert aws.blob_key(HEX) == f"blobs/sha256-{HEX}"
    assert S3Location.parse("s3://mmm/x?endpoint=https://[::1]:9000&addressing=virtual").endpoint == \
        "https://[::1]:9000"


@pytest.mark.parametrize("uri,says", [
    ("s3://ab/x", "not a valid S3 bucket name"),
    ("s3://My_Bucket/x", "not a valid S3 bucket name"),
    ("s3://bucket/a//b", "empty, '.' or '..' segment"),
    ("s3://bucket/a/../b", "empty, '.' or '..' segment"),
    ("s3://bucket/x?endpoint=http://key:secret@h:9000", "credentials belong in the model's Secret"),
    ("s3://bucket/x?endpoint=ftp://h", "must be http(s)://host[:port]"),
    ("s3://bucket/x?endpoint=http://h:9000/base", "without a path or query"),
    ("s3://bucket/x?addressing=dns", "addressing must be path or virtual"),
    ("s3://bucket/x?region=a&region=b", "given more than once"),
    ("s3://bucket/x?regoin=eu", "unknown parameter regoin"),
    ("s3://bucket/x#frag", "expected s3://bucket"),
    ("s3://my.bucket/x?endpoint=https://h&addressing=virtual", "has dots"),
])
def test_malformed_s3_uris_are_refused_before_any_request(uri, says):
    with pytest.raises(ManifestError, match=re.escape(says)):
        open_source(uri)


def test_credentials_never_show_their_values():
    creds = SourceCredentials({"AWS_ACCESS_KEY_ID": "AKIDVALUE", "AWS_SECRET_ACCESS_KEY": "s3cr3t"})
    for text in (repr(creds), str(creds), f"{creds}"):
        assert "s3cr3t" not in text and "AKIDVALUE" not in text and "AWS_SECRET_ACCESS_KEY" in text
    assert creds.fingerprint() != SourceCredentials({**creds, "AWS_SECRET_ACCESS_KEY": "x"}).fingerprint()
    assert creds.fingerprint() == SourceCredentials(dict(creds)).fingerprint()

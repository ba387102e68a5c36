"""Throughput records are keyed by the source's repository, never by its credentials."""

from __future__ import annotations

import pytest

from bundle.throughput import source_key


@pytest.mark.parametrize("uri, key", [
    ("file:///srv/models/llama/rev-7", "file:///srv/models/llama"),
    ("https://user:secret@cdn.example:8443/bundles/?token=abc#x", "https://cdn.example:8443/bundles"),
    ("http://127.0.0.1:9000/base", "http://127.0.0.1:9000/base"),
    ("oci://registry.example/team/model:v3", "oci://registry.example/team/model"),
    ("oci+http://u:p@[::1]:5000/model", "oci+http://[::1]:5000/model"),
    ("s3://bucket/x", "s3://bucket/x@aws:us-east-1"),
    ("s3://bucket/team/x/?endpoint=http://127.0.0.1:9000&addressing=virtual",
     "s3://bucket/team/x@http://127.0.0.1:9000"),
    ("s3://Bad_Bucket/x", None),
    ("hf://org/name@0123456789abcdef0123456789abcdef01234567", "hf://org/name@https://huggingface.co"),
    ("hf://org/name@0123456789abcdef0123456789abcdef01234567?endpoint=http://127.0.0.1:8090&chunk=65536", "hf://org/name@http://127.0.0.1:8090"),
    ("hf://org/name", None),
    (None, None),
])
def test_source_key_names_the_repository_never_credentials(uri, key):
    assert source_key(uri) == key

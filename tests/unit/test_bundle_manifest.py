"""The manifest model: strict parsing, canonical JSON and a stable digest."""

from __future__ import annotations

import hashlib
import json

import pytest

import bundle.manifest as mf
from bundle.manifest import (
    MANIFEST_NAME, FileEntry, Manifest, ManifestError, Role, check_digest, chunk_range, n_chunks,
    revision_dirname,
)

H = hashlib.sha256(b"x").hexdigest()


def doc(*files: dict, chunk_size: int = 4096, **extra) -> dict:
    return {"schemaVersion": 1, "chunkSize": chunk_size, "files": list(files), **extra}


def f(path: str = "a.bin", size: int = 10, sha: str = H, role: str = "config", chunks=()) -> dict:
    return {"path": path, "size": size, "sha256": sha, "role": role, "chunks": list(chunks)}


def parse(d: dict) -> Manifest:
    return Manifest.parse(json.dumps(d))


@pytest.mark.parametrize("path,why", [
    ("/etc/passwd", "relative"), ("../up", "not normalized|escapes"), ("a/../../b", "normalized"),
    ("a/..", "normalized|escapes"), ("..", "escapes"), ("a//b", "normalized"), ("./a", "normalized"),
    ("a\\b", "POSIX"), ("", "non-empty"), ("a\x00b", "NUL"), (".", "normalized"),
    (MANIFEST_NAME, "reserved"),
])
def test_unsafe_paths_are_rejected_with_the_path_named(path, why):
    with pytest.raises(ManifestError, match=why) as e:
        parse(doc(f(path)))
    assert "files.0.path" in str(e.value)


def test_duplicate_paths_and_file_directory_clashes_are_rejected():
    with pytest.raises(ManifestError, match="duplicate path 'a.bin'"):
        parse(doc(f(), f()))
    with pytest.raises(ManifestError, match="both a file and a directory"):
        parse(doc(f("w"), f("w/x")))


@pytest.mark.parametrize("entry,why", [
    (f(size=-1), "size"), (f(size="ten"), "size"), (f(sha="ABC"), "sha256"),
    (f(sha=H.upper()), "sha256"), (f(sha=H[:-1]), "sha256"), (f(role="kernel"), "role"),
    (f(size=5000), "0 chunk digests for size 5000, expected 2"),
    (f(size=100, chunks=[H]), "1 chunk digests for size 100, expected 0"),
    (f(size=5000, chunks=[H, "zz"]), "chunks"),
])
def test_bad_sizes_digests_roles_and_chunk_lists_are_rejected(entry, why):
    with pytest.raises(ManifestError, match=why):
        parse(doc(entry))


def test_bad_top_level_fields_are_rejected():
    with pytest.raises(ManifestError, match="multiple of 4096"):
        parse(doc(f(), chunk_size=1000))
    with pytest.raises(ManifestError, match="schemaVersion"):
        parse(dict(doc(f()), schemaVersion=2))
    with pytest.raises(ManifestError, match="(?i)extra inputs"):
        parse(doc(f(), signature="x"))
    with pytest.raises(ManifestError, match="(?i)extra inputs"):
        parse(doc(dict(f(), mode=0o777)))
    with pytest.raises(ManifestError, match="invalid manifest"):
        Manifest.parse(b"{not json")


def test_oversized_manifests_are_rejected_before_parsing():
    with pytest.raises(ManifestError, match="over the limit"):
        Manifest.parse(b" " * (mf.MAX_MANIFEST_BYTES + 1))


def test_too_many_files_are_rejected(monkeypatch):
    monkeypatch.setattr(mf, "MAX_FILES", 2)
    with pytest.raises(ManifestError, match="3 files exceed the limit of 2"):
        parse(doc(f("a"), f("b"), f("c")))


def test_canonical_json_is_sorted_compact_and_order_independent():
    a = parse(doc(f("b", role="weights"), f("a")))
    b = parse(doc(f("a"), f("b", role="weights")))
    assert a.canonical_json() == b.canonical_json()
    text = a.canonical_json().decode()
    assert " " not in text and "\n" not in text
    assert [x["path"] for x in json.loads(text)["files"]] == ["a", "b"]
    assert list(json.loads(text)) == sorted(json.loads(text))
    pretty = json.dumps(json.loads(text), indent=4)  # whitespace does not change identity
    assert Manifest.parse(pretty).digest == a.digest
    assert a.digest == "sha256:" + hashlib.sha256(a.canonical_json()).hexdigest()


def test_digest_is_stable_across_versions():
    # A golden value: if serialization changes, every deployed bundle changes identity.
    m = parse(doc(f("config.json"), f("model.safetensors", 5000, role="weights", chunks=[H, H])))
    assert m.canonical_json() == (
        b'{"chunkSize":4096,"files":[{"chunks":[],"path":"config.json","role":"config","sha256":"'
        + H.encode() + b'","size":10},{"chunks":["' + H.encode() + b'","' + H.encode()
        + b'"],"path":"model.safetensors","role":"weights","sha256":"' + H.encode()
        + b'","size":5000}],"schemaVersion":1}')
    assert m.digest == "sha256:" + hashlib.sha256(m.canonical_json()).hexdigest()
    assert Manifest.parse(m.canonical_json()) == m


def test_identity_separates_graph_from_weights():
    base = parse(doc(f("g.onnx", role="graph"), f("w.bin", role="weights")))
    new_graph = parse(doc(f("g.onnx", sha="1" * 64, role="graph"), f("w.bin", role="weights")))
    new_weights = parse(doc(f("g.onnx", role="graph"), f("w.bin", sha="1" * 64, role="weights")))
    assert new_graph.weights_digest == base.weights_digest != new_weights.weights_digest
    assert new_weights.graph_digest == base.graph_digest != new_graph.graph_digest
    assert set(base.identity()) == {"bundle", "graph", "weights"}


def test_chunk_arithmetic():
    assert n_chunks(4096, 4096) == 0 and n_chunks(4097, 4096) == 2 and n_chunks(0, 4096) == 0
    e = FileEntry(path="w", size=10000, sha256=H, role=Role.weights, chunks=(H, H, H))
    assert chunk_range(e, 2, 4096) == (8192, 10000 - 8192)


def test_digest_forms():
    d = "sha256:" + H
    assert check_digest(d) == d and revision_dirname(d) == "sha256-" + H
    for bad in ("sha256:" + H.upper(), H, "sha512:" + H, "sha256:" + H + "0", None):
        with pytest.raises(ManifestError, match="digest"):
            check_digest(bad)

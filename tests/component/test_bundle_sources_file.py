"""file:// sources and push to file:// against real directories."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from bundle.errors import IntegrityMismatch, SourceUnavailable
from bundle.manifest import MANIFEST_NAME, ManifestError, chunk_range
from bundle.scan import build_manifest, write_manifest
from bundle.sources import TargetConflict, fetch_verified, open_source, push, push_size

CHUNK = 8192


def make_bundle(root: Path) -> Path:
    """A small real bundle: a 5-chunk weights file, a graph, a config and an empty file."""
    (root / "sub").mkdir(parents=True)
    (root / "model.safetensors").write_bytes(os.urandom(4 * CHUNK + 100))
    (root / "graph.onnx").write_bytes(os.urandom(3000))
    (root / "config.json").write_bytes(b'{"layers": 2}')
    (root / "sub" / "empty.txt").write_bytes(b"")
    write_manifest(root, build_manifest(root, chunk_size=CHUNK))
    return root


@pytest.fixture
def bundle_dir(tmp_path):
    return make_bundle(tmp_path / "bundle")


def digest_of(root: Path) -> str:
    return "sha256:" + hashlib.sha256((root / MANIFEST_NAME).read_bytes()).hexdigest()


def test_reads_every_file_and_chunk_of_a_bundle_directory(bundle_dir):
    src = open_source(f"file://{bundle_dir}")
    m = src.fetch_manifest(digest_of(bundle_dir))
    for f in m.files:
        assert fetch_verified(src, f, 0, f.size, f.sha256) == (bundle_dir / f.path).read_bytes()
    big = m.by_path()["model.safetensors"]
    assert len(big.chunks) == 5
    for i, sha in enumerate(big.chunks):
        off, n = chunk_range(big, i, m.chunk_size)
        assert hashlib.sha256(fetch_verified(src, big, off, n, sha, chunk=i)).hexdigest() == sha


def test_wrong_manifest_digest_is_an_integrity_mismatch(bundle_dir):
    with pytest.raises(IntegrityMismatch, match="resident-manifest.json"):
        open_source(f"file://{bundle_dir}").fetch_manifest("sha256:" + "0" * 64)


def test_a_missing_directory_is_unavailable(tmp_path):
    with pytest.raises(SourceUnavailable, match="cannot read"):
        open_source(f"file://{tmp_path}/absent").fetch_manifest("sha256:" + "0" * 64)


def test_a_changed_chunk_fails_verification_and_names_the_chunk(bundle_dir):
    src = open_source(f"file://{bundle_dir}")
    m = src.fetch_manifest(digest_of(bundle_dir))
    big = m.by_path()["model.safetensors"]
    with open(bundle_dir / big.path, "r+b") as f:
        f.seek(2 * CHUNK + 7)
        f.write(b"\xff" if f.read(1) != b"\xff" else b"\x00")
    assert fetch_verified(src, big, 0, CHUNK, big.chunks[0])  # untouched chunk still fine
    with pytest.raises(IntegrityMismatch, match="chunk 2") as e:
        fetch_verified(src, big, 2 * CHUNK, CHUNK, big.chunks[2], chunk=2)
    assert e.value.expected == big.chunks[2] and e.value.actual != big.chunks[2]


def test_a_truncated_file_is_an_integrity_mismatch(bundle_dir):
    src = open_source(f"file://{bundle_dir}")
    big = src.fetch_manifest(digest_of(bundle_dir)).by_path()["model.safetensors"]
    os.truncate(bundle_dir / big.path, 3 * CHUNK)
    with pytest.raises(IntegrityMismatch, match="truncated"):
        list(src.read(big, 2 * CHUNK, 2 * CHUNK))


def test_a_symlink_out_of_the_directory_is_not_followed(bundle_dir, tmp_path):
    src = open_source(f"file://{bundle_dir}")
    cfg = src.fetch_manifest(digest_of(bundle_dir)).by_path()["config.json"]
    secret = tmp_path / "secret"
    secret.write_bytes(b'{"layers": 2}')  # same bytes: only the path check can stop it
    (bundle_dir / "config.json").unlink()
    (bundle_dir / "config.json").symlink_to(secret)
    with pytest.raises(SourceUnavailable, match="outside the bundle"):
        list(src.read(cfg, 0, cfg.size))


def test_push_copies_the_bundle_and_is_idempotent(bundle_dir, tmp_path):
    target = tmp_path / "published" / "tiny"
    seen = []
    digest = push(bundle_dir, f"file://{target}", progress=seen.append)
    assert digest == digest_of(bundle_dir) == digest_of(target)
    src = open_source(f"file://{target}")
    m = src.fetch_manifest(digest)
    assert sum(seen) == m.total_bytes == push_size(bundle_dir, f"file://{target}")
    for f in m.files:
        assert (target / f.path).read_bytes() == (bundle_dir / f.path).read_bytes()
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # no staging left
    before = {p: p.stat().st_mtime_ns for p in target.rglob("*")}
    assert push(bundle_dir, f"file://{target}") == digest
    assert {p: p.stat().st_mtime_ns for p in target.rglob("*")} == before


def test_push_refuses_to_overwrite_another_bundle_and_changes_nothing(bundle_dir, tmp_path):
    other = make_bundle(tmp_path / "other")
    target = tmp_path / "published"
    first = push(other, f"file://{target}")
    snapshot = {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    with pytest.raises(TargetConflict, match="refusing to overwrite"):
        push(bundle_dir, f"file://{target}")
    assert {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()} == snapshot
    assert digest_of(target) == first


def test_push_of_a_bundle_changed_after_build_publishes_nothing(bundle_dir, tmp_path):
    data = bytearray((bundle_dir / "graph.onnx").read_bytes())
    data[0] ^= 1
    (bundle_dir / "graph.onnx").write_bytes(bytes(data))  # same size, other bytes
    target = tmp_path / "published"
    with pytest.raises(IntegrityMismatch, match="graph.onnx"):
        push(bundle_dir, f"file://{target}")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == [bundle_dir]  # the staging tree is gone too


def test_push_of_an_unbuilt_or_damaged_bundle_is_refused(tmp_path, bundle_dir):
    (tmp_path / "raw").mkdir()
    with pytest.raises(ManifestError, match="no manifest"):
        push(tmp_path / "raw", f"file://{tmp_path}/out")
    (bundle_dir / "config.json").unlink()
    with pytest.raises(ManifestError, match="missing"):
        push(bundle_dir, f"file://{tmp_path}/out")
    assert not (tmp_path / "out").exists()


def test_a_directory_whose_manifest_has_path_traversal_is_rejected(bundle_dir):
    raw = (bundle_dir / MANIFEST_NAME).read_bytes().replace(b'"path":"config.json"',
                                                           b'"path":"../config.json"')
    (bundle_dir / MANIFEST_NAME).write_bytes(raw)
    with pytest.raises(ManifestError, match="escapes"):
        open_source(f"file://{bundle_dir}").fetch_manifest("sha256:" + hashlib.sha256(raw).hexdigest())

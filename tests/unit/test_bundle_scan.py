"""Turning a directory into a manifest: only regular files, roles, chunk digests."""

from __future__ import annotations

import hashlib
import os
import socket
import stat

import pytest

from bundle.manifest import MANIFEST_NAME, ManifestError, Role
from bundle.scan import build_manifest, parse_rules, read_manifest, role_for, write_manifest

CS = 4096


def tree(root, files: dict[str, bytes]):
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def test_roles_chunks_and_hashes(tmp_path):
    big = os.urandom(3 * CS + 5)
    tree(tmp_path, {"model.safetensors": big, "graph.onnx": b"g", "tok/tokenizer.json": b"t",
                    "config.json": b"{}"})
    m = build_manifest(tmp_path, chunk_size=CS)
    by = m.by_path()
    assert {p: e.role for p, e in by.items()} == {
        "model.safetensors": Role.weights, "graph.onnx": Role.graph,
        "tok/tokenizer.json": Role.tokenizer, "config.json": Role.config}
    w = by["model.safetensors"]
    assert w.sha256 == hashlib.sha256(big).hexdigest() and w.size == len(big)
    assert w.chunks == tuple(hashlib.sha256(big[i:i + CS]).hexdigest() for i in range(0, len(big), CS))
    assert by["graph.onnx"].chunks == ()


def test_roles_file_and_rules_override_defaults(tmp_path):
    tree(tmp_path, {"weights.dat": b"w", "model.safetensors": b"x",
                    ".resident-roles": b"# comment\nweights.dat weights\n"})
    m = build_manifest(tmp_path, rules=parse_rules(["model.safetensors=graph"]))
    assert m.by_path()["weights.dat"].role == Role.weights
    assert m.by_path()["model.safetensors"].role == Role.graph
    assert ".resident-roles" not in m.by_path()
    with pytest.raises(ManifestError, match="role rule 1"):
        parse_rules(["*.x kernel"])
    assert role_for("anything.txt", []) == Role.config


def test_symlinks_are_refused(tmp_path):
    tree(tmp_path, {"a": b"1"})
    (tmp_path / "link").symlink_to(tmp_path / "a")
    with pytest.raises(ManifestError, match="link: symlinks are not allowed"):
        build_manifest(tmp_path)
    (tmp_path / "link").unlink()
    (tmp_path / "dirlink").symlink_to(tmp_path)
    with pytest.raises(ManifestError, match="symlinks"):
        build_manifest(tmp_path)


def test_fifos_sockets_and_device_files_are_refused(tmp_path):
    tree(tmp_path, {"a": b"1"})
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ManifestError, match="pipe: only regular files"):
        build_manifest(tmp_path)
    (tmp_path / "pipe").unlink()
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(ManifestError, match="sock: only regular files"):
            build_manifest(tmp_path)
    finally:
        s.close()
        (tmp_path / "sock").unlink()
    if os.geteuid() == 0:  # making a device node needs root (CI runs as root)
        os.mknod(tmp_path / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        with pytest.raises(ManifestError, match="null: only regular files"):
            build_manifest(tmp_path)


def test_write_and_read_manifest_round_trip(tmp_path):
    tree(tmp_path, {"w.bin": os.urandom(100)})
    m = build_manifest(tmp_path)
    path = write_manifest(tmp_path, m)
    assert path.name == MANIFEST_NAME and path.read_bytes() == m.canonical_json()
    assert read_manifest(tmp_path) == m
    assert build_manifest(tmp_path) == m  # the manifest itself is not part of the bundle
    assert not list(tmp_path.glob(".*.tmp"))


def test_missing_or_corrupt_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(ManifestError, match="no manifest.*resident bundle build"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text('{"files": [{"path": "../x"}]}')
    with pytest.raises(ManifestError, match="invalid manifest"):
        read_manifest(tmp_path)

"""Crashes of a materializing process (SIGKILL, real subprocesses) leave nothing visible,
and the next Store() reclaims their temporary files and catalog rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bundle.scan import build_manifest, write_manifest
from bundle.sources import open_source
from bundle.store import Store

CHUNK = 64 * 1024
REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from bundle.catalog import Catalog
    from bundle.scan import read_manifest
    from bundle.sources.file import FileSource
    from bundle.store import Store

    store_root, bundle_dir, crash_at = sys.argv[1], sys.argv[2], sys.argv[3]

    class SlowSource(FileSource):  # a real file:// source, slowed to be killed mid-fetch
        def read(self, entry, offset, length):
            for block in super().read(entry, offset, length):
                time.sleep(0.05)
                yield block

    if crash_at == "publish":  # die after the tree is renamed, before the catalog commit
        real = Catalog.finish_work
        def finish_work(self, token, digest, publish):
            if publish:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, token, digest, publish)
        Catalog.finish_work = finish_work
    Store(store_root).materialize(read_manifest(bundle_dir), SlowSource("file://" + bundle_dir))
""")


def make_bundle(root: Path, size: int) -> Path:
    root.mkdir()
    (root / "model.safetensors").write_bytes(os.urandom(size))
    (root / "config.json").write_bytes(b"{}")
    write_manifest(root, build_manifest(root, chunk_size=CHUNK))
    return root


def run_child(store_root: Path, bundle_dir: Path, crash_at: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(store_root), str(bundle_dir), crash_at],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def written(path: Path) -> int:
    """The size of a blob the child writes, 0 once it is gone: a finished blob is renamed into
    its tree between the glob that lists it and this stat."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def test_killed_mid_fetch_leaves_nothing_and_is_reclaimed(tmp_path):
    bundle_dir = make_bundle(tmp_path / "b", 2 << 20)
    manifest = build_manifest(bundle_dir, chunk_size=CHUNK)
    store_root = tmp_path / "store"
    proc = run_child(store_root, bundle_dir, "fetch")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until a partial blob exists
            blobs = list((store_root / "work").glob("*/blob-*")) if store_root.exists() else []
            if any(written(b) > 0 for b in blobs):
                break
            time.sleep(0.02)
        else:
            raise AssertionError(f"child never started writing: {proc.stderr.read()!r}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        stop(proc)
    assert any((store_root / "work").iterdir())  # the crash really left temporary files
    store = Store(store_root)
    assert store.reclaimed["work"] >= 1
    assert list((store_root / "work").iterdir()) == []
    assert not store.has_revision(manifest.digest) and store.revisions() == []
    assert store.catalog.revision_state(manifest.digest) is None and store.leases() == []
    res = store.materialize(manifest, open_source(f"file://{bundle_dir}"))  # and it still works
    assert res.method == "reconstruct"
    assert (res.path / "model.safetensors").read_bytes() == (bundle_dir / "model.safetensors").read_bytes()


def test_killed_between_rename_and_commit_removes_the_uncommitted_tree(tmp_path):
    bundle_dir = make_bundle(tmp_path / "b", 256 * 1024)
    manifest = build_manifest(bundle_dir, chunk_size=CHUNK)
    store_root = tmp_path / "store"
    proc = run_child(store_root, bundle_dir, "publish")
    try:
        assert proc.wait(60) == -signal.SIGKILL, proc.stderr.read()
    finally:
        stop(proc)
    tree = store_root / "revisions" / manifest.digest.replace(":", "-")
    assert tree.is_dir()  # renamed into place, but never committed: not a revision
    store = Store(store_root)
    assert not tree.exists() and not store.has_revision(manifest.digest)
    assert list((store_root / "work").iterdir()) == []
    assert store.materialize(manifest, open_source(f"file://{bundle_dir}")).method == "reconstruct"


def test_reopening_does_not_touch_live_work_of_another_process(tmp_path):
    bundle_dir = make_bundle(tmp_path / "b", 1 << 20)
    manifest = build_manifest(bundle_dir, chunk_size=CHUNK)
    store_root = tmp_path / "store"
    proc = run_child(store_root, bundle_dir, "none")
    try:
        deadline = time.monotonic() + 30
        while not (store_root / "work").exists() or not list((store_root / "work").glob("*/blob-*")):
            assert time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        other = Store(store_root)  # a second opener while the first is working
        assert other.reclaimed["work"] == 0
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        stop(proc)
    assert other.has_revision(manifest.digest)
    assert (other.revision_path(manifest.digest) / "model.safetensors").read_bytes() == \
        (bundle_dir / "model.safetensors").read_bytes()


def test_stray_work_is_kept_while_young_and_removed_when_old(tmp_path):
    import bundle.reclaim as reclaim
    store_root = tmp_path / "store"
    Store(store_root)
    young, old = store_root / "work" / "young-token", store_root / "work" / "old-token"
    young.mkdir()
    old.mkdir()
    (old / "blob-0").write_bytes(b"partial")
    past = time.time() - reclaim.STRAY_GRACE_SECONDS - 5
    os.utime(old, (past, past))
    store = Store(store_root)
    assert young.exists() and not old.exists() and store.reclaimed["work"] == 1


def test_a_deleted_tree_of_a_ready_revision_is_rebuilt(tmp_path):
    from bundle.reclaim import remove_tree
    bundle_dir = make_bundle(tmp_path / "b", 256 * 1024)
    manifest = build_manifest(bundle_dir, chunk_size=CHUNK)
    store = Store(tmp_path / "store")
    first = store.materialize(manifest, open_source(f"file://{bundle_dir}"))
    remove_tree(first.path)  # someone deleted it behind the store's back
    assert not store.has_revision(manifest.digest)
    again = store.materialize(manifest, open_source(f"file://{bundle_dir}"))
    assert again.method == "reconstruct" and store.has_revision(manifest.digest)
    assert again.bytes_fetched == 0  # its blobs were still there, by content
    assert (again.path / "model.safetensors").read_bytes() == \
        (bundle_dir / "model.safetensors").read_bytes()

"""The node content store on real filesystems: XFS with reflink (loop file), ext4 (the
root filesystem under /tmp), a tiny ext4 for disk-full; real SQLite; file:// sources."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import stat
import threading
import time
from pathlib import Path

import pytest

from bundle.errors import IntegrityMismatch, PlanError, SourceUnavailable, StoreError, StoreFull
from bundle.loopfs import loop_filesystem
from bundle.manifest import MANIFEST_NAME, Manifest
from bundle.scan import build_manifest, write_manifest
from bundle.sources import open_source
from bundle.sources.file import FileSource
from bundle.store import Store

CHUNK = 64 * 1024
WEIGHTS = 2 * 1024 * 1024  # 32 chunks


def make_bundle(root: Path, seed: int = 1, weights: bytes | None = None, graph: bytes = b"g1",
                size: int = WEIGHTS) -> tuple[Path, Manifest]:
    root.mkdir(parents=True)
    rng = __import__("random").Random(seed)
    (root / "model.safetensors").write_bytes(weights if weights is not None else rng.randbytes(size))
    (root / "graph.onnx").write_bytes(graph)
    (root / "config.json").write_bytes(b'{"layers": 2}')
    (root / "tokenizer.json").write_bytes(b'{"vocab": ["a", "b"]}')
    m = build_manifest(root, chunk_size=CHUNK)
    write_manifest(root, m)
    return root, m


def derive(src: Path, dst: Path, changed_chunks: list[int] = (), graph: bytes | None = None
           ) -> tuple[Path, Manifest]:
    """A new revision of ``src``: the given weight chunks overwritten, maybe a new graph."""
    shutil.copytree(src, dst)
    with open(dst / "model.safetensors", "r+b") as f:
        for i in changed_chunks:
            f.seek(i * CHUNK + 17)
            f.write(os.urandom(100))
    if graph is not None:
        (dst / "graph.onnx").write_bytes(graph)
    m = build_manifest(dst, chunk_size=CHUNK)
    write_manifest(dst, m)
    return dst, m


def uri(d: Path) -> str:
    return f"file://{d}"


def assert_tree_equals(tree: Path, bundle_dir: Path, m: Manifest) -> None:
    for f in m.files:
        assert (tree / f.path).read_bytes() == (bundle_dir / f.path).read_bytes(), f.path
        assert stat.S_IMODE((tree / f.path).stat().st_mode) == 0o444
    assert Manifest.parse((tree / MANIFEST_NAME).read_bytes()).digest == m.digest


def assert_nothing_left(store: Store, digest: str) -> None:
    assert not store.has_revision(digest)
    assert not store.revision_path(digest).exists()
    assert list((store.root / "work").iterdir()) == []
    assert store.catalog.revision_state(digest) is None


class SlowSource(FileSource):
    """A real file:// source that sleeps between blocks (to hold work in flight)."""

    def __init__(self, uri_: str, delay: float) -> None:
        super().__init__(uri_)
        self.delay = delay

    def read(self, entry, offset, length):
        for block in super().read(entry, offset, length):
            time.sleep(self.delay)
            yield block


class ShortSource(FileSource):
    """Fault injection: a stream that silently stops ``missing`` bytes early."""

    def __init__(self, uri_: str, missing: int) -> None:
        super().__init__(uri_)
        self.missing = missing

    def read(self, entry, offset, length):
        left = length - self.missing
        for block in super().read(entry, offset, length):
            if left <= 0:
                return
            yield block[:left]
            left -= len(block)


@pytest.fixture(scope="module")
def xfs():
    with loop_filesystem("xfs", 320 << 20) as mnt:
        yield mnt


@pytest.fixture
def xfs_dir(xfs, request):
    d = xfs / request.node.name
    d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_rebase_on_xfs_clones_unchanged_chunks_and_writes_only_changes(tmp_path, xfs_dir):
    a_dir, a = make_bundle(tmp_path / "a")
    b_dir, b = derive(a_dir, tmp_path / "b", changed_chunks=[3, 20])
    store = Store(xfs_dir / "store")
    assert store.reflink is True
    first = store.materialize(a, open_source(uri(a_dir)))
    assert first.method == "reconstruct" and first.bytes_fetched == a.total_bytes
    free_before = _free_bytes(xfs_dir)
    res = store.materialize(b, open_source(uri(b_dir)), donor=a.digest)
    used = free_before - _free_bytes(xfs_dir)
    assert res.method == "rebase" and res.verified
    assert res.bytes_fetched == 2 * CHUNK
    assert res.bytes_written == 2 * CHUNK  # clones write nothing
    assert res.bytes_cloned == WEIGHTS - 2 * CHUNK
    assert used < WEIGHTS // 2, used  # a copy would have used the whole file
    assert _shared_bytes(res.path / "model.safetensors") >= WEIGHTS - 2 * CHUNK
    assert_tree_equals(res.path, b_dir, b)
    # identical small files are hardlinks of the donor's
    assert (res.path / "config.json").stat().st_ino == (first.path / "config.json").stat().st_ino


def cut_at_tensors(root: Path, sizes: dict[str, int], changed: str | None = None) -> tuple[Path, Manifest]:
    """A bundle whose weights are a safetensors file of float32 tensors of the given
    element counts (awkward, so that tensors start off block boundaries), cut at its
    tensors; ``changed``: that tensor gets other values."""
    import numpy as np
    from safetensors.numpy import save

    root.mkdir(parents=True)
    weights = {name: np.full(n, 1.5 if name == changed else 0.5, dtype=np.float32)
               + np.arange(n, dtype=np.float32) for name, n in sizes.items()}
    (root / "model.safetensors").write_bytes(save(weights))
    (root / "config.json").write_bytes(b'{"layers": 2}')
    m = build_manifest(root, chunk_size=CHUNK, chunking="tensors")
    write_manifest(root, m)
    return root, m


@pytest.mark.parametrize("on", ["xfs", "ext4"])
def test_a_rebase_of_a_bundle_cut_at_tensors_fetches_the_changed_tensor_alone(tmp_path, xfs_dir, on):
    sizes = {"a": 70_001, "b": 150_003, "c": 33_333, "d": 120_007}
    a_dir, a = cut_at_tensors(tmp_path / "a", sizes)
    b_dir, b = cut_at_tensors(tmp_path / "b", sizes, changed="c")
    store = Store((xfs_dir if on == "xfs" else tmp_path) / "store")
    assert store.reflink is (on == "xfs")
    store.materialize(a, open_source(uri(a_dir)))
    res = store.materialize(b, open_source(uri(b_dir)), donor=a.digest)
    assert res.method == "rebase" and res.verified
    assert res.bytes_fetched == 33_333 * 4          # the tensor's bytes, not the chunks around them
    weights = b.by_path()["model.safetensors"].size
    assert res.bytes_reused == b.total_bytes - 33_333 * 4   # config.json linked, the rest cloned
    if on == "xfs":   # the blocks around the tensor are cloned; the bytes beside its two ends copied
        assert res.bytes_cloned == weights - 33_333 * 4
        assert _shared_bytes(res.path / "model.safetensors") >= weights - 33_333 * 4 - 4 * 4096
    assert_tree_equals(res.path, b_dir, b)


def _shared_bytes(p: Path) -> int:
    """Bytes of ``p`` in extents the filesystem reports as shared (filefrag -v)."""
    out = subprocess.run(["filefrag", "-v", str(p)], capture_output=True, text=True,
                         check=True).stdout
    block = int(re.search(r"blocks of (\d+) bytes", out).group(1))
    total = 0
    for line in out.splitlines():
        m = re.match(r"\s*\d+:\s+\d+\.\.\s*\d+:\s+\d+\.\.\s*\d+:\s+(\d+):.*shared", line)
        if m:
            total += int(m.group(1)) * block
    return total


def _free_bytes(p: Path) -> int:
    os.sync()
    st = os.statvfs(p)
    return st.f_bfree * st.f_frsize


def test_rebase_without_reflink_copies_locally_and_fetches_only_changes(tmp_path):
    a_dir, a = make_bundle(tmp_path / "a")
    b_dir, b = derive(a_dir, tmp_path / "b", changed_chunks=[0, 31])
    store = Store(tmp_path / "store")  # /tmp is the root ext4 here; probed, not assumed
    assert store.reflink is False
    store.materialize(a, open_source(uri(a_dir)))
    res = store.materialize(b, open_source(uri(b_dir)), donor=a.digest)
    assert res.method == "rebase"
    assert res.bytes_fetched == 2 * CHUNK  # no refetch of unchanged bytes
    assert res.bytes_written == WEIGHTS  # cloned chunks were copied
    assert res.bytes_cloned == 0
    assert res.plan.write_bytes == res.bytes_written
    assert_tree_equals(res.path, b_dir, b)


def test_graph_only_moves_only_the_graph_and_shares_weights(tmp_path):
    a_dir, a = make_bundle(tmp_path / "a")
    b_dir, b = derive(a_dir, tmp_path / "b", graph=b"graph v2")
    store = Store(tmp_path / "store")
    first = store.materialize(a, open_source(uri(a_dir)))
    res = store.materialize(b, open_source(uri(b_dir)), donor=a.digest)
    assert res.method == "graph-only" and res.plan.path == "GraphOnly"
    assert res.bytes_fetched == len(b"graph v2") == res.bytes_written
    w = "model.safetensors"
    assert (res.path / w).stat().st_ino == (first.path / w).stat().st_ino
    assert_tree_equals(res.path, b_dir, b)


def test_materialize_is_idempotent_and_reports_present(tmp_path):
    a_dir, a = make_bundle(tmp_path / "a")
    store = Store(tmp_path / "store")
    store.materialize(a, open_source(uri(a_dir)))
    again = store.materialize(a, open_source(uri(a_dir)))
    assert again.method == "present" and again.bytes_fetched == again.bytes_written == 0
    assert store.manifest(a.digest).digest == a.digest and store.revisions() == [a.digest]


def test_min_reuse_refusal_reconstructs_and_says_why(tmp_path):
    a_dir, a = make_bundle(tmp_path / "a")
    b_dir, b = derive(a_dir, tmp_path / "b", changed_chunks=list(range(20)))
    store = Store(tmp_path / "store")
    store.materialize(a, open_source(uri(a_dir)))
    res = store.materialize(b, open_source(uri(b_dir)), donor=a.digest, min_reuse=0.9)
    assert res.method == "reconstruct" and "under minReuse 90.0%" in res.fallback_reason
    assert res.bytes_fetched == WEIGHTS  # every weights byte, the identical small files linked
    assert_tree_equals(res.path, b_dir, b)


def test_absent_donor_falls_back_with_reason_and_graph_only_is_refused(tmp_path):
    a_dir, a = make_bundle(tmp_path / "a")
    store = Store(tmp_path / "store")
    missing = "sha256:" + "0" * 64
    with pytest.raises(PlanError, match="does not hold it"):
        store.materialize(a, open_source(uri(a_dir)), donor=missing, mode="GraphOnly")
    assert_nothing_left(store, a.digest)
    res = store.materialize(a, open_source(uri(a_dir)), donor=missing)
    assert res.method == "reconstruct" and "not in the store" in res.fallback_reason


def test_one_corrupt_chunk_is_refused_and_nothing_is_published(tmp_path):
    a_dir, a = make_bundle(tmp_path / "a")
    b_dir, b = derive(a_dir, tmp_path / "b", changed_chunks=[5, 9])
    store = Store(tmp_path / "store")
    store.materialize(a, open_source(uri(a_dir)))
    with open(b_dir / "model.safetensors", "r+b") as f:  # corrupt the source after build
        f.seek(9 * CHUNK + 1000)
        f.write(b"\x00\xff")
    with pytest.raises(IntegrityMismatch) as exc:
        store.materialize(b, open_source(uri(b_dir)), donor=a.digest)
    assert exc.value.chunk == 9 and exc.value.path == "model.safetensors"
    assert "chunk 9" in str(exc.value)
    assert_nothing_left(store, b.digest)
    assert_tree_equals(store.revision_path(a.digest), a_dir, a)  # the donor lost nothing


def test_truncated_sources_are_refused(tmp_path):
    a_dir, a = make_bundle(tmp_path / "a")
    store = Store(tmp_path / "store")
    with pytest.raises(IntegrityMismatch, match="truncated|ended early|ends early"):
        store.materialize(a, ShortSource(uri(a_dir), missing=10))
    assert_nothing_left(store, a.digest)
    os.truncate(a_dir / "model.safetensors", WEIGHTS - CHUNK)  # the file itself is short
    with pytest.raises(IntegrityMismatch):
        store.materialize(a, open_source(uri(a_dir)))
    assert_nothing_left(store, a.digest)


def test_symlink_planted_in_source_is_not_followed(tmp_path):
    a_dir, a = make_bundle(tmp_path / "a")
    secret = tmp_path / "secret"
    secret.write_bytes(b'{"layers": 2}')  # same bytes, still refused: it is outside
    (a_dir / "config.json").unlink()
    (a_dir / "config.json").symlink_to(secret)
    store = Store(tmp_path / "store")
    with pytest.raises(SourceUnavailable, match="outside"):
        store.materialize(a, open_source(uri(a_dir)))
    assert_nothing_left(store, a.digest)


def test_disk_full_leaves_nothing_and_keeps_earlier_revisions(tmp_path):
    small_dir, small = make_bundle(tmp_path / "small", size=256 * 1024)
    big_dir, big = make_bundle(tmp_path / "big", seed=2, size=12 << 20)
    with loop_filesystem("ext4", 8 << 20) as mnt:
        store = Store(mnt / "store")
        store.materialize(small, open_source(uri(small_dir)))
        with pytest.raises(StoreFull, match="full"):
            store.materialize(big, open_source(uri(big_dir)))
        assert_nothing_left(store, big.digest)
        assert_tree_equals(store.revision_path(small.digest), small_dir, small)
        reopened = Store(mnt / "store")
        assert reopened.revisions() == [small.digest]
        reopened.gc(0, 0)  # reclaim blobs the failed work left
        assert reopened.usage_bytes() == 0 and reopened.revisions() == []


def test_two_materializations_of_one_revision_at_once(tmp_path):
    a_dir, a = make_bundle(tmp_path / "a")
    store = Store(tmp_path / "store")
    results, errors = [], []

    def run():
        try:
            results.append(Store(tmp_path / "store").materialize(a, SlowSource(uri(a_dir), 0.005)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    methods = sorted(r.method for r in results)
    assert methods == ["present", "present", "reconstruct"]
    assert sum(r.bytes_fetched for r in results) == a.total_bytes  # fetched once
    assert len({r.path for r in results}) == 1
    assert_tree_equals(store.revision_path(a.digest), a_dir, a)


def test_leases_pin_and_gc_removes_unleased_lru_first(tmp_path):
    store = Store(tmp_path / "store")
    ms = []
    for i in range(3):
        d, m = make_bundle(tmp_path / f"r{i}", seed=10 + i, size=256 * 1024)
        store.materialize(m, open_source(uri(d)))
        ms.append(m)
    # use r0 again: r1 becomes least recently used
    assert store.materialize(ms[0], open_source(uri(tmp_path / "r0"))).method == "present"
    assert store.acquire_lease("pod-a/vol", ms[2].digest) is True
    assert store.acquire_lease("pod-a/vol", ms[2].digest) is True  # idempotent
    with pytest.raises(StoreError, match="already leases"):
        store.acquire_lease("pod-a/vol", ms[0].digest)
    per_rev = ms[0].total_bytes
    assert store.gc(10 * per_rev, 0) == []  # under the high watermark: nothing
    removed = store.gc(2 * per_rev, 2 * per_rev)
    assert removed == [ms[1].digest]  # LRU first, stops at the low watermark
    removed = store.gc(0, 0)
    assert removed == [ms[0].digest]
    assert store.revisions() == [ms[2].digest] and store.usage_bytes() == per_rev
    assert sorted(p.name for p in (store.root / "blobs").glob("*/*")) == sorted(
        {__import__("bundle.plan", fromlist=["x"]).content_key(f, CHUNK) for f in ms[2].files})
    assert store.release_lease("pod-a/vol") is True
    assert store.release_lease("pod-a/vol") is False
    assert store.gc(0, 0) == [ms[2].digest] and store.usage_bytes() == 0


def test_gc_racing_a_new_lease_never_removes_a_revision_it_reported_present(tmp_path):
    d, m = make_bundle(tmp_path / "a", size=128 * 1024)
    store = Store(tmp_path / "store")
    outcomes = set()
    for i in range(25):
        store.materialize(m, open_source(uri(d)))
        barrier = threading.Barrier(2)
        got = {}

        def lease():
            barrier.wait()
            got["present"] = store.acquire_lease(f"holder-{i}", m.digest)

        def collect():
            barrier.wait()
            got["removed"] = store.gc(0, 0)

        ts = [threading.Thread(target=lease), threading.Thread(target=collect)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        outcomes.add((got["present"], bool(got["removed"])))
        assert got["present"] != bool(got["removed"])  # exactly one of them won
        if got["present"]:
            assert store.gc(0, 0) == [] and store.has_revision(m.digest)
            assert_tree_equals(store.revision_path(m.digest), d, m)
        else:
            assert not store.has_revision(m.digest)
        store.release_lease(f"holder-{i}")
        store.gc(0, 0)
    assert outcomes  # both orders are legal; each was checked above


def test_link_tree_is_a_hardlink_copy_staged_then_renamed(tmp_path):
    a_dir, a = make_bundle(tmp_path / "a")
    store = Store(tmp_path / "store")
    res = store.materialize(a, open_source(uri(a_dir)))
    dest = tmp_path / "vol" / "revisions" / "x"
    assert store.link_tree(a.digest, dest) == dest
    for f in a.files:
        assert (dest / f.path).stat().st_ino == (res.path / f.path).stat().st_ino
    assert store.link_tree(a.digest, dest) == dest  # idempotent
    assert [p.name for p in dest.parent.iterdir()] == ["x"]  # no staging leftovers
    other = tmp_path / "vol" / "other"
    other.mkdir()
    with pytest.raises(StoreError, match="exists"):
        store.link_tree(a.digest, other)
    with pytest.raises(StoreError, match="not in the store"):
        store.link_tree("sha256:" + "1" * 64, tmp_path / "vol" / "y")


def test_metrics_and_structured_log_record_a_materialization(tmp_path, caplog):
    from prometheus_client import REGISTRY

    def sample(kind: str) -> float:
        return REGISTRY.get_sample_value("resident_delivery_bytes_total", {"kind": kind}) or 0.0

    a_dir, a = make_bundle(tmp_path / "a")
    store = Store(tmp_path / "store")
    before = sample("fetched")
    with caplog.at_level("INFO", logger="resident.bundle.store"):
        res = store.materialize(a, open_source(uri(a_dir)))
    assert sample("fetched") - before == res.bytes_fetched == a.total_bytes
    assert REGISTRY.get_sample_value("resident_store_bytes") == store.usage_bytes()
    rec = next(r for r in caplog.records if r.getMessage() == "materialized")
    assert rec.digest == a.digest and rec.bytes_fetched == a.total_bytes
    from bundle.jsonlog import JSONLineFormatter
    line = __import__("json").loads(JSONLineFormatter().format(rec))
    assert line["msg"] == "materialized" and line["method"] == "reconstruct"
    assert line["bytes_written"] == a.total_bytes and line["level"] == "info"


def test_an_unvalidated_manifest_with_traversal_is_refused_before_any_write(tmp_path):
    from bundle.manifest import FileEntry, ManifestError, Role
    a_dir, a = make_bundle(tmp_path / "a")
    evil = FileEntry.model_construct(path="../../escape", size=2, sha256=a.files[0].sha256,
                                     role=Role.config, chunks=())
    bad = Manifest.model_construct(schema_version=1, chunk_size=CHUNK, files=(evil,))
    store = Store(tmp_path / "store")
    with pytest.raises(ManifestError, match="escapes|normalized"):
        store.materialize(bad, open_source(uri(a_dir)))
    assert not (tmp_path / "escape").exists() and store.revisions() == []
    assert list((store.root / "work").iterdir()) == []

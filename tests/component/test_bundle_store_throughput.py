"""Rebase or reconstruct by measured throughput, on real filesystems: ext4 in a loop file
(no reflink: a rebase copies), XFS in a loop file (reflink: a rebase clones); file://
sources; the speeds kept in the store's SQLite catalog across reopening."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from bundle import throughput
from bundle.catalog import Catalog
from bundle.loopfs import loop_filesystem
from bundle.manifest import Manifest
from bundle.rebase_cost import decide_rebase
from bundle.scan import build_manifest, write_manifest
from bundle.sources import open_source
from bundle.store import Store

CHUNK = 64 * 1024
WEIGHTS = 8 << 20  # 128 chunks: every fetch and copy here is over MIN_SAMPLE_BYTES
MIB = 1 << 20
SLOW_DISK = (64 * MIB, 64.0)  # an earlier copy: 64 MiB in 64 s, 1 MiB/s


def make_bundle(root: Path) -> tuple[Path, Manifest]:
    root.mkdir(parents=True)
    (root / "model.safetensors").write_bytes(random.Random(7).randbytes(WEIGHTS))
    (root / "graph.onnx").write_bytes(b"g1")
    (root / "config.json").write_bytes(b'{"layers": 2}')
    m = build_manifest(root, chunk_size=CHUNK)
    write_manifest(root, m)
    return root, m


def derive(src: Path, dst: Path, changed_chunks: list[int]) -> tuple[Path, Manifest]:
    shutil.copytree(src, dst)
    with open(dst / "model.safetensors", "r+b") as f:
        for i in changed_chunks:
            f.seek(i * CHUNK + 5)
            f.write(os.urandom(64))
    m = build_manifest(dst, chunk_size=CHUNK)
    write_manifest(dst, m)
    return dst, m


def uri(d: Path) -> str:
    return f"file://{d}"


def read_tree(tree: Path, m: Manifest) -> dict[str, bytes]:
    return {f.path: (tree / f.path).read_bytes() for f in m.files}


@pytest.fixture
def revisions(tmp_path):
    """Three revisions of one repository (sibling directories), each changing 2 chunks."""
    v1, m1 = make_bundle(tmp_path / "repo" / "v1")
    v2, m2 = derive(v1, tmp_path / "repo" / "v2", [3, 90])
    v3, m3 = derive(v2, tmp_path / "repo" / "v3", [10, 100])
    return [(v1, m1), (v2, m2), (v3, m3)]


def deliver_base_then_rebase_target(store: Store, revisions) -> tuple:
    """v1 by reconstruct (measures the file:// source), then v2 with v1 as donor."""
    (v1, m1), (v2, m2), _ = revisions
    base = store.materialize(m1, open_source(uri(v1)))
    assert base.method == "reconstruct" and base.bytes_fetched == m1.total_bytes
    source_bps, _ = store.throughputs(uri(v2))  # the same repository, another revision
    assert source_bps and source_bps > 0
    throughput.record(store.catalog, "copy", throughput.COPY_KEY, *SLOW_DISK)
    return store.materialize(m2, open_source(uri(v2)), donor=m1.digest), source_bps


def test_ext4_with_a_fast_source_reconstructs_and_says_why(revisions):
    with loop_filesystem("ext4", 128 << 20) as mnt:
        store = Store(mnt / "store")
        assert store.reflink is False
        res, source_bps = deliver_base_then_rebase_target(store, revisions)
        v2, m2 = revisions[1]
        assert res.method == "reconstruct"
        assert res.fallback_reason == res.cost_reason
        assert res.cost_reason.startswith(
            f"no reflink: copying {(WEIGHTS - 2 * CHUNK) / MIB:.1f} MiB locally (~")
        assert "at 1 MiB/s) costs more than fetching them (~" in res.cost_reason
        assert res.cost_reason.endswith("; reconstructing")
        assert res.plan.rebase_reuse_fraction > 0.9  # admitted by minReuse, refused on cost
        # the changed file fetched whole; the identical graph and config linked by content
        assert res.bytes_fetched == WEIGHTS and res.bytes_reused == m2.total_bytes - WEIGHTS
        assert res.to_status()["costReason"] == res.cost_reason
        assert read_tree(res.path, m2) == read_tree(v2, m2)


def test_xfs_with_reflink_still_rebases_whatever_the_speeds(revisions):
    with loop_filesystem("xfs", 320 << 20) as mnt:
        store = Store(mnt / "store")
        assert store.reflink is True
        res, _ = deliver_base_then_rebase_target(store, revisions)
        v2, m2 = revisions[1]
        assert res.method == "rebase" and res.fallback_reason is None and res.cost_reason is None
        assert res.bytes_fetched == 2 * CHUNK and res.bytes_cloned > 0
        assert read_tree(res.path, m2) == read_tree(v2, m2)


def test_ext4_learns_its_copy_speed_and_the_record_survives_reopening(revisions):
    (v1, m1), (v2, m2), (v3, m3) = revisions
    with loop_filesystem("ext4", 128 << 20) as mnt:
        store = Store(mnt / "store")
        store.materialize(m1, open_source(uri(v1)))
        first = store.materialize(m2, open_source(uri(v2)), donor=m1.digest)
        # no copy measured yet: the admitted rebase is kept, and it says so
        assert first.method == "rebase" and first.fallback_reason is None
        assert first.cost_reason.endswith("local copy throughput unknown, no earlier measurement")
        source_bps, copy_bps = store.throughputs(uri(v3))
        assert source_bps > 0 and copy_bps > 0  # both measured on real work
        reopened = Store(mnt / "store")
        assert reopened.throughputs(uri(v3)) == (source_bps, copy_bps)
        # the next delivery weighs the measured speeds, whichever way they fall here
        res = reopened.materialize(m3, open_source(uri(v3)), donor=m2.digest)
        expected = decide_rebase(reflink=False, rebase_fetch_bytes=2 * CHUNK,
                                 reconstruct_fetch_bytes=WEIGHTS, copy_bytes=WEIGHTS - 2 * CHUNK,
                                 source_bps=source_bps, copy_bps=copy_bps)
        assert res.method == ("rebase" if expected.rebase else "reconstruct")
        assert res.cost_reason == expected.reason
        assert read_tree(res.path, m3) == read_tree(v3, m3)


def test_records_keep_the_median_of_recent_large_transfers(tmp_path):
    catalog = Catalog(tmp_path / "store.db")
    key = "file:///srv/repo"
    assert throughput.estimate(catalog, "fetch", key) is None
    assert not throughput.record(catalog, "fetch", key, MIB, 0.001)  # too small to mean speed
    assert not throughput.record(catalog, "fetch", None, 64 * MIB, 1.0)  # no source key
    for seconds in (1.0, 2.0, 100.0):  # one outlier does not move the median
        assert throughput.record(catalog, "fetch", key, 64 * MIB, seconds)
    assert throughput.estimate(catalog, "fetch", key) == pytest.approx(32 * MIB)
    for _ in range(throughput.KEEP):  # only the most recent records count
        throughput.record(catalog, "fetch", key, 64 * MIB, 0.5)
    assert throughput.estimate(catalog, "fetch", key) == pytest.approx(128 * MIB)
    assert throughput.estimate(catalog, "copy", throughput.COPY_KEY) is None
    assert throughput.estimate(Catalog(tmp_path / "store.db"), "fetch", key) == pytest.approx(128 * MIB)

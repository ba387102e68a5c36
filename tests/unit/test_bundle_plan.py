"""Delivery planning: graph-only vs whole-bundle, rebase reuse, admission, predicted bytes."""

from __future__ import annotations

import hashlib

import pytest

from bundle.manifest import FileEntry, Manifest, Role
from bundle.plan import PlanError, content_key, plan_delivery

CS = 4096  # tiny chunks keep the arithmetic visible


def h(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def entry(path: str, role: Role, chunks: list[str] | None = None, size: int | None = None,
          tag: str = "") -> FileEntry:
    """A manifest entry; chunk names stand for chunk contents (full chunks of CS bytes)."""
    if chunks:
        size = size if size is not None else len(chunks) * CS
        return FileEntry(path=path, size=size, sha256=h(path + "".join(chunks)), role=role,
                         chunks=tuple(h(c) for c in chunks))
    return FileEntry(path=path, size=size if size is not None else 100, sha256=h(path + tag),
                     role=role)


def manifest(*files: FileEntry) -> Manifest:
    return Manifest(files=files, chunkSize=CS)


def model(weights: list[str], graph_tag: str = "", tok_tag: str = "") -> Manifest:
    return manifest(entry("graph.onnx", Role.graph, tag=graph_tag),
                    entry("config.json", Role.config),
                    entry("tokenizer.json", Role.tokenizer, tag=tok_tag),
                    entry("model.safetensors", Role.weights, weights))


W = [f"w{i}" for i in range(100)]


def test_graph_only_when_weights_and_tokenizer_are_identical():
    donor, target = model(W), model(W, graph_tag="v2")
    p = plan_delivery(target, donor)
    assert (p.path, p.method) == ("GraphOnly", "graph-only")
    assert p.fetch_bytes == 100  # the graph file only
    assert set(p.identical_files) == {"config.json", "tokenizer.json", "model.safetensors"}
    assert p.write_bytes == 100 and p.fallback_reason is None
    assert p.to_status() == {"path": "GraphOnly", "method": "graph-only",
                             "reuseFraction": round(p.reuse_fraction, 6),
                             "bytes": {"fetch": 100, "reuse": p.total_bytes - 100, "write": 100},
                             "fallbackReason": None, "costReason": None}


def test_graph_only_forced_but_weights_differ_is_a_clear_error():
    donor, target = model(W), model(W[:-1] + ["new"])
    with pytest.raises(PlanError, match="model.safetensors differs"):
        plan_delivery(target, donor, mode="GraphOnly")
    with pytest.raises(PlanError, match="needs a donor"):
        plan_delivery(target, None, mode="GraphOnly")
    with pytest.raises(PlanError, match="tokenizer.json differs"):
        plan_delivery(model(W, tok_tag="x"), donor, mode="GraphOnly")


def test_rebase_clones_identical_chunks_and_fetches_changed_ones():
    changed = W.copy()
    changed[7], changed[42] = "c7", "c42"
    donor, target = model(W), model(changed, graph_tag="v2")
    p = plan_delivery(target, donor)
    assert (p.path, p.method) == ("WholeBundle", "rebase")
    assert p.changed_chunks == {"model.safetensors": [7, 42]}
    assert p.cloned_chunks == {"model.safetensors": 98}
    assert set(p.identical_files) == {"config.json", "tokenizer.json"}
    assert p.fetch_bytes == 2 * CS + 100  # two chunks and the changed graph
    assert p.write_bytes == p.fetch_bytes  # with reflink, clones write nothing
    assert p.reuse_bytes == 98 * CS + 200
    assert p.reuse_fraction == pytest.approx(p.reuse_bytes / p.total_bytes)
    fp = next(f for f in p.files if f.path == "model.safetensors")
    assert [c.index for c in fp.clones][:3] == [0, 1, 2] and fp.clones[8].index == 9 and fp.clones[8].donor_offset == 9 * CS
    # without reflink, cloned chunks must be copied: writes grow, fetches do not
    q = plan_delivery(target, donor, reflink=False)
    assert q.fetch_bytes == p.fetch_bytes and q.write_bytes == p.fetch_bytes + 98 * CS


def test_without_reflink_a_fast_source_makes_the_admitted_rebase_reconstruct():
    changed = W.copy()
    changed[7] = "c7"
    donor, target = model(W), model(changed, graph_tag="v2")
    fast = {"source_bps": 1000.0 * CS, "copy_bps": 10.0 * CS}  # copy 99 chunks ~9.9 s vs 0.1 s
    p = plan_delivery(target, donor, reflink=False, **fast)
    assert (p.path, p.method) == ("WholeBundle", "reconstruct")
    assert p.fallback_reason == p.cost_reason
    assert p.cost_reason.startswith("no reflink: copying 0.4 MiB locally (~9.90 s at 0.039 MiB/s) "
                                    "costs more than fetching them (~0.10 s")
    assert p.rebase_reuse_fraction == pytest.approx((99 * CS + 200) / p.total_bytes)
    assert p.fetch_bytes == p.total_bytes and p.to_status()["costReason"] == p.cost_reason
    # a slow source keeps the rebase and says why; reflink ignores the speeds
    slow = plan_delivery(target, donor, reflink=False, source_bps=1.0 * CS, copy_bps=10.0 * CS)
    assert slow.method == "rebase" and "costs less than" in slow.cost_reason
    assert slow.fallback_reason is None and "cost     no reflink" in slow.describe()
    cloned = plan_delivery(target, donor, **fast)
    assert cloned.method == "rebase" and cloned.cost_reason is None


def test_without_reflink_unknown_speeds_keep_the_rebase_and_say_so():
    donor, target = model(W), model(W[:-1] + ["x"], graph_tag="v2")
    p = plan_delivery(target, donor, reflink=False, copy_bps=1.0)
    assert p.method == "rebase" and p.fallback_reason is None
    assert "source throughput unknown" in p.cost_reason


def test_linked_files_are_not_counted_as_saved_by_a_rebase():
    """A file equal to a donor file is linked by either method (content addressing): a
    rebase that only links and clones one chunk saves fetching that chunk, nothing more."""
    donor = manifest(entry("big.bin", Role.weights, W[:50]), entry("w.bin", Role.weights, W[50:]))
    target = manifest(entry("big.bin", Role.weights, W[:50]),
                      entry("w.bin", Role.weights, W[50:51] + ["new"]))
    # copy 1 chunk at CS/s = 1 s; fetch 1 saved chunk at 2*CS/s = 0.5 s: reconstruct
    p = plan_delivery(target, donor, reflink=False, source_bps=2.0 * CS, copy_bps=1.0 * CS)
    assert p.method == "reconstruct" and "fetching them (~0.50 s" in p.cost_reason


def test_cost_rule_never_overrides_min_reuse_rebase_never_or_graph_only():
    donor = model(W)
    speeds = {"reflink": False, "source_bps": 1.0, "copy_bps": 1e12}  # copying is free
    low = plan_delivery(model(W[:30] + [f"n{i}" for i in range(70)]), donor, **speeds)
    assert low.method == "reconstruct" and "under minReuse" in low.fallback_reason
    assert low.cost_reason is None
    never = plan_delivery(model(W[:-1] + ["x"]), donor, rebase="Never", **speeds)
    assert never.method == "reconstruct" and never.cost_reason is None
    fast = {"reflink": False, "source_bps": 1e12, "copy_bps": 1.0}
    assert plan_delivery(model(W, graph_tag="v2"), donor, **fast).method == "graph-only"


def test_moved_chunks_are_found_anywhere_in_the_donor():
    donor = model(W)
    target = manifest(entry("graph.onnx", Role.graph), entry("shard2.safetensors", Role.weights,
                                                             list(reversed(W[:10]))))
    p = plan_delivery(target, donor, mode="WholeBundle")
    fp = next(f for f in p.files if f.path == "shard2.safetensors")
    assert fp.action == "rebase" and fp.clones[0].donor_offset == 9 * CS and not fp.fetch_chunks


def test_admission_refuses_rebase_under_min_reuse_with_reason():
    donor = model(W)
    target = model(W[:30] + [f"n{i}" for i in range(70)])
    p = plan_delivery(target, donor, min_reuse=0.5)
    assert p.method == "reconstruct" and p.path == "WholeBundle"
    assert "under minReuse 50.0%" in p.fallback_reason
    assert p.fetch_bytes == p.total_bytes == p.write_bytes and p.reuse_bytes == 0
    assert p.rebase_reuse_fraction == pytest.approx((30 * CS + 300) / p.total_bytes)
    # the same change admitted under a lower threshold
    assert plan_delivery(target, donor, min_reuse=0.2).method == "rebase"


def test_reconstruct_without_donor_or_with_rebase_never():
    target = model(W)
    for p in (plan_delivery(target, None), plan_delivery(target, model(W[:-1] + ["x"]),
                                                         rebase="Never")):
        assert p.method == "reconstruct" and p.fallback_reason is None
        assert p.fetch_bytes == p.total_bytes and all(f.action == "fetch" for f in p.files)


def test_identical_manifest_is_graph_only_with_nothing_to_fetch():
    p = plan_delivery(model(W), model(W))
    assert p.method == "graph-only" and p.fetch_bytes == 0 and p.reuse_fraction == 1.0


def test_whole_bundle_mode_skips_graph_only():
    p = plan_delivery(model(W, graph_tag="v2"), model(W), mode="WholeBundle")
    assert p.method == "rebase" and p.path == "WholeBundle"


@pytest.mark.parametrize("kw,msg", [({"mode": "Fast"}, "delivery mode"),
                                    ({"rebase": "Always"}, "rebase"),
                                    ({"min_reuse": 1.5}, "minReuse")])
def test_bad_options_are_refused(kw, msg):
    with pytest.raises(PlanError, match=msg):
        plan_delivery(model(W), None, **kw)


def test_content_key_follows_chunks_for_large_files_and_sha_for_small():
    small = entry("a", Role.config)
    assert content_key(small, CS) == small.sha256
    big = entry("b", Role.weights, ["x", "y"])
    other = FileEntry(path="c", size=big.size, sha256=big.sha256, role=Role.weights,
                      chunks=(big.chunks[0], h("z")))
    assert content_key(big, CS) != content_key(other, CS)  # same claimed sha, other bytes


def test_tail_chunk_of_other_length_is_not_cloned():
    donor = manifest(entry("w.bin", Role.weights, ["a", "b"], size=2 * CS))
    target = manifest(entry("w.bin", Role.weights, ["a", "b"], size=2 * CS - 10))
    fp = plan_delivery(target, donor, mode="WholeBundle").files[0]
    assert [c.index for c in fp.clones] == [0] and fp.fetch_chunks == (1,)

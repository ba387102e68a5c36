"""Parity: in place to R (and reload to R) generates bitwise what a fresh load of R does.

Real files in a bridge-like volume, real safetensors bytes, the real numpy decoder; the
comparison is on every generated token's logits, byte for byte.
"""

import json
import os
import struct

import numpy as np
import pytest

from bundle.cpu_model import make_demo, make_revision
from bundle.manifest import DEFAULT_CHUNK_SIZE
from bundle.scan import build_manifest, write_manifest
from owner.backends import BackendError
from owner.backends.cpu import CpuBackend
from testkit.local_volume import stage_revision
from owner.revisions import IntegrityError, open_revision

SIZE = 512 * 1024
PROMPTS = ["The quick brown fox", "résident", "?"]   # many tokens, a word outside the vocabulary, one token
ROWS = {  # name -> make_revision keyword arguments for "rows" revisions
    "all-projections": {"seed": 1, "fraction": 0.01},
    "lm-head": {"seed": 2, "fraction": 0.1, "tensors": ["lm_head.weight"]},
    "spanning-chunks": {"seed": 3, "fraction": 0.3,
                        "tensors": ["layers.0.attn.q_proj.weight", "layers.0.mlp.down_proj.weight"]},
}


def build(tmp, chunk_size):
    src, vol = tmp / "src", tmp / "vol"
    base = make_demo(src / "base", SIZE, seed=11, chunk_size=chunk_size)
    stage_revision(vol, src / "base", make_current=True)
    digests = {"base": base.digest}
    for name, kw in ROWS.items():
        make_revision(src / "base", src / name, "rows", chunk_size=chunk_size, **kw)
        digests[name] = stage_revision(vol, src / name)
    for kind in ("graph", "whole"):
        make_revision(src / "base", src / kind, kind, chunk_size=chunk_size)
        digests[kind] = stage_revision(vol, src / kind)
    return vol, digests


@pytest.fixture(scope="module", params=[64 * 1024, DEFAULT_CHUNK_SIZE], ids=["64KiB-chunks", "no-chunks"])
def volume(request, tmp_path_factory):
    return build(tmp_path_factory.mktemp("parity"), request.param)


def outputs(backend):
    runs = [backend.generate(p, 6) for p in PROMPTS]
    return [(r.tokens, [l.tobytes() for l in r.logits]) for r in runs]


def fresh(vol, digest):
    b = CpuBackend()
    b.load(open_revision(vol, digest))
    return b


@pytest.mark.parametrize("name", list(ROWS))
def test_in_place_matches_fresh_load(volume, name):
    vol, digests = volume
    live = fresh(vol, digests["base"])
    before = outputs(live)
    update = live.stage_in_place(open_revision(vol, digests[name]))
    assert update.rows_changed > 0
    live.apply_in_place(update)
    assert live.describe().identity == open_revision(vol, digests[name]).manifest.identity()
    after = outputs(live)
    assert after == outputs(fresh(vol, digests[name]))
    assert after != before  # the revision really changed the model's logits


def test_in_place_chain_and_back_matches_fresh_loads(volume):
    vol, digests = volume
    live = fresh(vol, digests["base"])
    base_out = outputs(live)
    for name in ("lm-head", "spanning-chunks", "all-projections", "base"):
        live.apply_in_place(live.stage_in_place(open_revision(vol, digests[name])))
        assert live.revision.digest == digests[name]
        assert outputs(live) == outputs(fresh(vol, digests[name]))
    assert outputs(live) == base_out


@pytest.mark.parametrize("name, reused, weights_reused",
                         [("whole", True, False), ("graph", False, True), ("lm-head", True, False)])
def test_reload_matches_fresh_load_and_reuses_graph_only_when_unchanged(volume, name, reused, weights_reused):
    vol, digests = volume
    live = fresh(vol, digests["base"])
    arena = live.weights["lm_head.weight"]
    report = live.reload(open_revision(vol, digests[name]))
    assert (report.graph_reused, report.weights_reused) == (reused, weights_reused)
    # a kept graph keeps its weight buffers (the new weights are widened into the same
    # memory); a new graph over the same weights is bound to the buffers already filled
    assert np.shares_memory(live.weights["lm_head.weight"], arena)
    assert outputs(live) == outputs(fresh(vol, digests[name]))


def test_graph_only_reload_reads_no_weights_file(tmp_path):
    vol, digests = build(tmp_path, 64 * 1024)
    graph = open_revision(vol, digests["graph"])
    assert graph.manifest.weights_digest == open_revision(vol, digests["base"]).manifest.weights_digest
    expected = outputs(fresh(vol, digests["graph"]))
    weights = graph.dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    os.unlink(weights)        # break the volume's hardlink, then spoil the file on disk
    data[5 * 64 * 1024] ^= 0x01
    weights.write_bytes(bytes(data))
    live = fresh(vol, digests["base"])
    kv = [v.kv for v in live.graph.variants]
    report = live.reload(graph)   # would raise IntegrityError if it read the spoiled file
    assert (report.graph_reused, report.weights_reused) == (False, True)
    assert [v.kv for v in live.graph.variants] == kv   # same variants: the KV arenas are taken over
    assert live.revision.digest == digests["graph"]
    assert outputs(live) == expected


def test_reload_names_the_corrupt_chunk_and_serves_nothing(tmp_path):
    vol, digests = build(tmp_path, 64 * 1024)
    rev = open_revision(vol, digests["lm-head"])
    weights = rev.dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    os.unlink(weights)  # the volume hardlinks the source bundle; break the link before corrupting
    data[3 * 64 * 1024 + 5] ^= 0x01
    weights.write_bytes(bytes(data))
    live = fresh(vol, digests["base"])
    with pytest.raises(IntegrityError, match=r"model.safetensors: chunk 3 \(bytes 196608\.\.\)"):
        live.reload(rev)
    assert live.describe().identity is None  # reload closed the old runtime; nothing half-loaded serves


def test_load_rejects_bf16_values_at_odd_offsets(tmp_path):
    src = tmp_path / "src"
    make_demo(src, SIZE, seed=11)
    weights = src / "model.safetensors"
    data = weights.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    body = data[8:8 + n].rstrip(b" ")
    header = body + b" " * ((len(body) + 1) % 2)  # still valid JSON, but 8 + its length is odd
    weights.write_bytes(struct.pack("<Q", len(header)) + header + data[8 + n:])
    write_manifest(src, build_manifest(src))
    digest = stage_revision(tmp_path / "vol", src, make_current=True, hardlink=False)
    with pytest.raises(BackendError, match="starts at odd byte"):
        CpuBackend().load(open_revision(tmp_path / "vol", digest))


def test_load_rejects_weights_whose_shapes_the_config_does_not_imply(tmp_path):
    src = tmp_path / "src"
    make_demo(src, SIZE, seed=11)
    config = json.loads((src / "config.json").read_text())
    config["d_ff"] += 2  # the file's MLP tensors no longer have the shapes the config implies
    (src / "config.json").write_text(json.dumps(config))
    write_manifest(src, build_manifest(src))
    digest = stage_revision(tmp_path / "vol", src, make_current=True, hardlink=False)
    with pytest.raises(BackendError, match=r"tensor layers\.0\.mlp\.up_proj\.weight has shape"):
        CpuBackend().load(open_revision(tmp_path / "vol", digest))


def test_graph_and_whole_revisions_are_not_admissible_in_place(volume):
    from owner.inplace import NeedsReload

    vol, digests = volume
    live = fresh(vol, digests["base"])
    for name, reason in (("graph", "graph, config"), ("whole", "not admissible")):
        with pytest.raises(NeedsReload, match=reason):
            live.stage_in_place(open_revision(vol, digests[name]))
    assert live.revision.digest == digests["base"]


def test_local_volume_matches_the_bridge_layout(tmp_path):
    from bundle.manifest import revision_dirname
    from bundle.scan import build_manifest
    from testkit.local_volume import set_current

    a = make_demo(tmp_path / "a", 128 * 1024, seed=1)
    b = make_revision(tmp_path / "a", tmp_path / "b", "graph")
    vol = tmp_path / "vol"
    assert stage_revision(vol, tmp_path / "a", make_current=True) == a.digest
    assert stage_revision(vol, tmp_path / "a") == a.digest  # idempotent
    stage_revision(vol, tmp_path / "b", hardlink=False)
    assert (vol / "current").readlink().as_posix() == f"revisions/{revision_dirname(a.digest)}"
    assert build_manifest(vol / "revisions" / revision_dirname(b.digest)).digest == b.digest
    set_current(vol, b.digest)
    assert open_revision(vol).digest == b.digest
    assert sorted(p.name for p in (vol / "revisions").iterdir()) == sorted(
        revision_dirname(d) for d in (a.digest, b.digest))


def test_reload_closes_the_old_runtime_before_creating_the_new(volume):
    vol, digests = volume
    events = []

    class RecordingCpuBackend(CpuBackend):
        """Test-only: records the order of close and load."""

        def close(self):
            events.append(("close", self.revision.digest if self.revision else None))
            super().close()

        def _load(self, rev, keep):
            events.append(("load", rev.digest, self.weights == {}))
            return super()._load(rev, keep)

    live = RecordingCpuBackend()
    live.load(open_revision(vol, digests["base"]))
    events.clear()
    live.reload(open_revision(vol, digests["whole"]))
    assert events == [("close", digests["base"]), ("load", digests["whole"], True)]


def test_in_place_to_the_live_revision_changes_nothing(volume):
    vol, digests = volume
    live = fresh(vol, digests["base"])
    before = outputs(live)
    update = live.stage_in_place(open_revision(vol, digests["base"]))
    assert update.rows_changed == 0 and update.bytes_read == 0
    live.apply_in_place(update)
    assert live.revision.digest == digests["base"] and outputs(live) == before

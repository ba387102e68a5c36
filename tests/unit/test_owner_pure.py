"""Pure parts of the owner: admission from manifests, safetensors layouts, wire models,
graph compilation checks, BF16 widening and the backend registry."""

import json
import re
import struct

import numpy as np
import pytest
from pydantic import ValidationError

from bundle.cpu_model import choose_config, default_graph
from bundle.model_revisions import to_bf16
from bundle.manifest import FileEntry, Role, build_entries
from owner import api
from owner.backends import BackendError, BackendUnavailable, create_backend
from owner.backends.vendor import VendorBackend
from owner.decoder import bf16_to_f32
from owner.graph import GraphError, LayoutChanged, compile_graph
from owner.admission import plan_ranges
from owner.inplace import ChangedRange, NeedsReload
from owner.safetensors_layout import DTYPE_BYTES, LayoutError, parse_layout

H = "0" * 64


def entry(path, sha, role, size=10, chunks=()):
    return FileEntry(path=path, size=size, sha256=sha * 64, role=role, chunks=chunks)


def manifest(weights_sha="a", graph_sha="b", size=10, chunks=()):
    return build_entries([entry("model.safetensors", weights_sha, Role.weights, size, chunks),
                          entry("graph.json", graph_sha, Role.graph)], chunk_size=4096)


def test_plan_ranges_lists_only_differing_chunks():
    a = manifest("a", size=3 * 4096, chunks=("1" * 64, "2" * 64, "3" * 64))
    b = manifest("c", size=3 * 4096, chunks=("1" * 64, "9" * 64, "3" * 64))
    layouts = {"model.safetensors": object()}
    assert plan_ranges(a, b, layouts) == [ChangedRange("model.safetensors", 1)]
    assert plan_ranges(a, a, layouts) == []


@pytest.mark.parametrize("target, reason", [
    (manifest("c", graph_sha="d"), "graph, config or tokenizer"),
    (manifest("c", size=11), "size changes"),
])
def test_plan_ranges_needs_reload_when_more_than_weights_rows_change(target, reason):
    with pytest.raises(NeedsReload, match=reason):
        plan_ranges(manifest(), target, {"model.safetensors": object()})


def test_plan_ranges_needs_reload_for_renamed_weights():
    other = build_entries([entry("other.safetensors", "a", Role.weights), entry("graph.json", "b", Role.graph)])
    with pytest.raises(NeedsReload, match="set of weights files"):
        plan_ranges(manifest(), other, {})


def safetensors_bytes(tensors):
    doc, off = {}, 0
    for name, shape in tensors:
        n = 2 * int(np.prod(shape))
        doc[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(doc).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * off


def test_layout_gives_absolute_offsets():
    data = safetensors_bytes([("a", [2, 3]), ("b", [4])])
    layout = parse_layout(data, len(data))
    slots = layout.by_name()
    assert slots["a"].start == layout.data_start and slots["a"].row_bytes == 6
    assert slots["b"].end == len(data)
    assert [t.name for t in layout.overlapping(layout.data_start + 11, layout.data_start + 13)] == ["a", "b"]


@pytest.mark.parametrize("mangle, message", [
    (lambda d: d[:4], "shorter"),
    (lambda d: struct.pack("<Q", 10**9) + d[8:], "over the limit"),
    (lambda d: d + b"\0\0", "file has"),
    (lambda d: d[:8] + b"x" + d[9:], "not JSON"),
])
def test_bad_layouts_are_rejected(mangle, message):
    data = mangle(safetensors_bytes([("a", [2, 3])]))
    with pytest.raises(LayoutError, match=message):
        parse_layout(data, len(data))


def safetensors_of(tensors):
    """A safetensors file of (name, dtype, bit patterns) in the order given, its header
    padded to 8 bytes as safetensors pads it."""
    doc, off = {}, 0
    for name, dtype, bits in tensors:
        doc[name] = {"dtype": dtype, "shape": list(bits.shape), "data_offsets": [off, off + bits.nbytes]}
        off += bits.nbytes
    raw = json.dumps(doc).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(bits.tobytes() for _, _, bits in tensors)


class ArrayRows:
    """A RowStore over tensors held as numpy bit patterns of their file dtype's width."""

    def __init__(self, rev):
        data = (rev.dir / "model.safetensors").read_bytes()
        self._layouts = {"model.safetensors": parse_layout(data, len(data))}
        self.bits = {s.name: np.frombuffer(data[s.start:s.end], f"u{DTYPE_BYTES[s.dtype]}").reshape(s.shape).copy()
                     for s in self._layouts["model.safetensors"].tensors}

    def layouts(self):
        return self._layouts

    def tensor_bytes(self, name, start, end):
        return self.bits[name].tobytes()[start:end]

    def live_bits(self, name):
        return self.bits[name]

    def read_rows(self, name, rows):
        return self.bits[name][rows]

    def write_rows(self, name, rows, values):
        self.bits[name][rows] = values

    def release_staged(self, update):
        update.patches = []


@pytest.mark.parametrize("f32_first", [True, False])
def test_f32_rows_are_staged_and_applied_as_their_bits_unless_the_tensor_starts_misaligned(tmp_path, f32_first):
    from bundle.scan import build_manifest, write_manifest
    from owner.admission import stage
    from owner.inplace import apply, rebuild_range
    from owner.revisions import open_revision
    from testkit.local_volume import stage_revision

    rng = np.random.default_rng(0)
    head = rng.standard_normal((8, 512)).astype(np.float32).view(np.uint32)  # rows of 2 KiB
    edited = head.copy()
    edited[[1, 2, 6]] = rng.standard_normal((3, 512)).astype(np.float32).view(np.uint32)
    norm = rng.standard_normal(3).astype(np.float16).view(np.uint16)  # 6 bytes: what follows is misaligned
    digests = []
    for name, rows in (("base", head), ("target", edited)):
        tensors = [("lm_head.weight", "F32", rows), ("model.norm.weight", "F16", norm)]
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(safetensors_of(tensors if f32_first else tensors[::-1]))
        write_manifest(tmp_path / name, build_manifest(tmp_path / name, chunk_size=4096))
        digests.append(stage_revision(tmp_path / "vol", tmp_path / name, make_current=name == "base"))
    base, target = (open_revision(tmp_path / "vol", d) for d in digests)
    store = ArrayRows(base)
    if not f32_first:
        with pytest.raises(NeedsReload, match="lm_head.weight .*F32 values do not start on 4-byte boundaries"):
            stage(store, base.manifest, target)
        return
    update = stage(store, base.manifest, target)
    staged = [(p.name, p.rows.tolist(), p.new.dtype) for p in update.patches]
    assert staged == [("lm_head.weight", [1, 2, 6], np.uint32)]
    assert apply(store, update, verify_chunks=True).rows == 3
    layout, want = store.layouts()["model.safetensors"], (target.dir / "model.safetensors").read_bytes()
    assert rebuild_range(store, layout, 0, len(want)) == want


@pytest.mark.parametrize("change, words", [
    (lambda t: t.update(a=("F16", t["a"][1])), "tensor a changes dtype from BF16 to F16"),
    (lambda t: t.update(a=("BF16", t["a"][1].reshape(3, 2))), r"tensor a changes shape from \[2, 3\] to \[3, 2\]"),
    (lambda t: t.pop("b"), "tensor b is not in the target"),
    (lambda t: t.update(c=("BF16", np.zeros(1, np.uint16))), "tensor c is new in the target"),
    (lambda t: t.update(a=t.pop("a")), "tensor (a|b) moves within the file"),
])
def test_a_layout_change_is_told_by_its_first_differing_tensor(change, words):
    from owner.safetensors_layout import first_difference

    def layout(tensors):
        data = safetensors_of([(n, dtype, bits) for n, (dtype, bits) in tensors.items()])
        return parse_layout(data, len(data))

    tensors = {"a": ("BF16", np.arange(6, dtype=np.uint16).reshape(2, 3)), "b": ("BF16", np.ones(4, np.uint16))}
    live = layout(tensors)
    change(tensors)
    assert re.fullmatch(words, first_difference(live, layout(tensors)))
    assert first_difference(live, live) == "the layouts are the same"


def test_bf16_widening_is_exact_and_the_high_half_words_give_the_bits_back():
    bits = to_bf16(np.random.default_rng(0).standard_normal(1000).astype(np.float32))
    wide = bf16_to_f32(bits)
    assert np.array_equal(wide.view(np.uint16)[1::2], bits)  # what CpuBackend.live_bits reads
    assert np.array_equal(wide.view(np.uint32), bits.astype(np.uint32) << 16)
    out = np.zeros((10, 100), np.float32)
    assert bf16_to_f32(bits, out=out) is out and np.array_equal(out.reshape(-1), wide)
    with pytest.raises(ValueError, match="cannot widen"):
        bf16_to_f32(bits, out=np.zeros(999, np.float32))


def test_transition_request_is_strict():
    ok = api.TransitionRequest.model_validate({"target": "sha256:" + H, "path": "WholeBundle"})
    assert ok.strategy == "Auto"
    for bad in ({"target": "sha256:xyz", "path": "WholeBundle"},
                {"target": "sha256:" + H, "path": "../../etc"},
                {"target": "sha256:" + H, "path": "GraphOnly", "strategy": "Sometimes"},
                {"target": "sha256:" + H, "path": "GraphOnly", "extra": 1}):
        with pytest.raises(ValidationError):
            api.TransitionRequest.model_validate(bad)


def test_status_serializes_with_contract_names():
    st = api.TransitionStatus(id="x", **{"from": None}, to="sha256:" + H, requested="Auto", path="GraphOnly")
    doc = json.loads(api.dump(st))
    assert {"id", "from", "to", "strategy", "result", "reason", "identity", "timings",
            "graphReused", "weightsReused"} <= set(doc)
    assert set(doc["timings"]) == {"stageSeconds", "applySeconds", "verifySeconds", "firstTokenSeconds",
                                   "warmupSeconds", "totalSeconds"}


def test_graph_compile_checks_layers_ops_and_variants():
    config = choose_config(256 * 1024)
    good = default_graph(config, [{"name": "v", "batch": 1, "seq": 8}])
    compiled = compile_graph(json.dumps(good).encode(), json.dumps(config).encode(), "d")
    assert compiled.variant_for(8).name == "v" and compiled.variants[0].kv.shape[3] == 8
    with pytest.raises(GraphError, match="exceed"):
        compiled.variant_for(9)
    bad_ops = dict(good, layers=[{"index": 0, "ops": ["teleport"]}] * config["n_layers"])
    for graph, message in ((dict(good, layers=good["layers"][:1]), "layers"), (bad_ops, "unknown op"),
                           (dict(good, variants=[]), "no variants"), (dict(good, format="x"), "format"),
                           (dict(good, variants=[{"name": "long", "batch": 1, "seq": config["max_seq"] + 1}]),
                            "seq 513 exceeds the model's max_seq 512")):
        with pytest.raises(GraphError, match=message):
            compile_graph(json.dumps(graph).encode(), json.dumps(config).encode(), "d")


def test_graph_compile_binds_an_earlier_graphs_arenas_only_where_they_fit():
    config = choose_config(256 * 1024)
    variants = [{"name": "v", "batch": 1, "seq": 8}, {"name": "w", "batch": 2, "seq": 8}]
    first = compile_graph(json.dumps(default_graph(config, variants)).encode(), json.dumps(config).encode(), "a")
    wider = [variants[0], {"name": "w", "batch": 2, "seq": 16}]
    again = compile_graph(json.dumps(default_graph(config, wider)).encode(),
                          json.dumps(dict(config, rope_theta=1000.0)).encode(), "b", bind=first)
    assert again.weights is first.weights and again.config["rope_theta"] == 1000.0
    assert again.variants[0].kv is first.variants[0].kv                       # same shape: taken over
    assert again.variants[1].kv.shape[3] == 16 and again.variants[1].kv is not first.variants[1].kv
    assert not np.array_equal(again.variants[0].cos, first.variants[0].cos)  # tables from the new config
    for other in (dict(config, d_ff=config["d_ff"] + 2), dict(config, n_layers=config["n_layers"] + 1)):
        with pytest.raises(LayoutChanged, match="other weight tensors"):
            compile_graph(json.dumps(default_graph(other, variants)).encode(), json.dumps(other).encode(), "c",
                          bind=first)
    fresh = compile_graph(json.dumps(default_graph(config, variants)).encode(), json.dumps(config).encode(), "d")
    assert fresh.weights is not first.weights and fresh.variants[0].kv is not first.variants[0].kv


def test_registry_names_backends_and_vendor_sdks_fail_clearly():
    with pytest.raises(BackendError, match="unknown backend"):
        create_backend("tpu")
    for name, module in (("rngd", "furiosa_llm"), ("atom", "optimum.rbln")):
        with pytest.raises(BackendUnavailable, match=module):
            create_backend(name)
    assert create_backend("cpu").describe().in_place


class FakeVendorBackend(VendorBackend):
    """A fake vendor SDK (none can run here) behind the real VendorBackend: records what it opened."""

    name, sdk_module = "fake-vendor", "json"   # any importable module stands in for the SDK

    def _open(self, revision):
        self.opened = revision.dir
        return object()


def staged_revision(root, files):
    from bundle.scan import build_manifest, write_manifest
    from bundle.manifest import revision_dirname
    tmp = root / "incoming"
    tmp.mkdir(parents=True)
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    manifest = build_manifest(tmp)
    write_manifest(tmp, manifest)
    (root / "revisions").mkdir()
    rdir = root / "revisions" / revision_dirname(manifest.digest)
    tmp.rename(rdir)
    return rdir, manifest.digest


def test_vendor_backends_hash_the_revision_before_the_sdk_sees_it(tmp_path):
    from owner.revisions import IntegrityError, open_revision
    rdir, digest = staged_revision(tmp_path, {"model.bin": b"w" * 5000, "config.json": b"{}", "empty": b""})
    backend = FakeVendorBackend()
    backend.load(open_revision(tmp_path, digest))
    assert backend.opened == rdir and backend.describe().identity is not None
    backend.close()

    (rdir / "model.bin").write_bytes(b"W" + b"w" * 4999)       # same size, one byte changed
    with pytest.raises(IntegrityError, match="model.bin"):
        backend.load(open_revision(tmp_path, digest))
    assert backend.engine is None and backend.revision is None
    (rdir / "model.bin").write_bytes(b"w" * 5000)
    (rdir / "extra.py").write_bytes(b"import os")                # a file the manifest does not name
    with pytest.raises(IntegrityError, match="extra.py"):
        backend.load(open_revision(tmp_path, digest))


def test_termination_line_is_one_camelcase_reason_and_what_kubelet_keeps(tmp_path):
    from owner.termination import MAX_BYTES, record_start_failure, termination_line

    assert termination_line("BackendUnavailable", "no\nSDK  here") == "BackendUnavailable: no SDK here"
    assert len(termination_line("LoadFailed", "é" * 5000).encode()) <= MAX_BYTES
    with pytest.raises(ValueError, match="CamelCase"):
        termination_line("backend unavailable", "x")
    missing = tmp_path / "termination-log"
    assert not record_start_failure("LoadFailed", "x", missing) and not missing.exists()
    missing.write_text("")
    assert record_start_failure("LoadFailed", "x", missing) and missing.read_text() == "LoadFailed: x\n"


def test_a_drain_waits_out_several_usual_gaps_between_requests_within_its_floor_and_ceiling():
    from owner.runtime import QUIET_CEILING_SECONDS, QUIET_GAPS, Arrivals
    a = Arrivals()
    assert a.quiet_seconds(1.0) == 1.0                 # no traffic seen yet: the floor
    for t in range(20):
        a.note(100.0 + 0.05 * t)                       # dense traffic: the floor still
    assert a.quiet_seconds(1.0) == 1.0 and a.last == pytest.approx(100.95)
    for t in range(40):
        a.note(101.0 + 0.5 * t)                        # one request in half a second: 8 gaps
    assert a.mean_gap == pytest.approx(0.5, rel=0.05)
    assert a.quiet_seconds(1.0) == pytest.approx(QUIET_GAPS * 0.5, rel=0.05) and QUIET_GAPS * 0.5 > 3.0
    a.note(a.last + 120.0)                             # an idle spell: never beyond the ceiling
    assert a.quiet_seconds(1.0) == QUIET_CEILING_SECONDS
    assert a.quiet_seconds(10.0) == 10.0               # a floor above the ceiling wins

"""Chunks cut at a safetensors file's tensors (bundle.chunking), and manifests that list
where their chunks start."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save

from bundle.chunking import FileHasher, cut_as, tensor_cuts, tensor_offsets
from bundle.manifest import FileEntry, Manifest, ManifestError, Role, chunk_range, chunk_starting_at, cut_alike
from bundle.scan import build_manifest

pytestmark = pytest.mark.unit
CHUNK = 64 * 1024


def weights(seed: int = 1, sizes=(5000, 70_001, 3, 200_000, 17)) -> dict[str, np.ndarray]:
    """Tensors of awkward sizes, so that most cuts fall off 4 KiB boundaries."""
    rng = np.random.default_rng(seed)
    return {f"t{i}": rng.standard_normal(n).astype(np.float32) for i, n in enumerate(sizes)}


def spans(data: bytes) -> dict[str, tuple[int, int]]:
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1]) for k, v in header.items()}


def cut(data: bytes, chunking: str = "tensors", blocks: int = 7777) -> tuple[str, tuple, tuple]:
    hasher = FileHasher("model.safetensors", len(data), CHUNK, chunking)
    for i in range(0, len(data), blocks):   # fed in pieces that fall anywhere
        hasher.update(data[i:i + blocks])
    return hasher.result()


def test_every_tensor_is_its_own_chunks_and_the_rest_is_block_aligned():
    data = save(weights())
    sha, chunks, offsets = cut(data)
    assert sha == hashlib.sha256(data).hexdigest()
    bounds = [*offsets, len(data)]
    assert offsets[0] == 0 and len(chunks) == len(offsets)
    assert all(b - a <= CHUNK for a, b in zip(bounds, bounds[1:]))
    for a, b, digest in zip(bounds, bounds[1:], chunks):
        assert hashlib.sha256(data[a:b]).hexdigest() == digest
    for name, (start, end) in spans(data).items():
        assert start in bounds and end in bounds, name
    # a chunk that is not aligned at both ends lies within a block of a cut
    cuts = tensor_cuts(data, len(data))
    for a, b in zip(bounds, bounds[1:]):
        if a % 4096 or (b % 4096 and b != len(data)):
            assert b - a < 4096 and any(c // 4096 in (a // 4096, (b - 1) // 4096) for c in cuts), (a, b)


def test_a_changed_tensor_changes_exactly_its_own_chunks():
    before = weights()
    after = dict(before, t3=np.random.default_rng(9).standard_normal(200_000).astype(np.float32))
    old, new = save(before), save(after)
    (_, a_chunks, a_off), (_, b_chunks, b_off) = cut(old), cut(new)
    assert a_off == b_off
    changed = [i for i, (x, y) in enumerate(zip(a_chunks, b_chunks)) if x != y]
    bounds = [*b_off, len(new)]
    moved = sum(bounds[i + 1] - bounds[i] for i in changed)
    start, end = spans(new)["t3"]
    assert moved == end - start
    # the same change in fixed slices moves the slices the tensor straddles
    (_, fa, _), (_, fb, _) = cut(old, "fixed"), cut(new, "fixed")
    assert sum(x != y for x, y in zip(fa, fb)) * CHUNK > end - start


def test_what_is_not_a_safetensors_file_is_cut_in_fixed_slices():
    junk = bytes(range(256)) * 1000
    assert cut(junk) == cut(junk, "fixed")
    claims_too_much = struct.pack("<Q", 10**9) + b"{}" * 50_000
    assert cut(claims_too_much)[2] == ()
    not_json = struct.pack("<Q", 10) + b"not json!!" + bytes(CHUNK * 2)
    assert cut(not_json)[2] == ()
    small = save(weights(sizes=(100,)))
    assert cut(small) == (hashlib.sha256(small).hexdigest(), (), ())
    other = FileHasher("model.bin", len(save(weights())), CHUNK, "tensors")
    other.update(save(weights()))
    assert other.result()[2] == ()


def test_a_file_of_too_many_tensors_is_cut_in_fixed_slices(monkeypatch):
    import bundle.chunking
    data = save(weights())   # 5 tensors: 5 cuts inside the file (the last ends it)
    assert cut(data)[2]
    monkeypatch.setattr(bundle.chunking, "MAX_CUTS", 4)
    assert cut(data) == cut(data, "fixed")


def test_a_file_that_ends_inside_its_header_is_hashed_and_comes_out_short():
    data = save(weights())
    hasher = FileHasher("model.safetensors", len(data), CHUNK, "tensors")
    hasher.update(data[:6])
    sha, chunks, offsets = hasher.result()
    assert sha == hashlib.sha256(data[:6]).hexdigest() and offsets == () and chunks == ()


def test_tensor_offsets_cut_at_the_blocks_around_each_cut():
    assert tensor_offsets([5000], 3 * CHUNK, CHUNK) == (0, 4096, 5000, 8192, 8192 + CHUNK, 8192 + 2 * CHUNK)
    assert tensor_offsets([8192], 20_000, CHUNK) == (0, 8192)


def test_offsets_are_checked_and_appear_in_the_canonical_form_only_when_present():
    entry = dict(path="w.safetensors", size=3 * CHUNK, sha256="a" * 64, role=Role.weights)
    fixed = Manifest(files=(FileEntry(**entry, chunks=("b" * 64,) * 3),), chunkSize=CHUNK)
    assert b"offsets" not in fixed.canonical_json()
    offsets = (0, 4096, 5000, 8192, 8192 + CHUNK, 8192 + 2 * CHUNK)
    cut_ = Manifest(files=(FileEntry(**entry, chunks=("b" * 64,) * 6, offsets=offsets),), chunkSize=CHUNK)
    listed = b'"offsets":[0,4096,5000,8192,73728,139264]'
    assert listed in cut_.canonical_json()
    assert Manifest.parse(cut_.canonical_json()) == cut_ and cut_.digest != fixed.digest

    def with_offsets(new: list[int]) -> bytes:
        return cut_.canonical_json().replace(listed, b'"offsets":' + json.dumps(new).replace(" ", "").encode())

    for bad in [[1, 4096, 5000, 8192, 73728, 139264], [0, 5000, 4096, 8192, 73728, 139264],
                [0, 4096, 5000, 8192, 73728, 3 * CHUNK], [0, 4096]]:
        with pytest.raises(ManifestError, match="offsets must start at 0"):
            Manifest.parse(with_offsets(bad))
    with pytest.raises(ManifestError, match="at most 65536 bytes"):   # a piece longer than a chunk
        Manifest.parse(with_offsets([0, 4096, 5000, 8192, 100_000, 139264]))


def test_chunk_ranges_follow_the_offsets():
    data = save(weights())
    built = FileEntry(path="m.safetensors", size=len(data), sha256=cut(data)[0], role=Role.weights,
                      chunks=cut(data)[1], offsets=cut(data)[2])
    got = b"".join(data[o:o + n] for o, n in (chunk_range(built, i, CHUNK) for i in range(len(built.chunks))))
    assert got == data
    assert chunk_starting_at(built, built.offsets[3], CHUNK) == 3
    assert chunk_starting_at(built, built.offsets[3] + 1, CHUNK) is None
    fixed = FileEntry(path="m.safetensors", size=len(data), sha256=cut(data)[0], role=Role.weights,
                      chunks=cut(data, "fixed")[1])
    assert chunk_starting_at(fixed, 2 * CHUNK, CHUNK) == 2 and chunk_starting_at(fixed, 100, CHUNK) is None
    assert cut_alike(built, CHUNK, built, 2 * CHUNK) and cut_alike(fixed, CHUNK, fixed, CHUNK)
    assert not cut_alike(fixed, CHUNK, fixed, 2 * CHUNK) and not cut_alike(built, CHUNK, fixed, CHUNK)


def test_an_entry_is_taken_for_the_same_bytes_only_when_cut_the_same_way():
    data = save(weights())
    sha, chunks, offsets = cut(data)
    cut_entry = FileEntry(path="m.safetensors", size=len(data), sha256=sha, role=Role.weights,
                          chunks=chunks, offsets=offsets)
    fixed_entry = FileEntry(path="m.safetensors", size=len(data), sha256=sha, role=Role.weights,
                            chunks=cut(data, "fixed")[1])
    assert cut_as(cut_entry, CHUNK, "tensors") and not cut_as(cut_entry, CHUNK, "fixed")
    assert cut_as(fixed_entry, CHUNK, "fixed") and not cut_as(fixed_entry, CHUNK, "tensors")
    config = FileEntry(path="config.json", size=10, sha256=sha, role=Role.config)
    assert cut_as(config, CHUNK, "tensors") and cut_as(config, CHUNK, "fixed")


def test_build_with_tensor_chunking_gives_another_digest_for_the_same_files(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(save(weights()))
    (tmp_path / "config.json").write_bytes(b"{}")
    fixed = build_manifest(tmp_path, chunk_size=CHUNK)
    tensors = build_manifest(tmp_path, chunk_size=CHUNK, chunking="tensors")
    assert fixed.digest != tensors.digest
    assert tensors.by_path()["config.json"] == fixed.by_path()["config.json"]
    assert tensors.by_path()["model.safetensors"].offsets
    with pytest.raises(ManifestError, match="chunking 'rows' must be one of fixed, tensors"):
        build_manifest(tmp_path, chunk_size=CHUNK, chunking="rows")

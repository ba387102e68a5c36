"""The demo-model generator: deterministic, right-sized, and revisions change what they say."""

import json

import numpy as np
import pytest

from bundle.cpu_model import choose_config, make_demo, make_revision, tensor_shapes
from bundle.model_revisions import WEIGHTS_NAME, DemoError, is_admissible, read_layout, to_bf16
from bundle.manifest import Role
from bundle.scan import build_manifest, read_manifest

SIZE = 256 * 1024


def tensors(bundle):
    start, header = read_layout(bundle / WEIGHTS_NAME)
    raw = (bundle / WEIGHTS_NAME).read_bytes()
    return {name: np.frombuffer(raw, np.uint16, (i["data_offsets"][1] - i["data_offsets"][0]) // 2,
                                start + i["data_offsets"][0]).reshape(i["shape"])
            for name, i in header.items()}


@pytest.fixture
def base(tmp_path):
    make_demo(tmp_path / "base", SIZE, seed=3)
    return tmp_path / "base"


def test_same_seed_same_digest_other_seed_other_digest(tmp_path, base):
    again = make_demo(tmp_path / "again", SIZE, seed=3)
    other = make_demo(tmp_path / "other", SIZE, seed=4)
    assert again.digest == read_manifest(base).digest
    assert other.weights_digest != again.weights_digest
    assert other.graph_digest == again.graph_digest


def test_files_roles_and_manifest_match_disk(base):
    m = read_manifest(base)
    roles = {f.path: f.role for f in m.files}
    assert roles == {"config.json": Role.config, "graph.json": Role.graph,
                     "tokenizer.json": Role.tokenizer, WEIGHTS_NAME: Role.weights}
    assert build_manifest(base).digest == m.digest


def test_weights_size_tracks_request_and_header_matches_config(base):
    config = json.loads((base / "config.json").read_text())
    size = (base / WEIGHTS_NAME).stat().st_size
    assert 0.5 * SIZE < size < 1.5 * SIZE
    _, header = read_layout(base / WEIGHTS_NAME)
    assert {n: tuple(i["shape"]) for n, i in header.items()} == dict(tensor_shapes(config))
    assert all(i["dtype"] == "BF16" for i in header.values())


def test_large_config_is_about_one_gib():
    c = choose_config(1 << 30)
    params = sum(int(np.prod(s)) for _, s in tensor_shapes(c))
    assert 0.9 < 2 * params / (1 << 30) < 1.1


def test_rows_revision_changes_only_a_fraction_of_admissible_rows(tmp_path, base):
    rev = make_revision(base, tmp_path / "r", "rows", fraction=0.05, seed=7)
    old, new = tensors(base), tensors(tmp_path / "r")
    assert rev.graph_digest == read_manifest(base).graph_digest
    assert rev.weights_digest != read_manifest(base).weights_digest
    changed = {n for n in old if not np.array_equal(old[n], new[n])}
    assert changed and all(is_admissible(n) for n in changed)
    for n in changed:
        rows = np.nonzero((old[n] != new[n]).any(axis=1))[0]
        assert len(rows) <= int(np.ceil(0.05 * old[n].shape[0]))
        assert rows.max() - rows.min() + 1 <= int(np.ceil(0.05 * old[n].shape[0]))  # one contiguous run


def test_rows_revision_of_named_tensors_is_deterministic(tmp_path, base):
    a = make_revision(base, tmp_path / "a", "rows", seed=5, tensors=["lm_head.weight"])
    b = make_revision(base, tmp_path / "b", "rows", seed=5, tensors=["lm_head.weight"])
    assert a.digest == b.digest
    old, new = tensors(base), tensors(tmp_path / "a")
    assert {n for n in old if not np.array_equal(old[n], new[n])} == {"lm_head.weight"}


def test_graph_revision_keeps_weights_byte_identical(tmp_path, base):
    rev = make_revision(base, tmp_path / "g", "graph")
    assert rev.weights_digest == read_manifest(base).weights_digest
    assert rev.graph_digest != read_manifest(base).graph_digest


def test_whole_revision_replaces_every_tensor(tmp_path, base):
    make_revision(base, tmp_path / "w", "whole")
    old, new = tensors(base), tensors(tmp_path / "w")
    assert all(not np.array_equal(old[n], new[n]) for n in old)


def test_bf16_rounds_to_nearest_even():
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5], dtype=np.float32)
    assert to_bf16(values).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020]


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "bits"}, "kind"),
    ({"kind": "rows", "fraction": 0}, "fraction"),
    ({"kind": "rows", "tensors": ["nope.weight"]}, "not in"),
    ({"kind": "rows", "tensors": ["embed.weight"]}, "not a projection"),
])
def test_bad_revision_requests_are_refused_and_leave_nothing(tmp_path, base, kwargs, message):
    with pytest.raises(DemoError, match=message):
        make_revision(base, tmp_path / "bad", **kwargs)
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())
    assert build_manifest(base).digest == read_manifest(base).digest  # base untouched


def test_refuses_non_empty_output_and_tiny_sizes(tmp_path, base):
    with pytest.raises(DemoError, match="not empty"):
        make_demo(base, SIZE)
    with pytest.raises(DemoError, match="too small"):
        make_demo(tmp_path / "tiny", 1000)
    with pytest.raises(DemoError, match="not a demo bundle"):
        make_revision(tmp_path, tmp_path / "x", "rows")

"""The torch backend on checkpoints as they come: tiny Llamas saved by transformers in F32,
F16 and BF16, with a tokenizer that adds a BOS or (as GPT-2's) none, switched in place by a
real owner and compared with transformers' own greedy generate on the new revision; what
cannot change in place is refused with its reason; and a first-token check that fails after
an apply is rolled back, or the result names the revision that serves.
"""

import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from bundle.manifest import revision_dirname
from bundle.model_revisions import WEIGHTS_NAME, copy_base, seal
from bundle.scan import build_manifest, write_manifest
from owner import api
from owner.backends.torch_lm import TorchBackend
from owner.inplace import NeedsReload
from owner.revisions import open_revision
from owner.runtime import Owner
from testkit.local_volume import stage_revision

from hf_checkpoints import (
    DTYPES, PROMPT, FirstTokenFailsOnce, llama_checkpoint, rows_edited, rows_that_differ, transformers_greedy,
)

EDITED = {"lm_head.weight", "model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(dtype, adds_bos) -> a base checkpoint, its rows-edited revision and transformers'
    greedy tokens on each; built once per module, when first asked for."""
    cache = {}

    def make(dtype: str, adds_bos: bool):
        if (dtype, adds_bos) not in cache:
            tmp = tmp_path_factory.mktemp(f"{dtype}-{'bos' if adds_bos else 'nobos'}")
            base = llama_checkpoint(tmp / "base", dtype, adds_bos)
            before = transformers_greedy(base)
            rows = rows_edited(base, tmp / "rows", head_rows=sorted(set(before[:3])))
            cache[dtype, adds_bos] = base, rows, before, transformers_greedy(rows)
        return cache[dtype, adds_bos]

    return make


def volume_of(tmp_path, base, *others):
    """A bridge-like volume with ``base`` current and ``others`` staged; their digests."""
    vol = tmp_path / "vol"
    digests = [stage_revision(vol, base, make_current=True, hardlink=False)]
    digests += [stage_revision(vol, d, hardlink=False) for d in others]
    return vol, digests


def started(vol, backend):
    owner = Owner(vol, backend, warmup=True)  # warm-up runs the first-token check at start too
    owner.start()
    return owner


def transition(owner, digest, strategy):
    st = owner.submit(api.TransitionRequest(target=digest, path="WholeBundle", strategy=strategy))
    return owner.wait_transition(st.id, 60)


def greedy(owner):
    return owner.generate(api.GenerateRequest(prompt=PROMPT, maxTokens=12))


@pytest.mark.parametrize("dtype, adds_bos", [
    ("F32", False),  # as GPT-2 checkpoints come: F32, and a tokenizer that adds no BOS
    ("F16", True),
    ("BF16", True),
    ("BF16", False),
])
def test_rows_change_in_place_and_the_owner_answers_as_transformers_on_the_new_revision(
        tmp_path, made, dtype, adds_bos):
    base, rows, before, after = made(dtype, adds_bos)
    assert after != before  # the edit is visible in what transformers generates
    vol, (base_digest, rows_digest) = volume_of(tmp_path, base, rows)
    owner = started(vol, TorchBackend())
    try:
        assert owner.identity().residency.dtype == str(DTYPES[dtype]).removeprefix("torch.")
        assert greedy(owner).tokens == before
        live = {n: t.data_ptr() for n, t in owner.backend.live.bound.items()}
        if not adds_bos:  # the tokenizer is the hard case: a newline encodes to no tokens
            assert owner.backend.tokenizer("\n")["input_ids"] == []
        st = transition(owner, rows_digest, "InPlace")
        assert (st.result, st.strategy, st.reason) == ("succeeded", "InPlace", "")
        changed = rows_that_differ(base, rows)
        assert set(changed) == EDITED and st.rows_changed == sum(map(len, changed.values()))
        assert st.identity.bundle == rows_digest and owner.state == "ready"
        assert st.timings.first_token_seconds > 0
        out = greedy(owner)
        assert out.tokens == after and out.identity.bundle == rows_digest
        assert {n: t.data_ptr() for n, t in owner.backend.live.bound.items()} == live  # written in place
        st = transition(owner, base_digest, "InPlace")  # and back
        assert (st.result, st.strategy) == ("succeeded", "InPlace") and greedy(owner).tokens == before
    finally:
        owner.close()


def test_a_checkpoint_cut_at_its_tensors_changes_rows_in_place_as_transformers_does(tmp_path, made):
    """The same F32 revisions built with ``--chunking tensors``: the changed chunks are found
    by their offsets and checked after the write."""
    base, rows, before, after = made("F32", False)
    cut = []
    for d in (base, rows):
        copy = tmp_path / d.name
        shutil.copytree(d, copy)
        manifest = build_manifest(copy, chunk_size=64 * 1024, chunking="tensors")
        assert manifest.by_path()[WEIGHTS_NAME].offsets
        write_manifest(copy, manifest)
        cut.append(copy)
    vol, (_, rows_digest) = volume_of(tmp_path, *cut)
    owner = started(vol, TorchBackend(verify_chunks=True))
    try:
        assert greedy(owner).tokens == before
        st = transition(owner, rows_digest, "InPlace")
        assert (st.result, st.strategy, st.reason) == ("succeeded", "InPlace", "")
        assert st.rows_changed == sum(map(len, rows_that_differ(base, rows).values()))
        assert greedy(owner).tokens == after
    finally:
        owner.close()


def resaved(base, out, change):
    """A copy of ``base`` whose weights file safetensors writes again after ``change``(tensors)
    (the config stays the base's)."""
    tensors = load_file(base / WEIGHTS_NAME)
    change(tensors)
    copy_base(base, out)
    save_file(tensors, out / WEIGHTS_NAME, metadata={"format": "pt"})
    seal(out, 64 * 1024)
    return out


def as_bf16(tensors):
    for name in tensors:
        tensors[name] = tensors[name].to(torch.bfloat16)


def head_transposed(tensors):
    tensors["lm_head.weight"] = tensors["lm_head.weight"].t().contiguous()


@pytest.mark.parametrize("dtype, change, reason", [
    ("F16", as_bf16, "tensor .* changes dtype from F16 to BF16"),
    ("F32", head_transposed, r"tensor lm_head.weight changes shape from \[\d+, 64\] to \[64, \d+\]"),
])
def test_a_dtype_or_shape_change_needs_a_reload_and_says_which_tensor(tmp_path, made, dtype, change, reason):
    base = made(dtype, False)[0]
    target = resaved(base, tmp_path / "target", change)
    vol, (_, digest) = volume_of(tmp_path, base, target)
    backend = TorchBackend()
    backend.load(open_revision(vol))
    with pytest.raises(NeedsReload, match=reason):
        backend.stage_in_place(open_revision(vol, digest))


@pytest.mark.parametrize("strategy, old_files, live, words", [
    ("InPlace", "intact", "base", "rolled back in place"),
    ("InPlace", "corrupt", "rows", "rolling back .* failed"),
    ("Reload", "intact", "rows", "after the reload"),
])
def test_a_failed_first_token_check_after_an_apply_rolls_back_or_names_the_revision_that_serves(
        tmp_path, made, strategy, old_files, live, words):
    base, rows, before, after = made("F32", False)
    vol, (base_digest, rows_digest) = volume_of(tmp_path, base, rows)
    owner = started(vol, FirstTokenFailsOnce())
    try:
        if old_files == "corrupt":  # the rollback in place must read the base's rows again: it cannot
            weights = vol / "revisions" / revision_dirname(base_digest) / WEIGHTS_NAME
            weights.write_bytes(bytes(weights.stat().st_size))
        st = transition(owner, rows_digest, strategy)
        assert owner.backend.failed  # the injected check failure happened
        digest, tokens = (base_digest, before) if live == "base" else (rows_digest, after)
        assert st.result == "failed" and st.strategy == strategy
        assert "first-token check failed" in st.reason and re.search(words, st.reason)
        assert f"{digest} serves" in st.reason
        assert st.identity.bundle == digest and owner.state == "ready"
        assert owner.identity().identity.bundle == digest
        out = greedy(owner)
        assert out.tokens == tokens and out.identity.bundle == digest
    finally:
        owner.close()

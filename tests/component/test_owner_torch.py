"""The torch backend on real (tiny) Hugging Face checkpoints built here: parity with
transformers' own greedy generate, in place and reloads against fresh loads, faults, and
checkpoints that must not load.

Revisions come from ``bundle.hf_demo`` (Llama-style) and ``hf_checkpoints`` (Qwen2 with tied
embeddings, GPT-2 in F32); the owner runs them from a bridge-like local volume.
"""

import json
import os
import shutil
import threading

import numpy as np
import pytest

from bundle.model_revisions import read_layout
from bundle.hf_demo import make_hf_demo, make_hf_revision
from bundle.scan import build_manifest, write_manifest
from owner import api
from owner.backends.base import BackendError
from owner.backends.torch_lm import TorchBackend
from owner.inplace import NeedsReload
from testkit.local_volume import set_current, stage_revision
from owner.revisions import open_revision
from owner.runtime import Owner, StartupError

from hf_checkpoints import (
    PROMPT, FailReleaseWeights, FailRestoreWeights, FlipFirstWriteWeights, StrayWriteWeights, family_checkpoint,
    transformers_greedy,
)

CHUNK = 64 * 1024
SIZE = 1024 * 1024


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (checkpoint dir, digest staged in the shared volume)."""
    tmp = tmp_path_factory.mktemp("hf")
    src, vol = tmp / "src", tmp / "vol"
    make_hf_demo(src / "base", SIZE, seed=5, chunk_size=CHUNK)
    make_hf_revision(src / "base", src / "rows", "rows", fraction=0.05, seed=8, chunk_size=CHUNK)
    make_hf_revision(src / "base", src / "rows2", "rows", fraction=0.2, seed=9, chunk_size=CHUNK)
    make_hf_revision(src / "base", src / "graph", "graph", chunk_size=CHUNK)
    make_hf_revision(src / "base", src / "whole", "whole", chunk_size=CHUNK)
    family_checkpoint(src / "qwen2", "qwen2")
    family_checkpoint(src / "gpt2", "gpt2")
    out = {}
    for p in sorted(src.iterdir()):
        out[p.name] = (p, stage_revision(vol, p, make_current=p.name == "base", hardlink=False))
    out["vol"] = vol
    return out


@pytest.fixture(scope="module")
def reference(checkpoints):
    return {name: transformers_greedy(entry[0]) for name, entry in checkpoints.items() if name != "vol"}


def loaded(checkpoints, name="base", weights=None):
    backend = TorchBackend()
    if weights is not None:
        backend.live_weights = weights
    backend.load(open_revision(checkpoints["vol"], checkpoints[name][1]))
    return backend


def revision(checkpoints, name):
    return open_revision(checkpoints["vol"], checkpoints[name][1])


@pytest.mark.parametrize("family", ["base", "qwen2", "gpt2"])  # Llama, Qwen2 (tied), GPT-2 (F32)
def test_greedy_tokens_equal_transformers_generate(checkpoints, reference, family):
    backend = loaded(checkpoints, family)
    out = backend.generate(PROMPT, 12)
    assert out.tokens == reference[family]
    assert out.text == backend.tokenizer.decode(reference[family], skip_special_tokens=True)
    assert out.first_token_seconds > 0
    assert backend.generate(PROMPT, 12).tokens == out.tokens  # deterministic
    assert out.prompt_tokens == len(backend.tokenizer(PROMPT)["input_ids"])
    with pytest.raises(BackendError, match="positions"):
        backend.generate(PROMPT, 1024)  # past max_position_embeddings (512 or 128 here)


def test_streamed_pieces_join_to_generate_and_a_reader_leaving_stops_it(checkpoints):
    backend = loaded(checkpoints)
    whole = backend.generate(PROMPT, 12)
    pieces = list(backend.generate_stream(PROMPT, 12))
    assert len(pieces) > 1 and {p.prompt_tokens for p in pieces} == {whole.prompt_tokens}
    assert [t for p in pieces for t in p.tokens] == whole.tokens
    assert "".join(p.text for p in pieces) == whole.text
    stream = backend.generate_stream(PROMPT, 400)
    next(stream)
    stream.close()  # the reader leaves: the generating thread ends at its next step
    assert not [t for t in threading.enumerate() if t.name == "torch-generate"]


def changed_rows(base_dir, rev_dir):
    """{tensor: rows that differ}, read from the two checkpoint files directly."""
    def rows(path):
        start, header = read_layout(path / "model.safetensors")
        raw = (path / "model.safetensors").read_bytes()
        return {n: np.frombuffer(raw, np.uint16, (i["data_offsets"][1] - i["data_offsets"][0]) // 2,
                                 start + i["data_offsets"][0]).reshape(i["shape"][0], -1)
                for n, i in header.items() if i["dtype"] == "BF16"}
    a, b = rows(base_dir), rows(rev_dir)
    return {n: np.flatnonzero((a[n] != b[n]).any(axis=1)).tolist() for n in a if (a[n] != b[n]).any()}


def test_in_place_reports_exactly_the_changed_rows_and_matches_fresh_loads(checkpoints, reference):
    backend = loaded(checkpoints)
    ptrs = {n: t.data_ptr() for n, t in backend.live.bound.items()}
    for live, name in (("base", "rows"), ("rows", "rows2"), ("rows2", "base")):
        update = backend.stage_in_place(revision(checkpoints, name))
        want = changed_rows(checkpoints[live][0], checkpoints[name][0])
        assert {p.name: p.rows.tolist() for p in update.patches} == want
        assert backend.apply_in_place(update).rows == sum(map(len, want.values())) > 0
        assert backend.describe().identity == revision(checkpoints, name).manifest.identity()
        assert backend.generate(PROMPT, 12).tokens == reference[name]
    assert {n: t.data_ptr() for n, t in backend.live.bound.items()} == ptrs  # written in place


def test_chunk_verification_rebuilds_changed_chunks_from_live_parameters(checkpoints, reference):
    backend = TorchBackend(verify_chunks=True)
    backend.load(revision(checkpoints, "base"))
    update = backend.stage_in_place(revision(checkpoints, "rows"))
    assert update.checks and backend.apply_in_place(update).rows > 0
    assert backend.generate(PROMPT, 12).tokens == reference["rows"]


def test_reload_keeps_the_module_only_when_the_config_is_unchanged(checkpoints, reference):
    backend = loaded(checkpoints)
    module, first = backend.model, next(backend.model.parameters())
    report = backend.reload(revision(checkpoints, "whole"))
    assert report.graph_reused and backend.model is module and next(backend.model.parameters()) is first
    assert backend.generate(PROMPT, 12).tokens == reference["whole"]
    report = backend.reload(revision(checkpoints, "graph"))
    assert not report.graph_reused and backend.model is not module
    assert backend.model.config.max_position_embeddings == 1024
    assert backend.generate(PROMPT, 12).tokens == reference["graph"]
    assert backend.reload(revision(checkpoints, "rows")).graph_reused is False  # config differs again
    assert backend.generate(PROMPT, 12).tokens == reference["rows"]


def test_config_changes_are_not_admissible_in_place(checkpoints):
    backend = loaded(checkpoints)
    with pytest.raises(NeedsReload, match="config"):
        backend.stage_in_place(revision(checkpoints, "graph"))


def run(owner, name, checkpoints, strategy="Auto"):
    status = owner.submit(api.TransitionRequest(target=checkpoints[name][1], path="WholeBundle",
                                                strategy=strategy))
    return owner.wait_transition(status.id, 60)


@pytest.fixture
def owner_of(checkpoints):
    owners = []

    def start(weights=None, warmup=True):
        backend = TorchBackend()
        if weights is not None:
            backend.live_weights = weights
        owner = Owner(checkpoints["vol"], backend, warmup=warmup)
        owner.start()
        owners.append(owner)
        return owner

    yield start
    for o in owners:
        o.close()


def test_owner_transitions_report_residency_and_strategy(checkpoints, reference, owner_of):
    owner = owner_of()
    ident = owner.identity()
    assert ident.state == "ready" and ident.residency.device == "cpu"
    assert ident.residency.dtype == "bfloat16" and 0.9 * SIZE < ident.residency.bytes_resident < 1.2 * SIZE
    st = run(owner, "rows", checkpoints)
    assert (st.result, st.strategy, st.rows_changed > 0) == ("succeeded", "InPlace", True)
    st = run(owner, "graph", checkpoints)
    assert (st.result, st.strategy, st.graph_reused) == ("succeeded", "Reload", False)
    assert st.timings.warmup_seconds is not None  # a new module is warmed as at start
    out = owner.generate(api.GenerateRequest(prompt=PROMPT, maxTokens=12))
    assert out.tokens == reference["graph"] and out.identity.bundle == checkpoints["graph"][1]


def test_corrupt_write_rolls_back_to_the_base(checkpoints, reference, owner_of):
    owner = owner_of(FlipFirstWriteWeights)
    st = run(owner, "rows", checkpoints, "InPlace")
    assert st.result == "failed" and "restored" in st.reason and owner.state == "ready"
    assert st.identity.bundle == checkpoints["base"][1]
    assert owner.generate(api.GenerateRequest(prompt=PROMPT, maxTokens=12)).tokens == reference["base"]


def test_failed_rollback_unloads(checkpoints, owner_of):
    owner = owner_of(FailRestoreWeights)
    st = run(owner, "rows", checkpoints, "InPlace")
    assert st.result == "failed" and owner.state == "unloaded" and owner.identity().residency is None


def test_chunk_verification_catches_a_stray_write_and_unloads_when_restore_cannot_fix_it(checkpoints):
    backend = TorchBackend(verify_chunks=True)
    backend.live_weights = StrayWriteWeights
    owner = Owner(checkpoints["vol"], backend)
    owner.start()
    try:
        st = run(owner, "rows", checkpoints, "InPlace")
        assert st.result == "failed" and owner.state == "unloaded" and "do not match" in st.reason
    finally:
        owner.close()


def test_failed_release_quarantines(checkpoints, owner_of):
    owner = owner_of(FailReleaseWeights)
    st = run(owner, "rows", checkpoints, "InPlace")
    assert st.result == "failed" and owner.state == "quarantined" and "new identity live" in st.reason


def broken(tmp_path, checkpoints, how):
    """A copy of the base checkpoint with one defect, as the owner's current revision."""
    d = tmp_path / how
    shutil.copytree(checkpoints["base"][0], d)
    config = json.loads((d / "config.json").read_text())
    if how == "config-mismatch":
        config["intermediate_size"] += 64
    elif how == "more-layers":
        config["num_hidden_layers"] += 1
    elif how == "unknown-architecture":
        config["model_type"], config["architectures"] = "nosuchlm", ["NoSuchLMForCausalLM"]
    elif how == "no-tokenizer":
        for p in d.glob("tokenizer*"):
            p.unlink()
    (d / "config.json").write_text(json.dumps(config))
    write_manifest(d, build_manifest(d, chunk_size=CHUNK))
    vol = tmp_path / "vol"
    set_current(vol, stage_revision(vol, d))
    return vol


@pytest.mark.parametrize("how, message", [
    ("config-mismatch", "does not match its config: .*mlp.*has shape"),
    ("more-layers", "does not match its config: the config implies tensor model.layers.2"),
    ("unknown-architecture", "nosuchlm"),
    ("no-tokenizer", "no tokenizer files"),
])
def test_bad_checkpoints_fail_at_load_and_the_owner_is_never_ready(tmp_path, checkpoints, how, message):
    vol = broken(tmp_path, checkpoints, how)
    with pytest.raises(BackendError, match=message):
        TorchBackend().load(open_revision(vol))
    owner = Owner(vol, TorchBackend())
    with pytest.raises(StartupError):
        owner.start()
    assert owner.state == "unloaded" and owner.identity().identity is None


def test_a_device_torch_cannot_see_is_unavailable():
    from owner.backends import BackendUnavailable

    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA; the check is for machines without it")
    with pytest.raises(BackendUnavailable, match="no CUDA"):
        TorchBackend(device="cuda")

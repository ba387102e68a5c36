"""hf:// sources against a real Hub-compatible server (olah, offline, serving local git
repositories with LFS) on 127.0.0.1.

One server serves the session (``hub``); each test makes repositories of its own (``repo``).
What olah cannot do (Range, tokens, a 404 for a missing file) is in docs/sources.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import pytest
from safetensors.numpy import save

from bundle import cli
from bundle.errors import AccessDenied, IntegrityMismatch, SourceUnavailable
from bundle.scan import build_manifest
from bundle.sources import RetryPolicy, SourceCredentials, open_source
from bundle.sources.hf import MADE, CommitMissing, HfSource, RepositoryMissing, RevisionNotPinned
from bundle.sources.metrics import FETCHED_BYTES
from bundle.store import Store
from testkit.hf_server import HubRepo
from testkit.relay import CuttingRelay

CHUNK = 64 * 1024
FAST = RetryPolicy(attempts=2, backoff_seconds=0.01, connect_timeout_seconds=2, read_timeout_seconds=10)
CONFIG = json.dumps({"model_type": "llama", "hidden_size": 64}).encode()
TOKENIZER = json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode()


@pytest.fixture
def repo(hub_repo):
    return hub_repo


@pytest.fixture(autouse=True)
def fresh_process():
    """Each test makes its manifests itself, as a new process would."""
    MADE.clear()
    yield
    MADE.clear()


def tensors(seed: int, n: int = 8, elements: int = 64 * 1024) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"layers.{i}.weight": rng.standard_normal(elements, dtype=np.float32) for i in range(n)}


def span(data: bytes, name: str) -> tuple[int, int]:
    """Where tensor ``name``'s bytes lie in a safetensors file: [start, end)."""
    (n,) = struct.unpack("<Q", data[:8])
    start, end = json.loads(data[8:8 + n])[name]["data_offsets"]
    return 8 + n + start, 8 + n + end


def model_files(weights: dict[str, np.ndarray], **extra: bytes) -> dict[str, bytes]:
    return {"config.json": CONFIG, "tokenizer.json": TOKENIZER, "model.safetensors": save(weights),
            "README.md": b"# a model card\n", **extra}


def uri_of(hub, repo: HubRepo, commit: str) -> str:
    return f"hf://{repo.repo_id}@{commit}?endpoint={hub[0]}&chunk={CHUNK}"


def fetched() -> float:
    return FETCHED_BYTES.labels("hf")._value.get()


def test_a_commit_makes_the_bundle_resident_bundle_build_makes_of_its_download(hub, repo, tmp_path, capsys):
    commit = repo.commit(model_files(tensors(1), **{"sub/vocab.txt": b"a\nb\n"}))
    uri = uri_of(hub, repo, commit)
    with open_source(uri, FAST) as src:
        made = src.manifest()
    from huggingface_hub import snapshot_download
    local = tmp_path / "download"
    snapshot_download(repo.repo_id, revision=commit, endpoint=hub[0], token=False, local_dir=local)
    for left_out in (".gitattributes", "README.md", ".cache"):
        os.system(f"rm -rf {local / left_out}")
    assert made.digest == build_manifest(local, chunk_size=CHUNK).digest
    assert {f.path: f.role.value for f in made.files} == {
        "config.json": "config", "model.safetensors": "weights", "tokenizer.json": "tokenizer",
        "sub/vocab.txt": "config"}
    assert len(made.by_path()["model.safetensors"].chunks) > 1
    MADE.clear()   # made again from the server: the same bundle
    assert HfSource(uri, FAST).fetch_manifest(made.digest) == made
    MADE.clear()
    assert cli.main(["--quiet", "digest", uri]) == 0
    assert capsys.readouterr().out.strip() == made.digest
    assert cli.main(["--quiet", "digest", "--json", "--manifest", str(tmp_path / "m.json"), uri]) == 0
    assert json.loads(capsys.readouterr().out)["bundle"] == made.digest
    assert hashlib.sha256((tmp_path / "m.json").read_bytes()).hexdigest() == made.digest[7:]


def test_another_digest_than_the_commit_makes_is_an_integrity_mismatch(hub, repo):
    commit = repo.commit(model_files(tensors(1)))
    with pytest.raises(IntegrityMismatch, match=r"makes bundle sha256:[0-9a-f]{64}, not sha256:0{64}"):
        HfSource(uri_of(hub, repo, commit), FAST).fetch_manifest("sha256:" + "0" * 64)


def test_two_commits_differing_in_one_tensor_move_only_that_tensors_chunks(hub, repo, tmp_path):
    first = tensors(1)
    shard2 = save(tensors(2, n=4))   # a second file that both commits share
    a = repo.commit(model_files(first, **{"extra.safetensors": shard2}))
    second = dict(first)
    second["layers.3.weight"] = tensors(3)["layers.3.weight"]
    new_file = save(second)
    b = repo.commit({"model.safetensors": new_file})
    store = Store(tmp_path / "store")
    with open_source(uri_of(hub, repo, a), FAST) as src:
        ma = src.manifest()
        store.materialize(ma, src)

    # making the second manifest knowing the first reads what changed and the small files,
    # never the shared shard
    before = fetched()
    with HfSource(uri_of(hub, repo, b), FAST, known=[ma]) as src:
        mb = src.manifest()
        assert fetched() - before == len(new_file) + len(CONFIG) + len(TOKENIZER)
        assert mb.by_path()["extra.safetensors"] == ma.by_path()["extra.safetensors"]

        before = fetched()
        res = store.materialize(mb, src, donor=ma.digest)
    start, end = span(new_file, "layers.3.weight")
    touched = (end - 1) // CHUNK - start // CHUNK + 1   # the chunks the tensor's bytes lie in
    assert res.bytes_fetched == fetched() - before == touched * CHUNK
    assert res.bytes_fetched <= (end - start) + 2 * CHUNK
    assert (store.revision_path(mb.digest) / "model.safetensors").read_bytes() == new_file
    assert mb.graph_digest == ma.graph_digest   # config unchanged: an in-place candidate


def test_with_chunks_cut_at_tensors_a_changed_tensor_moves_alone(hub, repo, tmp_path):
    first = tensors(1, elements=50_001)   # tensors that start off block and chunk boundaries
    a = repo.commit(model_files(first))
    second = dict(first, **{"layers.3.weight": tensors(3, elements=50_001)["layers.3.weight"]})
    new_file = save(second)
    b = repo.commit({"model.safetensors": new_file})
    cut = lambda commit: uri_of(hub, repo, commit) + "&chunking=tensors"   # noqa: E731
    store = Store(tmp_path / "store")
    with open_source(cut(a), FAST) as src:
        ma = src.manifest()
        store.materialize(ma, src)
    with HfSource(cut(b), FAST, known=[ma]) as src:
        mb = src.manifest()
        before = fetched()
        res = store.materialize(mb, src, donor=ma.digest)
    start, end = span(new_file, "layers.3.weight")
    assert res.bytes_fetched == fetched() - before == end - start
    assert (store.revision_path(mb.digest) / "model.safetensors").read_bytes() == new_file
    # the bundle resident bundle build --chunking tensors makes of the same files
    (tmp_path / "b").mkdir()
    for name, data in {**model_files(second)}.items():
        if name != "README.md":
            (tmp_path / "b" / name).write_bytes(data)
    assert mb.digest == build_manifest(tmp_path / "b", chunk_size=CHUNK, chunking="tensors").digest
    assert mb.digest != build_manifest(tmp_path / "b", chunk_size=CHUNK).digest


def test_a_branch_is_refused_with_the_commit_it_points_at_now(hub, repo, capsys):
    first = repo.commit(model_files(tensors(1)))
    uri = f"hf://{repo.repo_id}@main?endpoint={hub[0]}"
    with pytest.raises(RevisionNotPinned, match=f"points at {first} now. Pin that commit: "
                                                f"hf://{repo.repo_id}@{first}\\?endpoint="):
        HfSource(uri, FAST).manifest()
    second = repo.commit({"config.json": b"{}"})          # the branch moves
    assert cli.main(["--quiet", "digest", uri]) == 2
    assert f"points at {second} now" in capsys.readouterr().err
    with pytest.raises(RevisionNotPinned, match="no branch or tag of that name"):
        HfSource(f"hf://{repo.repo_id}@nosuch?endpoint={hub[0]}", FAST).manifest()


def test_a_commit_a_force_push_dropped_is_missing_and_the_branches_are_shown(hub, repo):
    kept = repo.commit(model_files(tensors(1)))
    dropped = repo.commit({"config.json": b"{}"})
    repo.forget(dropped)
    with pytest.raises(CommitMissing, match=f"has no commit {dropped} .*branches now: main → {kept}"):
        HfSource(uri_of(hub, repo, dropped), FAST).manifest()


def test_a_repository_that_does_not_exist_is_missing(hub, hub_online):
    with pytest.raises(RepositoryMissing, match="acme/no-such-model at .* does not exist, or is private"):
        HfSource(f"hf://acme/no-such-model@{'a' * 40}?endpoint={hub[0]}", FAST).manifest()


def test_a_file_whose_bytes_are_not_its_lfs_oid_is_an_integrity_mismatch(hub, repo):
    commit = repo.commit(model_files(tensors(1)))
    oid = repo.git("lfs", "ls-files", "--long").split()[0]
    spoiled = bytearray(repo.lfs_object(oid).read_bytes())
    spoiled[-1] ^= 0xFF                                    # same size, another byte
    repo.lfs_object(oid).chmod(0o644)
    repo.lfs_object(oid).write_bytes(bytes(spoiled))
    with pytest.raises(IntegrityMismatch, match=f"model.safetensors: sha256 [0-9a-f]{{64}} != expected "
                                                f"{oid} .*not the file the Hub's LFS oid names"):
        HfSource(uri_of(hub, repo, commit), FAST).manifest()


def test_a_listed_file_the_server_does_not_serve_is_source_unavailable(hub, repo):
    commit = repo.commit(model_files(tensors(1)))
    oid = repo.git("lfs", "ls-files", "--long").split()[0]
    repo.lfs_object(oid).unlink()          # the mirror lost the LFS object
    with pytest.raises(SourceUnavailable, match="model.safetensors.*gave up after 2 attempts") as e:
        HfSource(uri_of(hub, repo, commit), FAST).manifest()
    assert not isinstance(e.value, AccessDenied)


def test_the_token_is_the_models_and_only_the_models(hub, repo, monkeypatch):
    commit = repo.commit(model_files(tensors(1)))
    port = int(hub[0].rsplit(":", 1)[1])
    relay = CuttingRelay(("127.0.0.1", port), after=1 << 40, cuts=0)
    uri = f"hf://{repo.repo_id}@{commit}?endpoint=http://127.0.0.1:{relay.port}&chunk={CHUNK}"
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment")
    try:
        with HfSource(uri, FAST, SourceCredentials({"HF_TOKEN": "hf_the_models_own"})) as src:
            src.manifest()
        with_token = b"".join(relay.requests)
        relay.requests.clear()
        with HfSource(uri, FAST) as src:        # another reader asks the server itself
            src.manifest()
        without = b"".join(relay.requests)
    finally:
        relay.close()
    assert with_token.count(b"authorization: Bearer hf_the_models_own") + \
        with_token.count(b"Authorization: Bearer hf_the_models_own") >= 4   # the tree and each file
    assert b"hf_from_the_environment" not in with_token + without
    assert b"authorization" not in without.lower()
    assert f"/tree/{commit}".encode() in without
    with pytest.raises(AccessDenied, match="the credentials lack HF_TOKEN"):
        HfSource(uri, FAST, SourceCredentials({"AWS_ACCESS_KEY_ID": "x"}))


def test_a_dropped_download_is_resumed_and_gives_the_same_bundle(hub, repo):
    commit = repo.commit(model_files(tensors(1)))
    whole = HfSource(uri_of(hub, repo, commit), FAST).manifest()
    MADE.clear()
    port = int(hub[0].rsplit(":", 1)[1])
    relay = CuttingRelay(("127.0.0.1", port), after=300_000, cuts=2)
    try:
        uri = f"hf://{repo.repo_id}@{commit}?endpoint=http://127.0.0.1:{relay.port}&chunk={CHUNK}"
        assert HfSource(uri, FAST).manifest().files == whole.files
    finally:
        relay.close()
    assert relay.cuts == 0

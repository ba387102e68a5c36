"""A transformers checkpoint kept on a Hub-compatible server (olah) reaches the torch
backend through hf:// as it is: the bundle of the commit is the checkpoint's own files,
the store builds it, and the backend generates what transformers generates on the
checkpoint directory."""

from __future__ import annotations

import pytest

from bundle.hf_demo import make_hf_demo
from bundle.manifest import MANIFEST_NAME
from bundle.sources.hf import MADE, HfSource
from bundle.store import Store
from owner.backends.torch_lm import TorchBackend
from owner.revisions import open_revision
from testkit.local_volume import stage_revision

from hf_checkpoints import PROMPT, transformers_greedy

CHUNK = 64 * 1024


@pytest.fixture(autouse=True)
def fresh_process():
    MADE.clear()
    yield
    MADE.clear()


def test_a_checkpoint_on_the_hub_is_served_from_hf_as_transformers_serves_it(hub, hub_repo, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    built = make_hf_demo(checkpoint, 512 * 1024, seed=5, chunk_size=CHUNK)   # transformers' save_pretrained
    commit = hub_repo.commit({p.name: p.read_bytes() for p in checkpoint.iterdir() if p.name != MANIFEST_NAME})
    with HfSource(f"hf://{hub_repo.repo_id}@{commit}?endpoint={hub[0]}&chunk={CHUNK}") as src:
        manifest = src.manifest()
        assert manifest.digest == built.digest     # the checkpoint's files, nothing added or lost
        store = Store(tmp_path / "store")
        store.materialize(src.fetch_manifest(manifest.digest), src)
    digest = stage_revision(tmp_path / "vol", store.revision_path(manifest.digest), make_current=True,
                            hardlink=False)
    backend = TorchBackend()
    backend.load(open_revision(tmp_path / "vol", digest))
    assert backend.generate(PROMPT, 12).tokens == transformers_greedy(checkpoint)

"""A torch model from ``hf://`` at a commit, on a real node (issue 28).

A real Hub-compatible server (olah, ``testkit.hf_server``) on this machine holds a tiny
Llama-style checkpoint in a git repository, in two commits: A, and B with rows of A
changed. It is exposed to the shared cluster (``world``). The model names the repository at
commit A; the operator checks the source, the bridge makes the bundle from the commit's
files and delivers it, and the torch backend in the owner-torch image answers as
transformers answers on the same files. A switch to commit B is applied in place, and the
answer is then transformers' answer on B.

This is the suite's one test of the torch backend on a node: the owner runs in the
owner-torch image (the project image plus torch for the CPU,
:func:`localcluster.images.owner_torch_image`), named by ``spec.runtime.image``, while the
install's own owner image stays the small one. The answers through the Service are
compared with what transformers itself generates greedily in this process. (A second
test, the same from the http bundle server, took 95 s of the suite for nothing more on
the owner's side; http sources are in every other e2e test.)
"""

from __future__ import annotations

import transformers

from bundle.manifest import MANIFEST_NAME
from hf_checkpoints import PROMPT, transformers_greedy
from localcluster.images import owner_torch_image
from localcluster.scenario import CHUNK, make_hf_bundles, model_body

SIZE, TOKENS = 1 << 20, 12


def transformers_text(checkpoint) -> str:
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(checkpoint / "tokenizer.json"))
    return tokenizer.decode(transformers_greedy(checkpoint, PROMPT, TOKENS), skip_special_tokens=True)


def test_a_torch_model_from_hf_at_a_commit_answers_as_transformers_and_switches_commits(world, hub, hub_repo,
                                                                                         tmp_path):
    image, tarball = owner_torch_image()
    world.cluster.import_image(tarball)
    digests, dirs = make_hf_bundles(tmp_path, SIZE, fraction=0.2)
    commits = {k: hub_repo.commit({p.name: p.read_bytes() for p in dirs[k].iterdir() if p.name != MANIFEST_NAME},
                                  message=f"revision {k}") for k in "ab"}
    want = {k: transformers_text(dirs[k]) for k in "ab"}
    assert want["a"] != want["b"], "the rows commit must change the answer, or the switch shows nothing"
    endpoint = f"http://{world.cluster.expose(int(hub[0].rsplit(':', 1)[1]))}"

    def source(k: str) -> str:
        return f"hf://{hub_repo.repo_id}@{commits[k]}?endpoint={endpoint}&chunk={CHUNK}"

    story = world.story("e2e-hf")
    story.apply(model_body(story.name, source("a"), digests["a"], image=image))
    story.wait_ready(digests["a"])
    pod = story.core.list_namespaced_pod(story.namespace, label_selector="resident.dev/slot=0").items[0]
    command = pod.spec.containers[0].command
    assert pod.spec.containers[0].image == image and command[command.index("--backend") + 1] == "torch"
    _, answer = story.complete(PROMPT, TOKENS)
    assert (answer["choices"][0]["text"], answer["system_fingerprint"]) == (want["a"], digests["a"])

    last = story.transition({"bundle": {"source": source("b"), "digest": digests["b"]}})
    assert (last["strategy"], last["result"]) == ("InPlace", "succeeded"), last
    assert last["bytes"]["fetched"] > 0 and last["bytes"]["reused"] > 0, last["bytes"]   # only what changed moved
    _, answer = story.complete(PROMPT, TOKENS)
    assert (answer["choices"][0]["text"], answer["system_fingerprint"]) == (want["b"], digests["b"])
    story.delete_and_wait_gone()

"""A Hugging Face checkpoint served by the torch backend on the local node.

The owner runs in the owner-torch image (the project image plus torch for the CPU,
:func:`localcluster.images.owner_torch_image`), named by ``spec.runtime.image``; the
install's own owner image stays the small one. Its answers through the Service's endpoint
are compared with what transformers itself generates greedily in this process for the same
checkpoint and prompt, before and after an in-place switch to a revision with changed rows.
"""

from __future__ import annotations

import transformers

from hf_checkpoints import PROMPT, transformers_greedy
from localcluster.images import owner_torch_image
from localcluster.scenario import make_hf_bundles, model_body

SIZE, TOKENS = 1 << 20, 12


def transformers_text(checkpoint) -> str:
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(checkpoint / "tokenizer.json"))
    return tokenizer.decode(transformers_greedy(checkpoint, PROMPT, TOKENS), skip_special_tokens=True)


def test_torch_owner_answers_as_transformers_does_before_and_after_an_in_place_switch(world, tmp_path):
    image, tarball = owner_torch_image()
    world.cluster.import_image(tarball)
    digests, dirs = make_hf_bundles(tmp_path, SIZE, fraction=0.2)
    for k in "ab":
        world.server.push(dirs[k])
    want = {k: transformers_text(dirs[k]) for k in "ab"}
    assert want["a"] != want["b"], "the rows revision must change the answer, or the switch shows nothing"

    story = world.story("e2e-torch")
    story.apply(model_body(story.name, world.server.url, digests["a"], image=image))
    story.wait_ready(digests["a"])
    pod = story.core.list_namespaced_pod(story.namespace, label_selector="resident.dev/slot=0").items[0]
    command = pod.spec.containers[0].command
    assert pod.spec.containers[0].image == image and command[command.index("--backend") + 1] == "torch"
    _, answer = story.complete(PROMPT, TOKENS)
    assert (answer["choices"][0]["text"], answer["system_fingerprint"]) == (want["a"], digests["a"])

    last = story.transition({"bundle": {"source": world.server.url, "digest": digests["b"]}})
    assert (last["strategy"], last["result"]) == ("InPlace", "succeeded"), last
    _, answer = story.complete(PROMPT, TOKENS)
    assert (answer["choices"][0]["text"], answer["system_fingerprint"]) == (want["b"], digests["b"])
    story.delete_and_wait_gone()

"""Pre-staged revisions on a real node (issue 26): kubelet, the bridge DaemonSet and the
operator of the chart. The next revision is staged beside the live one while the owner
serves the live one, and preloaded beside it (``spec.stage.preload``); the switch to it, a
reload, moves no byte and swaps the preloaded revision in, and the rollback to the
revision kept staged after it (``spec.transition.keepPrevious``, the default) moves none
either (it reloads: only ``spec.stage`` is preloaded).

The switch and the rollback are made as a user would: ``kubectl resident switch|rollback
--wait``, the project's plugin found by kubectl on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from localcluster.scenario import GROUP, VERSION, condition, model_body


def kubectl_resident(story, *args: str) -> subprocess.CompletedProcess:
    """``kubectl resident ARGS -n NS``: kubectl runs ``kubectl-resident`` from PATH (this
    venv's, where ``pip install`` put it), which reads the cluster from KUBECONFIG."""
    env = {**os.environ, "KUBECONFIG": str(story.cluster.kubeconfig),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return subprocess.run([str(story.cluster.bin_dir / "kubectl"), "resident", *args, story.name,
                           "-n", story.namespace], env=env, text=True, capture_output=True, timeout=330)

NAMESPACE = "e2e-stage"


def test_a_staged_revision_switches_and_rolls_back_without_delivery(world):
    url, a = world.server.url, world.revs.a
    b = world.fresh_revision("a", "rows", seed=91)   # new to the node
    story = world.story(NAMESPACE, "staged")
    body = model_body(story.name, url, a)
    body["spec"]["stage"] = {"source": url, "digest": b, "preload": True}
    body["spec"]["transition"] = {"strategy": "Reload"}
    story.apply(body)
    rm = story.wait("Ready on A with B staged and preloaded", lambda rm: (
        (rm.get("status") or {}).get("phase") == "Ready"
        and (rm["status"].get("identity") or {}).get("bundle") == a
        and condition(rm, "Staged").get("reason") == "Staged"
        and ((rm["status"]["stage"]["nodes"] or [{}])[0].get("preload") or {}).get("state") == "loaded"))
    row, = rm["status"]["stage"]["nodes"]
    assert row["state"] == "Staged" and row["bytes"]["fetched"] > 0, row
    assert story.generate("hello")["identity"]["bundle"] == a   # B waits beside A

    switched = kubectl_resident(story, "switch", "--wait", "--timeout", "300")
    assert switched.returncode == 0, switched.stderr
    assert switched.stdout.strip() == f"residentmodel '{story.name}': on {b[:19]} (1/1 owners)"
    assert "note:" not in switched.stderr   # staged on the one owner's node: nothing to deliver
    last = story.get()["status"]["lastTransition"]
    assert last["to"] == b and last["result"] == "succeeded" and last["prestaged"] is True, last
    assert last["strategy"] == "Reload" and last["preloaded"] is True, last   # a swap: no load in the switch
    assert last["bytes"]["fetched"] == 0 and last["durations"]["stagingSeconds"] == 0, last
    assert story.generate("hello")["identity"]["bundle"] == b

    def a_kept_staged(rm):
        deliveries = story.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "bundledeliveries")
        return (rm.get("status") or {}).get("previousBundle", {}).get("digest") == a and any(
            bd["spec"]["bundle"]["digest"] == a and bd["spec"].get("activate") is False
            and (bd.get("status") or {}).get("phase") == "Staged" for bd in deliveries["items"])
    story.wait("A kept staged", a_kept_staged)
    rolled = kubectl_resident(story, "rollback", "--wait", "--timeout", "300")
    assert rolled.returncode == 0, rolled.stderr
    back = story.get()["status"]["lastTransition"]
    assert back["to"] == a and back["result"] == "succeeded" and back["prestaged"] is True, back
    assert back["preloaded"] is False, back
    assert back["bytes"]["fetched"] == 0, back
    assert story.generate("hello")["identity"]["bundle"] == a
    story.delete_and_wait_gone()

"""A mount that cannot be made says why, on a real node: kubelet's FailedMount Event on the
owner Pod carries the bridge's answer, the model's conditions repeat it (``Degraded``
DeliveryFailed, ``Delivered=False`` MountFailed), and the mount succeeds once the source is
whole.

The bundle's manifest stays on the bundle server (so the operator places the model), but
one of its files is removed: the bridge's fetch gets HTTP 404 for it.
"""

from __future__ import annotations

from bundle.cpu_model import make_demo
from localcluster.scenario import CHUNK, BundleServer, condition, model_body
from polling import wait_for

SIZE = 1 << 20


def test_a_404_at_the_source_shows_in_the_pods_failed_mount_and_the_mount_recovers(world, tmp_path):
    # a revision of its own (seed 77: no chunk of it is in the node's store), on a server of
    # its own, on the shared cluster
    folder = tmp_path / "rev"
    digest = make_demo(folder, SIZE, seed=77, chunk_size=CHUNK).digest
    with BundleServer(tmp_path / "served", tmp_path / "logs", cluster=world.cluster) as server:
        server.push(folder)
        blobs = sorted((tmp_path / "served" / "blobs").iterdir(), key=lambda p: p.stat().st_size)
        missing = blobs[-1]                    # the weights: manifest readable, a file 404s
        missing.unlink()
        story = world.story("e2e-mount-failures", "broken")
        story.apply(model_body(story.name, server.url, digest))
        messages = wait_for(lambda: [e.message for e in story.failed_mounts() if "HTTP 404" in e.message],
                            timeout=180, what="kubelet's FailedMount naming the 404", every=1)
        assert f"delivering {digest} from {server.url}" in messages[0]
        assert missing.name in messages[0]     # the URL of the missing file
        assert "Unavailable" in messages[0]    # the CSI code, as kubelet prints it
        rm = story.wait("Degraded for its delivery, naming the 404",
                        lambda rm: condition(rm, "Degraded").get("reason") == "DeliveryFailed"
                        and "HTTP 404" in condition(rm, "Degraded").get("message", ""), timeout=60)
        degraded, delivered = condition(rm, "Degraded"), condition(rm, "Delivered")
        assert "HTTP 404" in degraded["message"] and missing.name in degraded["message"]
        assert (delivered["status"], delivered["reason"]) == ("False", "MountFailed")
        assert rm["status"]["phase"] == "Degraded"
        server.push(folder)                    # the file is back: kubelet's retry mounts it
        rm = story.wait_ready(digest)
        assert condition(rm, "Degraded")["status"] == "False"
        story.delete_and_wait_gone()

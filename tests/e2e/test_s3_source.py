"""A model from ``s3://`` with its credentials in a Secret, on a real node (issue 28).

A real S3-compatible server (SeaweedFS, ``testkit.s3_server``) runs on this machine and is
exposed to the shared cluster (``world``); the bucket refuses anonymous requests. The model names a Secret
of its namespace in ``spec.bundle.credentialsSecret``: the operator checks the source
with it, the owner Pod carries it as its bundle volume's ``nodePublishSecretRef``, real
kubelet hands its data to the bridge, and the bridge fetches from the bucket with it, for
the first revision and for the ones a transition stages. A Secret the store refuses is
the model's ``Degraded`` ``AccessDenied``, naming the bucket; the live revision keeps
serving.
"""

from __future__ import annotations

import json

from bundle.sources import push
from localcluster.scenario import condition, model_body
from testkit.s3_server import CREDENTIALS

NAMESPACE = "e2e-s3"


def test_a_model_from_s3_with_credentials_in_a_secret_serves_and_switches(world, s3_endpoint, s3_bucket,
                                                                          s3_prefix):
    cluster = world.cluster
    # revisions of its own after A: the node keeps what it staged, and a later test's
    # switch to the shared B must find B new to the node
    digests = {"a": world.revs.a, "fresh-81": world.fresh_revision("a", "rows", seed=81),
               "fresh-82": world.fresh_revision("a", "rows", seed=82)}
    a, b, c = digests.values()
    # the session's S3 server (tests/conftest.py), exposed to the cluster
    for k in digests:
        push(world.dirs[k], f"s3://{s3_bucket}/{s3_prefix}?endpoint={s3_endpoint}", credentials=CREDENTIALS)
    port = int(s3_endpoint.rsplit(":", 1)[1])
    source = f"s3://{s3_bucket}/{s3_prefix}?endpoint=http://{cluster.expose(port)}"
    story = world.story(NAMESPACE, "from-s3")
    cluster.kubectl("create", "secret", "generic", "s3-reader", "-n", NAMESPACE,
                    *(f"--from-literal={k}={v}" for k, v in CREDENTIALS.items()))
    body = model_body(story.name, source, a)
    body["spec"]["bundle"]["credentialsSecret"] = "s3-reader"
    story.apply(body)
    story.wait_ready(a)
    pod = story.owner_pods()[0]
    csi = next(v.csi for v in pod.spec.volumes if v.csi)
    assert csi.node_publish_secret_ref.name == "s3-reader"
    assert story.generate("hello")["identity"]["bundle"] == a

    # a switch to the next revision is staged from the bucket with the same Secret
    last = story.transition({"bundle": {"source": source, "digest": b,
                                        "credentialsSecret": "s3-reader"}})
    assert last["result"] == "succeeded", last

    # the Secret now holds credentials the store refuses: the next revision does not
    # start (the operator's check names the bucket), and the live one keeps serving
    cluster.kubectl("patch", "secret", "s3-reader", "-n", NAMESPACE, "--type=merge", "-p",
                    json.dumps({"stringData": {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}}))
    story.patch_spec({"bundle": {"source": source, "digest": c, "credentialsSecret": "s3-reader"}})
    rm = story.wait("Degraded AccessDenied naming the bucket", lambda rm: (
        condition(rm, "Degraded").get("reason") == "AccessDenied"
        and f"bucket {s3_bucket!r}" in condition(rm, "Degraded").get("message", "")), timeout=120)
    assert "not-the-secret" not in str(rm)
    assert story.generate("hello")["identity"]["bundle"] == b
    story.delete_and_wait_gone()

"""A model whose bundle lives in an S3 bucket, with its credentials in a Secret.

The real operator (as the chart's ServiceAccount) reads the model's Secret to check the
source, and places owner Pods whose bundle volume names the Secret in
``nodePublishSecretRef``; the played kubelet hands the Secret's data to the real bridge
with each publish, as kubelet does; the bridge fetches from a real S3-compatible server
(SeaweedFS) on 127.0.0.1 with it, and stages the next revision with it too. A Secret the
store refuses, or one that does not exist, leaves the model ``Degraded`` with the reason
and nothing placed, until the Secret is fixed.
"""

from __future__ import annotations

import base64

import pytest
from kubernetes import client

from bundle.cpu_model import make_demo, make_revision
from bundle.sources import push
from localcluster.processes import free_port
from testkit.s3_server import CREDENTIALS, admin_client, make_bucket, running_s3

from conftest_operator import Api, PlayedNode, condition, running_operator
from polling import wait_for
from test_operator_failures import degraded, nothing_created
from test_operator_transitions import ready_on, status

SIZE, CHUNK = 256 * 1024, 64 * 1024
BUCKET = "models"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The S3 server, and two revisions pushed to it: (endpoint, {name: digest})."""
    root = tmp_path_factory.mktemp("s3-bundles")
    with running_s3(tmp_path_factory.mktemp("s3")) as endpoint:
        make_bucket(admin_client(endpoint), BUCKET)
        one = make_demo(root / "one", SIZE, seed=31, chunk_size=CHUNK)
        two = make_revision(root / "one", root / "two", "rows", seed=32, fraction=0.05, chunk_size=CHUNK)
        d = {"one": one.digest, "two": two.digest}
        TOTALS.update({one.digest: one.total_bytes, two.digest: two.total_bytes})
        for name in d:
            push(root / name, f"s3://{BUCKET}/tiny?endpoint={endpoint}", credentials=CREDENTIALS)
        yield endpoint, d


def s3_total(digest: str) -> int:
    return TOTALS[digest]


TOTALS: dict[str, int] = {}


def put_secret(api: Api, name: str, data: dict[str, str]) -> None:
    body = client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data=data)
    try:
        api.core.create_namespaced_secret(api.ns, body)
    except client.ApiException as e:
        if e.status != 409:
            raise
        api.core.replace_namespaced_secret(name, api.ns, body)


def test_a_model_from_s3_with_credentials_in_a_secret_is_delivered_and_switched(
        cluster, namespace, s3, tmp_path):
    endpoint, d = s3
    source = f"s3://{BUCKET}/tiny?endpoint={endpoint}"
    api = Api(cluster, namespace)
    put_secret(api, "s3-reader", dict(CREDENTIALS))
    spec = {"bundle": {"source": source, "digest": d["one"], "credentialsSecret": "s3-reader"},
            "runtime": {"port": free_port()}, "transition": {"timeoutSeconds": 60}}
    with PlayedNode(cluster, namespace, tmp_path, real_bridge=True) as node, running_operator(namespace):
        api.create_model("lm", spec)
        wait_for(lambda: ready_on(api, d["one"]), timeout=45, what="Ready on one, from s3")
        pod = api.pods("resident.dev/model=lm")[0]
        csi = next(v.csi for v in pod.spec.volumes if v.csi)
        assert csi.node_publish_secret_ref.name == "s3-reader"
        api.patch_spec("lm", {"bundle": {"source": source, "digest": d["two"],
                                         "credentialsSecret": "s3-reader"}})
        wait_for(lambda: ready_on(api, d["two"]), timeout=45, what="Ready on two, staged from s3")
        last = status(api)["lastTransition"]
        assert last["result"] == "succeeded", last
        # chunk-level reuse from s3: the unchanged chunks came from the live revision
        assert last["bytes"]["reused"] > 0 and last["bytes"]["fetched"] < s3_total(d["two"]), last
        assert node.errors == [], node.errors[-1]


def test_refused_or_missing_credentials_leave_the_model_degraded_until_the_secret_is_fixed(
        cluster, namespace, s3):
    endpoint, d = s3
    source = f"s3://{BUCKET}/tiny?endpoint={endpoint}"
    api = Api(cluster, namespace)
    put_secret(api, "wrong", {**CREDENTIALS, "AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    with running_operator(namespace):
        for name, secret in (("refused", "wrong"), ("missing", "absent")):
            api.create_model(name, {"bundle": {"source": source, "digest": d["one"],
                                               "credentialsSecret": secret},
                                    "runtime": {"port": free_port()}})
        cond = wait_for(lambda: degraded(api, "refused", "AccessDenied"), timeout=30,
                        what="refused: Degraded/AccessDenied")
        assert f"bucket {BUCKET!r}" in cond["message"] and "SignatureDoesNotMatch" in cond["message"]
        assert "not-the-secret" not in cond["message"]
        cond = wait_for(lambda: degraded(api, "missing", "CredentialsUnavailable"), timeout=30,
                        what="missing: Degraded/CredentialsUnavailable")
        assert "Secret 'absent'" in cond["message"] and "does not exist" in cond["message"]
        for name in ("refused", "missing"):
            nothing_created(api, name)
        put_secret(api, "wrong", dict(CREDENTIALS))    # the Secret fixed, and the other created
        put_secret(api, "absent", dict(CREDENTIALS))
        for name in ("refused", "missing"):            # each looks again on its own backoff
            wait_for(lambda: (status(api, name).get("bundle") or {}).get("digest") == d["one"],
                     timeout=30, what=f"{name} placed once its Secret is right")
            wait_for(lambda: api.pods(f"resident.dev/model={name}"), timeout=20, what=f"{name}'s Pod")
            wait_for(lambda: condition(api.model(name), "Degraded").get("status") == "False",
                     timeout=20, what=f"{name} no longer Degraded")

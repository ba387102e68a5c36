"""A model whose bundle lives in an S3 bucket, with its credentials in a Secret.

The real operator (as the chart's ServiceAccount) reads the model's Secret to check the
source, and places owner Pods whose bundle volume names the Secret in
``nodePublishSecretRef``; the played kubelet hands the Secret's data to the real bridge
with each publish, as kubelet does; the bridge fetches from a real S3-compatible server
(SeaweedFS, the session's ``s3_endpoint``) on 127.0.0.1 with it. A Secret the store
refuses, or one that does not exist, leaves the model ``Degraded`` with the reason and
nothing placed, until the Secret is fixed. (Staging a next revision with the volume's
credentials is tests/component/test_csi_s3.py; the e2e test switches revisions.)
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from bundle.cpu_model import make_demo
from bundle.sources import push
from localcluster.processes import free_port
from testkit.s3_server import CREDENTIALS

from conftest_operator import Api, PlayedNode, condition, running_operator
from polling import wait_for
from test_operator_failures import degraded, nothing_created
from test_operator_transitions import ready_on, status

SIZE, CHUNK = 256 * 1024, 64 * 1024


@pytest.fixture(scope="module")
def s3(s3_endpoint, s3_bucket, tmp_path_factory):
    """A revision pushed to the session's S3 server: (source, digest)."""
    source = f"s3://{s3_bucket}/cluster-{uuid.uuid4().hex[:8]}?endpoint={s3_endpoint}"
    root = tmp_path_factory.mktemp("s3-bundle")
    digest = make_demo(root / "one", SIZE, seed=31, chunk_size=CHUNK).digest
    push(root / "one", source, credentials=CREDENTIALS)
    return source, digest


def put_secret(api: Api, name: str, data: dict[str, str]) -> None:
    body = client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data=data)
    try:
        api.core.create_namespaced_secret(api.ns, body)
    except client.ApiException as e:
        if e.status != 409:
            raise
        api.core.replace_namespaced_secret(name, api.ns, body)


def test_a_model_from_s3_with_credentials_in_a_secret_is_delivered(cluster, namespace, s3, tmp_path):
    source, digest = s3
    api = Api(cluster, namespace)
    put_secret(api, "s3-reader", dict(CREDENTIALS))
    spec = {"bundle": {"source": source, "digest": digest, "credentialsSecret": "s3-reader"},
            "runtime": {"port": free_port()}}
    with PlayedNode(cluster, namespace, tmp_path, real_bridge=True) as node, running_operator(namespace):
        api.create_model("lm", spec)
        wait_for(lambda: ready_on(api, digest), timeout=45, what="Ready, from s3")
        pod = api.pods("resident.dev/model=lm")[0]
        csi = next(v.csi for v in pod.spec.volumes if v.csi)
        assert csi.node_publish_secret_ref.name == "s3-reader"
        assert not any(v.secret and v.secret.secret_name == "s3-reader" for v in pod.spec.volumes)
        assert node.errors == [], node.errors[-1]


def test_refused_or_missing_credentials_leave_the_model_degraded_until_the_secret_is_fixed(
        cluster, namespace, s3):
    source, digest = s3
    api = Api(cluster, namespace)
    put_secret(api, "wrong", {**CREDENTIALS, "AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    with running_operator(namespace):
        for name, secret in (("refused", "wrong"), ("missing", "absent")):
            api.create_model(name, {"bundle": {"source": source, "digest": digest,
                                               "credentialsSecret": secret},
                                    "runtime": {"port": free_port()}})
        cond = wait_for(lambda: degraded(api, "refused", "AccessDenied"), timeout=30,
                        what="refused: Degraded/AccessDenied")
        assert f"bucket {source[5:].split('/')[0]!r}" in cond["message"]
        assert "SignatureDoesNotMatch" in cond["message"]
        assert "not-the-secret" not in cond["message"]
        cond = wait_for(lambda: degraded(api, "missing", "CredentialsUnavailable"), timeout=30,
                        what="missing: Degraded/CredentialsUnavailable")
        assert "Secret 'absent'" in cond["message"] and "does not exist" in cond["message"]
        for name in ("refused", "missing"):
            nothing_created(api, name)
        put_secret(api, "wrong", dict(CREDENTIALS))    # the Secret fixed, and the other created
        put_secret(api, "absent", dict(CREDENTIALS))
        for name in ("refused", "missing"):            # each looks again on its own backoff
            wait_for(lambda: (status(api, name).get("bundle") or {}).get("digest") == digest,
                     timeout=30, what=f"{name} placed once its Secret is right")
            wait_for(lambda: api.pods(f"resident.dev/model={name}"), timeout=20, what=f"{name}'s Pod")
            wait_for(lambda: condition(api.model(name), "Degraded").get("status") == "False",
                     timeout=20, what=f"{name} no longer Degraded")

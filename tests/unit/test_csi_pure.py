"""Pure parts of the bridge: mountinfo parsing, argument checks, namespace policy, locks."""

from __future__ import annotations

import grpc
import pytest

from csi_bridge import arguments, mountinfo
from csi_bridge.arguments import BundleRef, PodRef
from csi_bridge.authorization import (AllowAny, AwaitedPolicy, Denied, DenyAll, StaticPolicy, Unchecked,
                                      make_authorizer, model_declares)
from csi_bridge.fetches import Fetch
from csi_bridge.identity import NAME_RE, DRIVER_NAME
from csi_bridge.locks import VolumeLocks
from csi_bridge.status import CsiError, from_bundle_error
from testkit.bridge import publish_request
from bundle.errors import IntegrityMismatch, SourceUnavailable, StoreFull

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
SAMPLE = (
    "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "42 22 254:0 /tmp/vol\\040a /tmp/target\\040x ro,nosuid,nodev,relatime shared:2 - ext4 /dev/vda rw\n"
    "43 22 254:0 /tmp/vol /tmp/t2 rw,relatime - ext4 /dev/vda rw\n"
    "44 43 254:0 /tmp/vol /tmp/t2 ro,relatime - ext4 /dev/vda rw\n"
    "45 22 0:5 / /tmp/t2/sub rw - tmpfs tmpfs rw\n")


def test_mountinfo_parses_escapes_options_and_stacking():
    ms = mountinfo.parse(SAMPLE)
    m = mountinfo.mount_at("/tmp/target x", ms)
    assert m.root == "/tmp/vol a" and m.read_only and m.fstype == "ext4" and m.source == "/dev/vda"
    assert mountinfo.mount_at("/tmp/t2", ms).mount_id == 44  # the topmost of a stack
    assert mountinfo.mount_at("/tmp/t2/", ms).mount_id == 44
    assert mountinfo.mount_at("/tmp/none", ms) is None
    assert [m.mount_point for m in mountinfo.mounts_under("/tmp/t2", ms)] == ["/tmp/t2/sub", "/tmp/t2", "/tmp/t2"]
    assert mountinfo.mounts_under("/tmp/t", ms) == []  # a prefix of a name is not "under"


def test_mountinfo_rejects_garbage():
    with pytest.raises(mountinfo.MountinfoError):
        mountinfo.parse("not a mountinfo line\n")


def test_real_mountinfo_has_root():
    assert mountinfo.mount_at("/") is not None


def test_publish_arguments_accepted():
    args = arguments.check_publish(publish_request("v1", "/var/lib/k/mount/", D1, "file:///b",
                                                   namespace="ns", pod="p", pod_uid="u", model="m"))
    assert args.target_path == "/var/lib/k/mount"
    assert args.bundle == BundleRef(digest=D1, source="file:///b", model="m")
    assert args.pod == PodRef(namespace="ns", name="p", uid="u")


@pytest.mark.parametrize("path", ["", "rel", "/a/./b", "/a//b", "/", "/a/\x00"])
def test_bad_paths(path):
    with pytest.raises(CsiError) as e:
        arguments.check_path(path, "target_path")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_static_policy_and_fallbacks(tmp_path):
    f = tmp_path / "p.json"
    f.write_text('{"a": ["%s"]}' % D1)
    p = StaticPolicy(f)
    p.authorize(PodRef(namespace="a"), BundleRef(digest=D1, source="file:///x"))
    for pod, digest in ((PodRef(namespace="b"), D1), (PodRef(namespace="a"), D2), (PodRef(), D1)):
        with pytest.raises(Denied):
            p.authorize(pod, BundleRef(digest=digest, source="file:///x"))
    with pytest.raises(Denied):
        DenyAll().authorize(PodRef(namespace="a"), BundleRef(digest=D1, source="s"))
    AllowAny().authorize(PodRef(), BundleRef(digest=D1, source="s"))
    assert make_authorizer("api", api_client=None).name == "deny"  # fails closed
    f.write_text('["not a map"]')
    with pytest.raises(ValueError):
        StaticPolicy(f)
    with pytest.raises(ValueError):
        make_authorizer("static")


def test_an_awaited_policy_holds_a_check_until_the_real_one_arrives(tmp_path):
    import threading
    pod, bundle = PodRef(namespace="a"), BundleRef(digest=D1, source="file:///x")
    early = AwaitedPolicy("api", wait_seconds=0.05)
    with pytest.raises(Unchecked, match="has not reached the Kubernetes API"):   # kubelet retries
        early.authorize(pod, bundle)
    waiting = AwaitedPolicy("api", wait_seconds=30)
    outcome = []
    check = threading.Thread(target=lambda: outcome.append(_refusal(waiting, pod, bundle)))
    check.start()
    check.join(0.2)
    assert check.is_alive() and not outcome        # held, not refused
    waiting.arrive(DenyAll())
    check.join(5)
    assert outcome and isinstance(outcome[0], Denied) and "no API access" in str(outcome[0])
    f = tmp_path / "p.json"
    f.write_text('{"a": ["%s"]}' % D1)
    allowed = AwaitedPolicy("api")
    allowed.arrive(StaticPolicy(f))
    allowed.authorize(pod, bundle)                  # the real policy's answer, now at once


def _refusal(policy, pod, bundle):
    try:
        policy.authorize(pod, bundle)
    except Denied as e:
        return e
    with pytest.raises(ValueError):
        make_authorizer("maybe")


def test_model_declares_spec_and_status_identity():
    model = {"spec": {"bundle": {"digest": D1, "source": "oci://r/m:1"}},
             "status": {"identity": {"bundle": D2}}}
    assert model_declares(model, BundleRef(digest=D1, source="oci://r/m:1"))
    assert not model_declares(model, BundleRef(digest=D1, source="file:///elsewhere"))
    assert model_declares(model, BundleRef(digest=D2, source="anything://x"))
    assert not model_declares({"spec": {}}, BundleRef(digest=D1, source="s"))


def test_model_declares_its_staged_and_previous_revisions_at_their_sources():
    d3 = "sha256:" + "3" * 64
    model = {"spec": {"bundle": {"digest": D1, "source": "oci://r/m:1"},
                      "stage": {"digest": D2, "source": "oci://r/m:2"}},
             "status": {"previousBundle": {"digest": d3, "source": "oci://r/m:0"}}}
    assert model_declares(model, BundleRef(digest=D2, source="oci://r/m:2"))
    assert model_declares(model, BundleRef(digest=d3, source="oci://r/m:0"))
    assert not model_declares(model, BundleRef(digest=D2, source="oci://elsewhere/m:2"))
    assert not model_declares(model, BundleRef(digest=d3, source="oci://r/m:1"))


def test_error_mapping():
    assert from_bundle_error(SourceUnavailable("x"), "d").code == grpc.StatusCode.UNAVAILABLE
    assert from_bundle_error(StoreFull("x"), "d").code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert from_bundle_error(IntegrityMismatch("f", "a" * 64, "b" * 64), "d").code == grpc.StatusCode.DATA_LOSS
    assert from_bundle_error(KeyError("x"), "d").code == grpc.StatusCode.INTERNAL


def test_locks_refuse_a_busy_volume_and_release():
    locks = VolumeLocks()
    with locks.hold("v1", "t1"):
        with pytest.raises(CsiError) as e:
            with locks.hold("t1"):
                pass
        assert e.value.code == grpc.StatusCode.ABORTED
    with locks.hold("v1", "t1"):
        assert locks.busy("v1")
    assert not locks.busy("v1")


def test_fetch_progress_message():
    f = Fetch(D1, "file:///b", bytes_total=200)
    f.progress(50)
    assert "50 of 200 bytes (25%)" in f.describe()


def test_driver_name_is_valid():
    assert NAME_RE.match(DRIVER_NAME)


def test_event_body_names_the_delivery_and_is_capped():
    from csi_bridge.events import build_event
    obj = {"apiVersion": "resident.dev/v1alpha1", "kind": "BundleDelivery",
           "metadata": {"name": "d1", "namespace": "ns", "uid": "u-1"}}
    ev = build_event(obj, "DeliveryFailed", "x" * 5000, "node-a", warning=True)
    assert ev["involvedObject"] == {"apiVersion": "resident.dev/v1alpha1", "kind": "BundleDelivery",
                                    "name": "d1", "namespace": "ns", "uid": "u-1"}
    assert ev["type"] == "Warning" and len(ev["message"]) == 1024
    assert ev["source"] == {"component": "resident-bridge", "host": "node-a"}


def test_delivery_spec_validation():
    from pydantic import ValidationError
    from csi_bridge.staging import DeliverySpec
    good = {"nodeName": "n", "podName": "p", "podUID": "u", "path": "GraphOnly",
            "bundle": {"source": "file:///b", "digest": D1}}
    assert DeliverySpec.model_validate(good).min_reuse == 0.5
    for bad in ({**good, "path": "Sideways"}, {**good, "bundle": {"source": "x", "digest": "sha256:1"}},
                {**good, "minReuse": 2}, {k: v for k, v in good.items() if k != "podUID"}):
        with pytest.raises(ValidationError):
            DeliverySpec.model_validate(bad)


def test_csi_bridge_imports_only_bundle_among_project_packages():
    import ast
    from pathlib import Path
    import csi_bridge
    for path in Path(csi_bridge.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in ("owner", "resident_operator", "localcluster"), \
                    f"{path.name} imports {name}"


def test_delivery_retries_back_off_exponentially_up_to_a_cap_and_only_for_passing_failures():
    from csi_bridge import retries
    b = retries.Backoff(first_seconds=5, max_seconds=300)
    assert [b.delay(n) for n in (1, 2, 3, 4, 6, 7, 20)] == [5, 10, 20, 40, 160, 300, 300]
    at = retries.next_attempt("SourceUnavailable", 2, b, now=1_000_000.0)
    assert at == retries.timestamp(1_000_010.0) and at.endswith("Z")
    assert retries.next_attempt("PlanRefused", 1, b, now=0) is None
    failed = {"phase": "Failed", "nextAttemptTime": at, "observedGeneration": 3, "attempts": 2}
    assert not retries.due(failed, 1_000_009.0) and retries.due(failed, 1_000_010.0)
    assert not retries.due({**failed, "phase": "Staged"}, 2e6)
    assert not retries.due({"phase": "Failed"}, 2e6)             # final: no next attempt
    assert retries.previous_attempts(failed, 3) == 2 and retries.previous_attempts(failed, 4) == 0


def test_a_failing_gc_pass_is_counted_and_a_good_one_is_not():
    from csi_bridge.collection import Collector

    class Store:
        fail = True

        def gc(self, high, low):
            if self.fail:
                raise OSError("store database is locked")
            return ["sha256:" + "3" * 64]

    failures = []
    store = Store()
    gc = Collector(store, 100, 50, on_failure=lambda: failures.append(1))
    assert gc.collect() == [] and failures == [1]
    store.fail = False
    assert gc.collect() == ["sha256:" + "3" * 64] and failures == [1]
